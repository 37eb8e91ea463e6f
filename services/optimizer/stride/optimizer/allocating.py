"""GoldMiner's cluster level, live: rounds that divide the data-worker CPUs among the jobs
whose data workers are elastic, decided through the ``tune_data_workers`` port and
published as those jobs' plans.

What a job's view is for a round, and the budget, is :mod:`stride.optimizer.domain.
allocation`; the allocation is :func:`stride.policy.goldminer.allocate_data_worker_cpus`,
the one ``stride sim --env dataworkers`` runs at every arrival, completion and interval.
Here a round runs when a job's search ends (its job is new to the division), when a job
finishes (its CPUs are free) and every ``interval_seconds`` (remaining steps change).

A round reads every elastic job, decides outside any transaction, then stores each changed
job's plan in one transaction, the jobs that shrink first so those that grow find the
CPUs they free. A job that changed meanwhile (another plan, another search step), one an
operator's plan holds, or one whose plan no longer fits is left as it is until the next
round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime

import structlog

from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.decisions import DecisionFailed, DecisionPort
from stride.events.v1 import job_pb2
from stride.optimizer.adapters.convert import features_from_spec, plan_from_proto
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.domain import observations as obs
from stride.optimizer.domain.administrator import StageError
from stride.optimizer.domain.allocation import (
    ElasticJob,
    budget,
    data_worker_sizes,
    elastic_job,
    remaining_steps,
)
from stride.optimizer.domain.feeding import FeedRule, on_tuned, with_data_workers
from stride.optimizer.domain.tuning import Explanation, shape_of
from stride.optimizer.feeding import CapacityHold, StoreStep, still_as_seen
from stride.policy import goldminer
from stride.policy.contention import ShareBound
from stride.policy.goldminer import AllocationPolicy, ClusterAllocationRequest, JobAllocation

log = structlog.get_logger(__name__)

(_, ALLOCATION) = goldminer.ALGORITHMS


ShareBounds = Callable[[Session, list[str]], Awaitable[dict[str, ShareBound]]]


class DataWorkerAllocation:
    """Runs the cluster level's rounds and publishes the data workers they give."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        port: DecisionPort,
        rule: FeedRule,
        policy: AllocationPolicy,
        store: StoreStep,
        capacity_hold: CapacityHold,
        share_bounds: ShareBounds,
        cluster_cpu: float | None,
    ) -> None:
        self.database = database
        self.outbox = outbox
        self.port = port
        self.rule = rule
        self.policy = policy
        self._store = store
        self._capacity_hold = capacity_hold
        self._share_bounds = share_bounds
        self.cluster_cpu = cluster_cpu
        """Cores the running jobs may hold together (None: not bounded here)."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Run a round soon (a job's search ended, a job finished)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event, interval_seconds: float) -> None:
        """A round when woken and every ``interval_seconds``, until ``stop`` is set."""
        while not stop.is_set():
            self._wake.clear()
            try:
                await self.round()
            except Exception as error:
                log.warning(
                    "data-worker allocation round failed; the next one retries",
                    error=f"{type(error).__name__}: {error}",
                )
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            await asyncio.wait(waits, timeout=interval_seconds, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()

    async def round(self) -> int:
        """One round; returns how many jobs got new data workers."""
        async with self.database.sessions() as session:
            jobs = await self._elastic_jobs(session)
            if not jobs:
                return 0
            free = await self._free(session)
        cpus = budget(jobs, free, self.rule)
        if cpus < 1:
            return 0
        request = ClusterAllocationRequest(
            policy=self.policy, cpu_budget=cpus, jobs=tuple(job.curve for job in jobs)
        )
        try:
            reply = await self.port.decide(ALLOCATION, request, "cluster")
        except DecisionFailed as error:
            log.warning("data-worker allocation not decided", error=str(error))
            return 0
        changes = [
            (job, allocation)
            for job, allocation in zip(jobs, reply.allocations, strict=True)
            if allocation.data_worker_sizes != job.sizes
        ]
        changes.sort(key=lambda change: change[1].data_worker_cpu - change[0].cpu)
        now = datetime.now(UTC)
        applied = 0
        async with self.database.transaction() as session:
            for job, allocation in changes:
                applied += await self._apply(session, job, allocation, cpus, now)
        if applied:
            self.outbox.notify()
        return applied

    async def _free(self, session: Session) -> float | None:
        """Cores no running job holds (None: the cluster's cores are not bounded here)."""
        if self.cluster_cpu is None:
            return None
        held, _, _, _ = await repository.held_capacity(session, "")
        return max(0.0, self.cluster_cpu - held)

    async def _elastic_jobs(self, session: Session) -> list[ElasticJob]:
        rows = await repository.elastic_jobs(session)
        bounds = await self._share_bounds(session, [row.job_id for row in rows])
        jobs = []
        for row in rows:
            plan = plan_from_proto(row.newest)
            if data_worker_sizes(plan, self.rule) != row.view.feeding.given_sizes:
                continue  # an operator's plan set its data workers
            bound = bounds.get(row.job_id)
            jobs.append(
                elastic_job(
                    row.job_id,
                    row.view.plan_version,
                    row.view.feeding,
                    plan,
                    self.rule,
                    _remaining(row.spec, row.view.consumed),
                    bound.cpu if bound is not None else None,
                )
            )
        return jobs

    async def _apply(
        self,
        session: Session,
        job: ElasticJob,
        allocation: JobAllocation,
        cpus: int,
        now: datetime,
    ) -> int:
        """Store the job's new data workers if it is still as the round saw it; 1 if so."""
        locked = await still_as_seen(session, job.job_id, job.plan_version, job.feeding)
        if locked is None:
            log.info("allocation dropped: the job changed meanwhile", job_id=job.job_id)
            return 0
        existing, view, newest = locked
        if obs.job_clock(view, now.timestamp()) < view.hold_until:
            return 0  # an operator's plan holds
        sizes = allocation.data_worker_sizes
        detail = self._detail(job, allocation, cpus)
        reason = f"data workers: {detail}"
        plan = with_data_workers(
            plan_from_proto(newest), sizes, self.rule, reason, ALLOCATION.qualified_name
        )
        hold = await self._capacity_hold(session, job.job_id, plan)
        if hold:
            log.info("allocation held", job_id=job.job_id, why=hold)
            return 0
        explanation = Explanation(ALLOCATION.qualified_name, "", "", detail)
        step, explained = on_tuned(
            existing, plan, f"{job.job_id}.allocation.{newest.version}", explanation, now
        )
        feeding = replace(view.feeding, given=sizes)
        try:
            await self._store(
                session, step, None, now, explanation=explained, view=replace(view, feeding=feeding)
            )
        except StageError as error:
            log.info("allocation dropped", job_id=job.job_id, why=str(error))
            return 0
        log.info("data workers allocated", job_id=job.job_id, sizes=sizes, why=detail)
        return 1

    def _detail(self, job: ElasticJob, allocation: JobAllocation, cpus: int) -> str:
        unit = self.rule.cpu_unit
        given = " + ".join(f"{size * unit:g}" for size in allocation.data_worker_sizes)
        return (
            f"cluster allocation ({self.policy.value}): {allocation.data_worker_cpu} of "
            f"{cpus} data-worker CPUs of {unit:g} cores (was {job.cpu}): "
            f"{len(allocation.data_worker_sizes)} data workers of {given or 0} cores, "
            f"estimated {allocation.throughput:.3g} steps/s, "
            f"{allocation.normalized_throughput:.0%} of the training workers' rate"
        )


def _remaining(spec: bytes | None, consumed: int) -> int:
    """Steps the job has left, from its admitted spec (1 without one: SRTF then serves it
    as nearly done, which a job without a spec never is; every admitted job has one)."""
    if spec is None:
        return 1
    features = features_from_spec(job_pb2.JobSpec.FromString(spec))
    return remaining_steps(shape_of(features, 0).total_samples, consumed, features.batch_size)
