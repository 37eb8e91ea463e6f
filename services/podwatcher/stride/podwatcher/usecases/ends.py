"""How pods end: recorded and published with their reason, relaunched within the budget,
an OOM-killed pod waiting for a bigger plan, and the job ended when it succeeds, fails or
is cancelled."""

from __future__ import annotations

from dataclasses import replace

import structlog

from stride.bus import topics
from stride.db.engine import Session
from stride.events.v1 import job_pb2, pod_pb2
from stride.podwatcher.adapters.convert import (
    timestamp,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import (
    PodEnded,
)
from stride.podwatcher.adapters.outbound.repository import StoredJob
from stride.podwatcher.domain.cluster import PlanState, PodPhase
from stride.podwatcher.usecases.common import (
    FAILURE_REASONS,
    JOB_STATES,
    now_utc,
)
from stride.podwatcher.usecases.moves import Moves
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role

log = structlog.get_logger(__name__)


class PodEnds(Moves):
    """Records pods' ends and acts on them: relaunch, wait for a bigger plan, end the job."""

    async def pod_ended(self, ended: PodEnded) -> None:
        """Record how a pod ended and act on it (see :mod:`stride.podwatcher.usecases`)."""
        async with self._locks[ended.job_id]:
            follow_up = await self._record_end(ended)
        await self.backend.acknowledge(ended.name)
        self._usage.pop(ended.name, None)
        for waiting in sorted(self._waiting_for_room - {ended.job_id}):
            self.queue.add(waiting)
        if follow_up == "end-move":
            async with self._locks[ended.job_id]:
                async with self.database.sessions() as session:
                    job = await repository.get_job(session, ended.job_id)
                if job is not None and job.reconfigure_version:
                    await self._finish_reconfigure(
                        job,
                        PlanState.APPLIED,
                        "the old chief ended before it handed over; the new chief restored "
                        "the newest checkpoint",
                    )
        elif follow_up == "apply":
            self.queue.add(ended.job_id)
        elif follow_up == "oom-wait":
            self._apply_later(ended.job_id, self.timing.oom_replan_seconds + 0.5)

    async def _record_end(self, ended: PodEnded) -> str:
        now = now_utc()
        async with self.database.transaction() as session:
            row = await repository.get_pod(session, ended.name)
            job = await repository.get_job(session, ended.job_id, for_update=True)
            if (
                row is None
                or job is None
                or row.record.phase in (PodPhase.DELETED, PodPhase.SUCCEEDED)
            ):
                return ""
            if row.record.phase is PodPhase.FAILED and ended.reason == "Deleted":
                return ""  # a failed pod restarted at a new size: its end is already recorded
            pod = row.record
            # A pod the plan dropped or replaced was going anyway: however it ended, it is gone.
            # A chief that ends before it handed over to its standby ends the move too: the
            # standby takes over from the newest checkpoint.
            moving_chief = (
                pod.role is Role.CHIEF
                and row.retire_after is not None
                and row.retire_after == job.reconfigure_version
            )
            if ended.reason == "Deleted" or row.retire_after is not None:
                await repository.upsert_pod(
                    session, replace(row, record=replace(pod, phase=PodPhase.DELETED)), now
                )
                await self._event(
                    session,
                    topics.POD_DELETED,
                    row,
                    pod_pb2.POD_PHASE_DELETED,
                    ended.message,
                    ended.exit_code,
                    "deleted",
                    "",
                )
                log.info("pod deleted", pod=pod.name)
                return "end-move" if moving_chief else ""
            if ended.reason == "Succeeded" and pod.role is Role.CHIEF:
                await repository.upsert_pod(
                    session, replace(row, record=replace(pod, phase=PodPhase.SUCCEEDED)), now
                )
                await self._event(
                    session,
                    topics.POD_SUCCEEDED,
                    row,
                    pod_pb2.POD_PHASE_SUCCEEDED,
                    "",
                    0,
                    "succeeded",
                    "",
                )
                if job.state == "RUNNING":
                    await self._end_job(
                        session,
                        job,
                        job_pb2.JOB_OUTCOME_SUCCEEDED,
                        "every shard of the last epoch is done",
                    )
                log.info("job succeeded", job_id=job.job_id)
                return "cleanup"
            reason = ended.reason if ended.reason in FAILURE_REASONS else "Error"
            message = (
                ended.message
                if ended.reason != "Succeeded"
                else "exited with code 0 before the job ended"
            )
            failed = replace(
                row,
                record=replace(pod, phase=PodPhase.FAILED),
                last_failure=reason,
                last_message=message,
                failed_at=now,
            )
            await repository.upsert_pod(session, failed, now)
            await self._event(
                session,
                topics.POD_FAILED,
                row,
                pod_pb2.POD_PHASE_FAILED,
                message,
                ended.exit_code,
                "failed",
                f"{pod.restarts}",
                FAILURE_REASONS[reason],
            )
            log.warning(
                "pod failed",
                pod=pod.name,
                reason=reason,
                message=message[:300],
                restarts=pod.restarts,
            )
            if job.state != "RUNNING":
                return ""
            if pod.restarts >= self.timing.relaunch_budget:
                why = (
                    f"pod {pod.name} failed {pod.restarts + 1} times (relaunch budget "
                    f"{self.timing.relaunch_budget}); last: {reason}: {message}"
                )
                await self._end_job(session, job, job_pb2.JOB_OUTCOME_FAILED, why)
                return "cleanup"
        if reason == "OOMKilled":
            return "oom-wait"
        return "apply"

    async def _end_job(
        self, session: Session, job: StoredJob, outcome: job_pb2.JobOutcome.ValueType, message: str
    ) -> None:
        now = now_utc()
        await repository.set_job_state(session, job.job_id, JOB_STATES[outcome], message, now)
        event = job_pb2.JobFinished(
            job_id=job.job_id, outcome=outcome, message=message[:4000], finished_at=timestamp(now)
        )
        await self.outbox.add_event(
            session, topics.JOB_FINISHED.outgoing(job.job_id, event, f"{job.job_id}.finished")
        )
        self._after_commit_cleanup(job.job_id)

    def _after_commit_cleanup(self, job_id: str) -> None:
        self.outbox.notify()
        self._spawn(job_id, self._remove_pods(job_id))

    async def _remove_pods(self, job_id: str) -> None:
        async with self._locks[job_id], self.database.sessions() as session:
            rows = await repository.job_pods(session, job_id)
        await self._delete_all(
            row.record.name
            for row in rows
            if row.record.phase in (PodPhase.PENDING, PodPhase.RUNNING)
        )
        for row in rows:
            if row.record.phase is PodPhase.FAILED:
                async with self.database.transaction() as session:
                    await repository.upsert_pod(
                        session,
                        replace(row, record=replace(row.record, phase=PodPhase.DELETED)),
                        now_utc(),
                    )

    async def job_finished(self, event: job_pb2.JobFinished) -> None:
        """A job ended elsewhere (cancelled): remove its pods; its checkpoints stay."""
        state = JOB_STATES.get(event.outcome)
        if state is None:
            raise InvalidArgument("outcome", f"unknown job outcome {event.outcome}")
        async with self._locks[event.job_id], self.database.transaction() as session:
            job = await repository.get_job(session, event.job_id, for_update=True)
            if job is None or job.state != "RUNNING":
                return
            await repository.set_job_state(session, event.job_id, state, event.message, now_utc())
        log.info("job ended; removing its pods", job_id=event.job_id, state=state)
        await self._remove_pods(event.job_id)
