"""The dispatcher on real NATS and a real database: datasets, leasing, reports, fencing,
restarts, bad input."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.msg import Msg

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.dispatcher.app import SERVICE_NAME, build
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import shard_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

JOB = "job-disp01"


def params(**changes: object) -> pb.DatasetParameters:
    message = pb.DatasetParameters(
        record_count=1_000,
        batch_size=10,
        shard_batches=7,
        epochs=2,
        shuffle=True,
        seed=11,
        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
    )
    for key, value in changes.items():
        setattr(message, key, value)
    return message


def settings_for(nats_url: str, database_url: str) -> DispatcherSettings:
    return local_settings(DispatcherSettings, nats_url=nats_url, database_url=database_url)


@pytest.fixture
async def dispatcher(nats_url: str, database_url: str) -> AsyncIterator[ServiceHost]:
    async with running_service(build, settings_for(nats_url, database_url)) as host:
        yield host


@pytest.fixture
async def channel(dispatcher: ServiceHost) -> AsyncIterator[grpc.aio.Channel]:
    async with aio_channel(f"127.0.0.1:{dispatcher.server.port}", "dispatcher") as opened:
        yield opened


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.DispatcherServiceAsyncStub:
    return pb_grpc.DispatcherServiceStub(channel)


def ref(worker: str, incarnation: int, dataset: str = "train") -> pb.WorkerRef:
    return pb.WorkerRef(job_id=JOB, dataset=dataset, worker=worker, incarnation=incarnation)


async def register(stub: pb_grpc.DispatcherServiceAsyncStub, worker: str) -> int:
    reply = await stub.RegisterWorker(pb.RegisterWorkerRequest(job_id=JOB, worker=worker))
    assert reply.lease.seconds == 60
    return int(reply.incarnation)


async def expect_error(call: object, code: grpc.StatusCode, starts_with: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == code, raised.value.details()
    details = raised.value.details() or ""
    assert details.startswith(starts_with), details
    return details


async def test_health_and_reflection_report_the_service(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_create_dataset_is_idempotent_and_conflicts_name_the_difference(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    request = pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params())
    assert (await stub.CreateDataset(request)).created is True
    assert (await stub.CreateDataset(request)).created is False
    different = pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params(epochs=3))
    details = await expect_error(stub.CreateDataset(different), grpc.StatusCode.ALREADY_EXISTS)
    assert "epochs=2" in details
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert (state.epoch, state.todo, state.doing, state.done, state.finished) == (0, 0, 0, 0, False)


async def test_every_index_is_handed_out_once_through_failures_and_lost_workers(
    stub: pb_grpc.DispatcherServiceAsyncStub, nats_url: str
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params())
    )
    rng = random.Random(5)
    tokens = {name: await register(stub, name) for name in ("w0", "w1", "w2")}
    held: dict[str, dict[int, list[int]]] = {
        name: {} for name in tokens
    }  # id -> [start, end, reported, epoch]
    coverage: Counter[tuple[int, int]] = Counter()
    ended: set[str] = set()

    def credit(lease: list[int], offset: int) -> None:
        start, _, reported, epoch = lease
        for index in range(start + reported, start + offset):
            coverage[(epoch, index)] += 1
        lease[2] = max(reported, offset)

    for step in range(2_000):
        if len(ended) == len(tokens) and not any(held.values()):
            break
        worker = rng.choice(sorted(tokens))
        token = tokens[worker]
        if held[worker] and rng.random() < 0.7:
            shard_id = rng.choice(sorted(held[worker]))
            lease = held[worker][shard_id]
            size = lease[1] - lease[0]
            choice = rng.random()
            if choice < 0.4:
                offset = min(size, lease[2] + rng.randint(1, 30))
                await stub.ReportProgress(
                    pb.ReportProgressRequest(
                        worker=ref(worker, token), shard_id=shard_id, offset=offset
                    )
                )
                credit(lease, offset)
            elif choice < 0.85:
                await stub.ReportShardDone(
                    pb.ReportShardDoneRequest(worker=ref(worker, token), shard_id=shard_id)
                )
                credit(lease, size)
                del held[worker][shard_id]
            else:
                await stub.ReportShardFailed(
                    pb.ReportShardFailedRequest(
                        worker=ref(worker, token), shard_id=shard_id, reason="test"
                    )
                )
                del held[worker][shard_id]
                ended.clear()
        elif step % 97 == 50:
            lost = await stub.MarkWorkerLost(pb.MarkWorkerLostRequest(job_id=JOB, worker=worker))
            assert lost.requeued == len(held[worker])
            await expect_error(
                stub.GetShard(pb.GetShardRequest(worker=ref(worker, token))),
                grpc.StatusCode.FAILED_PRECONDITION,
            )
            held[worker] = {}
            tokens[worker] = await register(stub, worker)
            ended.clear()
        else:
            reply = await stub.GetShard(pb.GetShardRequest(worker=ref(worker, token)))
            if reply.end_of_data:
                ended.add(worker)
                continue
            if reply.retry_later:
                # Others hold the last shards; the end is only the end once they are done.
                assert reply.retry_after.ToTimedelta().total_seconds() > 0
                continue
            shard = reply.shard
            held[worker][shard.shard_id] = [shard.start, shard.end, shard.offset, shard.epoch]
    assert len(ended) == 3 and not any(held.values()), "the random run did not finish"
    assert set(coverage) == {(epoch, index) for epoch in range(2) for index in range(1_000)}
    assert set(coverage.values()) == {1}

    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    shards_per_epoch = 15  # 1000 records in shards of 70
    assert (state.epoch, state.todo, state.doing, state.done, state.finished) == (
        1,
        0,
        0,
        shards_per_epoch,
        True,
    )
    assert sorted(w.worker for w in state.workers) == ["w0", "w1", "w2"]

    done = await assert_eventually(lambda: at_least(nats_url, topics.SHARD_DONE.subject(JOB), 30))
    assert len(done) == 2 * shards_per_epoch
    events = [shard_pb2.ShardProgress.FromString(m.data) for m in done]
    assert {e.shard_id for e in events} == set(range(2 * shards_per_epoch))
    assert all(e.job_id == JOB and e.dataset == "train" and e.offset > 0 for e in events)
    assert (done[0].headers or {}).get("Stride-Type") == "stride.events.v1.ShardProgress"


async def at_least(nats_url: str, subject: str, count: int) -> list[Msg]:
    """The subject's messages once there are ``count`` (for assert_eventually)."""
    found = await stream_messages(nats_url, subject)
    assert len(found) >= count, f"{len(found)} of {count} messages on {subject}"
    return found


