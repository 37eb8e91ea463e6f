"""What a training pod's trainer prints, from the API server (the kubelet keeps it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from stride.podwatcher.adapters.outbound.backends.kubernetes.api import api_error


class TrainerLogs:
    """The trainer container's log: its tail, and new lines as they come."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    async def tail(self, name: str, namespace: str, lines: int) -> list[str]:
        try:
            text = await self.core.read_namespaced_pod_log(
                name, namespace, container="trainer", tail_lines=lines
            )
        except ApiException as error:
            return [f"(no log: {api_error(error)})"]
        return str(text).splitlines()

    async def follow(self, name: str, namespace: str) -> AsyncIterator[list[str]]:
        try:
            response: Any = await self.core.read_namespaced_pod_log(
                name,
                namespace,
                container="trainer",
                follow=True,
                since_seconds=1,
                _preload_content=False,
            )
        except ApiException as error:
            yield [f"(no log: {api_error(error)})"]
            return
        try:
            async for line in response.content:
                yield [line.decode(errors="replace").rstrip("\n")]
        finally:
            response.release()
