"""The agent's use cases: speaking for one pod (:class:`PodAgent`), and the channel from the
agent to its trainer's WatchControl streams (:class:`ControlChannel`).

Each watcher gets its own queue, so a slow trainer does not hold up another watcher. The
only producer today is shutdown: when the agent stops, every watcher gets STOP and its
stream ends. After that, a late watcher gets STOP at once. Pause and resume for seamless
migrations come from the podwatcher's migration issue, through :meth:`ControlChannel.send`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from stride.agent.adapters.outbound.checkpoints import CheckpointClient
from stride.agent.adapters.outbound.shards import ShardClient
from stride.agent.adapters.outbound.steps import StepReporter
from stride.agent.adapters.outbound.upstream import UpstreamError
from stride.agent.domain.control import ControlAction, ControlCommand

__all__ = ["ControlChannel", "PodAgent", "UpstreamError"]


@dataclass(frozen=True)
class PodAgent:
    """What the agent does for the trainer in its pod. It owns nothing durable: shards come
    from the dispatcher, checkpoints go to the cache, step metrics onto the bus, and control
    commands (pause, resume, stop) reach the trainer through :class:`ControlChannel`. A
    refusal upstream surfaces as :class:`UpstreamError` with the upstream's status."""

    job_id: str
    """The one job this pod belongs to; requests about any other are refused."""
    shards: ShardClient
    checkpoints: CheckpointClient
    steps: StepReporter
    control: ControlChannel


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
