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

from stride.admission.adapters.convert import decision_to_proto, spec_from_proto, timestamp
from stride.admission.adapters.outbound import repository
from stride.admission.adapters.outbound.repository import StoredJob
from stride.admission.domain.jobs import check_request_id, validate
from stride.admission.domain.policy import Outcome, decision_from_admit_all
from stride.bus import topics
from stride.db.engine import ConflictingWrite, Database
from stride.db.outbox import Outbox
from stride.decisions import DecisionFailed, DecisionPort
from stride.events.v1 import job_pb2
from stride.policy.admit_all import ADMIT_ALL, AdmitAllRequest
from stride.runtime.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable

__all__ = ["StoredJob", "Submissions", "new_job_id"]

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


def _same_job(stored: job_pb2.JobSpec, submitted: job_pb2.JobSpec) -> bool:
    """Whether a resubmission asks for the stored job. The deadline is left out: a retried
    ``stride submit`` of a spec with a relative deadline (``+6h``) resolves it anew each
    time, and the CLI's request id is derived from the deadline as written."""
    left, right = job_pb2.JobSpec(), job_pb2.JobSpec()
    left.CopyFrom(stored)
    right.CopyFrom(submitted)
    left.ClearField("deadline")
    right.ClearField("deadline")
    return left.SerializeToString(deterministic=True) == right.SerializeToString(deterministic=True)


class Submissions:
    """Submits, decides and ends jobs against the database, outbox and policy."""

    def __init__(self, database: Database, outbox: Outbox, admit: DecisionPort) -> None:
        self.database = database
        self.outbox = outbox
        self.admit = admit
        """Where admission decisions are made (in-process or by the executor pool)."""

    async def submit(self, spec: job_pb2.JobSpec, request_id: str) -> StoredJob:
        """Validate, store and decide a job. Invalid specs raise before anything is written."""
        check_request_id(request_id)
        view = spec_from_proto(spec)
        validate(view, None)
        # A retry is answered before the clock-based rules, so a retried submission whose
        # absolute deadline has just passed still gets its job back.
        if request_id:
            earlier = await self._earlier_submission(request_id, spec)
            if earlier is not None:
                return earlier
        now = datetime.now(UTC)
        validate(view, now)
        try:
            job_id = await self._store(spec, request_id, now)
        except ConflictingWrite:
            # A concurrent submission with the same request id stored first.
            earlier = await self._earlier_submission(request_id, spec) if request_id else None
            if earlier is None:
                raise
            return earlier
        self.outbox.notify()
        log.info("job submitted", job_id=job_id, user=spec.user, name=spec.name)
        await self.decide(job_id)
        return await self.get(job_id)

    async def _earlier_submission(self, request_id: str, spec: job_pb2.JobSpec) -> StoredJob | None:
        """The job an earlier submission with ``request_id`` created, if any. The same key
        with another spec is a client bug: reusing it would silently drop the new spec."""
        async with self.database.sessions() as session:
            existing = await repository.job_by_request_id(session, request_id)
        if existing is None:
            return None
        job = await self.get(existing)
        if not _same_job(job.spec, spec):
            raise AlreadyExists(
                f"request_id {request_id[:60]!r} was used for job {existing} with another spec; "
                "use a new request id (or none) to submit a different job"
            )
        log.info("duplicate submission", job_id=existing, request_id=request_id)
        return job

    async def _store(self, spec: job_pb2.JobSpec, request_id: str, now: datetime) -> str:
        """Store a new job and its ``submitted`` event in one transaction; its id."""
        async with self.database.transaction() as session:
            job_id = new_job_id()
            await repository.insert_job(session, job_id, request_id or None, spec, now)
            event = job_pb2.JobSubmitted(job_id=job_id, spec=spec, submitted_at=timestamp(now))
            await self.outbox.add_event(
                session, topics.JOB_SUBMITTED.outgoing(job_id, event, f"{job_id}.submitted")
            )
        return job_id

    async def decide(self, job_id: str) -> None:
        """Run the admission policy on a SUBMITTED job and publish its decision."""
        async with self.database.sessions() as session:
            pending = await repository.get_job(session, job_id)
        if pending is None or pending.state != "SUBMITTED":
            return
        # Decided outside the transaction: the admit port may ask the executor pool, and no
        # row lock is held meanwhile. The state is checked again before the decision is kept.
        request = AdmitAllRequest(
            job_name=pending.spec.name, has_deadline=pending.spec.HasField("deadline")
        )
        try:
            reply = await self.admit.decide(ADMIT_ALL, request, job_id)
        except DecisionFailed as error:
            raise Unavailable(f"admission could not decide {job_id}: {error}") from None
        decision = decision_from_admit_all(reply, ADMIT_ALL.qualified_name)
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            job = await repository.get_job(session, job_id, for_update=True)
            if job is None or job.state != "SUBMITTED":
                return
            message = decision_to_proto(job_id, decision, job.spec, now)
            await repository.record_decision(
                session, message, _STATE_BY_OUTCOME[decision.outcome], now
            )
            await self.outbox.add_event(
                session,
                topics.DECISION_TOPICS[decision.outcome.value].outgoing(
                    job_id, message, f"{job_id}.decision.1"
                ),
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
            await self.outbox.add_event(
                session, topics.JOB_FINISHED.outgoing(job_id, event, f"{job_id}.finished")
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
