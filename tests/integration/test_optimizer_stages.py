"""The live loop on real NATS and PostgreSQL: a simulated agent reports what the DLRM
environment's ground truth gives for the plan the optimizer published, and the optimizer
takes the job through its stages, deciding exactly what ``stride sim --env dlrm``'s Stride
policy decides on the same observations."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import create_engine, text

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.bus.signing import logical_message_id
from stride.configdb.app import build as build_configdb
from stride.configdb.settings import ConfigDbSettings
from stride.db.engine import schema_for
from stride.events.v1 import job_pb2, metrics_pb2, optimization_pb2, plan_pb2, pod_pb2
from stride.optimizer.adapters.convert import features_from_spec
from stride.optimizer.adapters.outbound.history import ConfigDbHistory
from stride.optimizer.app import build
from stride.optimizer.domain.tuning import pods_of
from stride.optimizer.settings import OptimizerSettings
from stride.policy.cold_start import cold_start_plan
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.stages import Pods
from stride.policy.warm_start import HistoricalJob
from stride.runtime.lifecycle import ServiceHost
from stride.sim.dlrm import (
    DlrmJobSpec,
    JobView,
    StridePolicy,
    _one,
    generate_jobs,
    load_straggler_covs,
    ps_memory_gib,
)
from stride.testing import SHARED_TRACES
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.processes import ServiceProcess
from stride.testing.streams import dead_letters, stream_messages

from .test_optimizer_service import wait_until_serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GIB = 1024**3
TICK = 60.0
COVS = SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"
Stub = Any


def settings(nats_url: str, database_url: str, **extra: Any) -> OptimizerSettings:
    values: dict[str, Any] = {
        "nats_url": nats_url,
        "database_url": database_url,
        "grpc_port": 0,
        "grpc_host": "127.0.0.1",
        "health_interval_seconds": 0.2,
        "shutdown_grace_seconds": 2,
        "tick_seconds": TICK,
        "min_plan_interval_seconds": 0,
        "decisions": {"stride-stage-step": "inprocess"},
    }
    return OptimizerSettings(**(values | extra))


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
    producer = await producer_bus(nats_url, name="test-agent")
    try:
        yield producer
    finally:
        await producer.close()


def dlrm_job(seed: int, index: int) -> DlrmJobSpec:
    """A job of the simulator's population with no hot PS (the live loop records a
    re-partition but does not order one yet)."""
    jobs = generate_jobs(index + 1, np.random.default_rng(seed), load_straggler_covs(COVS))
    return replace(jobs[index], hot_factor=1.0)


def admission(job_id: str, spec: DlrmJobSpec) -> job_pb2.AdmissionDecision:
    return job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        policy="stride-guarantees/1",
        spec=job_pb2.JobSpec(
            name="dlrm",
            user="alice",
            model=job_pb2.ModelReference(
                name=spec.model_name,
                family="dlrm",
                entrypoint="trainers.dlrm:main",
                embedding_dim=spec.embedding_dim,
                parameter_count=round(spec.model_bytes / 4),
            ),
            dataset=job_pb2.DatasetSpec(name="criteo", record_count=int(spec.total_samples)),
            batch_size=spec.batch_size,
            termination=job_pb2.Termination(max_epochs=1),
        ),
    )


def as_policy_plan(plan: plan_pb2.ResourcePlan) -> Plan:
    return Plan(
        roles=tuple(
            RoleResources(Role(_ROLE[r.role]), r.count, r.cpu, r.memory_bytes) for r in plan.roles
        ),
        reason=plan.reason or "-",
        algorithm=plan.algorithm or "-",
    )


_ROLE = {
    plan_pb2.ROLE_WORKER: "worker",
    plan_pb2.ROLE_PS: "ps",
    plan_pb2.ROLE_CHIEF: "chief",
    plan_pb2.ROLE_DATA_WORKER: "data_worker",
}


async def plans(nats_url: str, job_id: str, count: int) -> list[plan_pb2.ResourcePlan]:
    async def probe() -> list[plan_pb2.ResourcePlan]:
        found = await stream_messages(nats_url, topics.PLAN.subject(job_id))
        assert len(found) >= count, f"{len(found)} plans"
        return [plan_pb2.ResourcePlan.FromString(m.data) for m in found]

    return await assert_eventually(probe, timeout=20)


def stored_view(database_url: str, job_id: str) -> dict[str, Any]:
    """The optimizer's stored view of the job (read from its schema, as an operator would)."""
    schema = schema_for(database_url, "optimizer")
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text(f'SELECT view FROM "{schema}".observations WHERE job_id = :job'),
                {"job": job_id},
            ).one()
        return dict(json.loads(row.view))
    finally:
        engine.dispose()


