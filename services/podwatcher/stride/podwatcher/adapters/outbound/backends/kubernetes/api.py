"""Small helpers for calling the API server with ``kubernetes_asyncio``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException


def api_error(error: ApiException) -> str:
    """The API server's own message for a refused call."""
    try:
        return str(json.loads(error.body or b"").get("message", error.reason))
    except (TypeError, ValueError, AttributeError):
        return str(error.reason)


def as_body(manifest: dict[str, Any]) -> Any:
    """A manifest as a request body: the client serializes dicts as they are (its
    signatures name the generated models, which cost more to build than to send)."""
    return manifest


async def send(call: Callable[..., Any], *args: Any) -> None:
    """A call whose answer is not read: not decoded into the client's models (a fifth of
    the backend's CPU at a thousand pods, ``bench/kube_pods.py``)."""
    response = await call(*args, _preload_content=False)
    response.release()


async def create(call: Callable[..., Any], body: dict[str, Any]) -> None:
    """Create ``body`` in its namespace; one that exists already is left as it is."""
    try:
        await send(call, body["metadata"]["namespace"], as_body(body))
    except ApiException as error:
        if error.status != 409:
            raise


async def close_client(api: client.ApiClient) -> None:
    """Close the client's connections; TLS transports finish closing on the next loop
    turns, which aiohttp asks callers to give them (else their sockets are reported
    unclosed)."""
    await api.close()
    await asyncio.sleep(0.25)
