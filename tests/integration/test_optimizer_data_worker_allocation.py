"""GoldMiner's cluster level in the live optimizer (real NATS, a real database), played
against ``stride sim --env dataworkers``'s allocation on the same observations.

Two jobs share a cluster whose spare cores fit only part of what their data workers want.
Each is played as its chief would report it (the input queue that the simulator's ground
truth gives for its plan's data workers, as in ``test_optimizer_data_workers``). Job A's
search runs first and ends when the cluster has no room for its next step; the cluster
level then gives it what its queue says it needs. Job B's search then ends on what A left,
and the next round divides the data-worker CPUs by SRTF: B, nearly done, is served first.
Each round's data workers must be the simulator's allocation
(:func:`stride.sim.dataworkers.allocation_request`) for the same jobs and budget.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import pytest

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.bus.client import Bus
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.optimizer.adapters.convert import features_from_spec
from stride.optimizer.app import build
from stride.optimizer.settings import OptimizerSettings
from stride.policy.cold_start import COLD_START, ColdStartRequest
from stride.policy.goldminer import AllocationPolicy, allocate_data_worker_cpus
from stride.policy.plans import Plan, Role
from stride.runtime.lifecycle import ServiceHost
from stride.sim.dataworkers import DataWorkerJob, ElasticJob, allocation_request, observe_queue
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service

from . import test_optimizer_data_workers as tuning
from .test_optimizer_data_workers import RULE, Chief, Stub, configuration, settings
from .test_optimizer_service import admission, publish_admission, publish_finished

pytestmark = pytest.mark.integration

stub = tuning.stub
bus = tuning.bus
"""The tuning test's fixtures, over this module's optimizer."""

SPARE_UNITS = 7
"""Tuner CPUs (half cores) no training pod holds: fewer than the two jobs want (5 and 4)."""
BATCH = 512
ALLOCATION = "goldminer-cluster-allocation"


def decision(job_id: str, records: int) -> job_pb2.AdmissionDecision:
    made = admission(job_id)
    made.spec.dataset.record_count = records
    return made


A = decision("job-alloc-a", 1_000_000)
B = decision("job-alloc-b", 50_000)


def first_plan(made: job_pb2.AdmissionDecision) -> Plan:
    """Plan 1 as the optimizer makes it (its cold start: no config DB, no share)."""
    reply = COLD_START.run(ColdStartRequest(features_from_spec(made.spec), None))
    plan: Plan = reply.plan
    return plan


def training_workers(plan: Plan) -> int:
    return sum(r.count for r in plan.roles if r.role in (Role.CHIEF, Role.WORKER))


def ground_truth(made: job_pb2.AdmissionDecision, units_for_full_speed: int) -> DataWorkerJob:
    """A job whose full speed (1 step/s) takes ``units_for_full_speed`` data-worker CPUs;
    its training worker (one unit) is never the bottleneck below it."""
    gpus = training_workers(first_plan(made))
    return DataWorkerJob(
        job_id=made.job_id,
        submit_time=0.0,
        gpus=gpus,
        steps=10_000.0,
        training_cpu_per_gpu=0.5,
        preprocessing_cpu_per_gpu=units_for_full_speed / gpus,
    )


JOB_A = ground_truth(A, 5)
JOB_B = ground_truth(B, 4)


@pytest.fixture
async def optimizer(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    held = sum(first_plan(made).total_cpu() for made in (A, B))
    base: OptimizerSettings = settings(nats_url, postgres_url)
    chosen = base.model_copy(
        update={
            "cluster_cpu": held + SPARE_UNITS * RULE.cpu_unit,
            "cluster_memory_gib": 10_000.0,
            "data_worker_allocation": "srtf",
            # Rounds only when a search ends or a job finishes: the test knows when.
            "allocation_interval_seconds": 3600.0,
        }
    )
    async with running_service(build, chosen) as host:
        yield host


def sizes(plan: plan_pb2.ResourcePlan) -> tuple[float, ...]:
    """Cores of each data worker of the plan, largest first."""
    role = next((r for r in plan.roles if r.role == plan_pb2.ROLE_DATA_WORKER), None)
    if role is None:
        return ()
    cores = [role.cpu] * role.count
    for override in role.overrides:
        cores[override.index] = override.cpu
    return tuple(sorted(cores, reverse=True))


async def search(chief: Chief, job: DataWorkerJob) -> plan_pb2.ResourcePlan:
    """Report windows until the job's search has ended; the last plan it made."""
    plan = await chief.first_plan()
    for _ in range(12):
        seen = len(await chief.tuning_events())
        await chief.report(plan, observe_queue(job, configuration(plan)))

        async def stepped(seen: int = seen) -> list[optimization_pb2.OptimizationEvent]:
            events = await chief.tuning_events()
            assert len(events) > seen, f"{len(events)} tuning events"
            return events[seen:]

        new = [e.detail for e in await assert_eventually(stepped, timeout=20)]
        made: pb.ListPlansResponse = await chief.stub.ListPlans(
            pb.ListPlansRequest(job_id=chief.job_id)
        )
        searched = [p for p in made.plans if not p.algorithm.startswith(ALLOCATION)]
        plan = searched[-1]
        if any("tuning ends" in detail or detail.startswith("keep") for detail in new):
            return plan
    raise AssertionError(f"{job.job_id}'s search did not end: {new}")


