"""The reconcile loop: passes that compare a job's newest plan with its pods (the pure
``reconcile``) and take the step it gives: pods created, relaunched, resized, migrated,
deleted, or the job suspended."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import datetime, timedelta

import structlog
from google.protobuf import json_format

from stride.bus import topics
from stride.events.v1 import control_pb2, pod_pb2
from stride.podwatcher.adapters.convert import (
    plan_from_proto,
    timestamp,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import (
    PodEnded,
    PodStart,
)
from stride.podwatcher.adapters.outbound.repository import StoredJob, StoredPlan, StoredPod
from stride.podwatcher.domain.cluster import PlanState, PodPhase
from stride.podwatcher.domain.reconcile import (
    MEMBER_ROLES,
    PodRecord,
    PodWant,
    Reconciliation,
    Unplaceable,
    reconcile,
)
from stride.podwatcher.usecases.common import (
    SIMULATED,
    now_utc,
    retiring_or_new,
)
from stride.podwatcher.usecases.ends import PodEnds
from stride.vocabulary import Role

log = structlog.get_logger(__name__)


class Applying(PodEnds):
    """Passes of the reconcile loop: a job's pods made to match its newest plan."""

    async def reconcile_loop(self, stop: asyncio.Event, workers: int = 4) -> None:
        """Run passes for queued jobs until ``stop`` (see :mod:`stride.podwatcher.usecases`)."""

        async def worker() -> None:
            while True:
                job_id = await self.queue.get()
                try:
                    await self.apply(job_id)
                    self.queue.forget(job_id)
                except Exception as error:
                    delay = self.queue.retry(job_id)
                    log.warning(
                        "reconcile pass failed; queued again",
                        job_id=job_id,
                        error=f"{type(error).__name__}: {error}"[:500],
                        retry_in=round(delay, 3),
                        failures=self.queue.failures(job_id),
                    )
                finally:
                    self.queue.done(job_id)

        tasks = [asyncio.create_task(worker(), name=f"reconcile-{n}") for n in range(workers)]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.queue.close()

    async def apply(self, job_id: str) -> None:
        """One pass: make the job's pods match its newest plan (the reconcile loop of
        :mod:`stride.podwatcher.usecases`)."""
        async with self._locks[job_id]:
            await self._apply(job_id)

    async def _apply(self, job_id: str) -> None:
        async with self.database.sessions() as session:
            job = await repository.get_job(session, job_id)
            running = job is not None and job.state == "RUNNING"
            stored = await repository.newest_plan(session, job_id) if running else None
            if job is None or stored is None or not running:
                self._waiting_for_room.discard(job_id)
                return
            simulated = job.spec.simulated
            if not simulated:
                rows = await repository.job_pods(session, job_id)
                others = [
                    p for p in await repository.live_pods(session) if p.record.job_id != job_id
                ]
        if simulated:
            # `stride loadgen` plays this job's agents: its plans are the services' to make
            # and measure, and no pod is started for them.
            if stored.state is not PlanState.APPLIED:
                await self._set_plan_state(
                    job_id, stored.plan.version, PlanState.APPLIED, SIMULATED
                )
            return
        plan = plan_from_proto(stored.plan)
        if not any(resources.count for resources in plan.roles):
            await self._suspend(job, stored, rows)
            return
        now = now_utc()
        waiting = {
            row.record.name for row in rows if self._waits_for_oom_plan(row, plan.version, now)
        }
        try:
            recon = reconcile(
                plan,
                [row.record for row in rows],
                self.backend.nodes(),
                [row.record for row in others],
            )
        except Unplaceable as error:
            try:
                reconcile(plan, [row.record for row in rows], self.backend.nodes())
            except Unplaceable:
                log.warning(
                    "plan cannot be placed", job_id=job_id, version=plan.version, why=str(error)
                )
                await self._set_plan_state(job_id, plan.version, PlanState.FAILED, str(error))
                return
            # It fits the nodes, just not beside what other jobs hold now: wait for room.
            log.info("plan waits for room", job_id=job_id, version=plan.version, why=str(error))
            self._waiting_for_room.add(job_id)
            await self._set_plan_state(
                job_id, plan.version, PlanState.RECORDED, f"waiting for room: {error}"
            )
            return
        self._waiting_for_room.discard(job_id)
        relaunch = tuple(want for want in recon.relaunch if want.name not in waiting)
        recon = replace(recon, relaunch=relaunch)
        if recon.empty:
            if (
                job.reconfigure_version == 0
                and stored.state is not PlanState.APPLIED
                and not waiting
            ):
                await self._set_plan_state(job_id, plan.version, PlanState.APPLIED, "")
            return
        log.info(
            "applying plan",
            job_id=job_id,
            version=plan.version,
            create=[w.name for w in recon.create],
            relaunch=[w.name for w in recon.relaunch],
            resize=[r.pod.name for r in recon.resize],
            migrate=[m.old.name for m in recon.migrate],
            delete=[p.name for p in recon.delete],
        )
        by_name = {row.record.name: row for row in rows}
        starts = await self._record_starts(job, plan.version, recon, by_name)
        running_chiefs = [
            row
            for row in rows
            if row.record.role is Role.CHIEF and row.record.phase is PodPhase.RUNNING
        ]
        handing_over = next((r for r in running_chiefs if r.retire_after is not None), None)
        chief = (
            # A chief move is under way: the old chief still runs the cluster and is the
            # one to command (the other running chief is its standby, which only RESUME
            # addresses). A second pass while the move waits must not command the standby.
            handing_over
            if job.reconfigure_version and handing_over is not None
            else next((r for r in running_chiefs if r.retire_after is None), None)
        )
        retiring = [*recon.delete, *(m.old for m in recon.migrate)]
        # A plan that only resizes pods in place moves nothing, but the chief is still told
        # (its cluster unchanged): its step windows must measure the new plan's version.
        reconfigure = chief is not None and (
            (recon.membership_changed and retiring_or_new(recon))
            or (bool(recon.resize) and not retiring_or_new(recon))
        )
        await self._mark_retiring(job_id, retiring, plan.version if reconfigure else None)
        problems: list[str] = []
        for start in starts:
            try:
                await self.backend.start(start)
            except Exception as error:  # the backend's words go into the plan's message
                log.exception("pod failed to start", pod=start.record.name)
                problems.append(f"{start.record.name}: {type(error).__name__}: {error}")
                await self._record_end(
                    PodEnded(start.record.name, job_id, "Error", None, f"failed to start: {error}")
                )
                continue
            await self._record_started(start)
        notes: list[str] = []
        restarted_chief = any(
            start.record.role is Role.CHIEF and not start.standby
            for start in starts
            if start.record.name in by_name  # a relaunch, not a new pod
        )
        if job.reconfigure_version and restarted_chief and job.reconfigure_version <= plan.version:
            # The chief died during a move and came back on the new cluster (its start
            # carries the newest plan's): nothing is left to move, the old pods can go.
            notes.append("the chief restarted on the new cluster")
            await self._finish_reconfigure(job, PlanState.APPLIED, notes[-1])
        for resize in recon.resize:
            problems.extend(
                await self._resize(
                    job, plan.version, resize.pod, resize.cpu, resize.memory_bytes, by_name
                )
            )
        if reconfigure and chief is not None:
            # DLRover-RM sec. 5.2: the new pods first, and the pause only once they can
            # serve, so the chief does not wait for their start-up while paused. Recorded
            # now, so a newer plan or a restart sees the change pending.
            now = now_utc()
            async with self.database.transaction() as session:
                await repository.set_reconfigure(session, job_id, plan.version, now, now)
            self._spawn(
                job_id,
                self._reconfigure_when_ready(
                    job_id,
                    chief.record.name,
                    plan.version,
                    self._cluster_json(job_id, recon, starts, by_name),
                    starts,
                ),
            )
        else:
            await self._delete_all(pod.name for pod in retiring)
        state = (
            PlanState.FAILED
            if problems
            else PlanState.APPLYING
            if reconfigure
            else PlanState.APPLIED
        )
        await self._set_plan_state(job_id, plan.version, state, "; ".join(problems or notes))

    async def _suspend(self, job: StoredJob, stored: StoredPlan, rows: list[StoredPod]) -> None:
        """The newest plan runs no pod: checkpoint through the chief (PAUSE), then remove
        every pod (:mod:`stride.podwatcher.usecases`, 5)."""
        version, reason = stored.plan.version, stored.plan.reason
        live = [row for row in rows if row.record.live]
        if not live:
            if stored.state is not PlanState.APPLIED and not job.reconfigure_version:
                await self._set_plan_state(
                    job.job_id, version, PlanState.APPLIED, "suspended: no pod runs"
                )
            return
        if job.reconfigure_version == version:
            return  # already suspending: the chief's answer (or the timeout) ends it
        if stored.state is PlanState.APPLIED:
            # Suspended already (the chief's answer or the timeout ended it): its pods are
            # on their way out; the plan's state says how it went, and stays.
            await self._delete_all(row.record.name for row in live)
            return
        chief = next(
            (
                row
                for row in live
                if row.record.role is Role.CHIEF
                and row.record.phase is PodPhase.RUNNING
                and row.retire_after is None
            ),
            None,
        )
        await self._mark_retiring(job.job_id, [row.record for row in live], version)
        if chief is None:
            await self._delete_all(row.record.name for row in live)
            await self._set_plan_state(
                job.job_id,
                version,
                PlanState.APPLIED,
                "suspended without a checkpoint (no running chief to take one); it resumes "
                "from its newest periodic checkpoint",
            )
            log.warning("job suspended without a checkpoint", job_id=job.job_id)
            return
        now = now_utc()
        async with self.database.transaction() as session:
            await repository.set_reconfigure(session, job.job_id, version, now, now)
        command = control_pb2.ControlCommand(
            job_id=job.job_id,
            pod_name=chief.record.name,
            action=control_pb2.CONTROL_ACTION_PAUSE,
            plan_version=version,
            reason=f"plan v{version} suspends the job: {reason}"[:500],
            issued_at=timestamp(now),
        )
        await self.bus.publish(
            topics.CONTROL_COMMAND, job.job_id, command, f"{job.job_id}.pause.{version}"
        )
        await self._set_plan_state(
            job.job_id,
            version,
            PlanState.APPLYING,
            "suspending: the chief saves a checkpoint, then the pods are removed",
        )
        log.info("chief told to checkpoint before a suspension", job_id=job.job_id, version=version)

    def _waits_for_oom_plan(self, row: StoredPod, version: int, now: datetime) -> bool:
        """An OOM-killed pod waits a while for a plan newer than the one it ran under."""
        if row.record.phase is not PodPhase.FAILED or row.last_failure != "OOMKilled":
            return False
        if version > row.plan_version or row.failed_at is None:
            return False
        return now - row.failed_at < timedelta(seconds=self.timing.oom_replan_seconds)

    async def _record_starts(
        self,
        job: StoredJob,
        version: int,
        recon: Reconciliation,
        by_name: dict[str, StoredPod],
    ) -> list[PodStart]:
        """Write every pod to start as PENDING (ports chosen, kept on relaunch)."""
        wants = [*recon.create, *(m.replacement for m in recon.migrate)]
        rows: list[StoredPod] = []
        taken = {port for row in by_name.values() for port in (row.port, row.agent_port)}
        for want in wants:
            port, agent_port = self.ports(taken), self.ports(taken)
            rows.append(self._new_row(job.job_id, want, version, port, agent_port))
        for want in recon.relaunch:
            old = by_name[want.name]
            record = replace(
                old.record,
                cpu=want.cpu,
                memory_bytes=want.memory_bytes,
                node=want.node,
                phase=PodPhase.PENDING,
                restarts=old.record.restarts + 1,
            )
            rows.append(replace(old, record=record, plan_version=version))
        now = now_utc()
        async with self.database.transaction() as session:
            for row in rows:
                await repository.upsert_pod(session, row, now)
        known = {**by_name, **{row.record.name: row for row in rows}}
        cluster_json = self._cluster_json(job.job_id, recon, [], known)
        spec_json = json_format.MessageToJson(job.spec, indent=None)
        training_chiefs = {
            name
            for name, row in by_name.items()
            if row.record.role is Role.CHIEF and row.record.phase is PodPhase.RUNNING
        }
        return [
            PodStart(
                row.record,
                row.port,
                row.agent_port,
                version,
                spec_json,
                cluster_json,
                # A chief while another still trains (a migrated chief's new pod, or that
                # pod relaunched before the handover): it waits to take over.
                standby=row.record.role is Role.CHIEF and bool(training_chiefs - {row.record.name}),
            )
            for row in rows
        ]

    @staticmethod
    def _new_row(job_id: str, want: PodWant, version: int, port: int, agent_port: int) -> StoredPod:
        return StoredPod(
            record=PodRecord(
                name=want.name,
                job_id=job_id,
                role=want.role,
                index=want.index,
                generation=want.generation,
                cpu=want.cpu,
                memory_bytes=want.memory_bytes,
                node=want.node,
                phase=PodPhase.PENDING,
            ),
            port=port,
            agent_port=agent_port,
            plan_version=version,
        )

    def _cluster_json(
        self,
        job_id: str,
        recon: Reconciliation,
        starts: list[PodStart],
        by_name: dict[str, StoredPod],
    ) -> str:
        ports = {name: row.port for name, row in by_name.items()}
        ports.update({start.record.name: start.port for start in starts})
        address = self.backend.address
        cluster = {
            role.value: [
                address(name, job_id, ports[name])
                for name in recon.cluster.get(role, ())
                if name in ports
            ]
            for role in MEMBER_ROLES
        }
        return json.dumps(cluster, sort_keys=True)

    async def _mark_retiring(self, job_id: str, pods: list[PodRecord], version: int | None) -> None:
        if not pods or version is None:
            return
        async with self.database.transaction() as session:
            for pod in pods:
                row = await repository.get_pod(session, pod.name)
                if row is not None:
                    await repository.upsert_pod(
                        session, replace(row, retire_after=version), now_utc()
                    )

    async def _record_started(self, start: PodStart) -> None:
        record = replace(start.record, phase=PodPhase.RUNNING)
        async with self.database.transaction() as session:
            row = await repository.get_pod(session, record.name)
            if row is None:
                return
            await repository.upsert_pod(session, replace(row, record=record), now_utc())
            await self._event(
                session,
                topics.POD_STARTED,
                row,
                pod_pb2.POD_PHASE_RUNNING,
                "",
                None,
                "started",
                f"{row.record.restarts}",
            )
        log.info(
            "pod started",
            pod=record.name,
            node=record.node,
            cpu=record.cpu,
            memory_bytes=record.memory_bytes,
        )
