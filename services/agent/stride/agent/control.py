"""The channel from the agent to its trainer's WatchControl streams.

Each watcher gets its own queue, so a slow trainer does not hold up another watcher. The
only producer today is shutdown: when the agent stops, every watcher gets STOP and its
stream ends. After that, a late watcher gets STOP at once. Pause and resume for seamless
migrations come from the podwatcher's migration issue, through :meth:`ControlChannel.send`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from stride.agent.domain.control import ControlAction, ControlCommand


class ControlChannel:
    """Fans control commands out to every current watcher."""

    def __init__(self) -> None:
        self._watchers: set[asyncio.Queue[ControlCommand]] = set()
        self._final: ControlCommand | None = None

    @property
    def watchers(self) -> int:
        """How many streams are watching."""
        return len(self._watchers)

    def send(self, command: ControlCommand) -> None:
        """Deliver ``command`` to every watcher."""
        for queue in self._watchers:
            queue.put_nowait(command)

    def close(self, reason: str) -> None:
        """Send STOP to every watcher, now and in future; idempotent."""
        if self._final is not None:
            return
        self._final = ControlCommand(ControlAction.STOP, reason)
        self.send(self._final)

    @asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[ControlCommand]]:
        """A queue receiving every command from now on (STOP at once if already closed)."""
        queue: asyncio.Queue[ControlCommand] = asyncio.Queue()
        if self._final is not None:
            queue.put_nowait(self._final)
        self._watchers.add(queue)
        try:
            yield queue
        finally:
            self._watchers.discard(queue)