async def test_reports_keep_offsets_and_duplicates_are_harmless(
    stub: pb_grpc.DispatcherServiceAsyncStub, nats_url: str
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(
            job_id=JOB, dataset="train", parameters=params(shuffle=False, epochs=1)
        )
    )
    token = await register(stub, "w0")
    first = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
    assert (first.shard_id, first.start, first.end, first.offset) == (0, 0, 70, 0)
    await stub.ReportProgress(
        pb.ReportProgressRequest(worker=ref("w0", token), shard_id=0, offset=30)
    )
    await stub.ReportProgress(
        pb.ReportProgressRequest(worker=ref("w0", token), shard_id=0, offset=20)
    )
    await stub.ReportShardFailed(pb.ReportShardFailedRequest(worker=ref("w0", token), shard_id=0))
    await stub.ReportShardFailed(pb.ReportShardFailedRequest(worker=ref("w0", token), shard_id=0))
    again = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
    assert (again.shard_id, again.offset) == (0, 30)
    for _ in range(3):
        await stub.ReportShardDone(pb.ReportShardDoneRequest(worker=ref("w0", token), shard_id=0))
    await stub.ReportProgress(
        pb.ReportProgressRequest(worker=ref("w0", token), shard_id=0, offset=5)
    )

    failed = await assert_eventually(
        lambda: at_least(nats_url, topics.SHARD_FAILED.subject(JOB), 1)
    )
    done = await assert_eventually(lambda: at_least(nats_url, topics.SHARD_DONE.subject(JOB), 1))
    assert len(failed) == 1 and len(done) == 1
    assert shard_pb2.ShardProgress.FromString(failed[0].data).offset == 30
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert state.done == 1 and state.workers[0].records_consumed == 70


