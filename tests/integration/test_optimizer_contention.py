"""Contended plans and admission's shares in the live optimizer (real NATS and PostgreSQL).

- A growth the cluster cannot hold is kept as a claim; when capacity frees (the other job
  finishes) the claims are settled by the cluster's weighted greedy and the held job gets
  its plan, with an explanation naming the grant (DLRover-RM sec. 4.3, eq. 11-14).
- A job's plan never exceeds the share admission publishes for it: a smaller share shrinks
  the plan, an operator's plan beyond it is refused naming the share, an older share version
  changes nothing, and a malformed share is dead-lettered with nothing changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from sqlalchemy import create_engine, text

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.db.engine import schema_for
from stride.events.v1 import job_pb2, plan_pb2
from stride.optimizer.app import build
from stride.optimizer.domain.tuning import pods_of
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import stream_messages

from .test_optimizer_capacity import CPU, MEMORY, totals
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


@pytest.fixture
async def optimizer(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    values = settings(
        nats_url, postgres_url, cluster_cpu=CPU, cluster_memory_gib=MEMORY, enforce_shares=True
    )
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


def open_claims(database_url: str) -> dict[str, int]:
    """The optimizer's open claims: job -> the plan version each was made against."""
    schema = schema_for(database_url, "optimizer")
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(f'SELECT job_id, plan_version FROM "{schema}".claims'))
            return {row.job_id: row.plan_version for row in rows}
    finally:
        engine.dispose()


def stored_share_versions(database_url: str) -> dict[str, int]:
    """The share version the optimizer stored for each job."""
    schema = schema_for(database_url, "optimizer")
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(f'SELECT job_id, version FROM "{schema}".shares'))
            return {row.job_id: row.version for row in rows}
    finally:
        engine.dispose()


async def newest(nats_url: str, job_id: str) -> plan_pb2.ResourcePlan:
    return (await plans(nats_url, job_id, 1))[-1]


