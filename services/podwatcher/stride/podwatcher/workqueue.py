"""A rate-limited work queue of keys (client-go's ``workqueue``, in small; KOD2 sec. 4.2's
reconcile loop is fed by one).

Events only *add* a key (a job's id, a ``StrideJob``'s ``namespace/name``); a worker takes
keys one at a time and reconciles each against what it observes then. A key queued twice
before a worker takes it is done once; a key being worked on when it is added again is
queued once more after. A failed key is added again after an exponential back-off per key
(``base * 2**failures``, at most ``limit``), and :meth:`forget` resets it after a success.
The whole queue hands out at most ``rate`` keys a second (a token bucket of ``burst``), so a
storm of events (a thousand pods starting) cannot starve the API server or the database.
"""

from __future__ import annotations

import asyncio
import contextlib


class WorkQueue:
    """Keys to reconcile, deduplicated, with per-key back-off and an overall rate."""

    def __init__(
        self,
        *,
        base: float = 0.05,
        limit: float = 30.0,
        rate: float = 50.0,
        burst: int = 100,
    ) -> None:
        self.base = base
        self.limit = limit
        self.rate = rate
        self.burst = burst
        self._ready: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._working: set[str] = set()
        self._again: set[str] = set()
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tokens = float(burst)
        self._stamp: float | None = None

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, key: str) -> None:
        """Queue ``key`` unless it is queued already."""
        if key in self._working:
            self._again.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def add_after(self, key: str, delay: float) -> None:
        """Queue ``key`` in ``delay`` seconds (an earlier timer for it is kept)."""
        if delay <= 0:
            self.add(key)
            return
        if key in self._timers:
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay, fire)

    def retry(self, key: str) -> float:
        """Queue a failed key after its back-off; returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = float(min(self.base * 2**failures, self.limit))
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        """The key succeeded: its next failure backs off from the start."""
        self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    async def _take_token(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._stamp is not None:
                self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            await asyncio.sleep((1 - self._tokens) / self.rate)

    async def get(self) -> str:
        """The next key (waits for one, and for the rate); call :meth:`done` after."""
        key = await self._ready.get()
        await self._take_token()
        self._queued.discard(key)
        self._working.add(key)
        return key

    def done(self, key: str) -> None:
        """The worker finished ``key``; one added meanwhile is queued again."""
        self._working.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def close(self) -> None:
        """Cancel pending timers."""
        for timer in self._timers.values():
            with contextlib.suppress(Exception):
                timer.cancel()
        self._timers.clear()
