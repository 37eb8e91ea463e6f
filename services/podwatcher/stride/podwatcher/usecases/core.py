"""What every room of the pod watcher works with: its storage, backend, bus, timings,
locks and work queue, and the small steps they all take (a plan's state, a pod deleted,
an event through the outbox)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import structlog

from stride.bus import topics
from stride.bus.client import Bus
from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.events.v1 import pod_pb2
from stride.podwatcher.adapters.convert import (
    ROLE_TO_PROTO,
    timestamp,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import (
    Backend,
    PodUsage,
)
from stride.podwatcher.adapters.outbound.repository import StoredPod
from stride.podwatcher.domain.cluster import PlanState
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.usecases.common import (
    PortPicker,
    Timing,
    free_port,
    now_utc,
)
from stride.podwatcher.workqueue import WorkQueue

log = structlog.get_logger(__name__)


class PodWatcherCore:
    """The state and shared steps of the pod watcher's use cases."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        backend: Backend,
        bus: Bus,
        timing: Timing | None = None,
        ports: Callable[[], int] = free_port,
        cluster: str = "local",
    ) -> None:
        self.cluster = cluster
        """The cluster's name in the node inventory's subject."""
        self._published: tuple[NodeSpec, ...] | None = None
        """The node inventory last published (None: not yet in this run)."""
        self.database = database
        self.outbox = outbox
        self.backend = backend
        self.bus = bus
        self.timing = timing or Timing()
        self.ports = PortPicker(ports)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._usage: dict[str, PodUsage] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}
        self.queue = WorkQueue()
        """Jobs waiting for a pass of :meth:`reconcile_loop`."""
        self._running_at_startup: dict[str, int] = {}
        """The pods an earlier run left running (name to restarts), as :meth:`startup`
        found them: the only ones the lost-pod sweep may declare lost."""
        self._waiting_for_room: set[str] = set()
        """Jobs whose newest plan fits the nodes but not beside the other jobs' pods now:
        applied again whenever a pod ends and frees room (Kubernetes keeps such pods
        Pending)."""

    async def _set_plan_state(
        self, job_id: str, version: int, state: PlanState, message: str
    ) -> None:
        async with self.database.transaction() as session:
            await repository.set_state(session, job_id, version, state, message[:2000], now_utc())

    async def _delete_all(self, names: Iterable[str]) -> None:
        """Delete pods concurrently: each may take its grace period to stop."""
        await asyncio.gather(*(self._delete(name) for name in names))

    async def _delete(self, name: str) -> None:
        try:
            await self.backend.delete(name)
        except Exception:
            log.exception("pod delete failed", pod=name)

    async def _event(
        self,
        session: Session,
        topic: topics.Topic[pod_pb2.PodEvent],
        row: StoredPod,
        phase: pod_pb2.PodPhase.ValueType,
        message: str,
        exit_code: int | None,
        kind: str,
        attempt: str,
        reason: pod_pb2.PodFailureReason.ValueType = pod_pb2.POD_FAILURE_REASON_UNSPECIFIED,
    ) -> None:
        pod = row.record
        event = pod_pb2.PodEvent(
            job_id=pod.job_id,
            pod_name=pod.name,
            role=ROLE_TO_PROTO[pod.role],
            index=pod.index,
            phase=phase,
            reason=reason,
            message=message[:4000],
            exit_code=exit_code or 0,
            plan_version=row.plan_version,
            node=pod.node,
            occurred_at=timestamp(now_utc()),
        )
        message_id = f"{pod.name}.{kind}.{pod.restarts}{'.' + attempt if attempt else ''}"
        await self.outbox.add_event(session, topic.outgoing(pod.job_id, event, message_id))
        self.outbox.notify()

    def _spawn(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._timers[f"{key}:{id(task)}"] = task
        task.add_done_callback(lambda t: self._timers.pop(f"{key}:{id(t)}", None))

    def _apply_later(self, job_id: str, delay: float) -> None:
        self.queue.add_after(job_id, delay)