def stamp(moment: datetime) -> Timestamp:
    value = Timestamp()
    value.FromDatetime(moment)
    return value


class SimulatedAgent:
    """Reports, for the plan the optimizer published, the throughput and memory the DLRM
    environment's ground truth gives, on an accelerated clock (a window per call); and
    keeps the observations the simulator's job master would, for the reference policy."""

    def __init__(self, bus: Bus, job_id: str, spec: DlrmJobSpec, database_url: str) -> None:
        self.bus, self.job_id, self.spec = bus, job_id, spec
        self.database_url = database_url
        self.clock = datetime(2026, 1, 1, tzinfo=UTC)
        self.consumed = 0.0
        self.samples: list[tuple[Pods, float]] = []
        self.sample_count = 0
        self.memory_points: list[tuple[float, float, float]] = []
        self.reports = 0
        self.rng = np.random.default_rng(7)

    def ps_bytes(self, pods: Pods) -> list[int]:
        hot, cold = ps_memory_gib(self.spec, 1.0, pods.ps, self.consumed)
        return [int(hot * GIB)] + [int(cold * GIB)] * (pods.ps - 1)

    def worker_bytes(self) -> int:
        return int(self.spec.worker_mem_need_gib * GIB)

    async def report_usage(self, version: int, pods: Pods) -> None:
        self.clock += timedelta(seconds=1)
        sizes = [("worker", i, self.worker_bytes()) for i in range(pods.workers)]
        sizes += [("ps", i, size) for i, size in enumerate(self.ps_bytes(pods))]
        for role, index, memory in sizes:
            sample = pod_pb2.UsageSample(
                job_id=self.job_id,
                pod_name=f"{self.job_id}-{role}-{index}",
                role=plan_pb2.ROLE_WORKER if role == "worker" else plan_pb2.ROLE_PS,
                cpu_used=1.0,
                memory_used_bytes=memory,
                cpu_limit=float(pods.worker_cpu if role == "worker" else pods.ps_cpu),
                memory_limit_bytes=(pods.worker_mem_gib if role == "worker" else pods.ps_mem_gib)
                * GIB,
                sampled_at=stamp(self.clock),
                plan_version=version,
            )
            self.reports += 1
            await self.bus.publish(
                topics.POD_USAGE, self.job_id, sample, f"{self.job_id}.usage.{self.reports}"
            )
        # Usage and steps travel on different streams; a real job master decides on the
        # newest usage it has. The reference saw this usage, so wait until the live one has.
        moment = self.clock.timestamp()

        async def applied() -> bool:
            usage = stored_view(self.database_url, self.job_id)["usage"]
            assert sum(u["sampled_at"] == moment for u in usage.values()) == len(sizes)
            return True

        await assert_eventually(applied, timeout=20)

    def memory_point(self, pods: Pods) -> tuple[float, float, float]:
        memories = [size / GIB for size in self.ps_bytes(pods)]
        return self.consumed, sum(memories), max(memories)

    async def run_window(self, version: int, pods: Pods) -> JobView:
        """Train one window under ``pods``: usage, then the window's steps. Returns the
        view the simulator's policy decides on after it."""
        if not self.memory_points and self.sample_count == 0:
            # The pods as loaded, before training: the profiler's first memory sample.
            await self.report_usage(version, pods)
            self.memory_points.append(self.memory_point(pods))
        rate = _one(self.spec.params, self.spec, 1.0, pods)[0] * float(
            self.rng.lognormal(0.0, 0.05)
        )
        self.consumed = min(self.spec.total_samples - 1, self.consumed + rate * TICK)
        # The pods' usage at the end of the window, then the window's steps.
        self.clock += timedelta(seconds=TICK * 1.01)
        await self.report_usage(version, pods)
        metrics = metrics_pb2.StepMetrics(
            job_id=self.job_id,
            pod_name=f"{self.job_id}-chief-0",
            global_step=self.sample_count + 1,
            steps=1,
            step_seconds=TICK * 1.01,
            samples_per_second=rate,
            samples_consumed=int(self.consumed),
            reported_at=stamp(self.clock),
            plan_version=version,
        )
        self.reports += 1
        await self.bus.publish(
            topics.STEP_METRICS, self.job_id, metrics, f"{self.job_id}.steps.{self.reports}"
        )
        # What the live view holds after this window (the same numbers, as it parses them).
        self.consumed = float(int(self.consumed))
        self.samples.append((pods, rate))
        same = [i for i, (p, _) in enumerate(self.samples) if p == pods]
        if len(same) > 5:
            del self.samples[same[0]]
        self.sample_count += 1
        self.memory_points.append(self.memory_point(pods))
        del self.memory_points[:-24]
        return JobView(
            reason="tick",
            now=0.0,
            spec=self.spec,
            pods=pods,
            consumed=self.consumed,
            samples=tuple(self.samples),
            sample_count=self.sample_count,
            worker_util=0.5,
            ps_util=0.5,
            worker_memory_used_gib=self.worker_bytes() / GIB,
            memory_points=tuple(self.memory_points),
            hot_detected=False,
            history=(),
            cluster_cpus=10_000,
            queued_jobs=0,
        )


