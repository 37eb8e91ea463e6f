"""The dispatcher's issue features on real NATS and a real database: lease expiry, pod events,
the end of data only when all is done, snapshot and restore, stragglers, the index-list and
stream kinds, lease-number fencing, bad input, and `stride shards`."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.dispatcher.app import build
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import plan_pb2, pod_pb2, shard_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.shardclient import Revoked, ShardClient
from stride.shardclient.steps import StepOrderer
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

JOB = "job-feat01"
if TYPE_CHECKING:
    Stub = pb_grpc.DispatcherServiceAsyncStub


def params(**changes: Any) -> pb.DatasetParameters:
    message = pb.DatasetParameters(
        record_count=100,
        batch_size=5,
        shard_batches=4,
        epochs=1,
        shuffle=False,
        seed=1,
        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
    )
    for key, value in changes.items():
        setattr(message, key, value)
    return message


@pytest.fixture
def settings(nats_url: str, database_url: str) -> DispatcherSettings:
    return local_settings(
        DispatcherSettings,
        nats_url=nats_url,
        database_url=database_url,
        lease_seconds=0.6,
        sweep_interval_seconds=0.1,
        straggler_window_seconds=0.3,
        retry_after_seconds=0.05,
        batch_timeout_seconds=0.5,
    )


@pytest.fixture
async def dispatcher(settings: DispatcherSettings) -> AsyncIterator[ServiceHost]:
    async with running_service(build, settings) as host:
        yield host


@pytest.fixture
async def stub(dispatcher: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{dispatcher.server.port}", "dispatcher") as channel:
        yield pb_grpc.DispatcherServiceStub(channel)


def ref(worker: str, token: int, dataset: str = "train") -> pb.WorkerRef:
    return pb.WorkerRef(job_id=JOB, dataset=dataset, worker=worker, incarnation=token)


async def create(stub: Stub, dataset: str = "train", **changes: Any) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(job_id=JOB, dataset=dataset, parameters=params(**changes))
    )


async def register(stub: Stub, worker: str) -> int:
    reply = await stub.RegisterWorker(pb.RegisterWorkerRequest(job_id=JOB, worker=worker))
    return int(reply.incarnation)


async def get(stub: Stub, worker: str, token: int, dataset: str = "train") -> pb.GetShardResponse:
    return await stub.GetShard(pb.GetShardRequest(worker=ref(worker, token, dataset)))


async def state(stub: Stub, dataset: str = "train") -> pb.GetDatasetStateResponse:
    return await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset=dataset))


async def expect_error(call: Any, code: grpc.StatusCode, starts_with: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code, raised.value.details()
    details = raised.value.details() or ""
    assert details.startswith(starts_with), details
    return details


async def test_a_lapsed_lease_comes_back_and_its_late_reports_are_fenced(
    stub: Stub, nats_url: str
) -> None:
    await create(stub)
    token = await register(stub, "w0")
    first = await get(stub, "w0", token)
    await stub.ReportProgress(
        pb.ReportProgressRequest(
            worker=ref("w0", token), shard_id=first.shard.shard_id, offset=7, lease=first.lease
        )
    )

    async def requeued() -> bool:
        assert (await state(stub)).doing == 0
        return True

    await assert_eventually(requeued)
    # The same worker leases the shard again: its older view (lease 1) is refused.
    again = await get(stub, "w0", token)
    assert (again.shard.shard_id, again.shard.offset, again.lease) == (
        first.shard.shard_id,
        7,
        first.lease + 1,
    )
    await expect_error(
        stub.ReportShardDone(
            pb.ReportShardDoneRequest(
                worker=ref("w0", token), shard_id=first.shard.shard_id, lease=first.lease
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"lease {first.lease} of shard",
    )
    await stub.ReportShardDone(
        pb.ReportShardDoneRequest(
            worker=ref("w0", token), shard_id=again.shard.shard_id, lease=again.lease
        )
    )
    events = await assert_eventually(
        lambda: stream_messages(nats_url, topics.SHARD_REQUEUED.subject(JOB))
    )
    assert shard_pb2.ShardProgress.FromString(events[0].data).offset == 7


async def test_a_failed_pod_event_marks_its_worker_lost(stub: Stub, nats_url: str) -> None:
    await create(stub)
    tokens = {w: await register(stub, w) for w in ("pod-a", "pod-b")}
    held = await get(stub, "pod-a", tokens["pod-a"])
    await get(stub, "pod-b", tokens["pod-b"])
    bus = await producer_bus(nats_url, name="test-podwatcher")
    try:
        occurred = Timestamp()
        occurred.FromDatetime(datetime.now(UTC))
        for phase, topic in (
            (pod_pb2.POD_PHASE_RUNNING, topics.POD_STARTED),
            (pod_pb2.POD_PHASE_DELETED, topics.POD_DELETED),
        ):
            await bus.publish(
                topic,
                JOB,
                pod_pb2.PodEvent(
                    job_id=JOB,
                    pod_name="pod-a",
                    role=plan_pb2.ROLE_WORKER,
                    phase=phase,
                    occurred_at=occurred,
                ),
                message_id=f"{JOB}.pod-a.{topic.suffix}",
            )
    finally:
        await bus.close()

    async def lost() -> bool:
        current = await state(stub)
        assert [w.worker for w in current.workers] == ["pod-b"]
        assert current.todo >= 4  # pod-b's lease may lapse too: the test's leases are short
        return True

    await assert_eventually(lost)
    await expect_error(get(stub, "pod-a", tokens["pod-a"]), grpc.StatusCode.FAILED_PRECONDITION)
    # Its shard goes to the next asker, at the offset it had.
    taken = await get(stub, "pod-b", tokens["pod-b"])
    assert taken.shard.shard_id == held.shard.shard_id


async def test_end_of_data_waits_for_the_last_shards_to_be_done(stub: Stub) -> None:
    await create(stub, record_count=40)  # two shards
    a, b = await register(stub, "a"), await register(stub, "b")
    first, second = await get(stub, "a", a), await get(stub, "a", a)
    waiting = await get(stub, "b", b)
    assert waiting.retry_later and not waiting.end_of_data and not waiting.HasField("shard")
    assert waiting.retry_after.ToTimedelta().total_seconds() == pytest.approx(0.05)
    await stub.ReportShardDone(
        pb.ReportShardDoneRequest(worker=ref("a", a), shard_id=first.shard.shard_id)
    )
    # Done and "what next" in one call: the last shard is done, so this is the end.
    last = await stub.GetShard(
        pb.GetShardRequest(
            worker=ref("a", a), done_shard_id=second.shard.shard_id, done_lease=second.lease
        )
    )
    assert last.end_of_data and not last.retry_later
    assert (await get(stub, "b", b)).end_of_data
    assert (await state(stub)).finished


async def test_snapshot_and_restore_put_back_exactly_what_was_done(stub: Stub) -> None:
    await create(stub, epochs=2)
    token = await register(stub, "w0")
    done = await get(stub, "w0", token)
    await stub.ReportShardDone(
        pb.ReportShardDoneRequest(worker=ref("w0", token), shard_id=done.shard.shard_id)
    )
    partial = await get(stub, "w0", token)
    await stub.ReportProgress(
        pb.ReportProgressRequest(worker=ref("w0", token), shard_id=partial.shard.shard_id, offset=3)
    )
    taken = await stub.SnapshotShards(pb.SnapshotShardsRequest(job_id=JOB, dataset="train"))
    assert taken.snapshot_id.startswith("sha256:") and (taken.done, taken.doing) == (1, 1)
    snapshot = pb.ShardSnapshot.FromString(taken.snapshot)
    assert {(s.shard_id, s.offset, s.done) for s in snapshot.shards} == {
        (done.shard.shard_id, 20, True),
        (partial.shard.shard_id, 3, False),
    }
    # Training goes on past the checkpoint, then the job rolls back to it.
    await stub.ReportProgress(
        pb.ReportProgressRequest(worker=ref("w0", token), shard_id=partial.shard.shard_id, offset=9)
    )
    for _ in range(4):
        extra = await get(stub, "w0", token)
        await stub.ReportShardDone(
            pb.ReportShardDoneRequest(worker=ref("w0", token), shard_id=extra.shard.shard_id)
        )
    restored = await stub.RestoreShards(
        pb.RestoreShardsRequest(job_id=JOB, dataset="train", snapshot=taken.snapshot)
    )
    assert (restored.snapshot_id, restored.revoked) == (taken.snapshot_id, 1)
    after = await state(stub)
    assert (after.epoch, after.todo, after.doing, after.done) == (0, 4, 0, 1)
    # The revoked lease is fenced; the shard resumes at the checkpoint's offset.
    await expect_error(
        stub.ReportProgress(
            pb.ReportProgressRequest(
                worker=ref("w0", token), shard_id=partial.shard.shard_id, offset=12
            )
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    resumed = await get(stub, "w0", token)
    assert (resumed.shard.shard_id, resumed.shard.offset) == (partial.shard.shard_id, 3)
    again = await stub.SnapshotShards(pb.SnapshotShardsRequest(job_id=JOB, dataset="train"))
    assert (again.done, again.doing) == (1, 1)


async def test_bad_snapshots_are_refused_and_change_nothing(stub: Stub) -> None:
    await create(stub)
    await create(stub, "other", record_count=200)
    token = await register(stub, "w0")
    await get(stub, "w0", token)
    other = await stub.SnapshotShards(pb.SnapshotShardsRequest(job_id=JOB, dataset="other"))
    before = await state(stub)
    invalid, precondition = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    restore = stub.RestoreShards
    await expect_error(
        restore(pb.RestoreShardsRequest(job_id=JOB, dataset="train")), invalid, "snapshot:"
    )
    await expect_error(
        restore(pb.RestoreShardsRequest(job_id=JOB, dataset="train", snapshot=b"\xff\x00garbage")),
        invalid,
        "snapshot:",
    )
    await expect_error(
        restore(pb.RestoreShardsRequest(job_id=JOB, dataset="train", snapshot=other.snapshot)),
        precondition,
        "snapshot: it is of dataset 'other'",
    )
    forged = pb.ShardSnapshot.FromString(other.snapshot)
    forged.dataset = "train"
    await expect_error(
        restore(
            pb.RestoreShardsRequest(
                job_id=JOB, dataset="train", snapshot=forged.SerializeToString()
            )
        ),
        precondition,
        "snapshot: taken with other dataset parameters",
    )
    await expect_error(
        stub.SnapshotShards(pb.SnapshotShardsRequest(job_id=JOB, dataset="nope")),
        grpc.StatusCode.NOT_FOUND,
    )
    assert await state(stub) == before


async def test_bad_reports_get_the_right_status_and_change_nothing(stub: Stub) -> None:
    await create(stub)
    a, b = await register(stub, "a"), await register(stub, "b")
    mine = await get(stub, "a", a)
    await get(stub, "b", b)
    before = await state(stub)
    precondition = grpc.StatusCode.FAILED_PRECONDITION
    # A shard leased to another worker.
    await expect_error(
        stub.ReportShardDone(
            pb.ReportShardDoneRequest(worker=ref("b", b), shard_id=mine.shard.shard_id)
        ),
        precondition,
        f"shard {mine.shard.shard_id} is DOING, not leased to worker 'b'",
    )
    # A shard never given out (it exists, TODO) and one that does not exist.
    await expect_error(
        stub.ReportProgress(pb.ReportProgressRequest(worker=ref("a", a), shard_id=4, offset=1)),
        precondition,
    )
    await expect_error(
        stub.GetShard(pb.GetShardRequest(worker=ref("a", a), done_shard_id=999)),
        grpc.StatusCode.NOT_FOUND,
        "done_shard_id:",
    )
    await expect_error(
        stub.GetShard(pb.GetShardRequest(worker=ref("a", a), done_shard_id=-3)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "done_shard_id:",
    )
    await expect_error(
        stub.ReportProgress(
            pb.ReportProgressRequest(
                worker=ref("a", a), shard_id=mine.shard.shard_id, offset=1, lease=-1
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "lease:",
    )
    await expect_error(
        get(stub, "a", a, dataset="nope"), grpc.StatusCode.NOT_FOUND, "dataset 'nope'"
    )
    await expect_error(
        stub.ListDatasets(pb.ListDatasetsRequest(job_id="bad.job")),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job_id:",
    )
    assert await state(stub) == before


async def test_a_slow_worker_is_flagged_gets_smaller_shards_and_is_published(
    stub: Stub, nats_url: str
) -> None:
    await create(stub, record_count=2_000, batch_size=5, shard_batches=8)  # 40-record shards
    workers = ("fast-0", "fast-1", "fast-2", "slow")
    tokens = {w: await register(stub, w) for w in workers}
    held = {w: (await get(stub, w, tokens[w])).shard for w in workers}
    await asyncio.sleep(0.35)  # past the warm-up window

    async def report_round() -> None:
        for worker in workers:
            shard = held[worker]
            step = 1 if worker == "slow" else 8
            offset = min(shard.offset + step, shard.end - shard.start)
            try:
                await stub.ReportProgress(
                    pb.ReportProgressRequest(
                        worker=ref(worker, tokens[worker]), shard_id=shard.shard_id, offset=offset
                    )
                )
            except grpc.aio.AioRpcError as error:
                # This fixture's leases last 0.6 s: on a loaded machine one can lapse
                # between two reports (the shard goes back to TODO). Lease again, as a
                # worker would; the rates the straggler check compares still hold.
                if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
                held[worker] = (await get(stub, worker, tokens[worker])).shard
                continue
            shard.offset = offset
            if offset == shard.end - shard.start:
                await stub.ReportShardDone(
                    pb.ReportShardDoneRequest(
                        worker=ref(worker, tokens[worker]), shard_id=shard.shard_id
                    )
                )
                held[worker] = (await get(stub, worker, tokens[worker])).shard

    async def flagged() -> bool:
        await report_round()
        slow = {w.worker: w for w in (await state(stub)).workers}
        assert slow["slow"].straggler and not slow["fast-0"].straggler
        assert slow["slow"].rate < slow["fast-0"].rate / 2
        return True

    await assert_eventually(flagged, timeout=15, interval=0.05)
    await stub.ReportShardFailed(
        pb.ReportShardFailedRequest(
            worker=ref("slow", tokens["slow"]), shard_id=held["slow"].shard_id, reason="slow"
        )
    )
    smaller = await get(stub, "slow", tokens["slow"])
    assert smaller.straggler
    assert smaller.shard.end - smaller.shard.start - smaller.shard.offset <= 20  # half of 40

    async def slow_signal() -> shard_pb2.StragglerDetected:
        events = await stream_messages(nats_url, topics.STRAGGLER_DETECTED.subject(JOB))
        signals = [shard_pb2.StragglerDetected.FromString(event.data) for event in events]
        # A fast worker whose report straddled a pause of a loaded machine may be flagged
        # for a moment too; the slow one must be.
        found = [signal for signal in signals if signal.worker == "slow"]
        assert found, [signal.worker for signal in signals]
        return found[0]

    signal = await assert_eventually(slow_signal)
    assert signal.job_id == JOB
    assert signal.rate < signal.peer_median_rate / 2


async def test_index_list_and_stream_datasets(stub: Stub) -> None:
    await create(stub, "list", kind=shard_pb2.SHARDING_KIND_INDEX_LIST, shuffle=True, seed=9)
    await create(stub, "stream", kind=shard_pb2.SHARDING_KIND_STREAM, partitions=3, record_count=30)
    token = await register(stub, "w0")
    seen: list[int] = []
    while (reply := await get(stub, "w0", token, "list")).HasField("shard"):
        assert len(reply.shard.indices) == reply.shard.end - reply.shard.start
        seen.extend(reply.shard.indices)
        await stub.ReportShardDone(
            pb.ReportShardDoneRequest(
                worker=ref("w0", token, "list"), shard_id=reply.shard.shard_id
            )
        )
    assert sorted(seen) == list(range(100)) and seen != list(range(100))
    offsets: list[tuple[int, int]] = []
    while (reply := await get(stub, "w0", token, "stream")).HasField("shard"):
        offsets.extend(
            (reply.shard.partition, o) for o in range(reply.shard.start, reply.shard.end)
        )
        await stub.ReportShardDone(
            pb.ReportShardDoneRequest(
                worker=ref("w0", token, "stream"), shard_id=reply.shard.shard_id
            )
        )
    assert sorted(offsets) == [(p, o) for p in range(3) for o in range(30)]


async def test_stride_shards_shows_the_queues(stub: Stub, dispatcher: ServiceHost) -> None:
    await create(stub)
    token = await register(stub, "pod-0")
    await get(stub, "pod-0", token)
    env = {**os.environ, "STRIDE_DISPATCHER_ADDRESS": f"127.0.0.1:{dispatcher.server.port}"}
    env["COLUMNS"] = "160"
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "stride.cli", "shards", JOB],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "train" in shown.stdout and "index_range" in shown.stdout and "pod-0" in shown.stdout
    unknown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "stride.cli", "shards", "bad.job"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 2 and "job_id" in unknown.stderr


async def test_data_workers_get_step_batches_and_timed_out_ones_come_back(stub: Stub) -> None:
    await create(stub, kind=shard_pb2.SHARDING_KIND_INDEX_LIST, shuffle=True, epochs=2)

    async def fetch(worker: str, count: int) -> pb.FetchBatchesResponse:
        return await stub.FetchBatches(
            pb.FetchBatchesRequest(
                job_id=JOB, dataset="train", data_worker=worker, max_batches=count
            )
        )

    # dw-1 fetches three batches and dies; dw-0 produces everything else.
    lost = await fetch("dw-1", 3)
    assert [b.step_id for b in lost.batches] == [0, 1, 2]
    orderer: StepOrderer[list[int]] = StepOrderer(lost.consumed_step)
    consumed: list[tuple[int, int]] = []
    end = False
    while not end:
        reply = await fetch("dw-0", 4)
        end = reply.end_of_data
        for batch in reply.batches:
            for step, indices in orderer.push(batch.step_id, list(batch.indices)):
                consumed.extend((step * 5 // 100, index) for index in indices)
                await stub.ReportConsumed(
                    pb.ReportConsumedRequest(job_id=JOB, dataset="train", step_id=step)
                )
        if not reply.batches and not end:
            await asyncio.sleep(0.1)  # waiting for dw-1's batches to time out
    # dw-1 comes back late with what it produced: all of it is dropped.
    for batch in lost.batches:
        assert list(orderer.push(batch.step_id, list(batch.indices))) == []
    assert sorted(consumed) == [(e, i) for e in range(2) for i in range(100)]
    # dw-0's own early batches may have timed out too while step 0 was missing, and come
    # back to it a second time: dropped like dw-1's.
    assert orderer.consumed_step == 39 and orderer.dropped >= 3
    done = await fetch("dw-0", 1)
    assert done.end_of_data and not done.batches and done.consumed_step == 39


async def test_a_gone_data_workers_steps_go_to_another_at_once_not_after_the_time_out(
    settings: DispatcherSettings, nats_url: str
) -> None:
    """The pod watcher's event that a data worker was deleted (its plan dropped it, or it
    failed) frees the steps it fetched before: the next reader gets them without waiting a
    batch time-out (an hour here). Steps fetched after the event keep their lease."""
    patient = settings.model_copy(update={"batch_timeout_seconds": 3600.0})
    async with (
        running_service(build, patient) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "dispatcher") as channel,
    ):
        stub = pb_grpc.DispatcherServiceStub(channel)
        await create(stub, kind=shard_pb2.SHARDING_KIND_INDEX_LIST, epochs=1)

        async def fetch(worker: str, count: int) -> list[int]:
            reply = await stub.FetchBatches(
                pb.FetchBatchesRequest(
                    job_id=JOB, dataset="train", data_worker=worker, max_batches=count
                )
            )
            return [b.step_id for b in reply.batches]

        assert await fetch("job-dw-data-worker-0", 3) == [0, 1, 2]
        assert await fetch("job-dw-chief-0", 2) == [3, 4]
        bus = await producer_bus(nats_url, name="test-podwatcher")
        try:
            occurred = Timestamp()
            occurred.FromDatetime(datetime.now(UTC))
            for pod, role in (
                ("job-dw-data-worker-0", plan_pb2.ROLE_DATA_WORKER),
                ("job-dw-ps-0", plan_pb2.ROLE_PS),  # holds no steps: nothing to free
            ):
                await bus.publish(
                    topics.POD_DELETED,
                    JOB,
                    pod_pb2.PodEvent(
                        job_id=JOB,
                        pod_name=pod,
                        role=role,
                        phase=pod_pb2.POD_PHASE_DELETED,
                        occurred_at=occurred,
                    ),
                    message_id=f"{JOB}.{pod}.deleted",
                )
        finally:
            await bus.close()

        got: list[int] = []

        async def freed() -> bool:
            # Before the event is applied, new steps come instead (leased to the chief).
            got.extend(await fetch("job-dw-chief-0", 3))
            assert {0, 1, 2} <= set(got), f"still leased to the gone data worker: {got}"
            return True

        await assert_eventually(freed)
        # The chief's own steps were not the gone pod's: still leased, not handed out again.
        assert 3 not in got and 4 not in got, got


async def test_a_restored_snapshot_puts_the_steps_back_to_its_consumed_step(stub: Stub) -> None:
    """A chief in the data-worker mode that restores a checkpoint trains again the steps it
    trained after it: the snapshot keeps the consumed step, and the restore rewinds to it."""
    await create(stub, kind=shard_pb2.SHARDING_KIND_INDEX_LIST, shuffle=True)

    async def fetch(count: int) -> pb.FetchBatchesResponse:
        return await stub.FetchBatches(
            pb.FetchBatchesRequest(job_id=JOB, dataset="train", data_worker="dw", max_batches=count)
        )

    async def consume(step: int) -> None:
        await stub.ReportConsumed(
            pb.ReportConsumedRequest(job_id=JOB, dataset="train", step_id=step)
        )

    first = await fetch(8)
    await consume(4)
    assert (await state(stub)).consumed_step == 4
    snapshot = await stub.SnapshotShards(pb.SnapshotShardsRequest(job_id=JOB, dataset="train"))
    assert pb.ShardSnapshot.FromString(snapshot.snapshot).consumed_step == 4
    await consume(7)
    await fetch(4)  # steps 8 to 11, in flight when the chief dies
    await stub.RestoreShards(
        pb.RestoreShardsRequest(job_id=JOB, dataset="train", snapshot=snapshot.snapshot)
    )
    assert (await state(stub)).consumed_step == 4
    again = await fetch(3)
    assert [b.step_id for b in again.batches] == [5, 6, 7] and again.consumed_step == 4
    # The same steps are the same samples (the batch of a step id is fixed by the seed).
    assert [list(b.indices) for b in again.batches] == [list(b.indices) for b in first.batches[5:]]
    # A snapshot whose consumed step is not a step of the dataset is refused, naming it.
    forged = pb.ShardSnapshot.FromString(snapshot.snapshot)
    forged.consumed_step = 10**6
    await expect_error(
        stub.RestoreShards(
            pb.RestoreShardsRequest(
                job_id=JOB, dataset="train", snapshot=forged.SerializeToString()
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "snapshot: consumed_step 1000000 is not a step",
    )
    assert (await state(stub)).consumed_step == 4
    # A dataset read by shards keeps no consumed step.
    await create(stub, "shards")
    plain = await stub.SnapshotShards(pb.SnapshotShardsRequest(job_id=JOB, dataset="shards"))
    assert not pb.ShardSnapshot.FromString(plain.snapshot).HasField("consumed_step")


async def test_data_worker_bad_input(stub: Stub) -> None:
    await create(stub)
    await create(stub, "stream", kind=shard_pb2.SHARDING_KIND_STREAM, partitions=2)
    invalid, precondition = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    fetch = stub.FetchBatches
    await expect_error(
        fetch(pb.FetchBatchesRequest(job_id=JOB, dataset="train", data_worker="d", max_batches=0)),
        invalid,
        "max_batches:",
    )
    await expect_error(
        fetch(pb.FetchBatchesRequest(job_id=JOB, dataset="train", max_batches=1)),
        invalid,
        "data_worker:",
    )
    await expect_error(
        fetch(pb.FetchBatchesRequest(job_id=JOB, dataset="stream", data_worker="d", max_batches=1)),
        precondition,
        "dataset:",
    )
    await expect_error(
        fetch(pb.FetchBatchesRequest(job_id=JOB, dataset="nope", data_worker="d", max_batches=1)),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_error(
        stub.ReportConsumed(pb.ReportConsumedRequest(job_id=JOB, dataset="train", step_id=0)),
        precondition,
        "step_id: step 0 was never dispatched",
    )
    await expect_error(
        stub.ReportConsumed(pb.ReportConsumedRequest(job_id=JOB, dataset="train", step_id=-1)),
        invalid,
        "step_id:",
    )
    first = await fetch(
        pb.FetchBatchesRequest(job_id=JOB, dataset="train", data_worker="d", max_batches=2)
    )
    assert [b.step_id for b in first.batches] == [0, 1] and first.consumed_step == -1


@pytest.mark.parametrize("session", [True, False], ids=["session", "unary"])
async def test_the_client_library_prefetches_and_reports_revocations(
    stub: Stub, dispatcher: ServiceHost, session: bool
) -> None:
    await create(stub, epochs=1)
    address = f"127.0.0.1:{dispatcher.server.port}"

    def work() -> None:
        with ShardClient(address, JOB, "w0", session=session, timeout=5.0) as client:
            first = client.get_shard("train").shard
            assert first is not None
            # Sent ahead: completes `first` and leases the next in one call.
            ahead = client.get_shard_async("train", done=first)
            second = ahead.result().shard
            assert second is not None and second.shard_id != first.shard_id
            token = client.incarnation
            # The lease (0.6 s) lapses: the shard is someone else's, the token still good.
            time.sleep(1.2)
            with pytest.raises(Revoked, match="lease"):
                client.report_done(second)
            assert client.incarnation == token
            third = client.get_shard("train").shard
            assert third is not None
            # Marked lost: the token itself is fenced; the client registers again.
            lost = pb_grpc.DispatcherServiceStub(client.channel).MarkWorkerLost(
                pb.MarkWorkerLostRequest(job_id=JOB, worker="w0")
            )
            assert lost.requeued == 1
            with pytest.raises(Revoked):
                client.get_shard_async("train", done=third).result()
            assert client.incarnation is not None and client.incarnation > (token or 0)
            assert client.get_shard("train").shard is not None

    await asyncio.to_thread(work)
    counts = await state(stub)
    assert (counts.done, counts.doing) == (1, 1)
