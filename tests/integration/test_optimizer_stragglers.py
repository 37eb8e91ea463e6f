"""The optimizer records the dispatcher's stragglers on their job, on real NATS and a real
database: a worker that reports far slower than its peers is flagged by the dispatcher, whose
StragglerDetected reaches the optimizer's consumer, and the job's optimization events (what
``stride explain`` reads) say so, with root cause STRAGGLER. A redelivered event is
recorded once; one for a job the optimizer does not run is acknowledged and dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as dispatcher_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.db.engine import Database
from stride.db.migrations import upgrade
from stride.dispatcher.app import build as build_dispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import job_pb2, optimization_pb2, shard_pb2
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.app import MIGRATIONS
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.domain.administrator import Administrator, JobStage
from stride.optimizer.settings import OptimizerSettings
from stride.optimizer.stragglers import StragglerEvents, straggler_event_id
from stride.runtime.errors import InvalidArgument
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service

if TYPE_CHECKING:
    DispatcherStub = dispatcher_grpc.DispatcherServiceAsyncStub
    OptimizerStub = pb_grpc.OptimizerServiceAsyncStub

pytestmark = pytest.mark.integration

JOB = "job-slowone"
WORKERS = ("fast-0", "fast-1", "fast-2", "slow")


def admission(job_id: str) -> job_pb2.AdmissionDecision:
    return job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        policy="stride-guarantees/1",
        minimum_share=job_pb2.ResourceShare(workers=1, cpu=1.0, memory_bytes=2 * 1024**3),
        spec=job_pb2.JobSpec(
            name="wide-deep",
            user="alice",
            model=job_pb2.ModelReference(
                name="wide-and-deep", entrypoint="trainers.wide_deep:main", embedding_dim=8
            ),
            dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
            batch_size=512,
            termination=job_pb2.Termination(max_epochs=2),
        ),
    )


@pytest.fixture
async def optimizer(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    settings = local_settings(
        OptimizerSettings, nats_url=nats_url, database_url=postgres_url, shutdown_grace_seconds=2
    )
    async with running_service(build_optimizer, settings) as host:
        yield host


@pytest.fixture
async def dispatcher(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    settings = local_settings(
        DispatcherSettings,
        nats_url=nats_url,
        database_url=postgres_url,  # its own schema beside the optimizer's
        lease_seconds=30.0,
        sweep_interval_seconds=0.1,
        straggler_window_seconds=0.3,
    )
    async with running_service(build_dispatcher, settings) as host:
        yield host


async def events_of(stub: OptimizerStub, job_id: str) -> list[optimization_pb2.OptimizationEvent]:
    try:
        reply = await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id=job_id))
    except grpc.aio.AioRpcError as error:  # the admission not applied yet
        raise AssertionError(f"no events: {error.code()}") from None
    return list(reply.events)


async def test_a_straggler_the_dispatcher_flags_is_an_optimization_event_of_its_job(
    optimizer: ServiceHost, dispatcher: ServiceHost, nats_url: str
) -> None:
    bus = await producer_bus(nats_url)
    try:
        await bus.publish(topics.JOB_ADMITTED, JOB, admission(JOB), f"{JOB}.test.admitted")
    finally:
        await bus.close()
    async with (
        aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as optimizer_channel,
        aio_channel(f"127.0.0.1:{dispatcher.server.port}", "dispatcher") as dispatcher_channel,
    ):
        plans = pb_grpc.OptimizerServiceStub(optimizer_channel)
        shards = dispatcher_grpc.DispatcherServiceStub(dispatcher_channel)

        async def planned() -> bool:
            assert [e.root_cause for e in await events_of(plans, JOB)] == [
                optimization_pb2.ROOT_CAUSE_COLD_START
            ]
            return True

        await assert_eventually(planned)
        await flag_the_slow_worker(shards)

        async def recorded() -> optimization_pb2.OptimizationEvent:
            found = [
                event
                for event in await events_of(plans, JOB)
                if event.root_cause == optimization_pb2.ROOT_CAUSE_STRAGGLER
            ]
            assert found
            return found[0]

        event = await assert_eventually(recorded)
    assert event.job_id == JOB
    assert event.event_id.startswith(f"{JOB}.slow.straggler.")  # the dispatcher's message id
    assert event.stage == optimization_pb2.JOB_STAGE_COLD_START
    assert event.detail.startswith("worker slow is a straggler at ")
    assert "% of its peers' median rate (" in event.detail
    assert event.detail.endswith("records/s); it gets smaller shards")


async def flag_the_slow_worker(stub: DispatcherStub) -> None:
    """Run four workers, one reporting an eighth of the others' records, until the
    dispatcher flags it."""
    await stub.CreateDataset(
        dispatcher_pb.CreateDatasetRequest(
            job_id=JOB,
            dataset="train",
            parameters=dispatcher_pb.DatasetParameters(
                record_count=20_000,
                batch_size=5,
                shard_batches=8,
                epochs=1,
                seed=1,
                kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
            ),
        )
    )
    refs = {}
    held = {}
    for name in WORKERS:
        token = (
            await stub.RegisterWorker(dispatcher_pb.RegisterWorkerRequest(job_id=JOB, worker=name))
        ).incarnation
        refs[name] = dispatcher_pb.WorkerRef(
            job_id=JOB, dataset="train", worker=name, incarnation=token
        )
        held[name] = (await stub.GetShard(dispatcher_pb.GetShardRequest(worker=refs[name]))).shard

    async def flagged() -> bool:
        for name in WORKERS:
            shard = held[name]
            offset = min(shard.offset + (1 if name == "slow" else 8), shard.end - shard.start)
            await stub.ReportProgress(
                dispatcher_pb.ReportProgressRequest(
                    worker=refs[name], shard_id=shard.shard_id, offset=offset
                )
            )
            shard.offset = offset
            if offset == shard.end - shard.start:
                grant = await stub.GetShard(
                    dispatcher_pb.GetShardRequest(worker=refs[name], done_shard_id=shard.shard_id)
                )
                held[name] = grant.shard
        state = await stub.GetDatasetState(
            dispatcher_pb.GetDatasetStateRequest(job_id=JOB, dataset="train")
        )
        assert {w.worker for w in state.workers if w.straggler} >= {"slow"}
        return True

    await assert_eventually(flagged, timeout=30, interval=0.1)


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    await asyncio.to_thread(upgrade, database_url, "optimizer", MIGRATIONS)
    opened = Database(database_url, "optimizer")
    try:
        yield opened
    finally:
        await opened.dispose()


async def add_job(database: Database, job_id: str, stage: JobStage) -> None:
    async with database.transaction() as session:
        await repository.insert_administrators(
            session,
            [
                repository.administrator_row(
                    Administrator(job_id, stage, 1), None, datetime.now(UTC)
                )
            ],
        )


def detected(
    job_id: str, worker: str = "w-3", at: datetime | None = None
) -> shard_pb2.StragglerDetected:
    moment = Timestamp()
    moment.FromDatetime(at or datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    return shard_pb2.StragglerDetected(
        job_id=job_id, worker=worker, rate=41.2, peer_median_rate=343.0, detected_at=moment
    )


async def test_a_redelivered_straggler_is_recorded_once(database: Database) -> None:
    await add_job(database, JOB, JobStage.STEADY)
    stragglers = StragglerEvents(database)
    message_id = f"{JOB}.w-3.straggler.1.1767323045000"
    assert await stragglers.detected(detected(JOB), message_id)
    assert not await stragglers.detected(detected(JOB), message_id)  # the same message again
    # Flagged again later (after it recovered): a new message, a new event.
    later = detected(JOB, at=datetime(2026, 1, 2, 3, 14, 5, tzinfo=UTC))
    assert await stragglers.detected(later, f"{JOB}.w-3.straggler.1.1767323645000")
    async with database.sessions() as session:
        events = await repository.list_events(session, JOB)
    assert [e.event_id for e in events] == [message_id, f"{JOB}.w-3.straggler.1.1767323645000"]
    first = events[0]
    assert first.root_cause == optimization_pb2.ROOT_CAUSE_STRAGGLER
    assert first.stage == optimization_pb2.JOB_STAGE_STEADY
    assert first.detail == (
        "worker w-3 is a straggler at 12% of its peers' median rate (41.2 against 343 "
        "records/s); it gets smaller shards"
    )
    assert first.created_at.ToDatetime(tzinfo=UTC) == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


async def test_stragglers_of_jobs_the_optimizer_does_not_run_are_dropped(
    database: Database,
) -> None:
    stragglers = StragglerEvents(database)
    assert not await stragglers.detected(detected("job-unknown"), "job-unknown.w-3.straggler.1.1")
    await add_job(database, "job-done", JobStage.FINISHED)
    assert not await stragglers.detected(detected("job-done"), "job-done.w-3.straggler.1.1")
    async with database.sessions() as session:
        assert await repository.list_events(session, "job-done") == []
    with pytest.raises(InvalidArgument, match="worker"):
        await stragglers.detected(detected(JOB, worker="bad worker"), "x")
    bad_rate = detected(JOB)
    bad_rate.rate = float("nan")
    with pytest.raises(InvalidArgument, match="rate"):
        await stragglers.detected(bad_rate, "x")


def test_a_long_message_id_is_digested_to_fit() -> None:
    long = f"{JOB}." + "w" * 253 + ".straggler.1.1767323045000"
    event_id = straggler_event_id(JOB, long)
    assert event_id.startswith(f"{JOB}.straggler.") and len(event_id) <= 200
    assert straggler_event_id(JOB, long) == event_id
    assert straggler_event_id(JOB, f"{JOB}.w.straggler.1.2") == f"{JOB}.w.straggler.1.2"
    assert straggler_event_id(JOB, "elsewhere") != "elsewhere"