async def test_the_live_optimizer_decides_what_the_simulator_decides(
    stub: Stub, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    job_id = "job-dlrm-1"
    spec = dlrm_job(seed=3, index=4)
    await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.admitted")
    first = (await plans(nats_url, job_id, 1))[0]
    start = pods_of(as_policy_plan(first))
    assert start is not None
    # The simulator's job, as the live job is: its request is the live cold-start plan,
    # its size the admitted spec's (whole records, whole float32 parameters).
    spec = replace(
        spec,
        request=start,
        total_samples=float(int(spec.total_samples)),
        model_bytes=4.0 * round(spec.model_bytes / 4),
    )
    agent = SimulatedAgent(bus, job_id, spec, postgres_url)
    reference = StridePolicy()
    version, pods = 1, start
    changes = 0
    for tick in range(1, 13):
        view = await agent.run_window(version, pods)
        expected = reference.decide(view)

        async def decided(tick: int = tick) -> dict[str, Any]:
            stored = stored_view(postgres_url, job_id)
            assert stored["sample_count"] == tick and stored["pending"] == -1, stored
            return stored

        await assert_eventually(decided, timeout=20)
        published = await plans(nats_url, job_id, version)
        if expected.pods is None:
            assert len(published) == version, f"tick {tick}: the simulator kept the plan"
            continue
        published = await plans(nats_url, job_id, version + 1)
        assert pods_of(as_policy_plan(published[version])) == expected.pods, f"tick {tick}"
        version, pods = version + 1, expected.pods
        changes += 1
    # The job went through sampling and model-based optimisation, as in the simulator.
    explained = await stub.GetPlanExplanation(pb.GetPlanExplanationRequest(job_id=job_id))
    stages = [e.stage for e in explained.explanations]
    assert stages[0] == "cold_start" and "sampling" in stages, stages
    assert changes >= 4
    assert all(e.recorded and e.algorithm for e in explained.explanations)
    sampling = next(e for e in explained.explanations if e.stage == "sampling")
    assert sampling.algorithm == "stride-stage-step/1" and sampling.detail.startswith("probe")
    events = await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id=job_id))
    causes = {e.root_cause for e in events.events}
    assert optimization_pb2.ROOT_CAUSE_SAMPLING in causes


