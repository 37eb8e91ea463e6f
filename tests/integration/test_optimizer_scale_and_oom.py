"""The optimizer's operator override (ScaleJob) and its OOM relaunch rule, on real NATS
and a real database."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import optimization_pb2, plan_pb2, pod_pb2
from stride.optimizer.app import build
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import dead_letters, stream_messages

from .test_optimizer_service import admission, optimizer_settings, publish_admission

pytestmark = pytest.mark.integration

Stub = Any


@pytest.fixture
async def optimizer(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    async with running_service(build, optimizer_settings(nats_url, postgres_url)) as host:
        yield host


@pytest.fixture
async def stub(optimizer: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as channel:
        yield pb_grpc.OptimizerServiceStub(channel)


@pytest.fixture
async def bus(optimizer: ServiceHost, nats_url: str) -> AsyncIterator[Bus]:
    producer = await producer_bus(nats_url, name="test-producer")
    try:
        yield producer
    finally:
        await producer.close()


async def plans_on_the_bus(nats_url: str, job_id: str, count: int) -> list[plan_pb2.ResourcePlan]:
    async def probe() -> list[plan_pb2.ResourcePlan]:
        found = await stream_messages(nats_url, topics.PLAN.subject(job_id))
        assert len(found) >= count, f"{len(found)} plan messages"
        return [plan_pb2.ResourcePlan.FromString(m.data) for m in found]

    return await assert_eventually(probe, timeout=20)


def role(plan: plan_pb2.ResourcePlan, wanted: int) -> plan_pb2.RoleResources:
    return next(r for r in plan.roles if r.role == wanted)


async def test_scale_publishes_the_next_version_as_an_override(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    await publish_admission(bus, admission("job-scale"))
    first = (await plans_on_the_bus(nats_url, "job-scale", 1))[0]
    reply = await stub.ScaleJob(
        pb.ScaleJobRequest(job_id="job-scale", workers=3, ps=2, reason="demo")
    )
    assert reply.plan.version == 2 and reply.plan.algorithm == "manual"
    assert role(reply.plan, plan_pb2.ROLE_WORKER).count == 3
    assert role(reply.plan, plan_pb2.ROLE_PS).count == 2
    assert (
        role(reply.plan, plan_pb2.ROLE_WORKER).memory_bytes
        == role(first, plan_pb2.ROLE_WORKER).memory_bytes
    )
    published = await plans_on_the_bus(nats_url, "job-scale", 2)
    assert published[1] == reply.plan
    events = await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id="job-scale"))
    assert events.events[-1].root_cause == optimization_pb2.ROOT_CAUSE_OVERRIDE
    assert "manual scale by operator to 3 workers and 2 PS: demo" in events.events[-1].detail
    again = await stub.ScaleJob(pb.ScaleJobRequest(job_id="job-scale", workers=1))
    assert again.plan.version == 3
    assert role(again.plan, plan_pb2.ROLE_PS).count == 2  # ps 0 keeps the current count
    # Data workers (GoldMiner): the first ones are sized as the job's workers; unset keeps
    # them, 0 removes them.
    fed = await stub.ScaleJob(pb.ScaleJobRequest(job_id="job-scale", workers=1, data_workers=2))
    data, worker = role(fed.plan, plan_pb2.ROLE_DATA_WORKER), role(fed.plan, plan_pb2.ROLE_WORKER)
    assert (data.count, data.cpu, data.memory_bytes) == (2, worker.cpu, worker.memory_bytes)
    events = await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id="job-scale"))
    assert "to 1 workers and 2 data workers" in events.events[-1].detail
    kept = await stub.ScaleJob(pb.ScaleJobRequest(job_id="job-scale", workers=2))
    assert role(kept.plan, plan_pb2.ROLE_DATA_WORKER).count == 2
    none = await stub.ScaleJob(pb.ScaleJobRequest(job_id="job-scale", workers=2, data_workers=0))
    assert role(none.plan, plan_pb2.ROLE_DATA_WORKER).count == 0


async def test_scale_refuses_bad_input_and_changes_nothing(stub: Stub, bus: Bus) -> None:
    for request, code, field in (
        (pb.ScaleJobRequest(job_id="", workers=1), grpc.StatusCode.INVALID_ARGUMENT, "job_id"),
        (pb.ScaleJobRequest(job_id="job-none", workers=1), grpc.StatusCode.NOT_FOUND, "job"),
        (
            pb.ScaleJobRequest(job_id="job-none", workers=0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "workers",
        ),
        (
            pb.ScaleJobRequest(job_id="job-none", workers=-2),
            grpc.StatusCode.INVALID_ARGUMENT,
            "workers",
        ),
        (
            pb.ScaleJobRequest(job_id="job-none", workers=1, ps=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "ps",
        ),
        (
            pb.ScaleJobRequest(job_id="job-none", workers=1, data_workers=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "data_workers",
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ScaleJob(request)
        assert raised.value.code() == code, request
        assert field in str(raised.value.details())


def oom_event(job_id: str, pod_role: plan_pb2.Role.ValueType, index: int) -> pod_pb2.PodEvent:
    return pod_pb2.PodEvent(
        job_id=job_id,
        pod_name=f"{job_id}-pod-{index}",
        role=pod_role,
        index=index,
        phase=pod_pb2.POD_PHASE_FAILED,
        reason=pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
    )


async def test_a_worker_oom_doubles_worker_memory_once_under_redelivery(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    await publish_admission(bus, admission("job-oom"))
    first = (await plans_on_the_bus(nats_url, "job-oom", 1))[0]
    event = oom_event("job-oom", plan_pb2.ROLE_WORKER, 0)
    await bus.publish(topics.POD_FAILED, "job-oom", event, "job-oom-pod-0.failed.0")
    plans = await plans_on_the_bus(nats_url, "job-oom", 2)
    grown = plans[1]
    assert (
        role(grown, plan_pb2.ROLE_WORKER).memory_bytes
        == 2 * role(first, plan_pb2.ROLE_WORKER).memory_bytes
    )
    assert "OOM" in grown.reason
    # The same failure again (same id, as a redelivery has) changes nothing.
    await bus.js.publish(
        topics.POD_FAILED.subject("job-oom"),
        event.SerializeToString(),
        headers={
            "Stride-Type": event.DESCRIPTOR.full_name,
            "Nats-Msg-Id": "job-oom-pod-0.failed.0",
        },
    )
    # A non-OOM failure makes no plan either; then a marker proves both were handled.
    error = pod_pb2.PodEvent(
        job_id="job-oom",
        pod_name="job-oom-pod-1",
        index=1,
        reason=pod_pb2.POD_FAILURE_REASON_ERROR,
    )
    await bus.publish(topics.POD_FAILED, "job-oom", error, "job-oom-pod-1.failed.0")
    ps_event = oom_event("job-oom", plan_pb2.ROLE_PS, 0)
    await bus.publish(topics.POD_FAILED, "job-oom", ps_event, "job-oom-ps-0.failed.0")
    plans = await plans_on_the_bus(nats_url, "job-oom", 3)
    assert len(plans) == 3
    # A PS OOM goes through the stage step's OOM rule, as in the simulator: with no memory
    # growth measured yet, the PS memory doubles (in whole GiB) and the count stays.
    gib = 1024**3
    ps_before = role(first, plan_pb2.ROLE_PS)
    assert role(plans[2], plan_pb2.ROLE_PS).count == ps_before.count
    assert (
        role(plans[2], plan_pb2.ROLE_PS).memory_bytes
        == 2 * math.ceil(ps_before.memory_bytes / gib) * gib
    )
    assert plans[2].algorithm == "stride-stage-step/1"
    events = await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id="job-oom"))
    assert [e.root_cause for e in events.events].count(optimization_pb2.ROOT_CAUSE_OOM) == 2
    # No executor runs here: the pool's failure is recorded and the step ran in-process.
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id="job-oom"))
    assert "ran in the optimizer: no executor replica answers" in (
        explained.explanations[2].fallback
    )
    assert explained.explanations[1].algorithm == "dlrover-adjust/1"


async def test_an_oom_of_an_unknown_job_is_dead_lettered(bus: Bus, nats_url: str) -> None:
    event = oom_event("job-ghost", plan_pb2.ROLE_WORKER, 0)
    await bus.publish(topics.POD_FAILED, "job-ghost", event, "ghost.failed.0")

    async def parked() -> list[Any]:
        found = await dead_letters(nats_url, "optimizer-pod-failed")
        assert found
        return found

    found = await assert_eventually(parked, timeout=20)
    assert "job-ghost" in (found[0].headers or {})["Stride-Dead-Letter-Reason"]
