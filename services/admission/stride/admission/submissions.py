"""Admission's use cases: submit, decide, cancel and finish jobs.

Each step commits its state change and its events (through the outbox) in one transaction,
so a job is never stored without its ``submitted`` event or decided without its decision
event. A crash between storing and deciding leaves the job SUBMITTED, and
:meth:`Submissions.decide_pending` finishes it on the next start.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import structlog

from stride.admission.adapters import repository
from stride.admission.adapters.convert import decision_to_proto, spec_from_proto, timestamp
from stride.admission.adapters.repository import StoredJob
from stride.admission.domain.jobs import validate
from stride.admission.domain.policy import AdmissionPolicy, Outcome
from stride.bus import subjects
from stride.bus.client import message_headers
from stride.db.engine import Database
from stride.db.outbox import Outbox
from stride.events.v1 import job_pb2
from stride.runtime.errors import InvalidArgument, NotFound

log = structlog.get_logger(__name__)

_STATE_BY_OUTCOME = {
    Outcome.ADMITTED: "ADMITTED",
    Outcome.REJECTED: "REJECTED",
    Outcome.QUEUED: "QUEUED",
}
_STATE_BY_JOB_OUTCOME = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: "SUCCEEDED",
    job_pb2.JOB_OUTCOME_FAILED: "FAILED",
    job_pb2.JOB_OUTCOME_CANCELLED: "CANCELLED",
}


def new_job_id() -> str:
    """A short, subject-safe, pod-name-safe job id."""
    return f"job-{uuid.uuid4().hex[:12]}"


class Submissions:
    """Submits, decides and ends jobs against the database, outbox and policy."""

    def __init__(self, database: Database, outbox: Outbox, policy: AdmissionPolicy) -> None:
        self.database = database
        self.outbox = outbox
        self.policy = policy

    async def submit(self, spec: job_pb2.JobSpec, request_id: str) -> StoredJob:
        """Validate, store and decide a job. Invalid specs raise before anything is written."""
        now = datetime.now(UTC)
        validate(spec_from_proto(spec), now)
        if len(request_id) > 200:
            raise InvalidArgument("request_id", "must be at most 200 characters")
        async with self.database.transaction() as session:
            if request_id:
                existing = await repository.job_by_request_id(session, request_id)
                if existing is not None:
                    log.info("duplicate submission", job_id=existing, request_id=request_id)
                    return await self.get(existing)
            job_id = new_job_id()
            await repository.insert_job(session, job_id, request_id or None, spec, now)
            event = job_pb2.JobSubmitted(job_id=job_id, spec=spec, submitted_at=timestamp(now))
            await self.outbox.add(
                session,
                subjects.job_submitted(job_id),
                event.SerializeToString(),
                f"{job_id}.submitted",
                message_headers(event),
            )
        self.outbox.notify()
        log.info("job submitted", job_id=job_id, user=spec.user, name=spec.name)
        await self.decide(job_id)
        return await self.get(job_id)

    async def decide(self, job_id: str) -> None:
        """Run the admission policy on a SUBMITTED job and publish its decision."""
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            job = await repository.get_job(session, job_id, for_update=True)
            if job is None or job.state != "SUBMITTED":
                return
            decision = self.policy.decide(spec_from_proto(job.spec), now)
            message = decision_to_proto(job_id, decision, job.spec, now)
            await repository.record_decision(
                session, message, _STATE_BY_OUTCOME[decision.outcome], now
            )
            await self.outbox.add(
                session,
                subjects.job_decision(decision.outcome.value, job_id),
                message.SerializeToString(),
                f"{job_id}.decision.1",
                message_headers(message),
            )
        self.outbox.notify()
        log.info(
            "job decided", job_id=job_id, outcome=decision.outcome.value, policy=decision.policy
        )

    async def decide_pending(self) -> int:
        """Decide every job a crash left undecided; returns how many."""
        async with self.database.sessions() as session:
            pending = await repository.undecided_job_ids(session)
        for job_id in pending:
            await self.decide(job_id)
        if pending:
            log.info("decided jobs left pending", count=len(pending))
        return len(pending)

    async def get(self, job_id: str) -> StoredJob:
        """One job, or NotFound."""
        if not job_id:
            raise InvalidArgument("job_id", "is required")
        async with self.database.sessions() as session:
            job = await repository.get_job(session, job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    async def list(self, user: str, page_size: int) -> list[StoredJob]:
        """Jobs newest first."""
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument("page_size", f"must be between 0 and 1000, got {page_size}")
        async with self.database.sessions() as session:
            return await repository.list_jobs(session, user or None, page_size or 100)

    async def cancel(self, job_id: str) -> StoredJob:
        """Cancel a job (no-op if it already ended) and publish that it finished."""
        now = datetime.now(UTC)
        await self.get(job_id)
        async with self.database.transaction() as session:
            job = await repository.get_job(session, job_id, for_update=True)
            if job is None or job.state in repository.TERMINAL_STATES:
                return await self.get(job_id)
            await repository.set_state(session, job_id, "CANCELLED", now)
            event = job_pb2.JobFinished(
                job_id=job_id,
                outcome=job_pb2.JOB_OUTCOME_CANCELLED,
                message="cancelled by user",
                finished_at=timestamp(now),
            )
            await self.outbox.add(
                session,
                subjects.job_finished(job_id),
                event.SerializeToString(),
                f"{job_id}.finished",
                message_headers(event),
            )
        self.outbox.notify()
        log.info("job cancelled", job_id=job_id)
        return await self.get(job_id)

    async def finished(self, event: job_pb2.JobFinished) -> None:
        """Record that a job ended (from the bus); idempotent, and a terminal state sticks."""
        if not event.job_id:
            raise InvalidArgument("job_id", "is required")
        state = _STATE_BY_JOB_OUTCOME.get(event.outcome)
        if state is None:
            raise InvalidArgument("outcome", f"unknown job outcome {event.outcome}")
        async with self.database.transaction() as session:
            job = await repository.get_job(session, event.job_id, for_update=True)
            if job is None or job.state in repository.TERMINAL_STATES:
                return
            await repository.set_state(session, event.job_id, state, datetime.now(UTC))
