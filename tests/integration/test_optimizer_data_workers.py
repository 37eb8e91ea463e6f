"""GoldMiner's job-level tuner in the live optimizer (real NATS, a real database), played
against ``stride sim --env dataworkers``'s search on the same observations.

A job is played as its chief would report it: each step window carries the input queue that
the simulator's ground truth (:func:`stride.sim.dataworkers.observe_queue`) gives for the
data workers of the job's current plan. The optimizer reads the queue, steps the tuner
through its ``tune_data_workers`` port and publishes the data workers as the next plan; the
player reads them back from the plan. The sequence of configurations and actions must be the
one the simulator's search (:func:`stride.sim.dataworkers.tuning_replies`) makes with the
optimizer's own tuner configuration.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import metrics_pb2, optimization_pb2, plan_pb2
from stride.optimizer.app import build
from stride.optimizer.domain.feeding import FeedRule
from stride.optimizer.settings import OptimizerSettings
from stride.policy.goldminer import PipelineConfiguration, QueueObservation
from stride.runtime.lifecycle import ServiceHost
from stride.sim.dataworkers import DataWorkerJob, observe_queue, tuning_replies
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import dead_letters

from .test_optimizer_service import admission, optimizer_settings, publish_admission

pytestmark = pytest.mark.integration

Stub = Any
INTERVAL = 30.0
RULE = FeedRule(
    interval_seconds=INTERVAL, cpu_unit=0.5, max_data_worker_cpu=2.0, max_data_workers=4
)
"""A laptop's rule: half-core units, data workers of up to 2 cores."""
JOB = DataWorkerJob(
    job_id="job-feed",
    submit_time=0.0,
    gpus=1,
    steps=10_000.0,
    training_cpu_per_gpu=0.5,
    preprocessing_cpu_per_gpu=5.0,
)
"""A CPU-heavy input pipeline: ten of its pre-processing CPUs per training CPU."""


def settings(nats_url: str, database_url: str) -> OptimizerSettings:
    base = optimizer_settings(nats_url, database_url)
    return base.model_copy(
        update={
            # Only the tuner decides here: no stage-step window closes in this test.
            "tick_seconds": 86_400.0,
            "tuning_interval_seconds": RULE.interval_seconds,
            "data_worker_cpu_unit": RULE.cpu_unit,
            "max_data_worker_cpu": RULE.max_data_worker_cpu,
            "max_data_workers": RULE.max_data_workers,
            # The job-level search alone (the cluster level's rounds would then trim what
            # it found to what the queue needs: test_optimizer_data_worker_allocation.py).
            "data_worker_allocation": "off",
        }
    )