async def test_stale_and_lost_incarnations_are_fenced(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params())
    )
    await expect_error(
        stub.GetShard(pb.GetShardRequest(worker=ref("w0", 1))), grpc.StatusCode.FAILED_PRECONDITION
    )
    old = await register(stub, "w0")
    shard = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", old)))).shard
    new = await register(stub, "w0")  # the pod restarted: its old shard goes back to TODO
    assert new == old + 1
    details = await expect_error(
        stub.ReportShardDone(
            pb.ReportShardDoneRequest(worker=ref("w0", old), shard_id=shard.shard_id)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert "stale" in details
    regained = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", new)))).shard
    assert regained.shard_id == shard.shard_id

    other = await register(stub, "w1")
    await expect_error(
        stub.ReportProgress(
            pb.ReportProgressRequest(worker=ref("w1", other), shard_id=shard.shard_id)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    lost = await stub.MarkWorkerLost(pb.MarkWorkerLostRequest(job_id=JOB, worker="w0"))
    assert lost.requeued == 1
    assert (
        await stub.MarkWorkerLost(pb.MarkWorkerLostRequest(job_id=JOB, worker="w0"))
    ).requeued == 0
    details = await expect_error(
        stub.ReportProgress(
            pb.ReportProgressRequest(worker=ref("w0", new), shard_id=shard.shard_id)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert "lost" in details


BAD_CREATES = [
    (pb.CreateDatasetRequest(dataset="train", parameters=params()), "job_id"),
    (pb.CreateDatasetRequest(job_id="job.with.dots", dataset="t", parameters=params()), "job_id"),
    (pb.CreateDatasetRequest(job_id=JOB, parameters=params()), "dataset"),
    (pb.CreateDatasetRequest(job_id=JOB, dataset="train"), "parameters"),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(record_count=0)),
        "parameters.record_count",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(batch_size=-1)),
        "parameters.batch_size",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(shard_batches=0)),
        "parameters.shard_batches",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(epochs=0)),
        "parameters.epochs",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(kind=0)),
        "parameters.kind",
    ),
    (
        pb.CreateDatasetRequest(
            job_id=JOB, dataset="t", parameters=params(kind=shard_pb2.SHARDING_KIND_STREAM)
        ),
        "parameters.partitions",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(record_count=1 << 50)),
        "parameters.record_count",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(shard_batches=1 << 62)),
        "parameters.shard_batches",
    ),
    (
        pb.CreateDatasetRequest(job_id=JOB, dataset="t", parameters=params(kind=99)),
        "parameters.kind",
    ),
]


