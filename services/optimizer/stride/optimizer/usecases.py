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

from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

import structlog

from stride.bus import topics
from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.decisions import DecisionFailed, DecisionPort
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2, pod_pb2
from stride.optimizer.adapters.convert import (
    event_to_proto,
    features_from_spec,
    plan_from_proto,
    plan_to_proto,
)
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.domain.administrator import (
    JobStage,
    StageError,
    Step,
    check_job_id,
    on_admitted,
    on_finished,
    on_manual_scale,
    on_pod_failure,
)
from stride.policy import dlrover
from stride.policy.cold_start import COLD_START, ColdStartRequest
from stride.policy.plans import Plan, Role
from stride.policy.registry import AlgorithmSpec
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from stride.vocabulary import check_pod_count

log = structlog.get_logger(__name__)

DLROVER_ADJUST = next(spec for spec in dlrover.ALGORITHMS if spec.name == dlrover.ADJUST_NAME)
"""DLRover's stage step, whose first rules are the OOM rules Stride's simulator applies too:
a worker OOM doubles the workers' memory, a PS OOM doubles the PS count (sec. 4.2)."""
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

    async def scale(self, job_id: str, workers: int, ps: int, reason: str) -> plan_pb2.ResourcePlan:
        """An operator's manual plan: the newest plan with these counts, as the next
        version, recorded as an override (DLRover's ScalePlan)."""
        check_job_id(job_id)
        check_pod_count(workers, "workers", raise_as=InvalidArgument)
        if workers < 1:
            raise InvalidArgument("workers", f"must be at least 1, got {workers}")
        check_pod_count(ps, "ps", raise_as=InvalidArgument)
        if len(reason) > 500:
            raise InvalidArgument("reason", f"must be at most 500 characters, got {len(reason)}")
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            administrator = await repository.get_administrator(session, job_id, for_update=True)
            if administrator is None:
                raise NotFound(f"job {job_id!r} not found")
            newest = await repository.newest_plan(session, job_id)
            if newest is None:
                raise FailedPrecondition(f"job {job_id!r} has no plan to scale yet")
            plan = _with_counts(plan_from_proto(newest), workers, ps, reason)
            try:
                step = on_manual_scale(
                    administrator,
                    job_id,
                    plan,
                    str(administrator.plan_version + 1),
                    f"manual scale by operator to {workers} workers"
                    + (f" and {ps} PS" if ps else "")
                    + (f": {reason}" if reason else ""),
                    now,
                )
            except StageError as error:
                raise FailedPrecondition(str(error)) from None
            await self._store(session, step, None, now)
        self.outbox.notify()
        log.info("manual scale published", job_id=job_id, version=step.plans[0].version)
        return plan_to_proto(step.plans[0])

    async def pod_failed(self, event: pod_pb2.PodEvent, event_id: str) -> None:
        """An OOM-killed pod gets the policy's OOM rule as the next plan, once per failure.

        Other failures change no plan: the podwatcher relaunches the pod as it was.
        """
        job_id = check_job_id(event.job_id)
        if event.reason != pod_pb2.POD_FAILURE_REASON_OOM_KILLED:
            log.info("pod failure noted; no new plan", job_id=job_id, pod=event.pod_name)
            return
        async with self.database.sessions() as session:
            administrator = await repository.get_administrator(session, job_id)
            newest = await repository.newest_plan(session, job_id)
            seen = await repository.has_event(session, event_id)
        if administrator is None or newest is None:
            raise InvalidArgument("job_id", f"no job {job_id!r} with a plan is known here")
        if seen or administrator.stage is JobStage.FINISHED:
            return
        role = _ROLE_BY_EVENT.get(event.role)
        current = plan_from_proto(newest)
        if role is None or current.role(Role.PS) is None or current.role(Role.WORKER) is None:
            log.warning("OOM of a pod the OOM rule does not cover", pod=event.pod_name)
            return
        request = _oom_request(current, role, event.index)
        reply = await self._decide(DLROVER_ADJUST, request, job_id)
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            existing = await repository.get_administrator(session, job_id, for_update=True)
            if await repository.has_event(session, event_id):
                return
            step = on_pod_failure(
                existing,
                job_id,
                reply.plan,
                event_id,
                f"{event.pod_name} was OOM-killed: {reply.plan.reason if reply.plan else ''}",
                now,
            )
            if not step.changed:
                return
            await self._store(session, step, None, now)
        self.outbox.notify()
        log.info("OOM relaunch plan published", job_id=job_id, pod=event.pod_name)


_ROLE_BY_EVENT = {plan_pb2.ROLE_WORKER: Role.WORKER, plan_pb2.ROLE_PS: Role.PS}


def _oom_request(plan: Plan, role: Role, index: int) -> dlrover.AdjustRequest:
    """DLRover's step request for an OOM kill of pod ``index`` of ``role``."""
    observations = {}
    for each in (Role.WORKER, Role.PS):
        resources = plan.role(each)
        count = 0 if resources is None else resources.count
        observations[each] = tuple(
            dlrover.PodObservation(i, 0.0, 0, oom_killed=(each is role and i == index))
            for i in range(count)
        )
    return dlrover.AdjustRequest(
        dlrover.Stage.SAMPLE, plan, observations[Role.WORKER], observations[Role.PS]
    )


def _with_counts(plan: Plan, workers: int, ps: int, reason: str) -> Plan:
    roles = []
    for resources in plan.roles:
        count = resources.count
        if resources.role is Role.WORKER:
            count = workers
        elif resources.role is Role.PS and ps:
            count = ps
        overrides = tuple(o for o in resources.overrides if o.index < count)
        roles.append(replace(resources, count=count, overrides=overrides))
    if all(r.role is not Role.WORKER for r in roles):
        raise FailedPrecondition("the job's plan has no worker role to scale")
    return Plan(
        roles=tuple(roles),
        reason="manual scale by operator" + (f": {reason}" if reason else ""),
        algorithm="manual",
    )
