"""GoldMiner's job-level tuner, live: one tuning step per measured interval of a job's input
queue, decided through the ``tune_data_workers`` port and published as the job's plan.

What the job's view keeps between steps, and how a step's configuration becomes the
data-worker role of a plan, is :mod:`stride.optimizer.domain.feeding`; the search is
:func:`stride.policy.goldminer.tune_step`, the same step ``stride sim --env dataworkers``
runs. A step is made off the metric consumers (:class:`~stride.optimizer.usecases.
DueDecisions`, with the job's stage-step decisions), outside any transaction, and stored
only if the job's plan and view are still the ones it was made for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.decisions import DecisionFailed, DecisionPort
from stride.events.v1 import plan_pb2
from stride.optimizer.adapters.convert import plan_from_proto
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.domain import observations as obs
from stride.optimizer.domain.administrator import Administrator, JobStage, StageError, Step
from stride.optimizer.domain.feeding import (
    Feeding,
    FeedRule,
    configuration_of,
    observation,
    on_tuned,
    with_configuration,
)
from stride.optimizer.domain.tuning import Explanation
from stride.policy import goldminer
from stride.policy.goldminer import QueueObservation, TunerReply, TunerRequest, TuningPhase
from stride.policy.plans import Plan

log = structlog.get_logger(__name__)

(TUNE_STEP, _) = goldminer.ALGORITHMS


class StoreStep(Protocol):
    async def __call__(
        self,
        session: Session,
        step: Step,
        spec: bytes | None,
        now: datetime,
        explanation: Explanation | None = None,
        view: obs.Observations | None = None,
    ) -> None: ...


CapacityHold = Callable[[Session, str, Plan], Awaitable[str]]


async def still_as_seen(
    session: Session, job_id: str, plan_version: int, feeding: Feeding
) -> tuple[Administrator, obs.Observations, plan_pb2.ResourcePlan] | None:
    """The job's administrator, view and newest plan, locked, if it still runs under the
    plan and data-worker state a decision was made for (None: it changed meanwhile)."""
    existing = await repository.get_administrator(session, job_id, for_update=True)
    view = await repository.get_observations(session, job_id, for_update=True)
    newest = await repository.newest_plan(session, job_id)
    if (
        existing is None
        or view is None
        or newest is None
        or existing.stage is JobStage.FINISHED
        or view.feeding != feeding
        or view.plan_version != plan_version
    ):
        return None
    return existing, view, newest


class DataWorkerTuning:
    """Makes a job's due tuning step and publishes the data workers it asks for."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        port: DecisionPort,
        rule: FeedRule,
        store: StoreStep,
        capacity_hold: CapacityHold,
        on_elastic: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_elastic``: called when a job's search ends with data workers the cluster
        level divides CPUs to (:mod:`.allocating`)."""
        self.database = database
        self.outbox = outbox
        self.port = port
        self.rule = rule
        self.config = rule.config()
        self._store = store
        self._capacity_hold = capacity_hold
        self._on_elastic = on_elastic

    async def tune(self, job_id: str) -> None:
        """Make the job's due tuning step, if it has one."""
        async with self.database.sessions() as session:
            inputs = await repository.decision_inputs(session, job_id)
        view, newest = inputs.view, inputs.newest
        if (
            inputs.administrator is None
            or inputs.administrator.stage is JobStage.FINISHED
            or view is None
            or newest is None
            or not view.feeding.due
        ):
            return
        feeding = view.feeding
        current = configuration_of(plan_from_proto(newest), self.rule)
        expected = feeding.state.configuration.data_workers if feeding.state is not None else 0
        if current.data_workers != expected:
            # An operator's plan (stride scale --data-workers) decides this job's data workers.
            await self._settle(job_id, view, None, "", "an operator's plan set the data workers")
            return
        observed = observation(feeding, obs.training_utilization(view))
        request = TunerRequest(config=self.config, state=feeding.state, observation=observed)
        try:
            reply = await self.port.decide(TUNE_STEP, request, job_id)
        except DecisionFailed as error:
            if error.retryable:
                raise  # still due: the sweep asks again
            log.error("data-worker tuning refused its input", job_id=job_id, error=str(error))
            await self._settle(job_id, view, None, "", f"the tuner refused: {error}")
            return
        await self._settle(job_id, view, reply, newest.version, "", observed)

    async def _settle(
        self,
        job_id: str,
        seen: obs.Observations,
        reply: TunerReply | None,
        version: Any,
        ended: str,
        observed: QueueObservation | None = None,
    ) -> None:
        """Store the step (``reply``), or end the search (``ended``: why), if the job is
        still where the step was made."""
        now = datetime.now(UTC)
        published = None
        async with self.database.transaction() as session:
            locked = await still_as_seen(session, job_id, seen.plan_version, seen.feeding)
            if locked is None:
                log.info("tuning step dropped: the job changed while it was made", job_id=job_id)
                return
            existing, view, newest = locked
            if reply is None:
                await self._end(session, existing, view, ended, now)
                return
            current = plan_from_proto(newest)
            plan, hold = await self._plan_of(session, job_id, current, reply)
            state = reply.state
            if hold:
                # No room for the step: the search ends where the job is.
                state = replace(
                    state,
                    phase=TuningPhase.CONVERGED,
                    configuration=configuration_of(current, self.rule),
                    last_action=goldminer.TuningAction.KEEP,
                )
            measured = view.feeding.measured(observed) if observed is not None else view.feeding
            feeding = replace(measured, state=state, due=False, windows=())
            explanation = Explanation(
                algorithm=TUNE_STEP.qualified_name,
                stage="",
                root_cause="",
                detail=_detail(reply, hold),
                bound=hold,
            )
            step, explained = on_tuned(
                existing,
                plan,
                f"{job_id}.tune.{reply.state.intervals}.{version}",
                explanation,
                now,
            )
            try:
                await self._store(
                    session,
                    step,
                    None,
                    now,
                    explanation=explained if plan is not None else None,
                    view=replace(view, feeding=feeding),
                )
            except StageError as error:
                log.info("tuning step dropped", job_id=job_id, why=str(error))
                return
            published = step.plans[0].version if step.plans else None
        self.outbox.notify()
        if feeding.elastic:
            self._on_elastic()
        log.info(
            "data-worker tuning step",
            job_id=job_id,
            action=reply.action.value,
            configuration=f"{reply.configuration}",
            plan=published,
            why=reply.reason,
            held=hold,
        )

    async def _end(
        self,
        session: Session,
        existing: Administrator,
        view: obs.Observations,
        why: str,
        now: datetime,
    ) -> None:
        """End the job's search for good, with an event saying why."""
        feeding = replace(view.feeding, due=False, windows=(), held=why)
        explanation = Explanation(
            TUNE_STEP.qualified_name, "", "", f"data-worker tuning ended: {why}"
        )
        step, _ = on_tuned(existing, None, f"{existing.job_id}.tune.ended", explanation, now)
        await self._store(session, step, None, now, view=replace(view, feeding=feeding))
        log.info("data-worker tuning ended", job_id=existing.job_id, why=why)

    async def _plan_of(
        self, session: Session, job_id: str, current: Plan, reply: TunerReply
    ) -> tuple[Plan | None, str]:
        """The plan the step asks for (None: the job's holds it already), and why it cannot
        be published ('' when it can)."""
        if configuration_of(current, self.rule) == reply.configuration:
            return None, ""
        plan = with_configuration(
            current,
            reply.configuration,
            self.rule,
            f"data workers: {reply.reason}",
            TUNE_STEP.qualified_name,
        )
        hold = await self._capacity_hold(session, job_id, plan)
        return (None, hold) if hold else (plan, "")


def _detail(reply: TunerReply, hold: str) -> str:
    configuration = reply.configuration
    said = (
        f"{reply.action.value}: {reply.reason} "
        f"({configuration.data_workers} data workers of {configuration.data_worker_cpu} CPUs)"
    )
    return f"{said}; held, tuning ends: {hold}" if hold else said
