"""The policy ports on real NATS: the executor pool decides exactly what the service would
decide in-process, a missing pool is a retryable failure, and a service routed to the pool
takes its decisions there."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stride.bus import topics
from stride.bus.client import Bus
from stride.cli.endpoints import pid_alive
from stride.decisions import EXECUTOR, DecisionFailed, ExecutorPool, build_decisions
from stride.events.v1 import job_pb2
from stride.executor.adapters.outbound.workers import DEFAULT_REGISTRY
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
from stride.policy.throughput import PAPER_PARAMETERS, Configuration, throughput
from stride.runtime.lifecycle import ServiceHost
from stride.testing.algorithms import SpinRequest
from stride.testing.algorithms import registry as spin_registry
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
_ids = itertools.count(1)
TEST_REGISTRY = "stride.testing.algorithms:registry"
SPIN = spin_registry().get("test-spin", 1)
DOOMED_SPIN = 2.0
"""Seconds the killed replica's request spins."""


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
async def executor(
    nats_url: str, replica: str = "replica-a", registry: str = DEFAULT_REGISTRY
) -> AsyncIterator[ServiceHost]:
    settings = local_settings(
        ExecutorSettings,
        nats_url=nats_url,
        replica_name=replica,
        shutdown_grace_seconds=2,
        registry=registry,
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


async def test_a_replica_killed_mid_request_is_answered_by_another(
    nats_url: str, bus: Bus, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """The replica running a request is killed (SIGKILL, its worker process with it): the
    requester hears nothing more and, after ``silence_seconds``, asks the pool again; the
    survivor answers."""
    doomed = ServiceProcess(
        "executor",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_EXECUTOR_REPLICA_NAME": "doomed",
            "STRIDE_EXECUTOR_REGISTRY": TEST_REGISTRY,
        },
        tmp_path,
    ).start()
    try:

        def serving() -> bool:
            assert "service started" in doomed.log_text()
            return True

        await assert_eventually(serving, timeout=60)
        pool = ExecutorPool(bus, silence_seconds=3.0)
        asked = asyncio.create_task(
            pool.run(SPIN, SpinRequest(DOOMED_SPIN), "job-slow", timeout=90.0)
        )

        def taken() -> bool:
            assert "algorithm started" in doomed.log_text()
            return True

        await assert_eventually(taken, timeout=30, interval=0.05)
        assert doomed.process is not None
        workers = children(doomed.process.pid)
        assert workers, "the doomed replica runs its algorithms in no worker process"
        # Frozen first, so it cannot answer however long the survivor takes to start on a
        # loaded machine (it once finished its spin first, in CI); still subscribed, it
        # keeps the queue group from being empty until it is killed.
        os.kill(doomed.process.pid, signal.SIGSTOP)
        async with executor(nats_url, replica="survivor", registry=TEST_REGISTRY):
            doomed.kill()
            reply = await asked
        assert reply.spun_seconds >= DOOMED_SPIN
        runs = [s for s in spans.get_finished_spans() if s.name == "run test-spin/1"]
        # (Twice, if a loaded machine held the survivor's word past the silence: harmless.)
        assert {(s.attributes or {})["stride.executor.replica"] for s in runs} == {"survivor"}
        assert "algorithm ran" not in doomed.log_text()

        def worker_gone() -> bool:
            assert not [pid for pid in workers if pid_alive(pid)]
            return True

        # Its worker does not run on for nobody (it spun for DOOMED_SPIN s).
        await assert_eventually(worker_gone, timeout=10)
    finally:
        doomed.kill()


async def test_a_run_longer_than_the_silence_is_waited_for_not_asked_again(
    nats_url: str, bus: Bus, spans: InMemorySpanExporter
) -> None:
    """A live replica says every second that it still runs, so a search longer than the
    silence the requester allows runs once. (Before, the requester asked another replica
    each time its attempt ran out, and every slow search ran several times at once.)"""
    async with executor(nats_url, replica="steady", registry=TEST_REGISTRY):
        pool = ExecutorPool(bus, silence_seconds=4.0)
        reply = await pool.run(SPIN, SpinRequest(9.0), "job-long", timeout=60.0)
    assert reply.spun_seconds >= 9.0
    runs = [s for s in spans.get_finished_spans() if s.name == "run test-spin/1"]
    assert len(runs) == 1, [s.attributes for s in runs]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def admission_request() -> AdmissionRequest:
    """A deadline job that fits: 3,600 iterations due in an hour on 8 GPUs."""
    curve = ScalingCurve((1, 2, 4), (1.0, 1.9, 3.6))
    return AdmissionRequest(8, 0.0, 300.0, DeadlineJob("job-1", curve, 3600.0, 3600.0))
