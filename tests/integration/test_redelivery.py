"""Nothing waits half a minute and nothing is lost: a fact whose consumer crashed mid-handler
is redelivered within seconds, a long handler is not redelivered under itself, and a fact
that waits for a dependency is kept however long the dependency is down."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from stride.bus import topics
from stride.bus.client import ACK_WAIT_SECONDS, Delivery
from stride.events.v1 import job_pb2
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.settings import OptimizerSettings
from stride.runtime.errors import Unavailable
from stride.testing.bus import producer_bus
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.processes import ServiceProcess
from stride.testing.streams import dead_letters, stream_messages

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

_ids = itertools.count(1)


def admitted(job_id: str) -> job_pb2.AdmissionDecision:
    spec = job_pb2.JobSpec(
        name="wide-deep",
        user="alice",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.w:main"),
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


async def test_a_plan_interrupted_by_an_optimizer_crash_comes_within_seconds(
    nats_url: str, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path / 'optimizer.db'}"
    held: list[Msg] = []
    nc = await nats.connect(nats_url)
    # A pool "replica" that takes the decision request and never answers, so the optimizer
    # process is inside its handler, the message unacked, when it is killed.

    async def hold(msg: Msg) -> None:
        held.append(msg)

    await nc.subscribe(
        topics.EXECUTOR_RUN.pattern(), queue=topics.EXECUTOR_RUN.queue_group, cb=hold
    )
    crashing = ServiceProcess(
        "optimizer",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": database_url,
            "STRIDE_OPTIMIZER_DECISIONS": '{"adjust": "executor"}',
        },
        tmp_path,
    ).start()
    bus = await producer_bus(nats_url, name="test-redelivery")
    try:
        await bus.ensure_streams()
        await bus.publish(topics.JOB_ADMITTED, "job-crash", admitted("job-crash"), "a.1")
        await assert_eventually(lambda: held, timeout=30, message="the optimizer never asked")
        crashing.kill()
        killed_at = time.monotonic()
        await nc.close()
        settings = local_settings(
            OptimizerSettings,
            nats_url=nats_url,
            database_url=database_url,
            shutdown_grace_seconds=2,
        )
        async with running_service(build_optimizer, settings):

            async def planned() -> int:
                found = await stream_messages(nats_url, topics.PLAN.subject("job-crash"))
                assert len(found) == 1
                return len(found)

            await assert_eventually(planned, timeout=20)
        waited = time.monotonic() - killed_at
        # Ack wait plus a start-up; it was 30 s before consumers reported progress.
        assert waited < ACK_WAIT_SECONDS + 8, f"redelivered after {waited:.1f}s"
    finally:
        crashing.kill()
        await bus.close()
        if not nc.is_closed:
            await nc.close()


async def test_a_slow_handler_is_not_redelivered_under_itself(nats_url: str) -> None:
    bus = await producer_bus(nats_url, name="test-slow")
    await bus.ensure_streams()
    calls: list[str] = []
    stop = asyncio.Event()

    async def slow(event: job_pb2.JobFinished, delivery: Delivery) -> None:
        calls.append(delivery.key)
        await asyncio.sleep(3.5)  # over the ack wait below

    task = asyncio.create_task(
        bus.consume(topics.JOB_FINISHED, durable="slow", handler=slow, stop=stop, ack_wait=1.0)
    )
    try:
        await bus.publish(topics.JOB_FINISHED, "job-s", job_pb2.JobFinished(job_id="job-s"), "s.1")
        await assert_eventually(lambda: calls, timeout=10)
        await asyncio.sleep(4.5)
        assert calls == ["job-s"]
    finally:
        stop.set()
        await task
        await bus.close()


async def test_a_fact_waiting_for_a_dependency_is_never_dead_lettered(nats_url: str) -> None:
    bus = await producer_bus(nats_url, name="test-waiting")
    await bus.ensure_streams()
    attempts: list[int] = []
    stop = asyncio.Event()

    async def pool_down(event: job_pb2.JobFinished, delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        if delivery.attempt <= 4:
            raise Unavailable("the executor pool is down")

    task = asyncio.create_task(
        bus.consume(
            topics.JOB_FINISHED, durable="waiting", handler=pool_down, stop=stop, max_deliver=2
        )
    )
    try:
        await bus.publish(topics.JOB_FINISHED, "job-w", job_pb2.JobFinished(job_id="job-w"), "w.1")
        await assert_eventually(lambda: len(attempts) >= 5, timeout=30)
        assert attempts[:5] == [1, 2, 3, 4, 5]
        assert await dead_letters(nats_url, "waiting") == []
    finally:
        stop.set()
        await task
        await bus.close()