@pytest.fixture
async def optimizer(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    async with running_service(build, settings(nats_url, postgres_url)) as host:
        yield host


@pytest.fixture
async def stub(optimizer: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as channel:
        yield pb_grpc.OptimizerServiceStub(channel)


@pytest.fixture
async def bus(optimizer: ServiceHost, nats_url: str) -> AsyncIterator[Bus]:
    producer = await producer_bus(nats_url, name="test-chief")
    try:
        yield producer
    finally:
        await producer.close()


class Chief:
    """Reports step windows as a job's chief would, with the queue the ground truth gives."""

    def __init__(self, bus: Bus, stub: Stub, job_id: str) -> None:
        self.bus = bus
        self.stub = stub
        self.job_id = job_id
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)
        self.step = 0
        self.reports = itertools.count()

    async def plan(self) -> plan_pb2.ResourcePlan:
        reply: pb.GetPlanResponse = await self.stub.GetPlan(pb.GetPlanRequest(job_id=self.job_id))
        return reply.plan

    async def first_plan(self) -> plan_pb2.ResourcePlan:
        async def made() -> plan_pb2.ResourcePlan:
            try:
                return await self.plan()
            except grpc.aio.AioRpcError as error:
                raise AssertionError(f"no plan yet: {error.code().name}") from None

        return await assert_eventually(made, timeout=20)

    async def tuning_events(self) -> list[optimization_pb2.OptimizationEvent]:
        events = await self.stub.ListOptimizationEvents(
            pb.ListOptimizationEventsRequest(job_id=self.job_id)
        )
        return [e for e in events.events if e.root_cause == optimization_pb2.ROOT_CAUSE_INPUT_QUEUE]

    async def report(self, plan: plan_pb2.ResourcePlan, queue: QueueObservation) -> None:
        """One window of INTERVAL seconds of training under ``plan``, read from its data
        workers."""
        steps = 30
        self.step += steps
        self.clock += timedelta(seconds=INTERVAL)
        metrics = metrics_pb2.StepMetrics(
            job_id=self.job_id,
            pod_name=f"{self.job_id}-chief-0",
            global_step=self.step,
            steps=steps,
            step_seconds=INTERVAL / steps,
            samples_per_second=queue.throughput * 512,
            samples_consumed=self.step * 512,
            plan_version=plan.version,
            input_queue=metrics_pb2.InputQueue(
                data_workers=configuration(plan).data_workers,
                enqueue_rate=queue.enqueue_rate,
                dequeue_rate=queue.dequeue_rate,
                wait_share=0.0,
                queue_length=int(queue.queue_length),
                steps_per_second=queue.throughput,
                queue_capacity=queue.queue_capacity,
            ),
        )
        metrics.reported_at.FromDatetime(self.clock)
        await self.bus.publish(
            topics.STEP_METRICS, self.job_id, metrics, f"{self.job_id}.w.{next(self.reports)}"
        )


def configuration(plan: plan_pb2.ResourcePlan) -> PipelineConfiguration:
    """The tuner's configuration a plan holds (what the player reads back)."""
    role = next((r for r in plan.roles if r.role == plan_pb2.ROLE_DATA_WORKER), None)
    if role is None or role.count == 0:
        return PipelineConfiguration(0, 0, 1)
    units = role.cpu / RULE.cpu_unit
    assert units == round(units), f"data workers of {role.cpu} cores: not whole units"
    return PipelineConfiguration(role.count, round(units), 1)


async def test_a_job_is_given_the_data_workers_the_simulators_search_gives_it(
    stub: Stub, bus: Bus
) -> None:
    expected = tuning_replies(RULE.config(), lambda c: observe_queue(JOB, c))
    await publish_admission(bus, admission(JOB.job_id))
    chief = Chief(bus, stub, JOB.job_id)
    first = await chief.first_plan()
    played = []
    plan = first
    for _ in range(len(expected) + 2):
        seen = len(await chief.tuning_events())
        await chief.report(plan, observe_queue(JOB, configuration(plan)))

        async def stepped(seen: int = seen) -> list[optimization_pb2.OptimizationEvent]:
            events = await chief.tuning_events()
            assert len(events) > seen, f"{len(events)} tuning events"
            return events

        events = await assert_eventually(stepped, timeout=20)
        plan = await chief.plan()
        played.append((configuration(plan), events[-1].detail))
        if events[-1].detail.split(":")[0] in ("keep", "fall-back", "roll-back"):
            break  # converged
    wanted = [(reply.configuration, reply.action.value) for reply in expected]
    got = [(config, detail.split(":")[0]) for config, detail in played]
    assert got == wanted, f"live {got}\nsim  {wanted}"
    # The job ends with two data workers of 2 cores (4 units of 0.5) each, which keep its
    # queue full: five times the throughput it had without them.
    final = next(r for r in plan.roles if r.role == plan_pb2.ROLE_DATA_WORKER)
    assert (final.count, final.cpu) == (2, 2.0)
    worker = next(r for r in first.roles if r.role == plan_pb2.ROLE_WORKER)
    assert final.memory_bytes == worker.memory_bytes
    explanations = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=JOB.job_id))
    explained = explanations.explanations[-1]
    assert explained.plan.version == plan.version
    assert explained.algorithm.startswith("goldminer-tune-step")
    assert explained.root_cause == "input_queue"
    assert "add-data-worker" in explained.detail
    # The search has converged: more windows change nothing.
    count = len(await chief.tuning_events())
    await chief.report(plan, observe_queue(JOB, configuration(plan)))
    await chief.report(plan, observe_queue(JOB, configuration(plan)))
    assert len(await chief.tuning_events()) == count
    assert (await chief.plan()).version == plan.version


async def test_a_bad_input_queue_is_dead_lettered_naming_its_field(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    await publish_admission(bus, admission("job-badq"))
    chief = Chief(bus, stub, "job-badq")
    plan = await chief.first_plan()
    bad = metrics_pb2.StepMetrics(
        job_id="job-badq",
        pod_name="job-badq-chief-0",
        global_step=100,
        steps=1,
        step_seconds=1.0,
        plan_version=plan.version,
        input_queue=metrics_pb2.InputQueue(queue_length=9, queue_capacity=4),
    )
    bad.reported_at.FromDatetime(chief.clock)
    await bus.publish(topics.STEP_METRICS, "job-badq", bad, "job-badq.bad")

    async def parked() -> list[Any]:
        found = await dead_letters(nats_url, "optimizer-step-metrics")
        assert found, "nothing dead-lettered"
        return found

    found = await assert_eventually(parked, timeout=20)
    reasons = " ".join((m.headers or {})["Stride-Dead-Letter-Reason"] for m in found)
    assert "input_queue.queue_capacity" in reasons
    # Nothing of it reached the tuner.
    assert await chief.tuning_events() == []


async def test_an_operators_data_workers_end_the_search_and_stay(stub: Stub, bus: Bus) -> None:
    await publish_admission(bus, admission("job-oper"))
    chief = Chief(bus, stub, "job-oper")
    await chief.first_plan()
    scaled = await stub.ScaleJob(pb.ScaleJobRequest(job_id="job-oper", workers=1, data_workers=2))
    plan = scaled.plan
    assert configuration(plan).data_workers == 2
    for _ in range(3):
        await chief.report(plan, observe_queue(JOB, configuration(plan)))

    async def ended() -> list[optimization_pb2.OptimizationEvent]:
        events = await chief.tuning_events()
        assert events, "no tuning event yet"
        return events

    (event,) = await assert_eventually(ended, timeout=20)
    assert event.detail == "data-worker tuning ended: an operator's plan set the data workers"
    assert (await chief.plan()).version == plan.version
