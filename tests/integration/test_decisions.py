"""The policy ports on real NATS: the executor pool decides exactly what the service would
decide in-process, a missing pool is a retryable failure, and a service routed to the pool
takes its decisions there."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stride.bus import topics
from stride.bus.client import Bus
from stride.decisions import EXECUTOR, DecisionFailed, build_decisions
from stride.events.v1 import job_pb2
from stride.executor.app import build as build_executor
from stride.executor.settings import ExecutorSettings
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.settings import OptimizerSettings
from stride.policy.cold_start import COLD_START, ColdStartRequest, JobFeatures
from stride.policy.elasticflow import ALGORITHMS as ELASTICFLOW
from stride.policy.elasticflow.admission import AdmissionRequest, DeadlineJob
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.fitting import ALGORITHMS as FIT_ALGORITHMS
from stride.policy.fitting import FitRequest
from stride.policy.pareto import ALGORITHMS as PARETO_ALGORITHMS
from stride.policy.pareto import ClusterLimits, ParetoRequest, SearchBounds
from stride.policy.throughput import PAPER_PARAMETERS, Configuration, throughput
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.processes import ServiceProcess
from stride.testing.streams import stream_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FEATURES = JobFeatures(
    model_name="wide-and-deep", record_count=100_000, batch_size=512, max_epochs=2, embedding_dim=8
)
(FIT,) = FIT_ALGORITHMS
PARETO = next(spec for spec in PARETO_ALGORITHMS if spec.name == "dlrover-pareto-candidates")
_ids = itertools.count(1)


def fit_request() -> FitRequest:
    rng = np.random.default_rng(3)
    configs = [
        Configuration(
            workers=int(rng.integers(1, 17)),
            parameter_servers=int(rng.integers(1, 5)),
            worker_cpu=float(rng.uniform(1, 16)),
            ps_cpu=float(rng.uniform(1, 8)),
            batch_size=int(rng.integers(32, 512)),
            embedding_dim=8,
            model_bytes=5e7,
        )
        for _ in range(12)
    ]
    return FitRequest(tuple(configs), tuple(throughput(PAPER_PARAMETERS, c) for c in configs))


@asynccontextmanager
async def executor(nats_url: str, replica: str = "replica-a") -> AsyncIterator[ServiceHost]:
    settings = local_settings(
        ExecutorSettings, nats_url=nats_url, replica_name=replica, shutdown_grace_seconds=2
    )
    async with running_service(build_executor, settings) as host:
        yield host


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connected = await producer_bus(nats_url, name="test-decisions")
    await connected.ensure_streams()
    try:
        yield connected
    finally:
        await connected.close()


async def test_the_pool_decides_exactly_what_in_process_decides(nats_url: str, bus: Bus) -> None:
    local = build_decisions({}, bus=None)
    pooled = build_decisions({"adjust": EXECUTOR, "admit": EXECUTOR}, bus=bus)
    async with executor(nats_url):
        cold_request = ColdStartRequest(FEATURES, 4.0)
        assert await pooled.adjust.decide(COLD_START, cold_request, "job-1") == (
            await local.adjust.decide(COLD_START, cold_request, "job-1")
        )
        admit_request = admission_request()
        assert await pooled.admit.decide(ELASTICFLOW[0], admit_request) == (
            await local.admit.decide(ELASTICFLOW[0], admit_request)
        )
        # The fit is heavy: by default it goes to the pool even with no routes at all.
        default = build_decisions({}, bus=bus)
        assert default.adjust.implementation_for(FIT.name) == EXECUTOR
        everything_local = build_decisions({FIT.name: "inprocess"}, bus=None)
        request = fit_request()
        assert await default.adjust.decide(FIT, request) == (
            await everything_local.adjust.decide(FIT, request)
        )


async def test_no_replica_is_a_retryable_failure(bus: Bus) -> None:
    pooled = build_decisions({"adjust": EXECUTOR}, bus=bus, timeout=2.0)
    with pytest.raises(DecisionFailed, match="cold-start-plan") as raised:
        await pooled.adjust.decide(COLD_START, ColdStartRequest(FEATURES))
    assert raised.value.retryable


def admitted(job_id: str) -> job_pb2.AdmissionDecision:
    spec = job_pb2.JobSpec(
        name="wide-deep",
        user="alice",
        model=job_pb2.ModelReference(
            name="wide-and-deep", entrypoint="trainers.wide_deep:main", embedding_dim=8
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
        batch_size=512,
        termination=job_pb2.Termination(max_epochs=2),
    )
    return job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        policy="stride-guarantees/1",
        spec=spec,
    )


async def test_an_optimizer_routed_to_the_pool_plans_there(
    nats_url: str, database_url: str, bus: Bus, spans: InMemorySpanExporter
) -> None:
    settings = local_settings(
        OptimizerSettings,
        nats_url=nats_url,
        database_url=database_url,
        shutdown_grace_seconds=2,
        decisions={"adjust": EXECUTOR},
        decision_timeout_seconds=1.0,
    )
    async with running_service(build_optimizer, settings):
        await bus.publish(
            topics.JOB_ADMITTED, "job-pooled", admitted("job-pooled"), f"t.{next(_ids)}"
        )
        # No replica yet: the decision cannot be made, so no plan, and the fact waits.
        await asyncio.sleep(2.5)
        assert await stream_messages(nats_url, topics.PLAN.subject("job-pooled")) == []
        async with executor(nats_url, replica="late-replica"):

            async def planned() -> int:
                found = await stream_messages(nats_url, topics.PLAN.subject("job-pooled"))
                assert len(found) == 1
                return len(found)

            await assert_eventually(planned, timeout=20)
    runs = [span for span in spans.get_finished_spans() if span.name == "run cold-start-plan/1"]
    assert runs, "the cold-start plan was not run by the executor pool"
    assert (runs[0].attributes or {})["stride.executor.replica"] == "late-replica"


def slow_pareto_request() -> ParetoRequest:
    """NSGA-II with a big population: seconds of CPU, long enough to kill its replica."""
    gib = 1024**3
    return ParetoRequest(
        params=PAPER_PARAMETERS,
        current=Configuration(
            workers=4,
            parameter_servers=2,
            worker_cpu=4.0,
            ps_cpu=8.0,
            batch_size=512,
            worker_memory_bytes=8 * gib,
            ps_memory_bytes=16 * gib,
            embedding_dim=16,
            model_bytes=2e8,
        ),
        bounds=SearchBounds(
            min_workers=1,
            max_workers=32,
            min_parameter_servers=1,
            max_parameter_servers=8,
            min_worker_cpu=1,
            max_worker_cpu=16,
            min_ps_cpu=1,
            max_ps_cpu=16,
            min_worker_memory_gib=8,
            max_worker_memory_gib=16,
            min_ps_memory_gib=16,
            max_ps_memory_gib=32,
        ),
        cluster=ClusterLimits(
            cpu_cores=200.0,
            memory_bytes=2000 * gib,
            max_pod_cpu=32.0,
            max_pod_memory_bytes=256 * gib,
        ),
        population_size=200,
        generations=200,
    )


async def test_a_replica_killed_mid_request_is_answered_by_another(
    nats_url: str, bus: Bus, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    doomed = ServiceProcess(
        "executor",
        {"STRIDE_NATS_URL": nats_url, "STRIDE_EXECUTOR_REPLICA_NAME": "doomed"},
        tmp_path,
    ).start()
    try:

        def serving() -> bool:
            assert "service started" in doomed.log_text()
            return True

        await assert_eventually(serving, timeout=30)
        # An attempt long enough for the slow run to finish on a loaded 2-core machine: with
        # a shorter one every attempt is cut off and asked again, and the run never ends.
        pooled = build_decisions({"adjust": EXECUTOR}, bus=bus, timeout=90.0, attempt_seconds=15.0)
        request = slow_pareto_request()
        asked = asyncio.create_task(pooled.adjust.decide(PARETO, request, "job-slow"))

        def taken() -> bool:
            assert "algorithm started" in doomed.log_text()
            return True

        await assert_eventually(taken, timeout=20, interval=0.05)
        async with executor(nats_url, replica="survivor"):
            doomed.kill()
            reply = await asked
        assert reply.candidates
        runs = [s for s in spans.get_finished_spans() if s.name.startswith("run dlrover-pareto")]
        # Only the survivor ran it to the end (perhaps twice, if a run outlasted an attempt
        # and the port asked again: harmless for a pure algorithm).
        replicas = [(s.attributes or {})["stride.executor.replica"] for s in runs]
        assert replicas and set(replicas) == {"survivor"}, replicas
        assert "algorithm ran" not in doomed.log_text()
    finally:
        doomed.kill()


def admission_request() -> AdmissionRequest:
    """A deadline job that fits: 3,600 iterations due in an hour on 8 GPUs."""
    curve = ScalingCurve((1, 2, 4), (1.0, 1.9, 3.6))
    return AdmissionRequest(8, 0.0, 300.0, DeadlineJob("job-1", curve, 3600.0, 3600.0))
