"""The optimizer's use cases: act on job lifecycle facts, and answer for plans and events.

Every fact is applied by the job's administrator (pure, in ``domain``) and its step is
committed in ONE transaction: the administrator's state, the optimization events, the plan
versions, and the plans' bus messages in the outbox. The plan messages carry deterministic
ids (``<job_id>.plan.<version>``), so whatever a crash interrupts, a restart ends with each
plan version exactly once in the database and once on the stream:

- crash before the commit: nothing was written and the fact is redelivered;
- crash after the commit, before the ack: the redelivered fact finds the administrator and
  changes nothing; the relay publishes what the outbox holds;
- crash after a publish, before its outbox row is removed: the relay publishes again and
  JetStream drops the duplicate id.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypeVar

import structlog

from stride.bus import topics
from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.decisions import DecisionFailed, DecisionPort
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.optimizer.adapters.convert import event_to_proto, features_from_spec, plan_to_proto
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.domain.administrator import (
    JobStage,
    Step,
    check_job_id,
    on_admitted,
    on_finished,
)
from stride.policy.cold_start import COLD_START, ColdStartRequest
from stride.policy.registry import AlgorithmSpec
from stride.runtime.errors import InvalidArgument, NotFound, Unavailable

log = structlog.get_logger(__name__)

RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT")


class Planning:
    """Applies lifecycle facts to administrators and reads plans back."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        adjust: DecisionPort,
        max_pod_cpu: float | None = None,
    ) -> None:
        self.database = database
        self.outbox = outbox
        self.adjust = adjust
        """Where plans are decided (in-process or by the executor pool, as configured)."""
        self.max_pod_cpu = max_pod_cpu

    async def admitted(self, decision: job_pb2.AdmissionDecision) -> None:
        """A job was admitted: create its administrator and publish plan 1. Idempotent."""
        job_id = check_job_id(decision.job_id)
        if decision.outcome != job_pb2.ADMISSION_OUTCOME_ADMITTED:
            raise InvalidArgument(
                "outcome", f"{job_pb2.AdmissionOutcome.Name(decision.outcome)} is not ADMITTED"
            )
        if not decision.HasField("spec"):
            raise InvalidArgument("spec", "is required (the plan is made from it)")
        # Computed before the transaction: bad input fails here, with nothing written.
        features = features_from_spec(decision.spec)
        async with self.database.sessions() as session:
            known = await repository.get_administrator(session, job_id)
        if known is not None:
            log.info("admission already applied; ignored", job_id=job_id, stage=known.stage.value)
            return
        # Decided before the transaction: the executor pool may take a while, and no row
        # lock is held meanwhile. A redelivery racing this one is settled below.
        cold_start = await self._decide(
            COLD_START, ColdStartRequest(features, self.max_pod_cpu), job_id
        )
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            existing = await repository.get_administrator(session, job_id, for_update=True)
            step = on_admitted(existing, job_id, cold_start.plan, now)
            if not step.changed:
                log.info(
                    "admission already applied; ignored",
                    job_id=job_id,
                    stage=existing.stage.value if existing else None,
                )
                return
            await self._store(session, step, decision.spec.SerializeToString(), now)
        self.outbox.notify()
        log.info("job administrator created", job_id=job_id, plans=[p.version for p in step.plans])

    async def _decide(
        self, algorithm: AlgorithmSpec[RequestT, ReplyT], request: RequestT, job_id: str
    ) -> ReplyT:
        """Ask the adjust port; a decision that cannot be made now is Unavailable (the bus
        redelivers the fact later), one that never can is an InvalidArgument."""
        try:
            return await self.adjust.decide(algorithm, request, job_id)
        except DecisionFailed as error:
            if error.retryable:
                raise Unavailable(str(error)) from None
            raise InvalidArgument(algorithm.name, str(error)) from None

    async def finished(self, event: job_pb2.JobFinished) -> None:
        """A job ended: its administrator moves to FINISHED. Idempotent."""
        job_id = check_job_id(event.job_id)
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            existing = await repository.get_administrator(session, job_id, for_update=True)
            step = on_finished(existing, job_id)
            if not step.changed:
                return
            await self._store(session, step, None, now)
        log.info("job administrator finished", job_id=job_id, known_before=existing is not None)

    async def _store(self, session: Session, step: Step, spec: bytes | None, now: datetime) -> None:
        """Write one step: administrator, events, plans and the plans' outbox messages."""
        assert step.after is not None, "a step that stores always has an administrator"
        if step.before is None:
            await repository.insert_administrator(session, step.after, spec, now)
        else:
            await repository.update_administrator(session, step.after, now)
        for event in step.events:
            await repository.insert_event(session, event_to_proto(event))
        for versioned in step.plans:
            message = plan_to_proto(versioned)
            await repository.insert_plan(session, message)
            await self.outbox.add_event(
                session, topics.PLAN.outgoing(versioned.job_id, message, versioned.message_id)
            )

    async def newest_plan(self, job_id: str) -> tuple[plan_pb2.ResourcePlan, JobStage]:
        """The job's newest plan and its stage; NotFound if the job or its plan is unknown."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            administrator = await repository.get_administrator(session, job_id)
            if administrator is None:
                raise NotFound(f"job {job_id!r} not found")
            plan = await repository.newest_plan(session, job_id)
        if plan is None:
            raise NotFound(f"job {job_id!r} has no plan ({administrator.stage.value})")
        return plan, administrator.stage

    async def plans(self, job_id: str) -> list[plan_pb2.ResourcePlan]:
        """Every plan version of the job, oldest first; NotFound if the job is unknown."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            if await repository.get_administrator(session, job_id) is None:
                raise NotFound(f"job {job_id!r} not found")
            return await repository.list_plans(session, job_id)

    async def events(self, job_id: str) -> list[optimization_pb2.OptimizationEvent]:
        """The job's optimization events, oldest first; NotFound if the job is unknown."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            if await repository.get_administrator(session, job_id) is None:
                raise NotFound(f"job {job_id!r} not found")
            return await repository.list_events(session, job_id)