async def test_a_redelivered_window_decides_once_and_bad_metrics_are_dead_lettered(
    stub: Stub, bus: Bus, nats_url: str, postgres_url: str
) -> None:
    job_id = "job-dlrm-2"
    spec = dlrm_job(seed=3, index=4)
    await bus.publish(topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.admitted")
    first = (await plans(nats_url, job_id, 1))[0]
    start = pods_of(as_policy_plan(first))
    assert start is not None
    agent = SimulatedAgent(bus, job_id, replace(spec, request=start), postgres_url)
    await agent.run_window(1, start)
    second = await plans(nats_url, job_id, 2)  # the first probe
    before = stored_view(postgres_url, job_id)
    # The same window again under a new message id (what a crashed agent's retry sends):
    # it is the same report (pod, time), so nothing changes.
    metrics = metrics_pb2.StepMetrics(
        job_id=job_id,
        pod_name=f"{job_id}-chief-0",
        steps=1,
        step_seconds=TICK * 1.01,
        samples_per_second=100.0,
        samples_consumed=10,
        reported_at=stamp(agent.clock),
        plan_version=1,
    )
    await bus.publish(topics.STEP_METRICS, job_id, metrics, f"{job_id}.again")
    # Out of order (older than the pod's last report), impossible values, an unknown job.
    older = metrics_pb2.StepMetrics()
    older.CopyFrom(metrics)
    older.reported_at.CopyFrom(stamp(agent.clock - timedelta(seconds=5)))
    await bus.publish(topics.STEP_METRICS, job_id, older, f"{job_id}.older")
    negative = metrics_pb2.StepMetrics()
    negative.CopyFrom(metrics)
    negative.samples_per_second = -1.0
    negative.reported_at.CopyFrom(stamp(agent.clock + timedelta(seconds=5)))
    await bus.publish(topics.STEP_METRICS, job_id, negative, f"{job_id}.negative")
    ghost = metrics_pb2.StepMetrics()
    ghost.CopyFrom(metrics)
    ghost.job_id = "job-ghost"
    await bus.publish(topics.STEP_METRICS, "job-ghost", ghost, "ghost.steps")

    async def parked() -> list[Any]:
        found = await dead_letters(nats_url, "optimizer-step-metrics")
        assert len(found) == 3, len(found)
        return found

    found = await assert_eventually(parked, timeout=20)
    reasons = " ".join((m.headers or {})["Stride-Dead-Letter-Reason"] for m in found)
    assert "out of order" in reasons
    assert "samples_per_second" in reasons
    assert "job-ghost" in reasons
    assert stored_view(postgres_url, job_id) == before
    assert len(await plans(nats_url, job_id, 2)) == len(second) == 2


async def test_an_operator_plan_holds_and_a_min_interval_holds_too(
    nats_url: str, postgres_url: str
) -> None:
    async with running_service(
        build, settings(nats_url, postgres_url, min_plan_interval_seconds=3600)
    ) as host:
        producer = await producer_bus(nats_url, name="test-agent")
        try:
            job_id = "job-dlrm-3"
            spec = dlrm_job(seed=3, index=4)
            await producer.publish(
                topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.admitted"
            )
            first = (await plans(nats_url, job_id, 1))[0]
            start = pods_of(as_policy_plan(first))
            assert start is not None
            agent = SimulatedAgent(producer, job_id, replace(spec, request=start), postgres_url)
            await agent.run_window(1, start)

            async def held() -> bool:
                stored = stored_view(postgres_url, job_id)
                assert stored["sample_count"] == 1 and stored["pending"] == -1
                return True

            await assert_eventually(held, timeout=20)
            assert len(await plans(nats_url, job_id, 1)) == 1
            async with aio_channel(f"127.0.0.1:{host.server.port}", "optimizer") as channel:
                stub = pb_grpc.OptimizerServiceStub(channel)
                events = await stub.ListOptimizationEvents(
                    pb.ListOptimizationEventsRequest(job_id=job_id)
                )
                assert "held: the last plan is" in events.events[-1].detail
                assert events.events[-1].root_cause == optimization_pb2.ROOT_CAUSE_SAMPLING
                # An operator's plan is never held by the interval, and holds the job.
                scaled = await stub.ScaleJob(
                    pb.ScaleJobRequest(job_id=job_id, workers=start.workers + 1, reason="try")
                )
                assert scaled.plan.version == 2
                pods = pods_of(as_policy_plan(scaled.plan))
                assert pods is not None
                await agent.run_window(2, pods)

                async def held_again() -> bool:
                    stored = stored_view(postgres_url, job_id)
                    assert stored["sample_count"] == 2 and stored["pending"] == -1
                    return True

                await assert_eventually(held_again, timeout=20)
                events = await stub.ListOptimizationEvents(
                    pb.ListOptimizationEventsRequest(job_id=job_id)
                )
                assert "held: an operator's plan holds" in events.events[-1].detail
                assert len(await plans(nats_url, job_id, 2)) == 2
                explained = await stub.GetPlanExplanation(
                    pb.GetPlanExplanationRequest(job_id=job_id)
                )
                assert [e.root_cause for e in explained.explanations] == [
                    "cold_start",
                    "override",
                ]
        finally:
            await producer.close()


async def test_an_optimizer_sigkilled_mid_round_resumes_with_no_plan_duplicated_or_skipped(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """The real process is SIGKILLed right after each window is sent (before, during or
    after its decision) and restarted: the job's view and stage come back from the database,
    the window is decided once, and the plans are the reference's, numbered 1..n once."""
    process = ServiceProcess(
        "optimizer",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": postgres_url,
            "STRIDE_OPTIMIZER_HEALTH_INTERVAL_SECONDS": "0.2",
            "STRIDE_OPTIMIZER_ACK_WAIT_SECONDS": "1",
            "STRIDE_OPTIMIZER_TICK_SECONDS": str(TICK),
            "STRIDE_OPTIMIZER_MIN_PLAN_INTERVAL_SECONDS": "0",
            "STRIDE_OPTIMIZER_DECISIONS": '{"stride-stage-step": "inprocess"}',
        },
        tmp_path,
    ).start()
    bus: Bus | None = None
    try:
        await wait_until_serving(process.address)
        bus = await producer_bus(nats_url, name="test-agent")
        job_id = "job-dlrm-killed"
        spec = dlrm_job(seed=3, index=4)
        await bus.publish(
            topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.admitted"
        )
        first = (await plans(nats_url, job_id, 1))[0]
        start = pods_of(as_policy_plan(first))
        assert start is not None
        spec = replace(
            spec,
            request=start,
            total_samples=float(int(spec.total_samples)),
            model_bytes=4.0 * round(spec.model_bytes / 4),
        )
        agent = SimulatedAgent(bus, job_id, spec, postgres_url)
        reference = StridePolicy()
        version, pods = 1, start
        delays = random.Random(11)
        for tick in range(1, 8):
            view = await agent.run_window(version, pods)
            expected = reference.decide(view)
            await asyncio.sleep(delays.uniform(0.0, 0.05))
            process.kill()
            process.start()
            await wait_until_serving(process.address)

            async def decided(tick: int = tick) -> bool:
                stored = stored_view(postgres_url, job_id)
                assert stored["sample_count"] == tick and stored["pending"] == -1, stored
                return True

            await assert_eventually(decided, timeout=30)
            if expected.pods is not None:
                published = await plans(nats_url, job_id, version + 1)
                assert pods_of(as_policy_plan(published[version])) == expected.pods
                version, pods = version + 1, expected.pods
        messages = await stream_messages(nats_url, topics.PLAN.subject(job_id))
        ids = [logical_message_id((m.headers or {})["Nats-Msg-Id"]) for m in messages]
        assert ids == [f"{job_id}.plan.{v}" for v in range(1, version + 1)]
        async with aio_channel(process.address, "optimizer") as channel:
            stub = pb_grpc.OptimizerServiceStub(channel)
            listed = await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))
            assert [p.version for p in listed.plans] == list(range(1, version + 1))
        assert version >= 4
    finally:
        if bus is not None:
            await bus.close()
        process.kill()