async def test_bad_create_requests_name_the_field_and_store_nothing(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    for request, field in BAD_CREATES:
        await expect_error(
            stub.CreateDataset(request), grpc.StatusCode.INVALID_ARGUMENT, f"{field}:"
        )
    await expect_error(
        stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="t")),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_bad_reports_name_the_field(stub: pb_grpc.DispatcherServiceAsyncStub) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params())
    )
    token = await register(stub, "w0")
    shard = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await expect_error(stub.GetShard(pb.GetShardRequest()), invalid, "worker:")
    await expect_error(
        stub.GetShard(pb.GetShardRequest(worker=ref("w0", 0))), invalid, "worker.incarnation:"
    )
    await expect_error(
        stub.GetShard(pb.GetShardRequest(worker=ref("", token))), invalid, "worker.worker:"
    )
    await expect_error(
        stub.RegisterWorker(pb.RegisterWorkerRequest(job_id=JOB)), invalid, "worker:"
    )
    await expect_error(
        stub.ReportProgress(
            pb.ReportProgressRequest(
                worker=ref("w0", token), shard_id=shard.shard_id, offset=10_000
            )
        ),
        invalid,
        "offset:",
    )
    await expect_error(
        stub.ReportShardDone(pb.ReportShardDoneRequest(worker=ref("w0", token), shard_id=-1)),
        invalid,
        "shard_id:",
    )
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert state.doing == 1 and state.workers[0].shard_ids == [shard.shard_id]


async def test_unknown_things_are_not_found(stub: pb_grpc.DispatcherServiceAsyncStub) -> None:
    missing = grpc.StatusCode.NOT_FOUND
    token = await register(stub, "w0")
    await expect_error(stub.GetShard(pb.GetShardRequest(worker=ref("w0", token, "nope"))), missing)
    await expect_error(
        stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="nope")), missing
    )
    await expect_error(
        stub.MarkWorkerLost(pb.MarkWorkerLostRequest(job_id=JOB, worker="ghost")), missing
    )
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params())
    )
    await expect_error(
        stub.ReportShardDone(pb.ReportShardDoneRequest(worker=ref("w0", token), shard_id=12345)),
        missing,
    )


async def test_queue_state_survives_a_restart(nats_url: str, database_url: str) -> None:
    settings = settings_for(nats_url, database_url)
    async with (
        running_service(build, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "dispatcher") as channel,
    ):
        stub = pb_grpc.DispatcherServiceStub(channel)
        await stub.CreateDataset(
            pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params(epochs=1))
        )
        token = await register(stub, "w0")
        leased = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
        await stub.ReportProgress(
            pb.ReportProgressRequest(worker=ref("w0", token), shard_id=leased.shard_id, offset=12)
        )
    async with (
        running_service(build, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "dispatcher") as channel,
    ):
        stub = pb_grpc.DispatcherServiceStub(channel)
        state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
        assert (state.todo, state.doing) == (14, 1)
        # The same incarnation carries on after the restart: nothing was in memory only.
        await stub.ReportShardFailed(
            pb.ReportShardFailedRequest(worker=ref("w0", token), shard_id=leased.shard_id)
        )
        again = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
        assert (again.shard_id, again.offset) == (leased.shard_id, 12)


async def test_concurrent_workers_never_share_a_shard(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(
            job_id=JOB, dataset="train", parameters=params(epochs=1, shard_batches=1)
        )
    )
    tokens = [await register(stub, f"w{i}") for i in range(4)]

    async def drain(index: int) -> list[int]:
        got: list[int] = []
        while True:
            reply = await stub.GetShard(pb.GetShardRequest(worker=ref(f"w{index}", tokens[index])))
            if reply.end_of_data:
                return got
            if reply.retry_later:
                await asyncio.sleep(0.01)
                continue
            got.append(reply.shard.shard_id)
            await stub.ReportShardDone(
                pb.ReportShardDoneRequest(
                    worker=ref(f"w{index}", tokens[index]), shard_id=reply.shard.shard_id
                )
            )

    results = await asyncio.gather(*(drain(i) for i in range(4)))
    handed_out = [shard_id for got in results for shard_id in got]
    assert sorted(handed_out) == list(range(100))


def open_session(stub: pb_grpc.DispatcherServiceAsyncStub) -> Any:
    """A ShardSession driven with write()/read(): grpc.aio allows calling a stream-stream
    method without a request iterator, its type stubs do not."""
    return stub.ShardSession()  # type: ignore[call-arg]