async def allocated(chief: Chief, after: int) -> plan_pb2.ResourcePlan:
    """The job's plan once the cluster level gave it one newer than version ``after``."""

    async def given() -> plan_pb2.ResourcePlan:
        plan = await chief.plan()
        assert plan.version > after, f"still plan {plan.version}"
        assert plan.algorithm.startswith(ALLOCATION), plan.algorithm
        return plan

    return await assert_eventually(given, timeout=20)


def remaining(made: job_pb2.AdmissionDecision, chief: Chief) -> int:
    total = made.spec.dataset.record_count * made.spec.termination.max_epochs
    return math.ceil((total - chief.step * BATCH) / BATCH)


def expected(
    jobs: list[tuple[DataWorkerJob, int, int]], budget: int
) -> dict[str, tuple[float, ...]]:
    """The simulator's allocation: data-worker cores per job."""
    elastic = [ElasticJob(job, 1, left, size) for job, left, size in jobs]
    reply = allocate_data_worker_cpus(allocation_request(AllocationPolicy.SRTF, budget, elastic))
    return {
        a.job_id: tuple(size * RULE.cpu_unit for size in a.data_worker_sizes)
        for a in reply.allocations
    }


async def test_the_cluster_level_divides_data_worker_cpus_as_the_simulator_does(
    stub: Stub,
    bus: Bus,
) -> None:
    for made in (A, B):
        await publish_admission(bus, made)
    chief_a, chief_b = Chief(bus, stub, A.job_id), Chief(bus, stub, B.job_id)
    await chief_b.first_plan()

    # A's search grows one data worker to 4 units, and a second does not fit: it ends.
    searched = await search(chief_a, JOB_A)
    assert sizes(searched) == (2.0,), searched
    details = [e.detail for e in await chief_a.tuning_events()]
    assert any("tuning ends: cluster capacity" in detail for detail in details), details
    # Alone, A gets what its queue needs: 5 units (1 step/s at 0.2 a unit), as the
    # simulator gives it from the 7 spare.
    alone = await allocated(chief_a, searched.version)
    wanted = expected([(JOB_A, remaining(A, chief_a), 4)], SPARE_UNITS)
    assert sizes(alone) == wanted[A.job_id] == (2.0, 0.5), (sizes(alone), wanted)

    # B's search ends on the 2 units A left; then SRTF serves B (76 steps left against
    # A's thousands) up to its ideal 4 units, and A gets the rest.
    searched_b = await search(chief_b, JOB_B)
    assert sizes(searched_b) == (1.0,), searched_b
    shared_b = await allocated(chief_b, searched_b.version)
    shared_a = await allocated(chief_a, alone.version)
    wanted = expected(
        [(JOB_A, remaining(A, chief_a), 4), (JOB_B, remaining(B, chief_b), 2)], SPARE_UNITS
    )
    got = {A.job_id: sizes(shared_a), B.job_id: sizes(shared_b)}
    assert got == wanted == {A.job_id: (1.5,), B.job_id: (1.0, 1.0)}, (got, wanted)

    # Each change is explained, by the allocation and its policy.
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=B.job_id))
    last = explained.explanations[-1]
    assert last.plan.version == shared_b.version
    assert last.algorithm.startswith("goldminer-cluster-allocation")
    assert last.detail.startswith("cluster allocation (srtf): 4 of 7 data-worker CPUs"), last

    # B finishes: its CPUs are free, and the round that follows gives A its 5 units again.
    await publish_finished(bus, B.job_id)
    regrown = await allocated(chief_a, shared_a.version)
    wanted = expected([(JOB_A, remaining(A, chief_a), 4)], SPARE_UNITS)
    assert sizes(regrown) == wanted[A.job_id] == (2.0, 0.5), (sizes(regrown), wanted)