def past_plan(job_id: str, workers: int, ps: int) -> plan_pb2.ResourcePlan:
    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=1,
        reason="final",
        algorithm="stride-stage-step/1",
        roles=[
            plan_pb2.RoleResources(role=plan_pb2.ROLE_CHIEF, count=1, cpu=1.0, memory_bytes=GIB),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_WORKER, count=workers, cpu=2.0, memory_bytes=4 * GIB
            ),
            plan_pb2.RoleResources(role=plan_pb2.ROLE_PS, count=ps, cpu=4.0, memory_bytes=8 * GIB),
        ],
        created_at=stamp(datetime.now(UTC)),
    )


async def test_a_new_job_warm_starts_from_similar_finished_jobs_as_the_simulator_does(
    nats_url: str, postgres_url: str
) -> None:
    """DLRover-RM Alg. 1 live: the config DB's similar finished jobs are the history, and
    the first plan is the simulator's Stride policy's arrival decision on that history."""
    configdb_settings = local_settings(
        ConfigDbSettings, nats_url=nats_url, database_url=postgres_url
    )
    async with running_service(build_configdb, configdb_settings) as configdb:
        address = f"127.0.0.1:{configdb.server.port}"
        optimizer_settings = settings(nats_url, postgres_url, configdb_address=address)
        async with running_service(build, optimizer_settings) as optimizer:
            producer = await producer_bus(nats_url, name="test-history")
            history_source = ConfigDbHistory(address)
            try:
                spec = dlrm_job(seed=3, index=4)
                job_spec = admission("job-any", spec).spec
                for index, (workers, ps) in enumerate(((4, 2), (8, 2), (6, 4))):
                    past = f"job-past-{index}"
                    submitted = job_pb2.JobSubmitted(
                        job_id=past, spec=job_spec, submitted_at=stamp(datetime.now(UTC))
                    )
                    await producer.publish(topics.JOB_SUBMITTED, past, submitted, f"{past}.s")
                    await producer.publish(
                        topics.PLAN, past, past_plan(past, workers, ps), f"{past}.plan.1"
                    )
                    end = job_pb2.JobFinished(
                        job_id=past,
                        outcome=job_pb2.JOB_OUTCOME_SUCCEEDED,
                        finished_at=stamp(datetime.now(UTC)),
                    )
                    await producer.publish(topics.JOB_FINISHED, past, end, f"{past}.f")

                async def recorded() -> tuple[HistoricalJob, ...]:
                    found = await history_source.similar(job_spec)
                    assert len(found) == 3, found
                    return found

                history = await assert_eventually(recorded, timeout=20)
                job_id = "job-dlrm-warm"
                await producer.publish(
                    topics.JOB_ADMITTED, job_id, admission(job_id, spec), f"{job_id}.admitted"
                )
                first = (await plans(nats_url, job_id, 1))[0]
                cold = pods_of(cold_start_plan(features_from_spec(job_spec)))
                assert cold is not None
                reference = StridePolicy().decide(
                    JobView(
                        reason="arrival",
                        now=0.0,
                        spec=replace(spec, request=cold),
                        pods=cold,
                        consumed=0.0,
                        samples=(),
                        sample_count=0,
                        worker_util=0.0,
                        ps_util=0.0,
                        worker_memory_used_gib=0.0,
                        memory_points=(),
                        hot_detected=False,
                        history=history,
                        cluster_cpus=10_000,
                        queued_jobs=0,
                    )
                )
                assert reference.pods is not None and reference.pods != cold
                assert pods_of(as_policy_plan(first)) == reference.pods
                async with aio_channel(
                    f"127.0.0.1:{optimizer.server.port}", "optimizer"
                ) as channel:
                    stub = pb_grpc.OptimizerServiceStub(channel)
                    explained = await stub.GetPlanExplanation(
                        pb.GetPlanExplanationRequest(job_id=job_id)
                    )
                why = explained.explanations[0]
                assert why.algorithm == "stride-stage-step/1"
                assert why.detail.startswith("warm start from 3 similar finished job(s)")
                assert "of 3 candidates from the config DB" in why.detail
            finally:
                await history_source.close()
                await producer.close()


async def test_without_a_reachable_config_db_a_job_starts_cold(
    nats_url: str, postgres_url: str
) -> None:
    unreachable = settings(nats_url, postgres_url, configdb_address="127.0.0.1:9")
    async with running_service(build, unreachable):
        producer = await producer_bus(nats_url, name="test-cold")
        try:
            job_id = "job-dlrm-cold"
            spec = dlrm_job(seed=3, index=4)
            decision = admission(job_id, spec)
            await producer.publish(topics.JOB_ADMITTED, job_id, decision, f"{job_id}.admitted")
            first = (await plans(nats_url, job_id, 1))[0]
            assert first.algorithm == "cold-start-plan/1"
            cold = cold_start_plan(features_from_spec(decision.spec))
            assert pods_of(as_policy_plan(first)) == pods_of(cold)
        finally:
            await producer.close()
