"""A list-then-watch cache of one kind of object (client-go's informer, in small).

It lists once, then watches from the list's resourceVersion with bookmarks, so a
reconnect resumes where it left off; when the server has compacted that version away
(``410 Gone``, or an ERROR event saying so) it lists again and reports what changed
meanwhile. Nothing polls: after the first list, every change arrives as a watch event.
Objects are kept as the API's JSON (dicts): decoding a thousand pods into generated
models costs more than the pod watcher's own work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from kubernetes_asyncio.client.exceptions import ApiException

log = structlog.get_logger(__name__)

Lister = Callable[..., Awaitable[Any]]
"""A generated ``list_*`` method (``CoreV1Api.list_pod_for_all_namespaces``, say)."""
Handler = Callable[[str, dict[str, Any]], None]
"""Called with ``ADDED``/``MODIFIED``/``DELETED`` and the object, in the watch's order."""

WATCH_SECONDS = 240
"""A watch call's server-side timeout: it is renewed from the last version seen."""


class Gone(Exception):
    """The version to resume from is compacted away: list again."""


class Informer:
    """Keeps ``objects`` (by ``namespace/name``) in step with the server."""

    def __init__(
        self, kind: str, lister: Lister, handler: Handler, *, label_selector: str = ""
    ) -> None:
        self.kind = kind
        self.lister = lister
        self.handler = handler
        self.label_selector = label_selector
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = ""
        self.synced = asyncio.Event()
        self.requests = 0
        """API calls made (lists and watches), for the benchmark."""
        self.relists = 0

    @staticmethod
    def key(item: dict[str, Any]) -> str:
        meta = item.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        return f"{namespace}/{meta.get('name', '')}" if namespace else meta.get("name", "")

    async def list(self) -> None:
        """List everything; report what appeared, changed or went since the cache."""
        self.requests += 1
        response = await self.lister(label_selector=self.label_selector, _preload_content=False)
        try:
            body = json.loads(await response.read())
        finally:
            response.release()
        fresh = {self.key(item): item for item in body.get("items") or []}
        for key, old in list(self.objects.items()):
            if key not in fresh:
                del self.objects[key]
                self.handler("DELETED", old)
        for key, item in fresh.items():
            previous = self.objects.get(key)
            self.objects[key] = item
            if previous is None:
                self.handler("ADDED", item)
            elif (previous.get("metadata") or {}).get("resourceVersion") != (
                item.get("metadata") or {}
            ).get("resourceVersion"):
                self.handler("MODIFIED", item)
        self.version = (body.get("metadata") or {}).get("resourceVersion", "")
        self.synced.set()

    async def watch_once(self) -> None:
        """One watch call, until the server ends it; raises :class:`Gone` on 410."""
        self.requests += 1
        try:
            response = await self.lister(
                label_selector=self.label_selector,
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=self.version,
                timeout_seconds=WATCH_SECONDS,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status == 410:
                raise Gone(str(error.reason)) from None
            raise
        pending = b""
        try:
            # Chunks, not lines: aiohttp refuses lines over 64 KiB, and a pod carrying a
            # large job spec in its environment is one.
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._event(json.loads(line))
        finally:
            response.release()

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        item = event.get("object") or {}
        if kind == "ERROR":
            if item.get("code") == 410:
                raise Gone(item.get("message", "resource version too old"))
            raise ApiException(status=item.get("code", 500), reason=item.get("message", ""))
        version = (item.get("metadata") or {}).get("resourceVersion")
        if version:
            self.version = version
        if kind == "BOOKMARK":
            return
        key = self.key(item)
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = item
        self.handler(kind, item)

    async def run(self, stop: asyncio.Event) -> None:
        """List (unless listed already), then watch until ``stop``; list again on 410, back
        off on errors."""
        delay = 0.5
        listed = bool(self.version)
        while not stop.is_set():
            try:
                if not listed:
                    await self.list()
                    listed = True
                await self.watch_once()
                delay = 0.5
            except Gone as error:
                self.relists += 1
                log.info("watch version compacted; listing again", kind=self.kind, why=str(error))
                listed = False
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("watch failed; retrying", kind=self.kind, error=str(error)[:300])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 10.0)
