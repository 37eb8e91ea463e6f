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

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import structlog

from stride.bus import topics
from stride.bus.topics import Outgoing
from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.decisions import DecisionFailed, DecisionPort
from stride.events.v1 import job_pb2, metrics_pb2, optimization_pb2, plan_pb2, pod_pb2
from stride.optimizer.adapters.convert import (
    STAGE_TO_PROTO,
    event_to_proto,
    features_from_spec,
    plan_from_proto,
    plan_to_proto,
    share_values,
)
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.allocating import DataWorkerAllocation
from stride.optimizer.domain import observations as obs
from stride.optimizer.domain.administrator import (
    Administrator,
    JobStage,
    RootCause,
    StageError,
    Step,
    check_job_id,
    on_admitted,
    on_finished,
    on_manual_scale,
    on_pod_failure,
)
from stride.optimizer.domain.claims import claim_from_json, claim_to_json
from stride.optimizer.domain.feeding import FeedRule
from stride.optimizer.domain.requests import plan_totals, shrunk_into
from stride.optimizer.domain.tuning import (
    Explanation,
    has_pods,
    on_replanned,
    on_share_plan,
    on_stage_reply,
    pods_of,
    shape_of,
    with_pods,
    without_pods,
)
from stride.optimizer.feeding import DataWorkerTuning
from stride.optimizer.share_asking import ShareAsker, ShareAsking
from stride.policy import dlrover, stages
from stride.policy.cold_start import COLD_START, ColdStartRequest, JobFeatures
from stride.policy.contention import (
    Claim,
    ShareBound,
    claim_of,
    settle,
)
from stride.policy.goldminer import AllocationPolicy
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.registry import AlgorithmSpec
from stride.policy.warm_start import HistoricalJob
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from stride.vocabulary import check_pod_count

log = structlog.get_logger(__name__)

DLROVER_ADJUST = next(spec for spec in dlrover.ALGORITHMS if spec.name == dlrover.ADJUST_NAME)
(STAGE_STEP,) = stages.ALGORITHMS
"""Stride's per-job stage step, the one ``stride sim --env dlrm`` runs."""
ROLE_NAMES = {
    plan_pb2.ROLE_WORKER: "worker",
    plan_pb2.ROLE_PS: "ps",
    plan_pb2.ROLE_CHIEF: "chief",
    plan_pb2.ROLE_DATA_WORKER: "data_worker",
}
"""DLRover's stage step, whose first rules are the OOM rules Stride's simulator applies too:
a worker OOM doubles the workers' memory, a PS OOM doubles the PS count (sec. 4.2)."""
Metric = metrics_pb2.StepMetrics | pod_pb2.UsageSample
"""What agents and pods report: a window of steps, or a pod's CPU and memory use."""
RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT")


class HistorySource(Protocol):
    """Finished jobs similar to a spec, for the warm start (the config DB)."""

    async def similar(self, spec: job_pb2.JobSpec) -> tuple[HistoricalJob, ...]:
        """Similar finished jobs with the configurations they ended with."""
        ...


@dataclass(frozen=True)
class Capacity:
    """What the running jobs may hold together: the cluster's cores and memory (until
    admission grants shares, the optimizer's configured bound)."""

    cpu: float
    memory_gib: float


_UNBOUNDED = 1e18
"""Free capacity where the optimizer bounds none (claims then wait only for shares)."""


Scope = Callable[[], AbstractContextManager[Any]]
"""What one fact's work runs in (a batch handler gives each its message's trace)."""


@dataclass(frozen=True)
class _FirstPlan:
    """An admitted job's first plan, decided and not stored yet (``Planning._first_plan``)."""

    job_id: str
    spec: bytes
    plan: Plan
    explanation: Explanation
    default: stages.Pods | None
    scope: Scope = nullcontext
    share: dict[str, Any] | None = None
    """The share the admission decision carried (``_share_values``), stored with plan 1."""

    def logged(self, step: Step) -> None:
        if not step.changed:
            log.info(
                "admission already applied; ignored",
                job_id=self.job_id,
                stage=step.before.stage.value if step.before else None,
            )
            return
        log.info(
            "job administrator created",
            job_id=self.job_id,
            plans=[p.version for p in step.plans],
        )


@dataclass
class _Writes:
    """New rows and plan messages of one or more steps, written together (:meth:`flush`):
    a statement per table instead of several per step."""

    administrators: list[dict[str, Any]] = field(default_factory=list)
    events: list[optimization_pb2.OptimizationEvent] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    observations: list[dict[str, Any]] = field(default_factory=list)
    outgoing: list[Outgoing] = field(default_factory=list)

    async def flush(self, session: Session, outbox: Outbox) -> None:
        """Write what waits, in order (an event id stored before is skipped)."""
        await repository.insert_administrators(session, self.administrators)
        await repository.insert_events(session, self.events)
        await repository.insert_plans(session, self.plans)
        await repository.insert_observations(session, self.observations)
        await outbox.add_events(session, self.outgoing)
        self.administrators, self.events, self.plans = [], [], []
        self.observations, self.outgoing = [], []


def _within_share(
    bound: ShareBound | None, plan: Plan, explanation: Explanation
) -> tuple[Plan, Explanation]:
    """``plan`` shrunk into the job's share (``bound``) if admission's share came first
    (the two arrive through different consumers) and the plan exceeds it."""
    shrunk = None if bound is None else shrunk_into(bound, plan)
    if shrunk is None:
        return plan, explanation
    fitted, why = shrunk
    fitted_plan = with_pods(
        plan, fitted, f"{plan.reason}; fitted into the admission share", plan.algorithm
    )
    return fitted_plan, replace(
        explanation,
        detail=f"{explanation.detail}; fitted into the admission share ({why})",
        bound="admission share",
    )