async def test_a_session_answers_every_call_in_order_and_refusals_keep_it_open(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params(epochs=1))
    )
    token = await register(stub, "w0")
    me = ref("w0", token)
    session = open_session(stub)

    async def ask(sequence: int, **call: Any) -> pb.ShardSessionResponse:
        await session.write(pb.ShardSessionRequest(sequence=sequence, **call))
        reply = await session.read()
        assert isinstance(reply, pb.ShardSessionResponse) and reply.sequence == sequence
        return reply

    first = (await ask(1, get_shard=pb.GetShardRequest(worker=me))).get_shard
    assert first.HasField("shard") and first.lease == 1
    shard_id = first.shard.shard_id
    progress = await ask(
        2, progress=pb.ReportProgressRequest(worker=me, shard_id=shard_id, offset=5)
    )
    assert progress.WhichOneof("result") == "progress"

    # Refused calls: the status and message the unary call would have had; nothing changes.
    refusals: list[tuple[int, dict[str, Any], grpc.StatusCode, str]] = [
        (3, {}, grpc.StatusCode.INVALID_ARGUMENT, "call:"),
        (4, {"get_shard": pb.GetShardRequest()}, grpc.StatusCode.INVALID_ARGUMENT, "worker:"),
        (
            5,
            {"get_shard": pb.GetShardRequest(worker=ref("w0", token, "nope"))},
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
        (
            6,
            {"progress": pb.ReportProgressRequest(worker=me, shard_id=shard_id, offset=10_000)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "offset:",
        ),
        (
            7,
            {"done": pb.ReportShardDoneRequest(worker=ref("w0", token + 1), shard_id=shard_id)},
            grpc.StatusCode.FAILED_PRECONDITION,
            "",
        ),
        (
            8,
            {"done": pb.ReportShardDoneRequest(worker=me, shard_id=12345)},
            grpc.StatusCode.NOT_FOUND,
            "",
        ),
    ]
    for sequence, call, code, starts_with in refusals:
        reply = await ask(sequence, **call)
        assert reply.WhichOneof("result") == "error", (sequence, reply)
        assert reply.error.code == code.value[0], (sequence, reply.error)
        assert reply.error.message.startswith(starts_with), reply.error.message
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert (state.doing, state.done) == (1, 0)
    assert state.workers[0].records_consumed == 5

    # The session still works after the refusals: done piggy-backed on the next get.
    done_and_next = await ask(
        9, get_shard=pb.GetShardRequest(worker=me, done_shard_id=shard_id, done_lease=1)
    )
    assert done_and_next.get_shard.shard.shard_id != shard_id
    failed = await ask(
        10,
        failed=pb.ReportShardFailedRequest(
            worker=me, shard_id=done_and_next.get_shard.shard.shard_id, reason="test"
        ),
    )
    assert failed.WhichOneof("result") == "failed"
    await session.done_writing()
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert (state.todo, state.doing, state.done) == (14, 0, 1)


async def test_pipelined_session_calls_lease_distinct_shards(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params(epochs=1))
    )
    me = ref("w0", await register(stub, "w0"))
    session = open_session(stub)
    # Several calls go out before any answer is read; each is answered once, in order.
    for sequence in range(1, 6):
        await session.write(
            pb.ShardSessionRequest(sequence=sequence, get_shard=pb.GetShardRequest(worker=me))
        )
    replies = [await session.read() for _ in range(5)]
    await session.done_writing()
    assert [reply.sequence for reply in replies] == [1, 2, 3, 4, 5]
    leased = {reply.get_shard.shard.shard_id for reply in replies}
    assert len(leased) == 5
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert state.doing == 5 and sorted(state.workers[0].shard_ids) == sorted(leased)


async def test_a_batched_get_shard_leases_several_and_reports_several_done(
    stub: pb_grpc.DispatcherServiceAsyncStub,
) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(
            job_id=JOB, dataset="train", parameters=params(epochs=1, shard_batches=1)
        )
    )
    me = ref("w0", await register(stub, "w0"))
    reply = await stub.GetShard(pb.GetShardRequest(worker=me, max_shards=8))
    leased = [(reply.shard, reply.lease), *((m.shard, m.lease) for m in reply.more_shards)]
    assert len({shard.shard_id for shard, _ in leased}) == 8
    assert all(lease == 1 for _, lease in leased)

    done = [pb.ShardDone(shard_id=shard.shard_id, lease=lease) for shard, lease in leased]
    following = await stub.GetShard(pb.GetShardRequest(worker=me, max_shards=8, done_shards=done))
    assert len(following.more_shards) == 7
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert (state.done, state.doing) == (8, 8)

    # The same over a session.
    session = open_session(stub)
    await session.write(
        pb.ShardSessionRequest(sequence=1, get_shard=pb.GetShardRequest(worker=me, max_shards=3))
    )
    answer = await session.read()
    await session.done_writing()
    assert answer.WhichOneof("result") == "get_shard"
    assert len(answer.get_shard.more_shards) == 2

    bad = [
        (pb.GetShardRequest(worker=me, max_shards=-1), "max_shards"),
        (pb.GetShardRequest(worker=me, max_shards=65), "max_shards"),
        (
            pb.GetShardRequest(worker=me, done_shards=[pb.ShardDone(shard_id=1, lease=-1)]),
            "done_shards[0].lease",
        ),
        (
            pb.GetShardRequest(worker=me, done_shards=[pb.ShardDone(shard_id=-3)]),
            "done_shards[0].shard_id",
        ),
        (
            pb.GetShardRequest(
                worker=me, done_shards=[pb.ShardDone(shard_id=n) for n in range(65)]
            ),
            "done_shards",
        ),
    ]
    for request, field in bad:
        await expect_error(stub.GetShard(request), grpc.StatusCode.INVALID_ARGUMENT, f"{field}:")
    # A done report of a shard another worker holds refuses the whole call.
    other = ref("w1", await register(stub, "w1"))
    theirs = await stub.GetShard(pb.GetShardRequest(worker=other))
    mixed = [
        pb.ShardDone(shard_id=following.shard.shard_id, lease=following.lease),
        pb.ShardDone(shard_id=theirs.shard.shard_id, lease=theirs.lease),
    ]
    await expect_error(
        stub.GetShard(pb.GetShardRequest(worker=me, done_shards=mixed)),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    after = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert (after.done, after.doing) == (8, 8 + 3 + 1)  # nothing changed by the refusals


async def test_hand_outs_resume_after_the_database_dropped_every_connection(
    nats_url: str, postgres_url: str
) -> None:
    """PostgreSQL restarted (every connection dropped): calls in flight may answer
    UNAVAILABLE, and the next ones are served on new connections, not UNAVAILABLE for good
    (bench/chaos.py found the fast path's own connection never reopened)."""
    settings = settings_for(nats_url, postgres_url)
    async with (
        running_service(build, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "dispatcher") as channel,
    ):
        stub = pb_grpc.DispatcherServiceStub(channel)
        await stub.CreateDataset(
            pb.CreateDatasetRequest(job_id=JOB, dataset="train", parameters=params(epochs=1))
        )
        token = await register(stub, "w0")
        first = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            dropped = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
        assert dropped is not None and dropped[0] >= 1

        async def done() -> None:
            await stub.ReportShardDone(
                pb.ReportShardDoneRequest(worker=ref("w0", token), shard_id=first.shard_id)
            )

        async def served() -> bool:
            try:
                await done()
            except grpc.aio.AioRpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
                raise AssertionError(f"not yet: {error.details()}") from None
            return True

        await assert_eventually(served, timeout=10, interval=0.2)
        second = (await stub.GetShard(pb.GetShardRequest(worker=ref("w0", token)))).shard
        assert second.shard_id != first.shard_id
        state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
        assert (state.done, state.doing) == (1, 1)