async def test_a_held_growth_is_granted_by_the_weighted_greedy_when_the_other_job_finishes(
    stub: Any, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    jobs = ("job-claim-a", "job-claim-b")
    agents, versions, pods = {}, {}, {}
    for index, job_id in enumerate(jobs):
        spec = dlrm_job(seed=3, index=4 + index)
        await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.adm")
        start = pods_of(as_policy_plan(await newest(nats_url, job_id)))
        assert start is not None
        agents[job_id] = SimulatedAgent(bus, job_id, spec, postgres_url)
        versions[job_id], pods[job_id] = 1, start
    held_job = ""
    for window in range(1, 5):
        for job_id in jobs:
            await agents[job_id].run_window(versions[job_id], pods[job_id])

            async def decided(job_id: str = job_id, window: int = window) -> bool:
                stored = stored_view(postgres_url, job_id)
                assert stored["sample_count"] == window and stored["pending"] == -1, stored
                return True

            await assert_eventually(decided, timeout=20)
            plan = await newest(nats_url, job_id)
            versions[job_id] = plan.version
            grown = pods_of(as_policy_plan(plan))
            assert grown is not None
            pods[job_id] = grown
            claims = open_claims(postgres_url)
            if job_id in claims:
                # The claim is on the plan the job runs, and nothing else was published.
                assert claims[job_id] == plan.version, (claims, plan.version)
                held_job = job_id
                break
        if held_job:
            break
    assert held_job, "no growth was held although the cluster had no room for both probes"
    other = next(j for j in jobs if j != held_job)
    before = versions[held_job]
    await bus.publish(
        topics.JOB_FINISHED,
        other,
        job_pb2.JobFinished(job_id=other, outcome=job_pb2.JOB_OUTCOME_SUCCEEDED),
        f"{other}.finished",
    )

    async def granted() -> plan_pb2.ResourcePlan:
        plan = await newest(nats_url, held_job)
        assert plan.version == before + 1, plan.version
        return plan

    plan = await assert_eventually(granted, timeout=20)
    cpu, memory = totals(plan)
    assert cpu <= CPU and memory <= MEMORY, (cpu, memory)
    assert open_claims(postgres_url) == {}
    explained = await stub.GetPlanExplanation(
        pb.GetPlanExplanationRequest(job_id=held_job), timeout=5
    )
    last = explained.explanations[-1]
    assert last.plan.version == plan.version
    assert last.root_cause == "contention", last
    assert "weighted greedy" in last.detail and f"{other} finished" in last.detail, last.detail
    assert last.bound == "cluster capacity"
    events = await stub.ListOptimizationEvents(
        pb.ListOptimizationEventsRequest(job_id=held_job), timeout=5
    )
    assert any("granted when" in e.detail for e in events.events)


def share_event(
    job_id: str, version: int, cpu: float, memory_gib: float, reason: str = "arrival"
) -> job_pb2.JobShare:
    return job_pb2.JobShare(
        job_id=job_id,
        version=version,
        share=job_pb2.ResourceShare(cpu=cpu, memory_bytes=int(memory_gib * GIB)),
        units=int(cpu),
        reason=reason,
    )


async def test_a_plan_stays_within_the_share_admission_grants(
    stub: Any, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    job_id = "job-share-a"
    spec = dlrm_job(seed=3, index=4)
    await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.adm")
    first = await newest(nats_url, job_id)
    cpu, memory = totals(first)
    first_pods = pods_of(as_policy_plan(first))
    assert first_pods is not None
    # A share with the plan's memory but fewer cores: the plan is shrunk into it.
    share_cpu = cpu - first_pods.worker_cpu
    await bus.publish(
        topics.JOB_SHARE, job_id, share_event(job_id, 2, share_cpu, memory), f"{job_id}.share.2"
    )

    async def shrunk() -> plan_pb2.ResourcePlan:
        plan = await newest(nats_url, job_id)
        assert plan.version == 2, plan.version
        return plan

    second = await assert_eventually(shrunk, timeout=20)
    assert totals(second)[0] <= share_cpu
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=job_id))
    assert explained.explanations[-1].root_cause == "share"
    assert explained.explanations[-1].bound == "admission share"
    assert "share v2" in explained.explanations[-1].detail
    # An operator's plan beyond the share is refused, naming it.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ScaleJob(pb.ScaleJobRequest(job_id=job_id, workers=8), timeout=5)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "admission share" in (refused.value.details() or "")
    # An older share (redelivered out of order) changes nothing; a bad one is dead-lettered.
    await bus.publish(
        topics.JOB_SHARE, job_id, share_event(job_id, 1, 2.0, 4.0), f"{job_id}.share.1"
    )
    await bus.publish(
        topics.JOB_SHARE, job_id, share_event(job_id, 3, -4.0, memory), f"{job_id}.share.3"
    )

    async def dead() -> list[Any]:
        found = await stream_messages(nats_url, topics.dead_letter_subject("optimizer-shares"))
        assert found, "no dead letter yet"
        return found

    letters = await assert_eventually(dead, timeout=20)
    reasons = [m.headers.get("Stride-Dead-Letter-Reason", "") for m in letters if m.headers]
    assert any("share.cpu" in reason for reason in reasons), reasons
    assert [p.version for p in await plans(nats_url, job_id, 2)] == [1, 2]
    # A larger share lets an operator's plan through again.
    await bus.publish(
        topics.JOB_SHARE, job_id, share_event(job_id, 4, CPU, MEMORY), f"{job_id}.share.4"
    )

    async def scaled() -> bool:
        try:
            reply = await stub.ScaleJob(pb.ScaleJobRequest(job_id=job_id, workers=2), timeout=5)
        except grpc.aio.AioRpcError as error:  # share v4 not applied yet
            raise AssertionError(error.details()) from None
        assert reply.plan.version == 3
        return True

    await assert_eventually(scaled, timeout=20)


async def test_a_share_that_comes_before_the_admission_bounds_plan_1(
    stub: Any, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    job_id = "job-share-first"
    spec = dlrm_job(seed=3, index=4)
    # The share first (admission's two messages reach the optimizer through two consumers,
    # in either order): plan 1 is made within it.
    await bus.publish(
        topics.JOB_SHARE, job_id, share_event(job_id, 1, 9.0, 200.0), f"{job_id}.share.1"
    )

    async def stored() -> bool:
        assert stored_share_versions(postgres_url).get(job_id) == 1
        return True

    await assert_eventually(stored, timeout=10)
    await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.adm")
    first = await newest(nats_url, job_id)
    assert first.version == 1 and totals(first)[0] <= 9.0, totals(first)
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=job_id))
    assert explained.explanations[0].bound == "admission share"


