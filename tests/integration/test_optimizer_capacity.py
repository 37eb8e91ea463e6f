"""The optimizer never publishes more than the cluster has free (real NATS and PostgreSQL).

Two DLRM jobs whose stage steps both want to grow, on a cluster with room for little more
than their first plans: every plan published, at every moment, fits in the capacity with
the other job's plan; a growth that does not fit is held and says so (the window's event,
``stride explain``'s bound); an operator's plan that does not fit is refused, naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import plan_pb2
from stride.optimizer.app import build
from stride.optimizer.domain.tuning import pods_of
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import stream_messages

from .test_optimizer_stages import (
    SimulatedAgent,
    admission,
    as_policy_plan,
    dlrm_job,
    plans,
    settings,
    stored_view,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GIB = 1024**3
JOBS = ("job-cap-a", "job-cap-b")
CPU, MEMORY = 42.0, 400.0


def totals(plan: plan_pb2.ResourcePlan) -> tuple[float, float]:
    policy_plan = as_policy_plan(plan)
    return policy_plan.total_cpu(), policy_plan.total_memory_bytes() / GIB


@pytest.fixture
async def optimizer(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    # Room for the two cold-start plans (17 cores each: a 1-core chief, an 8-core worker,
    # two 4-core PS) and 8 cores more: one job's first probe (its worker at 16 cores), not
    # both jobs'.
    values = settings(nats_url, postgres_url, cluster_cpu=CPU, cluster_memory_gib=MEMORY)
    async with running_service(build, values) as host:
        yield host


@pytest.fixture
async def stub(optimizer: ServiceHost) -> AsyncIterator[Any]:
    async with aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as channel:
        yield pb_grpc.OptimizerServiceStub(channel)


@pytest.fixture
async def bus(optimizer: ServiceHost, nats_url: str) -> AsyncIterator[Bus]:
    producer = await producer_bus(nats_url, name="test-agent")
    try:
        yield producer
    finally:
        await producer.close()


async def all_plans(nats_url: str) -> dict[str, list[plan_pb2.ResourcePlan]]:
    found: dict[str, list[plan_pb2.ResourcePlan]] = {}
    for job_id in JOBS:
        messages = await stream_messages(nats_url, topics.PLAN.subject(job_id))
        found[job_id] = [plan_pb2.ResourcePlan.FromString(m.data) for m in messages]
    return found


def fits_at_every_moment(history: dict[str, list[plan_pb2.ResourcePlan]]) -> None:
    """Replay the plans in publication order: the newest plan of each job, summed, never
    exceeds the capacity."""
    events = sorted(
        (
            (plan.created_at.ToNanoseconds(), job_id, plan)
            for job_id, job_plans in history.items()
            for plan in job_plans
        ),
        key=lambda e: e[0],
    )
    held: dict[str, tuple[float, float]] = {}
    for _, job_id, plan in events:
        held[job_id] = totals(plan)
        cpu = sum(c for c, _ in held.values())
        memory = sum(m for _, m in held.values())
        assert cpu <= CPU + 1e-9 and memory <= MEMORY + 1e-9, (job_id, plan.version, held)


async def test_plans_never_exceed_free_capacity_and_a_held_growth_says_why(
    stub: Any, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    agents = {}
    versions = {}
    pods = {}
    for index, job_id in enumerate(JOBS):
        spec = dlrm_job(seed=3, index=4 + index)
        await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.adm")
        first = (await plans(nats_url, job_id, 1))[0]
        start = pods_of(as_policy_plan(first))
        assert start is not None
        agents[job_id] = SimulatedAgent(bus, job_id, spec, postgres_url)
        versions[job_id], pods[job_id] = 1, start
    for window in range(1, 4):
        for job_id in JOBS:
            await agents[job_id].run_window(versions[job_id], pods[job_id])

            async def decided(job_id: str = job_id, window: int = window) -> bool:
                stored = stored_view(postgres_url, job_id)
                assert stored["sample_count"] == window and stored["pending"] == -1, stored
                return True

            await assert_eventually(decided, timeout=20)
            newest = (await all_plans(nats_url))[job_id][-1]
            versions[job_id] = newest.version
            grown = pods_of(as_policy_plan(newest))
            assert grown is not None
            pods[job_id] = grown
    history = await all_plans(nats_url)
    fits_at_every_moment(history)
    # Somebody wanted to grow and was held for room, and said so.
    held = []
    for job_id in JOBS:
        events = await stub.ListOptimizationEvents(
            pb.ListOptimizationEventsRequest(job_id=job_id), timeout=5
        )
        held += [e.detail for e in events.events if "held: cluster capacity" in e.detail]
    assert held, "no growth was held although the cluster had no room for both probes"
    assert "more cores" in held[0] and "are free" in held[0]


async def test_an_operator_plan_that_does_not_fit_is_refused_and_changes_nothing(
    stub: Any, bus: Bus, nats_url: str
) -> None:
    job_id = JOBS[0]
    spec = dlrm_job(seed=3, index=4)
    await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.adm")
    await plans(nats_url, job_id, 1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ScaleJob(pb.ScaleJobRequest(job_id=job_id, workers=32), timeout=5)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cluster capacity" in (refused.value.details() or "")

    async def one_plan() -> bool:
        assert len(await stream_messages(nats_url, topics.PLAN.subject(job_id))) == 1
        return True

    await assert_eventually(one_plan, timeout=5)
    reply = await stub.ScaleJob(pb.ScaleJobRequest(job_id=job_id, workers=2), timeout=5)
    assert reply.plan.version == 2