class Planning:
    """Applies lifecycle facts to administrators and reads plans back."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        adjust: DecisionPort,
        max_pod_cpu: float | None = None,
        window: obs.WindowRule | None = None,
        space: stages.SearchSpace | None = None,
        min_plan_interval_seconds: float = 0.0,
        override_hold_seconds: float = 0.0,
        fallback: DecisionPort | None = None,
        history: HistorySource | None = None,
        capacity: Capacity | None = None,
        enforce_shares: bool = True,
        shares: ShareAsker | None = None,
        tune: DecisionPort | None = None,
        feed: FeedRule | None = None,
        allocate: AllocationPolicy | None = None,
    ) -> None:
        """``tune`` and ``feed``: size data workers from the jobs' input queues through
        this port (GoldMiner's tuner, :mod:`.feeding`); None tunes nothing. ``allocate``:
        then divide the data-worker CPUs among the tuned jobs by this policy (GoldMiner's
        cluster level, :mod:`.allocating`); None leaves each job what its search found."""
        self.database = database
        self.asking = ShareAsking(database, shares, self._share_bound, enforce_shares)
        """Asks admission for a plan beyond the job's share (None ``shares``: such a plan
        is held until admission raises the share of its own accord)."""
        self.outbox = outbox
        self.adjust = adjust
        """Where plans are decided (in-process or by the executor pool, as configured)."""
        self.max_pod_cpu = max_pod_cpu
        self.window = window or obs.WindowRule(tick_seconds=180.0)
        self.space = space or stages.SearchSpace()
        self.min_plan_interval_seconds = min_plan_interval_seconds
        self.override_hold_seconds = override_hold_seconds
        self.history = history
        """Where similar finished jobs come from (the config DB); None: cold starts only."""
        self.capacity = capacity
        """What the running jobs may hold together; None: not bounded here."""
        self.enforce_shares = enforce_shares
        """Keep plans within admission's shares (``OptimizerSettings.enforce_shares``)."""
        self.fallback = fallback
        """Where the stage step runs when ``adjust`` cannot answer (the executor pool is
        down or slow): in this process, off the event loop."""
        self.feed = feed if tune is not None else None
        self.allocation = (
            DataWorkerAllocation(
                database,
                outbox,
                tune,
                feed,
                allocate,
                self._store,
                self._capacity_hold,
                self._share_bounds,
                capacity.cpu if capacity is not None else None,
            )
            if tune is not None and feed is not None and allocate is not None
            else None
        )
        self.tuning = (
            DataWorkerTuning(
                database,
                outbox,
                tune,
                feed,
                self._store,
                self._capacity_hold,
                self.allocation.wake if self.allocation is not None else lambda: None,
            )
            if tune is not None and feed is not None
            else None
        )
        self.due = DueDecisions(self._decide_due, self.due_decisions)
        """The decisions metrics made due, made off the consumers (run by the app)."""

    async def _decide_due(self, job_id: str) -> None:
        """The job's due stage-step decision, then its due tuning step."""
        await self.decide_pending(job_id)
        if self.tuning is not None:
            await self.tuning.tune(job_id)

    async def admitted(self, decision: job_pb2.AdmissionDecision) -> None:
        """A job was admitted: create its administrator and publish plan 1. Idempotent."""
        (outcome,) = await self.admitted_all([decision])
        if outcome is not None:
            raise outcome

    async def admitted_all(
        self,
        decisions: Sequence[job_pb2.AdmissionDecision],
        scopes: Sequence[Scope] | None = None,
    ) -> list[Exception | None]:
        """:meth:`admitted` for a fetched batch; per decision, None or the error it met.

        Each job's first plan is decided as it would be alone (the executor pool and the
        config DB asked for all of them at once), then the batch is stored in one
        transaction, in order of job. Under a stream of submissions a transaction per job
        was much of the optimizer's work (``bench/submit_load.py``). If the transaction
        fails, each job is stored alone, so a bad one fails alone with its own error.

        ``scopes``: per decision, what its work runs in (its message's trace, so the plan
        it publishes stays in the job's trace); none by default."""
        within = list(scopes) if scopes is not None else [nullcontext] * len(decisions)

        async def first_plan(decision: job_pb2.AdmissionDecision, scope: Scope) -> _FirstPlan:
            with scope():
                first = await self._first_plan(decision)
            return replace(first, scope=scope)

        prepared = await asyncio.gather(
            *(first_plan(d, scope) for d, scope in zip(decisions, within, strict=True)),
            return_exceptions=True,
        )
        outcomes: list[Exception | None] = []
        ready: list[tuple[int, _FirstPlan]] = []
        for index, result in enumerate(prepared):
            if isinstance(result, Exception):
                outcomes.append(result)
            elif isinstance(result, BaseException):
                raise result  # cancelled: the batch is redelivered
            else:
                outcomes.append(None)
                ready.append((index, result))
        ready.sort(key=lambda item: item[1].job_id)
        if len(ready) > 1:
            try:
                async with self.database.transaction() as session:
                    stored = await self._store_firsts(session, [first for _, first in ready])
            except Exception as error:
                log.info("batch not stored together; one job at a time", why=str(error)[:200])
            else:
                self.outbox.notify()
                for (_, first), step in zip(ready, stored, strict=True):
                    first.logged(step)
                return outcomes
        for index, first in ready:
            try:
                with first.scope():
                    async with self.database.transaction() as session:
                        (step,) = await self._store_firsts(session, [first])
            except Exception as error:
                outcomes[index] = error
                continue
            self.outbox.notify()
            first.logged(step)
        return outcomes

    async def _first_plan(self, decision: job_pb2.AdmissionDecision) -> _FirstPlan:
        """Plan 1 of an admitted job, decided (cold start, then the warm start over similar
        finished jobs), not stored yet; bad input fails here, with nothing written."""
        job_id = check_job_id(decision.job_id)
        if decision.outcome != job_pb2.ADMISSION_OUTCOME_ADMITTED:
            raise InvalidArgument(
                "outcome", f"{job_pb2.AdmissionOutcome.Name(decision.outcome)} is not ADMITTED"
            )
        if not decision.HasField("spec"):
            raise InvalidArgument("spec", "is required (the plan is made from it)")
        features = features_from_spec(decision.spec)
        # Decided before the transaction: the executor pool may take a while, and no row
        # lock is held meanwhile. A redelivery (rare) is found in the transaction, not by a
        # read first, which cost every admitted job a transaction.
        cold_start = await self._decide(
            COLD_START, ColdStartRequest(features, self.max_pod_cpu), job_id
        )
        first, explanation = (
            cold_start.plan,
            Explanation(
                algorithm=cold_start.plan.algorithm,
                stage=JobStage.COLD_START.value,
                root_cause=RootCause.COLD_START.value,
                detail=cold_start.plan.reason,
            ),
        )
        default = pods_of(cold_start.plan)
        warm = await self._warm_start(decision.spec, features, default, job_id)
        if warm is not None and warm[0].pods is not None and default is not None:
            reply, fallback, neighbours = warm
            assert reply.pods is not None
            first = with_pods(cold_start.plan, reply.pods, reply.root_cause)
            explanation = replace(
                explanation,
                algorithm=STAGE_STEP.qualified_name,
                detail=f"{reply.root_cause} (of {neighbours} candidates from the config DB)",
                cost=reply.cost,
                fallback=fallback,
            )
        share = share_values(decision.share, "share.") if decision.HasField("share") else None
        if share is not None and share["job_id"] != job_id:
            raise InvalidArgument("share.job_id", f"is {share['job_id']!r}, not {job_id!r}")
        if share is not None:
            first = await self.asking.first(job_id, share, first)
        return _FirstPlan(
            job_id, decision.spec.SerializeToString(), first, explanation, default, share=share
        )

    async def _store_firsts(self, session: Session, firsts: Sequence[_FirstPlan]) -> list[Step]:
        """Store admitted jobs' administrators and plan 1 (nothing for a job that has an
        administrator), in order, with a statement per table for the whole batch: under a
        stream of submissions, about nine statements per job were much of the optimizer's
        work (``bench/submit_load.py``)."""
        now = datetime.now(UTC)
        job_ids = [first.job_id for first in firsts]
        existing = await repository.get_administrators(session, job_ids, for_update=True)
        for first in firsts:
            if first.share is not None:
                # The decision carried the job's share: plan 1 fits it even when the share's
                # own event comes later (it is then an older version, and changes nothing).
                await repository.put_share(session, {**first.share, "updated_at": now})
        bounds = await self._share_bounds(session, job_ids)
        writes = _Writes()
        steps = []
        for first in firsts:
            with first.scope():
                plan, explanation = _within_share(
                    bounds.get(first.job_id), first.plan, first.explanation
                )
                step = on_admitted(existing.get(first.job_id), first.job_id, plan, now)
                if step.changed:
                    assert step.after is not None
                    existing[first.job_id] = step.after  # the same job twice in a batch
                    # The stage step's later "request" is the cold default, as the
                    # simulator's is the user's request, whatever the warm start chose.
                    await self._store(
                        session,
                        step,
                        first.spec,
                        now,
                        explanation=explanation,
                        view=obs.Observations(request=first.default),
                        writes=writes,
                    )
            steps.append(step)
        await writes.flush(session, self.outbox)
        return steps

    async def _warm_start(
        self,
        spec: job_pb2.JobSpec,
        features: JobFeatures,
        default: stages.Pods | None,
        job_id: str,
    ) -> tuple[stages.StageReply, str, int] | None:
        """The stage step's arrival decision on the config DB's similar finished jobs
        (DLRover-RM Alg. 1), or None for the cold default: no config DB configured, none
        reachable (logged; the job still starts), no similar job, or a plan the stage step
        cannot size (no worker or PS)."""
        if self.history is None or default is None:
            return None
        try:
            history = await self.history.similar(spec)
        except Exception as error:
            log.warning("config DB unreachable; cold start", job_id=job_id, error=str(error))
            return None
        if not history:
            return None
        request = stages.StageRequest(
            reason=stages.Reason.ARRIVAL,
            features=features,
            shape=shape_of(features, spec.model.parameter_count),
            request=default,
            pods=default,
            history=history,
            space=self.space,
        )
        reply, fallback = await self._stage_step(request, job_id)
        return reply, fallback, len(history)

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
            await repository.delete_claims(session, [job_id])
        log.info("job administrator finished", job_id=job_id, known_before=existing is not None)
        if self.allocation is not None:
            self.allocation.wake()  # its data workers' CPUs are free
        # Its cores and memory are free: the open claims are settled over them.
        await self.settle_claims(f"{job_id} finished")

    async def _store(
        self,
        session: Session,
        step: Step,
        spec: bytes | None,
        now: datetime,
        explanation: Explanation | None = None,
        view: obs.Observations | None = None,
        writes: _Writes | None = None,
    ) -> None:
        """Write one step: administrator, events, plans (with ``explanation``), the plans'
        outbox messages, and the job's metric view (``view`` if the caller changed it),
        which starts a new window for a new plan. New rows and messages wait in ``writes``
        if given, for the caller to write with other steps' in the same transaction."""
        assert step.after is not None, "a step that stores always has an administrator"
        pending = writes if writes is not None else _Writes()
        if step.before is None:
            pending.administrators.append(repository.administrator_row(step.after, spec, now))
        else:
            await repository.update_administrator(session, step.after, now)
        pending.events += [event_to_proto(event) for event in step.events]
        for versioned in step.plans:
            message = plan_to_proto(versioned)
            pending.plans.append(
                repository.plan_row(message, explanation.to_json() if explanation else None)
            )
            pending.outgoing.append(
                topics.PLAN.outgoing(versioned.job_id, message, versioned.message_id)
            )
        if step.plans or view is not None:
            await self._store_view(session, step, now, view, pending)
        if writes is None:
            await pending.flush(session, self.outbox)

    async def _store_view(
        self,
        session: Session,
        step: Step,
        now: datetime,
        view: obs.Observations | None,
        pending: _Writes,
    ) -> None:
        """:meth:`_store`'s metric view: a new job's waits in ``pending``."""
        assert step.after is not None
        # A new administrator has no metric view yet (metrics of a job the optimizer does
        # not know are refused), so there is nothing to read for it.
        stored = (
            None
            if step.before is None
            else await repository.get_observations(session, step.after.job_id, for_update=True)
        )
        current = view if view is not None else (stored or obs.Observations())
        held = None
        if step.plans:
            newest = step.plans[-1]
            current = current.for_plan(
                newest.version,
                pods_of(newest.plan),
                obs.job_clock(current, now.timestamp()),
                data_workers=sum(r.count for r in newest.plan.roles if r.role is Role.DATA_WORKER),
            )
            held = plan_totals(newest.plan)
        if step.before is None:
            pending.observations.append(
                repository.observations_row(step.after.job_id, current, now, held)
            )
            return
        await repository.put_observations(
            session, step.after.job_id, current, now, new=stored is None, held=held
        )

    async def _capacity_hold(self, session: Session, job_id: str, plan: Plan) -> str:
        """Why ``plan`` cannot replace the job's current one within the job's share or the
        cluster's free capacity ('' when it fits, or when neither is bounded here); the
        reason begins with the bound's name ("admission share: ...", "cluster capacity:
        ..."). Serializes the
        capacity-taking transactions until this one ends, so two jobs never both take the
        same free cores."""
        want_cpu, want_memory = plan_totals(plan)
        newest = await repository.newest_plan(session, job_id)
        if newest is not None and has_pods(plan) and not has_pods(plan_from_proto(newest)):
            return (
                "admission share: the job is suspended (admission gave it no share) and "
                "resumes when admission gives it one"
            )
        share = await self._share_bound(session, job_id)
        if share is not None and (excess := share.excess(want_cpu, want_memory)):
            return excess
        if self.capacity is None:
            return ""
        await repository.lock_capacity(session)
        cpu, memory, own_cpu, own_memory = await repository.held_capacity(session, job_id)
        free_cpu = self.capacity.cpu - cpu
        free_memory = self.capacity.memory_gib - memory
        extra_cpu, extra_memory = want_cpu - own_cpu, want_memory - own_memory
        if extra_cpu <= free_cpu + 1e-9 and extra_memory <= free_memory + 1e-9:
            return ""
        return (
            f"cluster capacity: the plan needs {max(extra_cpu, 0):g} more cores and "
            f"{max(extra_memory, 0):g} more GiB, {max(free_cpu, 0):g} cores and "
            f"{max(free_memory, 0):g} GiB are free"
        )

    async def _share_bound(self, session: Session, job_id: str) -> ShareBound | None:
        """The most the job may hold, from admission's newest share of it; None when
        admission gave it no CPU share (a job sized by the optimizer alone, a GPU job's
        devices, or a share of zero units, which only preemption may act on)."""
        return (await self._share_bounds(session, [job_id])).get(job_id)

    async def _share_bounds(
        self, session: Session, job_ids: Sequence[str]
    ) -> dict[str, ShareBound]:
        """:meth:`_share_bound` of each of ``job_ids`` that has one, with one query."""
        if not self.enforce_shares:
            return {}
        return {
            job_id: ShareBound(share["cpu"], share["memory_gib"])
            for job_id, share in (await repository.get_shares(session, job_ids)).items()
            if share["cpu"] > 0 and share["memory_gib"] > 0
        }

    async def shared(self, event: job_pb2.JobShare) -> None:
        """Admission set the job's share: store it (an older version changes nothing), fit
        the job's plan into it if it no longer fits, and settle the open claims (a larger
        share may let the job's own claim through)."""
        values = share_values(event)
        job_id = values["job_id"]
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            if not await repository.put_share(session, {**values, "updated_at": now}):
                log.info("older share ignored", job_id=job_id, version=event.version)
                return
            if event.units <= 0:
                await self._suspend(session, job_id, int(event.version), event.reason, now)
            elif not await self._resume(session, job_id, int(event.version), event.reason, now):
                await self._fit_share(session, job_id, int(event.version), event.reason, now)
        self.outbox.notify()
        await self.settle_claims(f"share v{event.version} of {job_id}")

    async def _suspend(
        self, session: Session, job_id: str, version: int, reason: str, now: datetime
    ) -> None:
        """Admission gave the job nothing (preempted for a higher class, or its units went
        to guaranteed jobs): its next plan has no pods, so the podwatcher checkpoints it and
        removes them. Whatever ``enforce_shares`` says: a share of zero always binds."""
        existing = await repository.get_administrator(session, job_id, for_update=True)
        newest = await repository.newest_plan(session, job_id)
        if existing is None or newest is None or existing.stage is JobStage.FINISHED:
            return
        current = plan_from_proto(newest)
        if not has_pods(current):
            return
        detail = (
            f"suspended: admission's share v{version} is zero ({reason}); the job "
            "checkpoints, its pods are removed, and it resumes from that checkpoint when it "
            "gets a share again"
        )
        await self._store_suspension(
            session, existing, current, f"{job_id}.share.{version}", detail, now
        )
        await repository.delete_claims(session, [job_id])
        log.info("job suspended: its share is zero", job_id=job_id, share_version=version)

    async def _store_suspension(
        self,
        session: Session,
        existing: Administrator,
        current: Plan,
        event_id: str,
        detail: str,
        now: datetime,
    ) -> int:
        """Store the job's next plan as ``current`` without pods (a suspension), explained by
        ``detail``; returns its version."""
        explanation = Explanation(
            algorithm="stride-share/1",
            stage=existing.stage.value,
            root_cause=RootCause.SHARE.value,
            detail=detail,
            bound="admission share",
        )
        step, explained = on_share_plan(
            existing, without_pods(current, detail), event_id, explanation, now
        )
        await self._store(session, step, None, now, explanation=explained)
        assert step.after is not None
        return step.after.plan_version

    async def _wait_for_memory(
        self,
        session: Session,
        existing: Administrator,
        current: Plan,
        claim: Claim,
        event_id: str,
        why: str,
        now: datetime,
    ) -> None:
        """Admission queued the job's OOM fix (the cluster has no room for it now): suspend
        the job, so its pods are not killed again and again into a failure of the relaunch
        budget, and keep the fix as its claim, on the suspended plan, for :meth:`_resume`
        when admission grants it."""
        detail = (
            f"waits for memory: {why}; the job checkpoints, its pods are removed, and it "
            "resumes with the fix when admission grants it"
        )
        version = await self._store_suspension(session, existing, current, event_id, detail, now)
        await repository.put_claim(session, existing.job_id, version, claim_to_json(claim), now)
        log.warning("job waits for its OOM fix", job_id=existing.job_id, why=why)

    async def _resume(
        self, session: Session, job_id: str, version: int, reason: str, now: datetime
    ) -> bool:
        """A suspended job got a share again: its last plan with pods is its next plan
        (fitted into the share when shares are enforced). False when it was not suspended."""
        existing = await repository.get_administrator(session, job_id, for_update=True)
        newest = await repository.newest_plan(session, job_id)
        if existing is None or newest is None or existing.stage is JobStage.FINISHED:
            return False
        if has_pods(plan_from_proto(newest)):
            return False
        running = [
            plan_from_proto(message)
            for message in await repository.list_plans(session, job_id)
            if has_pods(plan_from_proto(message))
        ]
        if not running:
            return False
        plan = running[-1]
        detail = f"resumed: admission's share v{version} ({reason}); the plan before the pause"
        claimed = await repository.current_claim(session, job_id)
        waited = None if claimed is None else claim_from_json(claimed)
        bound = await self._share_bound(session, job_id)
        if (
            waited is not None
        ):  # it waits for its OOM fix: it resumes with it once the share holds it
            plan = with_pods(plan, waited.wanted, "-", plan.algorithm)
            if bound is not None and not bound.holds(*plan_totals(plan)):
                log.info("job still waits for its OOM fix", job_id=job_id, share_version=version)
                return True
            detail = (
                f"resumed with its OOM fix ({waited.cause}): admission's share v{version} "
                f"({reason})"
            )
            await repository.delete_claims(session, [job_id])
        shrunk = None if bound is None else shrunk_into(bound, plan)
        if shrunk is not None:
            plan = with_pods(plan, shrunk[0], "-", plan.algorithm)
            detail += f", fitted into the share ({shrunk[1]})"
        explanation = Explanation(
            algorithm="stride-share/1",
            stage=existing.stage.value,
            root_cause=RootCause.SHARE.value,
            detail=detail,
            bound="admission share",
        )
        resumed = Plan(roles=plan.roles, reason=detail, algorithm=plan.algorithm)
        step, explained = on_share_plan(
            existing, resumed, f"{job_id}.share.{version}", explanation, now
        )
        await self._store(session, step, None, now, explanation=explained)
        log.info("job resumed: it has a share again", job_id=job_id, share_version=version)
        return True

    async def _fit_share(
        self, session: Session, job_id: str, version: int, reason: str, now: datetime
    ) -> None:
        """Publish the job's plan shrunk into its share if its newest plan exceeds it."""
        bound = await self._share_bound(session, job_id)
        if bound is None:
            return
        existing = await repository.get_administrator(session, job_id, for_update=True)
        newest = await repository.newest_plan(session, job_id)
        if existing is None or newest is None or existing.stage is JobStage.FINISHED:
            return
        current = plan_from_proto(newest)
        shrunk = shrunk_into(bound, current)
        if shrunk is None:
            return
        fitted, excess = shrunk
        detail = f"{excess} (share v{version}: {reason})"
        explanation = Explanation(
            algorithm="stride-contention/1",
            stage=existing.stage.value,
            root_cause=RootCause.SHARE.value,
            detail=f"fitted into the admission share: {detail}",
            cost=stages.pods_cost(fitted),
            bound="admission share",
        )
        step, explained = on_replanned(
            existing,
            current,
            fitted,
            RootCause.SHARE,
            f"{job_id}.share.{version}",
            explanation,
            now,
        )
        await self._store(session, step, None, now, explanation=explained)
        await repository.delete_claims(session, [job_id])
        log.info("plan fitted into its share", job_id=job_id, share_version=version)

    async def settle_claims(self, why: str) -> int:
        """Grant the open claims that the free capacity now holds, by the cluster's
        weighted greedy (:func:`stride.policy.contention.settle`), as the simulator does when
        capacity frees. A claim whose job has a newer plan, or has finished, is void and
        closed; one beyond its job's share stays open. Returns the plans published."""
        now = datetime.now(UTC)
        published = 0
        async with self.database.transaction() as session:
            await repository.lock_capacity(session)
            rows = await repository.open_claims(session)
            if not rows:
                return 0
            void: list[str] = []
            claims: list[Claim] = []
            versions: dict[str, int] = {}
            for job_id, version, text, current in rows:
                if not current:
                    void.append(job_id)
                    continue
                claim = claim_from_json(text)
                share = await self._share_bound(session, job_id)
                if share is not None:
                    # The whole plan as claimed (chief and data workers as they are).
                    newest = await repository.newest_plan(session, job_id)
                    assert newest is not None, "a current claim is on a stored plan"
                    claimed = with_pods(plan_from_proto(newest), claim.wanted, "-")
                    if not share.holds(*plan_totals(claimed)):
                        continue
                claims.append(claim)
                versions[job_id] = version
            if self.capacity is None:
                free_cpu = free_memory = _UNBOUNDED
            else:
                used_cpu, used_memory, _, _ = await repository.held_capacity(session, "")
                free_cpu = self.capacity.cpu - used_cpu
                free_memory = self.capacity.memory_gib - used_memory
            settlement = settle(claims, free_cpu, free_memory)
            for grant in settlement.granted:
                job_id = grant.claim.job_id
                existing = await repository.get_administrator(session, job_id, for_update=True)
                newest = await repository.newest_plan(session, job_id)
                assert existing is not None and newest is not None
                explanation = Explanation(
                    algorithm="stride-contention/1",
                    stage=existing.stage.value,
                    root_cause=RootCause.CONTENTION.value,
                    detail=(
                        f"held for capacity ({grant.claim.cause}); granted when {why}: "
                        f"{grant.why}, rank {grant.rank} of {len(claims)}"
                    ),
                    predicted_throughput=grant.claim.throughput_wanted,
                    predicted_current=grant.claim.throughput_now,
                    cost=stages.pods_cost(grant.claim.wanted),
                    bound="cluster capacity",
                )
                step, explained = on_replanned(
                    existing,
                    plan_from_proto(newest),
                    grant.claim.wanted,
                    RootCause.CONTENTION,
                    f"{job_id}.granted.{versions[job_id]}",
                    explanation,
                    now,
                )
                await self._store(session, step, None, now, explanation=explained)
                published += 1
            await repository.delete_claims(
                session, void + [grant.claim.job_id for grant in settlement.granted]
            )
        if published:
            self.outbox.notify()
            log.info("claims granted", plans=published, open=len(settlement.left), why=why)
        return published

    async def job_owner(self, job_id: str) -> str | None:
        """The user who submitted a job the optimizer knows (None: no such admitted job)."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            spec = await repository.get_spec(session, job_id)
        return None if spec is None else job_pb2.JobSpec.FromString(spec).user

    async def newest_plan(
        self, job_id: str
    ) -> tuple[plan_pb2.ResourcePlan, JobStage, obs.Observations | None]:
        """The job's newest plan, its stage and its metric view; NotFound if the job or its
        plan is unknown."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            administrator = await repository.get_administrator(session, job_id)
            if administrator is None:
                raise NotFound(f"job {job_id!r} not found")
            plan = await repository.newest_plan(session, job_id)
            view = await repository.get_observations(session, job_id)
        if plan is None:
            raise NotFound(f"job {job_id!r} has no plan ({administrator.stage.value})")
        return plan, administrator.stage, view

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

    async def scale(
        self, job_id: str, workers: int, ps: int, reason: str, data_workers: int | None = None
    ) -> plan_pb2.ResourcePlan:
        """An operator's manual plan: the newest plan with these counts, as the next
        version, recorded as an override (DLRover's ScalePlan). ``data_workers`` None keeps
        the job's data workers."""
        check_job_id(job_id)
        check_pod_count(workers, "workers", raise_as=InvalidArgument)
        if workers < 1:
            raise InvalidArgument("workers", f"must be at least 1, got {workers}")
        check_pod_count(ps, "ps", raise_as=InvalidArgument)
        if data_workers is not None:
            check_pod_count(data_workers, "data_workers", raise_as=InvalidArgument)
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
            plan = _with_counts(plan_from_proto(newest), workers, ps, reason, data_workers)
            refused = await self._capacity_hold(session, job_id, plan)
            if refused:
                raise FailedPrecondition(refused)
            try:
                step = on_manual_scale(
                    administrator,
                    job_id,
                    plan,
                    str(administrator.plan_version + 1),
                    f"manual scale by operator to {workers} workers"
                    + (f" and {ps} PS" if ps else "")
                    + (f" and {data_workers} data workers" if data_workers is not None else "")
                    + (f": {reason}" if reason else ""),
                    now,
                )
            except StageError as error:
                raise FailedPrecondition(str(error)) from None
            view = await repository.get_observations(session, job_id, for_update=True)
            if view is not None:
                held_from = obs.job_clock(view, now.timestamp())
                view = replace(view, hold_until=held_from + self.override_hold_seconds)
            explanation = Explanation(
                algorithm="manual",
                stage=administrator.stage.value,
                root_cause=RootCause.OVERRIDE.value,
                detail=step.events[0].detail,
                bound=f"operator override: the optimizer holds it {self.override_hold_seconds:g}s",
            )
            await self._store(session, step, None, now, explanation=explanation, view=view)
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
        if not has_pods(current):
            log.info("pod failure of a suspended job; no new plan", job_id=job_id)
            return
        if role is None or current.role(Role.PS) is None or current.role(Role.WORKER) is None:
            log.warning("OOM of a pod the OOM rule does not cover", pod=event.pod_name)
            return
        plan, claim, algorithm, rule, fallback = await self._oom_fix(job_id, current, role, event)
        asked = None
        if plan is not None:
            plan, claim, asked = await self.asking.ask_for_fix(newest.version, current, plan, claim)
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            existing = await repository.get_administrator(session, job_id, for_update=True)
            if await repository.has_event(session, event_id):
                return
            if existing is not None and existing.plan_version != newest.version:
                # A newer plan was published while deciding: it was made for other pods.
                raise Unavailable(f"job {job_id} got a new plan meanwhile; deciding again")
            hold = "" if plan is None else await self._capacity_hold(session, job_id, plan)
            if hold and asked is not None:
                hold = f"{hold}; admission {asked.reason}"
            if asked is not None and asked.queued and hold and claim and claim.safety and existing:
                # No room now: the job waits for its fix instead of being killed again.
                await self._wait_for_memory(session, existing, current, claim, event_id, hold, now)
            else:
                step = on_pod_failure(
                    existing,
                    job_id,
                    plan,
                    event_id,
                    f"{event.pod_name} was OOM-killed: {rule}",
                    now,
                    hold,
                )
                if not step.changed:
                    return
                if hold:
                    # The event says why; the pod watcher relaunches the pod as it was. The
                    # stage step's OOM plan stays open as a claim until capacity frees.
                    await self._store(session, step, None, now)
                    if claim is not None and existing is not None:
                        await repository.put_claim(
                            session, job_id, existing.plan_version, claim_to_json(claim), now
                        )
                    log.warning("OOM relaunch plan held", job_id=job_id, why=hold)
                    return
                explanation = Explanation(
                    algorithm=algorithm,
                    stage=step.after.stage.value if step.after else "",
                    root_cause=RootCause.OOM.value,
                    detail=f"{event.pod_name} was OOM-killed: {rule}",
                    bound="OOM margin",
                    fallback=fallback,
                )
                await self._store(session, step, None, now, explanation=explanation)
        self.outbox.notify()
        log.info("OOM relaunch plan published", job_id=job_id, pod=event.pod_name)

    async def _oom_fix(
        self, job_id: str, current: Plan, role: Role, event: pod_pb2.PodEvent
    ) -> tuple[Plan | None, Claim | None, str, str, str]:
        """The OOM rule's plan for a killed pod of ``role``, with its safety claim (kept if
        the cluster cannot hold it now, granted first), the algorithm, the rule's words and
        how the decision fell back."""
        async with self.database.sessions() as session:
            view = await repository.get_observations(session, job_id)
            spec = await repository.get_spec(session, job_id)
        if role is Role.PS and view is not None and view.pods is not None and spec is not None:
            # The stage step's OOM rule, as the simulator applies it: memory above the
            # predicted peak once growth is measured, else doubled (002 sec. 5.3).
            oom_request = self._stage_request(view, spec, stages.Reason.OOM)
            stage_reply, fallback = await self._stage_step(oom_request, job_id)
            assert stage_reply.pods is not None
            plan = with_pods(current, stage_reply.pods, f"OOM: {stage_reply.root_cause}")
            claim = claim_of(job_id, oom_request, stage_reply)
            return plan, claim, STAGE_STEP.qualified_name, stage_reply.root_cause, fallback
        # DLRover's rule for a worker (sec. 4.2: its memory doubles), as the simulator's.
        reply = await self._decide(
            DLROVER_ADJUST, dlrover.oom_request(current, role, event.index), job_id
        )
        fixed = reply.plan
        rule = fixed.reason if fixed else ""
        held, wanted = pods_of(current), None if fixed is None else pods_of(fixed)
        worker_claim = None
        if held is not None and wanted is not None and wanted != held:
            # An OOM fix of any role averts a failure: a safety claim, granted first.
            worker_claim = Claim(job_id, held, wanted, 0.0, 0.0, 0.0, 0.0, safety=True, cause=rule)
        return fixed, worker_claim, DLROVER_ADJUST.qualified_name, rule, ""

    # --- The live loop: metrics -> windows -> stage step -> plans ----------------------

    async def measured(self, batch: Sequence[Metric]) -> list[Exception | None]:
        """Apply a batch of metrics (agents' step windows and pods' usage) to the jobs'
        views in ONE transaction, and schedule the decisions they made due.

        Returns each metric's outcome, in order: None when applied (or ignored: a finished
        job's, an older plan's, a redelivery), or an InvalidArgument naming the problem for
        one that cannot be applied (unknown job, out of order, impossible values), which
        the bus dead-letters; the others of the batch still apply. A window that closes
        makes a decision due (stored as the view's ``pending``); it is made by
        :class:`DueDecisions` once every worker and PS reported usage, off the consumer."""
        outcomes: list[Exception | None] = [None] * len(batch)
        changes: dict[str, list[tuple[int, Callable[[obs.Observations], obs.Observations]]]] = {}
        for index, metric in enumerate(batch):
            try:
                job_id, change = self._change_of(metric)
            except InvalidArgument as error:
                outcomes[index] = error
                continue
            changes.setdefault(job_id, []).append((index, change))
        due: list[str] = []
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            # Every job's rows with one query each, locked in order of job id (so two
            # batches never wait for each other in a cycle), and the changed views written
            # with one statement: the batch holds its locks for a few round trips, not three
            # per job, so the decisions waiting on those rows are not held up behind it.
            job_ids = sorted(changes)
            administrators = await repository.get_administrators(session, job_ids, for_update=True)
            views = await repository.get_observations_many(session, job_ids, for_update=True)
            changed: dict[str, obs.Observations] = {}
            for job_id in job_ids:
                administrator = administrators.get(job_id)
                view = None
                problem = f"no job {job_id!r} is known to the optimizer"
                if administrator is not None:
                    if administrator.stage is JobStage.FINISHED:
                        continue
                    view = views.get(job_id)
                    problem = f"job {job_id!r} has no plan to measure yet"
                if view is None:
                    for index, _ in changes[job_id]:
                        outcomes[index] = InvalidArgument("job_id", problem)
                    continue
                after = view
                for index, change in changes[job_id]:
                    try:
                        after = change(after)
                    except obs.MetricRefused as error:
                        outcomes[index] = InvalidArgument(error.field, error.problem)
                if after != view:
                    changed[job_id] = after
                if (after.pending >= 0 and obs.measured(after, self.window)) or (after.feeding.due):
                    due.append(job_id)
            await repository.put_observations_many(session, changed, now)
        for job_id in due:
            self.due.schedule(job_id)
        return outcomes

    def _change_of(
        self, metric: Metric
    ) -> tuple[str, Callable[[obs.Observations], obs.Observations]]:
        """The job a metric is about and how it changes the job's view; InvalidArgument
        for a metric that names no job, pod or role."""
        job_id = check_job_id(metric.job_id)
        if not metric.pod_name:
            raise InvalidArgument("pod_name", "is required")
        if isinstance(metric, metrics_pb2.StepMetrics):
            report = obs.StepReport(
                pod_name=metric.pod_name,
                plan_version=metric.plan_version,
                steps=metric.steps,
                samples_per_second=metric.samples_per_second,
                samples_consumed=metric.samples_consumed,
                reported_at=metric.reported_at.ToDatetime(tzinfo=UTC).timestamp(),
                step_seconds=metric.step_seconds,
                input_queue=_input_queue(metric),
            )
            return job_id, lambda view: obs.add_steps(view, report, self.window, self.feed)
        role = ROLE_NAMES.get(metric.role)
        if role is None:
            raise InvalidArgument("role", f"must be a pod role, got {metric.role}")
        usage = obs.PodUsage(
            role=role,
            cpu_used=metric.cpu_used,
            memory_used_bytes=metric.memory_used_bytes,
            cpu_limit=metric.cpu_limit,
            plan_version=metric.plan_version,
            sampled_at=metric.sampled_at.ToDatetime(tzinfo=UTC).timestamp(),
        )
        pod_name = metric.pod_name
        return job_id, lambda view: obs.add_usage(view, pod_name, usage)

    async def due_decisions(self) -> list[str]:
        """Jobs with a window waiting for its decision (a restart resumes them)."""
        async with self.database.sessions() as session:
            return await repository.jobs_with_due_decisions(session)

    def _stage_request(
        self, view: obs.Observations, spec_bytes: bytes, reason: stages.Reason
    ) -> stages.StageRequest:
        """The stage step's request from the job's view: what the simulator's job master
        gives it (``stride.sim.dlrm.stage_request``), measured instead of simulated."""
        assert view.pods is not None and view.request is not None
        spec = job_pb2.JobSpec.FromString(spec_bytes)
        features = features_from_spec(spec)
        return stages.StageRequest(
            reason=reason,
            features=features,
            shape=shape_of(features, spec.model.parameter_count),
            request=view.request,
            pods=view.pods,
            consumed=float(view.consumed),
            samples=view.samples,
            sample_count=view.sample_count,
            worker_memory_used_gib=obs.worker_memory_used_gib(view),
            memory_points=view.memory_points,
            hot_detected=obs.hot_ps(view),
            history=(),
            last_fit_sample_count=view.last_fit_sample_count,
            space=self.space,
        )

    async def _stage_step(
        self, request: stages.StageRequest, job_id: str
    ) -> tuple[stages.StageReply, str]:
        """The stage step's reply, and how it fell back ('' if it did not).

        The executor pool first; when it cannot answer in time, the same step in this
        process; when the step itself fails, the stage heuristic: keep the plan on a tick,
        double the PS memory on an OOM (DLRover's reaction, sec. 4.2)."""
        try:
            return await self.adjust.decide(STAGE_STEP, request, job_id), ""
        except DecisionFailed as error:
            failure = str(error)
            if not error.retryable or self.fallback is None:
                return _stage_heuristic(request), f"stage heuristic: {failure}"
        try:
            reply = await self.fallback.decide(STAGE_STEP, request, job_id)
        except DecisionFailed as error:
            return _stage_heuristic(request), f"stage heuristic: {failure}; then {error}"
        return reply, f"ran in the optimizer: {failure}"

    async def decide_pending(self, job_id: str) -> None:
        """Make the job's due decision, if it has one and its pods' usage is in.

        The decision is made outside any transaction (the executor pool may take a while)
        and stored only if the job's plan and view are still the ones it was made for; a
        newer plan (an OOM rule, an operator) wins and the stale decision is dropped, so a
        job is never adjusted twice for one reason (DLRover issue #302)."""
        async with self.database.sessions() as session:
            inputs = await repository.decision_inputs(session, job_id)
        administrator, view, spec, newest = (
            inputs.administrator,
            inputs.view,
            inputs.spec,
            inputs.newest,
        )
        if (
            administrator is None
            or administrator.stage is JobStage.FINISHED
            or view is None
            or view.pending < 0
            or spec is None
            or newest is None
            or not has_pods(plan_from_proto(newest))
            or not obs.measured(view, self.window)
        ):
            return
        view = obs.with_memory_point(view)
        request = self._stage_request(view, spec, stages.Reason.TICK)
        reply, fallback = await self._stage_step(request, job_id)
        if fallback:
            log.warning("stage step fell back", job_id=job_id, how=fallback)
        now = datetime.now(UTC)
        asked = None
        if reply.pods is not None and not self._timing_hold(view, now):
            running = plan_from_proto(newest)
            asked = await self.asking.ask(
                newest.version,
                running,
                with_pods(running, reply.pods, "-"),
                claim_of(job_id, request, reply),
            )
        async with self.database.transaction() as session:
            existing = await repository.get_administrator(session, job_id, for_update=True)
            current = await repository.get_observations(session, job_id, for_update=True)
            if (
                existing is None
                or current is None
                or existing.stage is JobStage.FINISHED
                or existing.plan_version != administrator.plan_version
                or current.pending != view.pending
            ):
                log.info(
                    "decision dropped: the job changed while it was made"
                    if current is None or current.pending >= 0
                    else "decision already made by another trigger",
                    job_id=job_id,
                )
                return
            hold = self._timing_hold(current, now)
            bound = reply.bound
            claim: Claim | None = None
            if not hold and reply.pods is not None:
                hold = await self._capacity_hold(
                    session, job_id, with_pods(plan_from_proto(newest), reply.pods, "-")
                )
                if hold:
                    bound = hold.split(":", 1)[0]
                    if asked is not None:
                        hold = f"{hold}; admission {asked.reason}"
                    # Kept as a claim: settled with the others when capacity frees.
                    claim = claim_of(job_id, request, reply)
            explanation = Explanation(
                algorithm=STAGE_STEP.qualified_name,
                stage=reply.stage.value,
                root_cause="",
                detail=reply.root_cause,
                samples_used=len(request.samples),
                sample_count=request.sample_count,
                fit_rmsle=reply.fit_rmsle,
                predicted_throughput=reply.predicted_throughput,
                predicted_current=reply.predicted_current,
                cost=reply.cost,
                bound=bound,
                fallback=fallback,
            )
            step, explained = on_stage_reply(
                existing,
                plan_from_proto(newest),
                reply,
                f"{job_id}.tick.{view.pending}",
                explanation,
                first_fit=view.last_fit_sample_count < 0 and reply.fitted_at >= 0,
                hold_reason=hold,
                now=now,
            )
            settled = replace(
                current,
                memory_points=view.memory_points,
                pending=-1,
                last_fit_sample_count=(
                    reply.fitted_at if reply.fitted_at >= 0 else current.last_fit_sample_count
                ),
            )
            await self._store(session, step, None, now, explanation=explained, view=settled)
            if claim is not None:
                await repository.put_claim(
                    session, job_id, existing.plan_version, claim_to_json(claim), now
                )
            else:
                await repository.delete_claims(session, [job_id])
            after = step.after or existing
            detail = (
                f"{reply.root_cause}; held: {hold}" if hold and reply.pods else reply.root_cause
            )
            await self.outbox.add_event(
                session, _window_decided(job_id, view.pending, after, bool(step.plans), detail, now)
            )
        self.outbox.notify()
        if step.plans and reply.pods is not None and _frees(request.pods, reply.pods):
            await self.settle_claims(f"{job_id} shrank")
        if step.plans:
            log.info(
                "stage step published a plan",
                job_id=job_id,
                version=step.plans[0].version,
                stage=reply.stage.value,
                why=reply.root_cause,
            )
        else:
            log.debug("stage step kept the plan", job_id=job_id, why=reply.root_cause, hold=hold)

    def _timing_hold(self, view: obs.Observations, now: datetime) -> str:
        """Why a new plan must wait for time to pass ('' when it need not): an operator's
        plan holding, or the minimum interval between plans."""
        moment = view.closed_at if view.closed_at >= 0 else now.timestamp()
        if moment < view.hold_until:
            return f"an operator's plan holds for {view.hold_until - moment:.0f}s more"
        if (
            self.min_plan_interval_seconds > 0
            and moment - view.last_plan_at < self.min_plan_interval_seconds
        ):
            return (
                f"the last plan is {moment - view.last_plan_at:.0f}s old "
                f"(minimum {self.min_plan_interval_seconds:g}s between plans)"
            )
        return ""

    async def explanations(
        self, job_id: str
    ) -> list[tuple[plan_pb2.ResourcePlan, Explanation | None]]:
        """Every plan version of the job with why it was chosen, oldest first."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            if await repository.get_administrator(session, job_id) is None:
                raise NotFound(f"job {job_id!r} not found")
            rows = await repository.list_explanations(session, job_id)
        return [(plan, Explanation.from_json(text) if text else None) for plan, text in rows]


class DueDecisions:
    """Makes the jobs' due decisions off the metric consumers: at most one at a time per
    job (a job's windows are decided in order, and a second trigger for a job being decided
    runs once more after it), at most ``concurrency`` jobs at once, so the consumers keep
    taking metrics while the executor pool works. A sweep every ``sweep_seconds`` (and at
    start, for a restarted optimizer) schedules every job whose view holds a due window, so
    a decision that failed or was interrupted is made later, never lost."""

    def __init__(
        self,
        decide: Callable[[str], Awaitable[None]],
        due: Callable[[], Awaitable[list[str]]],
        concurrency: int = 8,
        sweep_seconds: float = 5.0,
    ) -> None:
        self._decide = decide
        self._due = due
        self._limit = asyncio.Semaphore(concurrency)
        self.sweep_seconds = sweep_seconds
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()

    def schedule(self, job_id: str) -> None:
        """Decide the job's due window soon (once more if it is being decided now)."""
        if job_id in self._running:
            self._again.add(job_id)
            return
        self._running[job_id] = asyncio.create_task(self._run(job_id), name=f"decide-{job_id}")

    async def _run(self, job_id: str) -> None:
        try:
            while True:
                self._again.discard(job_id)
                async with self._limit:
                    try:
                        await self._decide(job_id)
                    except Exception as error:
                        # Kept due in storage: the sweep schedules it again.
                        log.warning(
                            "decision failed; the sweep retries it",
                            job_id=job_id,
                            error=f"{type(error).__name__}: {error}",
                        )
                        return
                if job_id not in self._again:
                    return
        finally:
            self._running.pop(job_id, None)

    async def run(self, stop: asyncio.Event) -> None:
        """Sweep until ``stop`` is set, then let the decisions under way finish (a
        decision cut short is still due in storage and made by the next optimizer)."""
        try:
            while not stop.is_set():
                try:
                    for job_id in await self._due():
                        if job_id not in self._running:
                            self.schedule(job_id)
                except Exception as error:
                    log.warning(
                        "due-decision sweep failed", error=f"{type(error).__name__}: {error}"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.sweep_seconds)
        finally:
            running = list(self._running.values())
            if running:
                await asyncio.wait(running, timeout=10.0)
            for task in running:
                task.cancel()


