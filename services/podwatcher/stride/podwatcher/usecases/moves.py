"""Moving a job's TensorFlow cluster (DLRover-RM sec. 5.2): in-place resizes, the chief's
RECONFIGURE and RESUME, its acks, and the timeout that ends a move the chief never confirms."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import structlog

from stride.bus import topics
from stride.events.v1 import control_pb2
from stride.podwatcher.adapters.convert import (
    timestamp,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import (
    PodStart,
    ResizeRefused,
)
from stride.podwatcher.adapters.outbound.repository import StoredJob, StoredPod
from stride.podwatcher.domain.cluster import PlanState, PodPhase
from stride.podwatcher.domain.reconcile import (
    MEMBER_ROLES,
    PodRecord,
)
from stride.podwatcher.usecases.common import (
    _standby_chief,
    now_utc,
)
from stride.podwatcher.usecases.core import PodWatcherCore

log = structlog.get_logger(__name__)


class Moves(PodWatcherCore):
    """Resizes and moves of a job's TensorFlow cluster, and the chief's acks."""

    async def _resize(
        self,
        job: StoredJob,
        version: int,
        pod: PodRecord,
        cpu: float,
        memory_bytes: int,
        by_name: dict[str, StoredPod],
    ) -> list[str]:
        """Resize in place. Where the kernel refuses a memory change (it cannot reclaim
        enough below the new limit), the pod is restarted under its own name at the new
        size instead: a departure from DLRover-RM sec. 5.2's migration for this one case,
        because a replacement would need room the node may not have; the chief restores
        from the flash checkpoint as after any PS or worker restart."""
        try:
            await self.backend.resize(pod.name, cpu, memory_bytes)
        except ResizeRefused as error:
            log.warning(
                "in-place resize refused; restarting the pod at its new size",
                pod=pod.name,
                why=str(error),
            )
            row = by_name[pod.name]
            async with self.database.transaction() as session:
                await repository.upsert_pod(
                    session,
                    replace(
                        row,
                        record=replace(
                            pod, cpu=cpu, memory_bytes=memory_bytes, phase=PodPhase.FAILED
                        ),
                        plan_version=version,
                        last_failure="",
                        last_message=f"resize refused: {error}",
                    ),
                    now_utc(),
                )
            await self.backend.delete(pod.name)
            return []
        async with self.database.transaction() as session:
            current = await repository.get_pod(session, pod.name)
            if current is not None:
                row = current
                await repository.upsert_pod(
                    session,
                    replace(
                        row,
                        record=replace(row.record, cpu=cpu, memory_bytes=memory_bytes),
                        plan_version=version,
                    ),
                    now_utc(),
                )
        log.info("pod resized in place", pod=pod.name, cpu=cpu, memory_bytes=memory_bytes)
        return []

    async def _reconfigure_when_ready(
        self, job_id: str, chief: str, version: int, cluster_json: str, new: list[PodStart]
    ) -> None:
        """Send RECONFIGURE once the new pods' trainers accept connections (or after
        ``reconfigure_timeout_seconds / 2``: the chief then waits for them itself), unless a
        newer plan has come meanwhile (it sends its own)."""
        ready = await self.backend.wait_ready(new, self.timing.reconfigure_timeout_seconds / 2)
        if not ready:
            log.warning("new pods not serving yet; telling the chief anyway", job_id=job_id)
        async with self._locks[job_id]:
            async with self.database.sessions() as session:
                job = await repository.get_job(session, job_id)
            if job is None or job.state != "RUNNING" or job.reconfigure_version != version:
                return
            await self._reconfigure(job_id, chief, version, cluster_json)

    async def _reconfigure(self, job_id: str, chief: str, version: int, cluster_json: str) -> None:
        now = now_utc()
        async with self.database.transaction() as session:
            await repository.set_reconfigure(session, job_id, version, now, now)
        command = control_pb2.ControlCommand(
            job_id=job_id,
            pod_name=chief,
            action=control_pb2.CONTROL_ACTION_RECONFIGURE,
            plan_version=version,
            cluster_json=cluster_json,
            reason=f"plan v{version} changed the cluster",
            issued_at=timestamp(now),
        )
        await self.bus.publish(
            topics.CONTROL_COMMAND, job_id, command, f"{job_id}.reconfigure.{version}"
        )
        log.info(
            "chief told to move to a new cluster",
            job_id=job_id,
            version=version,
            cluster=cluster_json,
        )

    async def _resume(
        self,
        job_id: str,
        chief: StoredPod,
        version: int,
        cluster_json: str,
        paused_at: datetime,
        checkpoint_id: str,
    ) -> None:
        """Tell a standby chief to take over (DLRover-RM sec. 5.2: restore into the new
        pod, resume)."""
        command = control_pb2.ControlCommand(
            job_id=job_id,
            pod_name=chief.record.name,
            action=control_pb2.CONTROL_ACTION_RESUME,
            plan_version=version,
            cluster_json=cluster_json,
            reason=f"the chief of plan v{version} takes over",
            issued_at=timestamp(now_utc()),
            paused_at=timestamp(paused_at),
            checkpoint_id=checkpoint_id,
        )
        await self.bus.publish(
            topics.CONTROL_COMMAND, job_id, command, f"{job_id}.resume.{version}"
        )
        log.info(
            "standby chief told to take over",
            job_id=job_id,
            pod=chief.record.name,
            version=version,
            checkpoint=checkpoint_id or "newest",
        )

    def _live_cluster_json(self, rows: list[StoredPod]) -> str:
        """The cluster of the pods that stay: live, not retiring, in task order."""
        staying = [row for row in rows if row.record.live and row.retire_after is None]
        cluster = {
            role.value: [
                self.backend.address(row.record.name, row.record.job_id, row.port)
                for row in sorted(
                    (r for r in staying if r.record.role is role), key=lambda r: r.record.index
                )
            ]
            for role in MEMBER_ROLES
        }
        return json.dumps(cluster, sort_keys=True)

    async def acked(self, ack: control_pb2.ControlAck) -> None:
        """The chief answered a RECONFIGURE: remove the pods it no longer uses (and, when the
        chief itself moved, let its standby take over)."""
        if ack.action == control_pb2.CONTROL_ACTION_RESUME:
            log.info(
                "new chief took over",
                job_id=ack.job_id,
                pod=ack.pod_name,
                version=ack.plan_version,
                paused_seconds=round(ack.paused_seconds, 3),
            )
            return
        if ack.action not in (
            control_pb2.CONTROL_ACTION_RECONFIGURE,
            control_pb2.CONTROL_ACTION_PAUSE,
        ):
            return
        async with self._locks[ack.job_id]:
            async with self.database.sessions() as session:
                job = await repository.get_job(session, ack.job_id)
            if (
                job is None
                or job.reconfigure_version == 0
                or ack.plan_version < job.reconfigure_version
            ):
                return
            log.info(
                "chief confirmed the new cluster",
                job_id=ack.job_id,
                version=ack.plan_version,
                ok=ack.ok,
                paused_seconds=round(ack.paused_seconds, 3),
            )
            if ack.action == control_pb2.CONTROL_ACTION_PAUSE:
                # A suspension: the checkpoint is saved (or the chief says why not); the
                # pods go either way, and the job resumes from its newest checkpoint.
                message = (
                    f"suspended after checkpoint {ack.checkpoint_id or '(newest)'}"
                    if ack.ok
                    else f"suspended; the chief could not checkpoint: {ack.message}"
                )
                await self._finish_reconfigure(job, PlanState.APPLIED, message)
                return
            message = (
                "" if ack.ok else f"the chief could not move to the new cluster: {ack.message}"
            )
            paused_at = ack.acked_at.ToDatetime(tzinfo=UTC) - timedelta(
                seconds=max(ack.paused_seconds, 0.0)
            )
            await self._finish_reconfigure(
                job,
                PlanState.APPLIED if ack.ok else PlanState.FAILED,
                message,
                paused_at=paused_at if ack.HasField("acked_at") else None,
                checkpoint_id=ack.checkpoint_id,
            )

    async def _finish_reconfigure(
        self,
        job: StoredJob,
        state: PlanState,
        message: str,
        *,
        paused_at: datetime | None = None,
        checkpoint_id: str = "",
    ) -> None:
        """End the move to plan ``job.reconfigure_version``: a standby chief takes over (from
        ``checkpoint_id``, else the newest), then the pods the move retired are removed."""
        async with self.database.transaction() as session:
            rows = await repository.job_pods(session, job.job_id)
            await repository.set_reconfigure(session, job.job_id, 0, None, now_utc())
        standby = _standby_chief(rows, job.reconfigure_version)
        if standby is not None:
            await self._resume(
                job.job_id,
                standby,
                job.reconfigure_version,
                self._live_cluster_json(rows),
                paused_at or now_utc(),
                checkpoint_id,
            )
        await self._delete_all(
            row.record.name
            for row in rows
            if row.retire_after is not None
            and row.retire_after <= job.reconfigure_version
            and row.record.live
        )
        await self._set_plan_state(job.job_id, job.reconfigure_version, state, message)

    async def check_reconfigures(self) -> None:
        """Give up waiting for a chief that does not confirm its new cluster in time."""
        async with self.database.sessions() as session:
            pending = await repository.pending_reconfigures(session)
        limit = timedelta(seconds=self.timing.reconfigure_timeout_seconds)
        for job in pending:
            if job.reconfigure_since is not None and now_utc() - job.reconfigure_since > limit:
                async with self._locks[job.job_id]:
                    async with self.database.sessions() as session:
                        newest = await repository.newest_plan(session, job.job_id)
                    if newest is not None and not any(role.count for role in newest.plan.roles):
                        log.warning("the chief did not checkpoint in time", job_id=job.job_id)
                        await self._finish_reconfigure(
                            job,
                            PlanState.APPLIED,
                            f"suspended without the chief's checkpoint (no answer within "
                            f"{self.timing.reconfigure_timeout_seconds:g} s); it resumes from "
                            "its newest periodic checkpoint",
                        )
                        continue
                    log.warning(
                        "the chief did not confirm its new cluster in time", job_id=job.job_id
                    )
                    await self._finish_reconfigure(
                        job,
                        PlanState.FAILED,
                        f"the chief did not confirm the cluster of plan "
                        f"v{job.reconfigure_version} within "
                        f"{self.timing.reconfigure_timeout_seconds:g} s; its old pods were removed",
                    )
