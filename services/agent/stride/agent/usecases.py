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

import structlog

from stride.agent.adapters.outbound.checkpoints import CheckpointClient
from stride.agent.adapters.outbound.control import AckPublisher
from stride.agent.adapters.outbound.shards import ShardClient
from stride.agent.adapters.outbound.steps import StepReporter
from stride.agent.adapters.outbound.upstream import UpstreamError
from stride.agent.domain.control import ControlAction, ControlCommand

log = structlog.get_logger(__name__)

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
    acks: AckPublisher


class ControlChannel:
    """Fans control commands out to every current watcher.

    Commands come from the podwatcher over the bus (:meth:`deliver`): one addressed to
    another pod is not ours, and one older than a plan version already passed on is stale
    (redelivered or overtaken) and dropped. A command that arrives while no trainer watches
    (it is starting, or restarting after a re-exec) is kept, the newest only, and given to
    the next watcher."""

    def __init__(self, pod_name: str = "") -> None:
        self.pod_name = pod_name
        self._watchers: set[asyncio.Queue[ControlCommand]] = set()
        self._final: ControlCommand | None = None
        self._newest_version = 0
        self._kept: ControlCommand | None = None

    def deliver(self, command: ControlCommand, pod_name: str) -> bool:
        """Pass on a command from the podwatcher if it is for this pod and not stale."""
        if pod_name and self.pod_name and pod_name != self.pod_name:
            return False
        if command.plan_version and command.plan_version < self._newest_version:
            log.info(
                "stale control command dropped",
                action=command.action.value,
                version=command.plan_version,
                newest=self._newest_version,
            )
            return False
        self._newest_version = max(self._newest_version, command.plan_version)
        if not self._watchers:
            self._kept = command
            return True
        self.send(command)
        return True

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
        if self._kept is not None and self._final is None:
            queue.put_nowait(self._kept)
            self._kept = None
        if self._final is not None:
            queue.put_nowait(self._final)
        self._watchers.add(queue)
        try:
            yield queue
        finally:
            self._watchers.discard(queue)