_ROLE_BY_EVENT = {plan_pb2.ROLE_WORKER: Role.WORKER, plan_pb2.ROLE_PS: Role.PS}


def _window_decided(
    job_id: str, window: int, after: Administrator, changed: bool, detail: str, now: datetime
) -> Outgoing:
    """The announcement that the job's ``window`` was decided (``stride loadgen``'s players,
    and anyone following the job, learn of a kept plan from it)."""
    decided = optimization_pb2.WindowDecided(
        job_id=job_id,
        window=window,
        plan_version=after.plan_version,
        changed=changed,
        stage=STAGE_TO_PROTO[after.stage],
        detail=detail,
    )
    decided.decided_at.FromDatetime(now)
    return topics.WINDOW_DECIDED.outgoing(job_id, decided, f"{job_id}.decided.{window}")


def _frees(before: stages.Pods, after: stages.Pods) -> bool:
    """Whether moving from ``before`` to ``after`` frees cores or memory."""
    return after.cpu < before.cpu or after.memory_gib < before.memory_gib


def _stage_heuristic(request: stages.StageRequest) -> stages.StageReply:
    """What a job gets when the stage step cannot decide: on a tick its plan holds; on a
    PS OOM its PS memory doubles (DLRover sec. 4.2)."""
    if request.reason is stages.Reason.OOM:
        pods = replace(request.pods, ps_mem_gib=request.pods.ps_mem_gib * 2)
        return stages.StageReply(pods, False, stages.Stage.STEADY, "PS OOM-killed: memory x2")
    return stages.StageReply(None, False, stages.Stage.STEADY, "the plan holds (no decision)")