async def test_the_share_an_admission_carries_bounds_plan_1_and_its_own_event_changes_nothing(
    stub: Any, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    job_id = "job-share-inside"
    spec = dlrm_job(seed=3, index=4)
    # Admission puts the job's share in the decision: plan 1 is made within it though the
    # share's own event has not come (it comes after, through the other consumer).
    decision = admission(job_id, spec)
    decision.share.CopyFrom(share_event(job_id, 1, 9.0, 200.0))
    await bus.publish(topics.JOB_ADMITTED, job_id, decision, f"{job_id}.adm")
    first = await newest(nats_url, job_id)
    assert first.version == 1 and totals(first)[0] <= 9.0, totals(first)
    assert stored_share_versions(postgres_url).get(job_id) == 1
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=job_id))
    assert explained.explanations[0].bound == "admission share"
    await bus.publish(
        topics.JOB_SHARE, job_id, share_event(job_id, 1, 9.0, 200.0), f"{job_id}.share.1"
    )
    # A later probe job's plan shows the share event was handled; this job got no plan 2.
    probe = "job-share-probe"
    await bus.publish(topics.JOB_ADMITTED, probe, admission(probe, spec), f"{probe}.adm")
    await newest(nats_url, probe)
    assert [p.version for p in await plans(nats_url, job_id, 1)] == [1]

    # A decision whose share names another job is refused, naming the field.
    bad = admission("job-share-bad", spec)
    bad.share.CopyFrom(share_event("job-other", 1, 9.0, 200.0))
    await bus.publish(topics.JOB_ADMITTED, "job-share-bad", bad, "job-share-bad.adm")

    async def dead() -> list[str]:
        found = await stream_messages(nats_url, topics.dead_letter_subject("optimizer-admitted"))
        reasons = [m.headers.get("Stride-Dead-Letter-Reason", "") for m in found if m.headers]
        assert any("share.job_id" in reason for reason in reasons), reasons
        return reasons

    await assert_eventually(dead, timeout=20)


async def test_a_zero_share_suspends_the_job_and_a_share_back_resumes_its_plan(
    stub: Any, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    job_id = "job-preempted"
    spec = dlrm_job(seed=3, index=4)
    await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.adm")
    first = await newest(nats_url, job_id)
    assert sum(role.count for role in first.roles) >= 3
    # Admission preempts it: a share of zero units. Plan 2 runs no pod (the podwatcher
    # checkpoints the job, then removes them); the sizes stay for the resumption.
    preempted = share_event(job_id, 2, 0.0, 0.0, "preempted for higher-priority jobs (job-x)")
    await bus.publish(topics.JOB_SHARE, job_id, preempted, f"{job_id}.share.2")

    async def suspended() -> plan_pb2.ResourcePlan:
        plan = await newest(nats_url, job_id)
        assert plan.version == 2, plan.version
        return plan

    second = await assert_eventually(suspended, timeout=20)
    assert [role.count for role in second.roles] == [0] * len(first.roles)
    assert [(r.role, r.cpu, r.memory_bytes) for r in second.roles] == [
        (r.role, r.cpu, r.memory_bytes) for r in first.roles
    ]
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=job_id))
    assert explained.explanations[-1].root_cause == "share"
    assert explained.explanations[-1].detail.startswith("suspended: admission's share v2 is zero")
    assert "preempted for higher-priority jobs" in explained.explanations[-1].detail
    # While suspended, no plan with pods is made: an operator's scale is refused.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.ScaleJob(pb.ScaleJobRequest(job_id=job_id, workers=2), timeout=5)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "suspended" in (refused.value.details() or "")
    # The same zero share again (a redelivery, a later round) changes nothing.
    again = share_event(job_id, 3, 0.0, 0.0, "arrival of job-y")
    await bus.publish(topics.JOB_SHARE, job_id, again, f"{job_id}.share.3")
    await assert_eventually(lambda: _share_version(postgres_url, job_id, 3), timeout=10)
    assert [p.version for p in await plans(nats_url, job_id, 2)] == [1, 2]
    # A share again: plan 3 is plan 1's pods, as before the pause.
    back = share_event(job_id, 4, CPU, MEMORY, "capacity freed")
    await bus.publish(topics.JOB_SHARE, job_id, back, f"{job_id}.share.4")

    async def resumed() -> plan_pb2.ResourcePlan:
        plan = await newest(nats_url, job_id)
        assert plan.version == 3, plan.version
        return plan

    third = await assert_eventually(resumed, timeout=20)
    assert [(r.role, r.count, r.cpu) for r in third.roles] == [
        (r.role, r.count, r.cpu) for r in first.roles
    ]
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=job_id))
    assert explained.explanations[-1].detail.startswith("resumed: admission's share v4")


async def _share_version(database_url: str, job_id: str, version: int) -> bool:
    assert stored_share_versions(database_url).get(job_id) == version
    return True
