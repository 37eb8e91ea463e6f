"""Start-up, the sweep for lost pods, usage samples, the node inventory, drains, and what the
API shows of pods, nodes and logs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog

from stride.bus import topics
from stride.events.v1 import pod_pb2
from stride.podwatcher.adapters.convert import (
    ROLE_TO_PROTO,
    inventory_to_proto,
    timestamp,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import (
    PodEnded,
)
from stride.podwatcher.adapters.outbound.repository import StoredPlan
from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.nodes import check_node_name
from stride.podwatcher.usecases.common import (
    NodeView,
    PodView,
    now_utc,
)
from stride.podwatcher.usecases.intake import Intake
from stride.runtime.errors import InvalidArgument, NotFound

log = structlog.get_logger(__name__)


class Inventory(Intake):
    """Start-up, sweeps, usage, the node inventory, drains and the API's views."""

    async def startup(self) -> None:
        """Re-adopt the pods an earlier run left running and remove orphans (pods with no
        live row: started just before a crash that lost their row, or already ended)."""
        adopted = set(self.backend.adopt())
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
        known = {row.record.name for row in live if row.record.phase is not PodPhase.FAILED}
        self._running_at_startup = {
            row.record.name: row.record.restarts
            for row in live
            if row.record.phase is PodPhase.RUNNING
        }
        for name in sorted(adopted - known):
            log.warning("orphan pod removed: no live row for it", pod=name)
            await self._delete(name)
        log.info("pods re-adopted", count=len(adopted & known), orphans=len(adopted - known))

    async def sweep_lost(self) -> None:
        """Rows that say RUNNING, as they did at start-up, for pods the backend does not run
        (they vanished while the podwatcher was down, and no end was recorded) fail as Error
        and are relaunched; then every running job's newest plan is applied again (a crash
        may have cut one short). Run once, shortly after start-up, when the ends the backend
        kept have been recorded."""
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
            jobs = await repository.running_jobs(session)
        # A pod whose end is still on its way to being recorded is not lost, nor is one
        # this run launched (or relaunched): its end is this run's to record, and one that
        # ended just now would be taken for lost with no exit code.
        present = set(self.backend.known())
        for row in live:
            record = row.record
            if (
                record.phase is PodPhase.RUNNING
                and record.name not in present
                and self._running_at_startup.get(record.name) == record.restarts
            ):
                await self.pod_ended(
                    PodEnded(
                        row.record.name,
                        row.record.job_id,
                        "Error",
                        None,
                        "lost: not running after the podwatcher restarted",
                    )
                )
        for job_id in jobs:
            self.queue.add(job_id)

    async def sample_usage(self) -> None:
        """Sample every running pod's usage and publish it."""
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
            versions: dict[str, int] = {}
            for job_id in {row.record.job_id for row in live}:
                newest = await repository.newest_plan(session, job_id)
                versions[job_id] = 0 if newest is None else newest.plan.version
        for row in live:
            if row.record.phase is not PodPhase.RUNNING:
                continue
            usage = self.backend.usage(row.record.name)
            if usage is None:
                continue
            self._usage[row.record.name] = usage
            moment = now_utc()
            sample = pod_pb2.UsageSample(
                job_id=row.record.job_id,
                pod_name=row.record.name,
                role=ROLE_TO_PROTO[row.record.role],
                cpu_used=usage.cpu_cores,
                memory_used_bytes=usage.memory_bytes,
                cpu_limit=row.record.cpu,
                memory_limit_bytes=row.record.memory_bytes,
                sampled_at=timestamp(moment),
                plan_version=versions.get(row.record.job_id, 0),
            )
            try:
                await self.bus.publish(
                    topics.POD_USAGE,
                    row.record.job_id,
                    sample,
                    f"{row.record.name}.usage.{int(moment.timestamp() * 1000)}",
                )
            except Exception:
                log.warning("usage sample not published", pod=row.record.name, exc_info=True)

    async def job_owner(self, job_id: str) -> str | None:
        """The user who submitted a job this podwatcher knows (None: it knows no such job)."""
        async with self.database.sessions() as session:
            stored = await repository.get_job(session, job_id)
        return None if stored is None else stored.spec.user

    async def job_pods(self, job_id: str) -> tuple[StoredPlan, list[PodView]]:
        """The job's newest plan and its pods (newest generation first), or NotFound."""
        if not job_id:
            raise InvalidArgument("job_id", "is required")
        async with self.database.sessions() as session:
            stored = await repository.newest_plan(session, job_id)
            rows = await repository.job_pods(session, job_id)
        if stored is None:
            raise NotFound(f"no plan recorded for job {job_id!r}")
        address = self.backend.address
        views = [
            PodView(
                row,
                self._usage.get(row.record.name),
                address(row.record.name, row.record.job_id, row.port),
            )
            for row in rows
            if row.record.phase is not PodPhase.DELETED
        ]
        return stored, views

    async def nodes(self) -> list[NodeView]:
        """Every node, drained or not, and what live pods were given on each."""
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
        views = []
        for node, drained in self.backend.all_nodes():
            on = [row.record for row in live if row.record.node == node.name]
            views.append(
                NodeView(node, sum(p.cpu for p in on), sum(p.memory_bytes for p in on), drained)
            )
        return views

    async def publish_inventory(self, reason: str) -> None:
        """Publish every node pods may be placed on now (through the outbox, so a NATS
        outage delays it and loses nothing)."""
        nodes = tuple(self.backend.nodes())
        moment = now_utc()
        message = inventory_to_proto(self.cluster, nodes, reason, moment)
        message_id = f"{self.cluster}.nodes.{int(moment.timestamp() * 1_000_000)}"
        async with self.database.transaction() as session:
            await self.outbox.add_event(
                session, topics.NODE_INVENTORY.outgoing(self.cluster, message, message_id)
            )
        self.outbox.notify()
        self._published = nodes
        log.info("node inventory published", reason=reason, nodes=len(nodes))

    async def check_inventory(self) -> None:
        """Publish the inventory if it changed since it was last published (the first
        call of a run always publishes: admission may have missed the last one)."""
        if self._published is None:
            await self.publish_inventory("start")
        elif tuple(self.backend.nodes()) != self._published:
            await self.publish_inventory("changed")

    async def drain(self, name: str) -> list[str]:
        """Take a node out of the inventory and evict its pods (their jobs relaunch them
        where their plans fit); the evicted pods' names."""
        check_node_name(name)
        if not self.backend.set_drained(name, True):
            raise NotFound(f"no node {name!r}")
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
        evicted = []
        for row in live:
            if row.record.node == name and row.record.phase is not PodPhase.FAILED:
                await self.backend.evict(row.record.name, f"node {name} drained")
                evicted.append(row.record.name)
        log.warning("node drained", node=name, evicted=len(evicted))
        await self.publish_inventory(f"{name} drained")
        return evicted

    async def restore(self, name: str) -> None:
        """Put a drained node back, and re-apply running jobs (pods waiting for room)."""
        check_node_name(name)
        if not self.backend.set_drained(name, False):
            raise NotFound(f"no node {name!r}")
        log.info("node restored", node=name)
        await self.publish_inventory(f"{name} restored")
        async with self.database.sessions() as session:
            jobs = await repository.running_jobs(session)
        for job_id in jobs:
            self.queue.add(job_id)

    async def logs(
        self, job_id: str, pod_name: str, tail: int, follow: bool
    ) -> AsyncIterator[tuple[str, list[str]]]:
        """The last ``tail`` lines of the pod's (or every pod's) log, then new ones."""
        async with self.database.sessions() as session:
            rows = await repository.job_pods(session, job_id)
        if not rows:
            raise NotFound(f"no pods recorded for job {job_id!r}")
        names = [row.record.name for row in rows]
        if pod_name:
            if pod_name not in names:
                raise NotFound(f"job {job_id!r} has no pod {pod_name!r}; it has {', '.join(names)}")
            names = [pod_name]
        for name in names:
            yield name, await self.backend.log_tail(name, tail)
        if not follow:
            return
        queue: asyncio.Queue[tuple[str, list[str]] | None] = asyncio.Queue()

        async def pump(name: str) -> None:
            try:
                async for lines in self.backend.follow_logs(name):
                    await queue.put((name, lines))
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(name)) for name in names]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                    continue
                yield item
        finally:
            for task in tasks:
                task.cancel()