def _with_counts(
    plan: Plan, workers: int, ps: int, reason: str, data_workers: int | None = None
) -> Plan:
    roles = []
    for resources in plan.roles:
        count = resources.count
        if resources.role is Role.WORKER:
            count = workers
        elif resources.role is Role.PS and ps:
            count = ps
        elif resources.role is Role.DATA_WORKER and data_workers is not None:
            count = data_workers
        overrides = tuple(o for o in resources.overrides if o.index < count)
        roles.append(replace(resources, count=count, overrides=overrides))
    worker = next((r for r in roles if r.role is Role.WORKER), None)
    if worker is None:
        raise FailedPrecondition("the job's plan has no worker role to scale")
    if data_workers and all(r.role is not Role.DATA_WORKER for r in roles):
        # The first data workers: as big as a worker, whose pre-processing they take on.
        roles.append(RoleResources(Role.DATA_WORKER, data_workers, worker.cpu, worker.memory_bytes))
    return Plan(
        roles=tuple(roles),
        reason="manual scale by operator" + (f": {reason}" if reason else ""),
        algorithm="manual",
    )


def _input_queue(metric: metrics_pb2.StepMetrics) -> obs.InputQueue | None:
    """The report's input queue (a job read by steps); InvalidArgument names a bad field."""
    if not metric.HasField("input_queue"):
        return None
    queue = metric.input_queue
    for name in ("enqueue_rate", "dequeue_rate", "wait_share"):
        value = getattr(queue, name)
        if not math.isfinite(value) or value < 0 or (name == "wait_share" and value > 1):
            raise InvalidArgument(f"input_queue.{name}", f"is out of range: {value}")
    if queue.data_workers < 0 or queue.queue_length < 0:
        raise InvalidArgument("input_queue", "counts must not be negative")
    if not math.isfinite(queue.steps_per_second) or queue.steps_per_second < 0:
        raise InvalidArgument(
            "input_queue.steps_per_second", f"is out of range: {queue.steps_per_second}"
        )
    if queue.queue_capacity < 0 or 0 < queue.queue_capacity < queue.queue_length:
        raise InvalidArgument(
            "input_queue.queue_capacity",
            f"{queue.queue_capacity} is negative or below queue_length {queue.queue_length}",
        )
    return obs.InputQueue(
        data_workers=queue.data_workers,
        enqueue_rate=queue.enqueue_rate,
        dequeue_rate=queue.dequeue_rate,
        wait_share=queue.wait_share,
        queue_length=queue.queue_length,
        steps_per_second=queue.steps_per_second,
        queue_capacity=queue.queue_capacity,
    )
