"""The checkpoint cache on real NATS, real shared memory and a real directory: flash saves,
streaming saves and loads, persistence, retention, restore order, corruption, isolation,
bad input."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.msg import Msg

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.signing import logical_message_id
from stride.ckptcache.adapters.outbound.directory_store import DirectoryStore
from stride.ckptcache.app import SERVICE_NAME, build
from stride.ckptcache.domain.checkpoints import CheckpointInfo, Tier
from stride.ckptcache.domain.checksum import checksum
from stride.ckptcache.domain.tiers import ShardSource
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.ckptclient import CheckpointCacheError, CheckpointClient
from stride.events.v1 import checkpoint_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.channels import aio_channel, sync_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

JOB = "job-ckpt01"
OTHER = "job-ckpt02"
CHUNK = 64 * 1024
MD = (("stride-job-id", JOB),)
MEMORY = checkpoint_pb2.CHECKPOINT_TIER_MEMORY
DURABLE = checkpoint_pb2.CHECKPOINT_TIER_DURABLE


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    path = Path("/dev/shm") / f"stride-test-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def settings_for(
    nats_url: str, store_dir: Path, shm_dir: Path, **changes: object
) -> CheckpointCacheSettings:
    values: dict[str, object] = {
        "nats_url": nats_url,
        "store_dir": store_dir,
        "shm_dir": shm_dir,
        "grpc_port": 0,
        "grpc_host": "127.0.0.1",
        "health_interval_seconds": 0.1,
        "chunk_bytes": CHUNK,
        "max_checkpoint_bytes": 8 * 1024 * 1024,
        "publish_retry_seconds": 0.2,
        **changes,
    }
    return CheckpointCacheSettings(**values)  # type: ignore[arg-type]


@pytest.fixture
async def cache(nats_url: str, store_dir: Path, shm_dir: Path) -> AsyncIterator[ServiceHost]:
    async with running_service(build, settings_for(nats_url, store_dir, shm_dir)) as host:
        yield host


def address(host: ServiceHost) -> str:
    return f"127.0.0.1:{host.server.port}"


@pytest.fixture
async def channel(cache: ServiceHost) -> AsyncIterator[grpc.aio.Channel]:
    async with aio_channel(address(cache), "ckptcache") as opened:
        yield opened


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.CheckpointCacheServiceAsyncStub:
    return pb_grpc.CheckpointCacheServiceStub(channel)


def payload(size: int, seed: int = 1) -> bytes:
    return bytes((index * 31 + seed) % 251 for index in range(size))


def header(
    data: bytes, checkpoint_id: str = "step-100", step: int = 100, **changes: object
) -> pb.CheckpointHeader:
    message = pb.CheckpointHeader(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        step=step,
        size_bytes=len(data),
        crc32c=checksum(data),
        shard_snapshot=b"shards@100",
        shard_snapshot_id="snap-100",
        tensors=[
            pb.TensorEntry(
                name="dense/kernel",
                dtype="float32",
                shape=[4, 2],
                offset=0,
                length=min(32, len(data)),
            )
        ],
    )
    for key, value in changes.items():
        setattr(message, key, value)
    return message


def save_stream(
    head: pb.CheckpointHeader | None, data: bytes, chunk: int = 100_000
) -> list[pb.SaveCheckpointRequest]:
    messages = [] if head is None else [pb.SaveCheckpointRequest(header=head)]
    messages += [
        pb.SaveCheckpointRequest(data=data[i : i + chunk]) for i in range(0, len(data), chunk)
    ]
    return messages


async def save(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
    messages: Iterable[pb.SaveCheckpointRequest],
    metadata: tuple[tuple[str, str], ...] = MD,
) -> pb.SaveCheckpointResponse:
    async def requests() -> AsyncIterator[pb.SaveCheckpointRequest]:
        for message in messages:
            yield message

    return await stub.SaveCheckpoint(requests(), metadata=metadata)


async def save_blocking(
    target: str,
    messages: list[pb.SaveCheckpointRequest],
    metadata: tuple[tuple[str, str], ...] = MD,
) -> pb.SaveCheckpointResponse:
    """:func:`save` through the blocking client, in a thread."""

    def call() -> pb.SaveCheckpointResponse:
        with sync_channel(target, "ckptcache") as channel:
            stub = pb_grpc.CheckpointCacheServiceStub(channel)
            reply: pb.SaveCheckpointResponse = stub.SaveCheckpoint(
                iter(messages), metadata=metadata, timeout=30
            )
            return reply

    return await asyncio.to_thread(call)


async def load(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, checkpoint_id: str = "", shard_index: int = 0
) -> tuple[pb.CheckpointHeader, bytes, int]:
    request = pb.LoadCheckpointRequest(checkpoint_id=checkpoint_id, shard_index=shard_index)
    chunks = [reply async for reply in stub.LoadCheckpoint(request, metadata=MD)]
    assert chunks[0].WhichOneof("chunk") == "header"
    assert all(c.WhichOneof("chunk") == "data" for c in chunks[1:])
    assert all(checksum(c.data) == c.data_crc32c for c in chunks[1:])
    return chunks[0].header, b"".join(c.data for c in chunks[1:]), len(chunks) - 1


async def listed(stub: pb_grpc.CheckpointCacheServiceAsyncStub) -> list[pb.CheckpointInfo]:
    reply = await stub.ListCheckpoints(pb.ListCheckpointsRequest(), metadata=MD)
    return list(reply.checkpoints)


async def durable(stub: pb_grpc.CheckpointCacheServiceAsyncStub, checkpoint_id: str) -> bool:
    return any(c.checkpoint_id == checkpoint_id and c.tier == DURABLE for c in await listed(stub))


async def expect_error(call: object, code: grpc.StatusCode, starts_with: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == code, raised.value.details()
    details = raised.value.details() or ""
    assert details.startswith(starts_with), details
    return details


async def persisted_events(nats_url: str, count: int) -> list[Msg]:
    found = await stream_messages(nats_url, topics.CHECKPOINT_PERSISTED.subject(JOB))
    assert len(found) >= count, f"{len(found)} of {count} events"
    return found


def files_under(path: Path) -> list[str]:
    if not path.exists():
        return []
    # The health check's writability probe (a `.probe-*` file that lives for one write)
    # may be caught in passing; it is not a checkpoint's.
    return sorted(
        str(p.relative_to(path))
        for p in path.rglob("*")
        if p.is_file() and not p.name.startswith(".probe-")
    )


def tensors(seed: int, size: int = 50_000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "wide/kernel": rng.standard_normal((size // 10, 10)).astype(np.float32),
        "deep/bias": rng.standard_normal(7).astype(np.float64),
        "step": np.array(seed, dtype=np.int64),
    }


def same_tensors(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> bool:
    return left.keys() == right.keys() and all(
        left[k].dtype == right[k].dtype and np.array_equal(left[k], right[k]) for k in left
    )


async def test_a_streamed_save_lands_in_memory_then_persists_and_is_announced(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, nats_url: str, channel: grpc.aio.Channel
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    data = payload(300_000)
    saved = await save(stub, save_stream(header(data), data))
    assert saved.tier == MEMORY
    loaded_header, loaded, chunks = await load(stub, "step-100")
    assert loaded == data and chunks == 5  # 300,000 bytes in 64 KiB chunks
    assert (loaded_header.shard_snapshot_id, loaded_header.shard_count) == ("snap-100", 1)
    assert loaded_header.tensors == header(data).tensors

    await assert_eventually(lambda: durable(stub, "step-100"))
    events = await assert_eventually(lambda: persisted_events(nats_url, 1))
    event = checkpoint_pb2.CheckpointStored.FromString(events[0].data)
    assert (event.checkpoint_id, event.step, event.size_bytes, event.shard_snapshot) == (
        "step-100",
        100,
        len(data),
        b"shards@100",
    )
    assert event.tier == DURABLE
    assert event.shard_snapshot_id == "snap-100"  # the data position travels with it
    headers = events[0].headers or {}
    assert (
        logical_message_id(headers["Nats-Msg-Id"])
        == f"{JOB}.step-100.persisted.{checksum(data):08x}"
    )
    saved_events = await stream_messages(nats_url, topics.CHECKPOINT_SAVED.subject(JOB))
    assert len(saved_events) == 1

    # A retried save of the same checkpoint succeeds and changes nothing.
    assert (await save(stub, save_stream(header(data), data))).tier == DURABLE
    assert len(await persisted_events(nats_url, 1)) == 1


async def test_the_flash_path_saves_through_shared_memory_and_restores_identical_tensors(
    cache: ServiceHost, stub: pb_grpc.CheckpointCacheServiceAsyncStub, shm_dir: Path
) -> None:
    client = CheckpointClient(address(cache), JOB)
    try:
        state = tensors(1)
        saved = await asyncio.to_thread(
            client.save, 10, state, shard_snapshot_id="snap-10", shard_snapshot=b"queues"
        )
        assert (saved.transport, saved.tier, saved.checkpoint_id) == (
            "shared-memory",
            "memory",
            "step-10",
        )
        restored = await asyncio.to_thread(client.restore)
        assert restored.transport == "shared-memory" and restored.step == 10
        assert same_tensors(restored.tensors, state)
        assert (restored.shard_snapshot_id, restored.shard_snapshot) == ("snap-10", b"queues")
        # The restored arrays are views of the segment (which they pin): let them go, so
        # the segment can return to the free pool below.
        del restored

        # Once step 10 is durable and step 11 is in, step 10 leaves memory and its segment
        # goes to the free pool; step 12 reuses it (the same file) instead of allocating.
        # (Step 11's segment is pooled in turn once step 12 is durable, which can be before
        # the save returns: the pool's content after it proves nothing.)
        await asyncio.to_thread(client.wait_until_durable, "step-10", 30)
        await asyncio.to_thread(client.save, 11, tensors(2))
        await asyncio.to_thread(client.wait_until_durable, "step-11", 30)
        free = shm_dir / JOB / ".free"
        await assert_eventually(lambda: len(files_under(free)) == 1)
        pooled = (free / files_under(free)[0]).stat().st_ino
        await asyncio.to_thread(client.save, 12, tensors(3))
        assert (shm_dir / JOB / "step-12" / "shard-00000.seg").stat().st_ino == pooled
        newest = await asyncio.to_thread(client.restore)
        assert newest.step == 12 and same_tensors(newest.tensors, tensors(3))
        older = await asyncio.to_thread(client.restore, "step-10")
        assert same_tensors(older.tensors, state)

        # The stream path gives the same answer as the shared-memory one.
        streaming = CheckpointClient(address(cache), JOB, transport="stream")
        try:
            assert same_tensors((await asyncio.to_thread(streaming.restore)).tensors, tensors(3))
            saved13 = await asyncio.to_thread(streaming.save, 13, tensors(4))
            assert saved13.transport == "stream"
            assert same_tensors((await asyncio.to_thread(client.restore)).tensors, tensors(4))
        finally:
            streaming.close()
    finally:
        client.close()


async def test_restored_arrays_map_the_segment_and_a_later_save_never_overwrites_them(
    cache: ServiceHost, shm_dir: Path
) -> None:
    client = CheckpointClient(address(cache), JOB)
    try:
        await asyncio.to_thread(client.save, 1, tensors(1))
        restored = await asyncio.to_thread(client.restore)
        assert restored.transport == "shared-memory"
        some = next(iter(restored.tensors.values()))
        assert not some.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            some[...] = 0
        assert len(files_under(shm_dir / JOB / ".pinned")) == 1
        # Step 1 leaves memory while its arrays are held: its segment is pinned, so it is
        # unlinked instead of going to the free pool, and the saves that follow (same
        # size) write to other segments.
        for step in (2, 3, 4):
            await asyncio.to_thread(client.save, step, tensors(step))
            await asyncio.to_thread(client.wait_until_durable, f"step-{step}", 30)
        await assert_eventually(lambda: not (shm_dir / JOB / "step-1").exists(), timeout=10)
        assert same_tensors(restored.tensors, tensors(1))
        # Dropping the arrays removes the pin.
        del restored, some
        assert files_under(shm_dir / JOB / ".pinned") == []
    finally:
        client.close()


async def test_a_client_on_another_node_streams(cache: ServiceHost, shm_dir: Path) -> None:
    # Another node has its own /dev/shm: the cache's node marker is not what the client
    # reads there, so it streams (and a client that insists on shared memory is told why).
    (shm_dir / "node-id").write_text("some-other-node")
    client = CheckpointClient(address(cache), JOB)
    insisting = CheckpointClient(address(cache), JOB, transport="shared-memory")
    try:
        saved = await asyncio.to_thread(client.save, 1, tensors(1))
        assert saved.transport == "stream"
        restored = await asyncio.to_thread(client.restore)
        assert restored.transport == "stream" and same_tensors(restored.tensors, tensors(1))
        with pytest.raises(RuntimeError, match="another node"):
            await asyncio.to_thread(insisting.save, 2, tensors(2))
    finally:
        client.close()
        insisting.close()


async def test_list_is_newest_first_and_empty_id_loads_the_newest(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
) -> None:
    for step in (100, 300, 200):
        data = payload(1000 + step, seed=step)
        await save(stub, save_stream(header(data, f"step-{step}", step), data))
    found = await listed(stub)
    assert [c.checkpoint_id for c in found] == ["step-300", "step-200", "step-100"]
    assert found[0].size_bytes == 1300 and found[0].shard_snapshot_id == "snap-100"
    assert found[0].saved_at.ToDatetime(tzinfo=UTC) <= datetime.now(UTC)
    newest_header, newest, _ = await load(stub)
    assert newest_header.checkpoint_id == "step-300" and newest == payload(1300, seed=300)
    other = await stub.ListCheckpoints(
        pb.ListCheckpointsRequest(), metadata=(("stride-job-id", OTHER),)
    )
    assert list(other.checkpoints) == []

    await stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id="step-300"), metadata=MD)
    assert (await load(stub))[0].checkpoint_id == "step-200"
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(checkpoint_id="step-300"), metadata=MD).read(),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_error(
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(checkpoint_id="step-300"), metadata=MD),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_different_contents_under_an_existing_id_conflict(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
) -> None:
    data = payload(5000)
    await save(stub, save_stream(header(data), data))
    other = payload(5000, seed=9)
    await expect_error(
        save(stub, save_stream(header(other), other)), grpc.StatusCode.ALREADY_EXISTS
    )
    assert (await load(stub, "step-100"))[1] == data


async def test_bad_saves_name_the_field_and_leave_nothing(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, store_dir: Path, shm_dir: Path, nats_url: str
) -> None:
    data = payload(10_000)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    damaged = save_stream(header(data), data)
    damaged[1].data_crc32c = checksum(damaged[1].data) ^ 1
    cases: list[tuple[list[pb.SaveCheckpointRequest], str]] = [
        ([], "header:"),
        (save_stream(None, data), "header:"),
        (save_stream(header(data, job_id="job.x"), data), "header.job_id:"),
        (save_stream(header(data, checkpoint_id="../../etc"), data), "header.checkpoint_id:"),
        (save_stream(header(data, step=-1), data), "header.step:"),
        (save_stream(header(data, size_bytes=9 * 1024 * 1024), data), "header.size_bytes:"),
        (save_stream(header(data), data[:-1]), "header.size_bytes:"),
        (save_stream(header(data, size_bytes=9_000), data), "header.size_bytes:"),
        (save_stream(header(data, crc32c=checksum(data) ^ 1), data), "header.crc32c:"),
        (save_stream(header(data, shard_count=2, shard_index=2), data), "header.shard_index:"),
        (save_stream(header(data, shard_count=-1), data), "header.shard_count:"),
        (damaged, "data_crc32c:"),
        (save_stream(header(data), data)[:1] + save_stream(header(data), data), "header:"),
        ([*save_stream(header(data), data), pb.SaveCheckpointRequest()], "data:"),
    ]
    bad_tensor = header(data)
    bad_tensor.tensors[0].offset = 9_990
    cases.append((save_stream(bad_tensor, data), "header.tensors[0].length:"))
    for messages, prefix in cases:
        await expect_error(save(stub, messages), invalid, prefix)
    assert files_under(store_dir) == []
    assert [f for f in files_under(shm_dir) if f != "node-id"] == []
    assert await listed(stub) == []
    assert await stream_messages(nats_url, topics.CHECKPOINTS.subjects[0]) == []


async def test_an_abandoned_upload_leaves_nothing_visible(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, shm_dir: Path
) -> None:
    data = payload(200_000)
    sent_some = asyncio.Event()

    async def torn() -> AsyncIterator[pb.SaveCheckpointRequest]:
        yield pb.SaveCheckpointRequest(header=header(data))
        yield pb.SaveCheckpointRequest(data=data[:50_000])
        sent_some.set()
        await asyncio.Event().wait()  # the client hangs, then goes away

    call = stub.SaveCheckpoint(torn(), metadata=MD)
    await sent_some.wait()
    incoming = shm_dir / JOB / ".incoming"
    await assert_eventually(lambda: files_under(incoming) != [])
    call.cancel()
    await assert_eventually(lambda: files_under(incoming) == [])
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(), metadata=MD).read(),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_bad_reads_name_the_field_or_are_not_found(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(checkpoint_id="a/b"), metadata=MD).read(),
        invalid,
        "checkpoint_id:",
    )
    await expect_error(
        stub.LocateCheckpoint(pb.LocateCheckpointRequest(shard_index=-1), metadata=MD),
        invalid,
        "shard_index:",
    )
    await expect_error(
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(), metadata=MD), invalid, "checkpoint_id:"
    )
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(), metadata=MD).read(),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(checkpoint_id="nope"), metadata=MD).read(),
        grpc.StatusCode.NOT_FOUND,
    )
    data = payload(1000)
    await save(stub, save_stream(header(data), data))
    await expect_error(
        stub.LocateCheckpoint(pb.LocateCheckpointRequest(shard_index=1), metadata=MD),
        invalid,
        "shard_index:",
    )


async def test_a_job_reaches_only_its_own_checkpoints(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, shm_dir: Path
) -> None:
    data = payload(2000)
    await save(stub, save_stream(header(data), data))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    denied = grpc.StatusCode.PERMISSION_DENIED
    other = (("stride-job-id", OTHER),)
    # No identity, or a malformed one.
    await expect_error(
        stub.ListCheckpoints(pb.ListCheckpointsRequest()), invalid, "metadata stride-job-id:"
    )
    await expect_error(
        stub.ListCheckpoints(pb.ListCheckpointsRequest(), metadata=(("stride-job-id", "../x"),)),
        invalid,
        "metadata stride-job-id:",
    )
    # Another job's name in the request.
    await expect_error(
        stub.ListCheckpoints(pb.ListCheckpointsRequest(job_id=JOB), metadata=other),
        denied,
        "job_id:",
    )
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(job_id=JOB), metadata=other).read(),
        denied,
        "job_id:",
    )
    await expect_error(
        stub.DeleteCheckpoint(
            pb.DeleteCheckpointRequest(job_id=JOB, checkpoint_id="step-100"), metadata=other
        ),
        denied,
        "job_id:",
    )
    await expect_error(save(stub, save_stream(header(data), data), other), denied, "header.job_id:")
    # Names that would escape the job's space.
    await expect_error(
        stub.LoadCheckpoint(
            pb.LoadCheckpointRequest(checkpoint_id=f"../{JOB}/step-100"), metadata=other
        ).read(),
        invalid,
        "checkpoint_id:",
    )
    foreign_segment = shm_dir / JOB / ".incoming" / "planted.seg"
    foreign_segment.parent.mkdir(parents=True, exist_ok=True)
    foreign_segment.write_bytes(data)
    for name in (f"../../{JOB}/.incoming/planted.seg", "../planted.seg", "planted"):
        await expect_error(
            stub.RegisterSegment(
                pb.RegisterSegmentRequest(
                    header=header(data, "step-5", 5, job_id=""), segment_name=name
                ),
                metadata=other,
            ),
            invalid,
            "segment_name:",
        )
    # The other job, by its own name, sees nothing of this one.
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(), metadata=other).read(),
        grpc.StatusCode.NOT_FOUND,
    )
    assert (await load(stub))[1] == data


async def test_concurrent_saves_of_two_jobs_stay_isolated(cache: ServiceHost) -> None:
    clients = {job: CheckpointClient(address(cache), job) for job in (JOB, OTHER)}

    def train(job: str, seed: int) -> None:
        for step in range(1, 9):
            clients[job].save(step, tensors(seed + step))

    try:
        await asyncio.gather(
            asyncio.to_thread(train, JOB, 100), asyncio.to_thread(train, OTHER, 200)
        )
        for job, seed in ((JOB, 100), (OTHER, 200)):
            restored = await asyncio.to_thread(clients[job].restore)
            assert restored.step == 8 and same_tensors(restored.tensors, tensors(seed + 8))
            steps = {c.step for c in await asyncio.to_thread(clients[job].list)}
            assert 8 in steps and steps <= set(range(1, 9))
    finally:
        for client in clients.values():
            client.close()


async def test_a_multi_shard_checkpoint_commits_only_when_every_shard_is_in(
    cache: ServiceHost, stub: pb_grpc.CheckpointCacheServiceAsyncStub
) -> None:
    client = CheckpointClient(address(cache), JOB)
    try:
        await asyncio.to_thread(client.save, 1, tensors(1))
        for index in (0, 2):  # shard 1 of 3 is missing
            await asyncio.to_thread(
                client.save,
                2,
                tensors(10 + index),
                shard_index=index,
                shard_count=3,
                shard_snapshot_id="snap-2",
            )
        assert [c.checkpoint_id for c in await listed(stub)] == ["step-1"]
        assert (await asyncio.to_thread(client.restore)).step == 1
        with pytest.raises(CheckpointCacheError) as raised:
            await asyncio.to_thread(
                client.save, 3, tensors(3), checkpoint_id="step-2", shard_index=1, shard_count=3
            )
        assert raised.value.code == grpc.StatusCode.ALREADY_EXISTS
        await asyncio.to_thread(
            client.save, 2, tensors(11), shard_index=1, shard_count=3, shard_snapshot_id="snap-2"
        )
        newest = (await listed(stub))[0]
        assert (newest.checkpoint_id, newest.shard_count, newest.shard_snapshot_id) == (
            "step-2",
            3,
            "snap-2",
        )
        for index in range(3):
            shard = await asyncio.to_thread(client.restore, shard_index=index)
            assert (shard.step, shard.shard_index, shard.shard_count) == (2, index, 3)
            assert same_tensors(shard.tensors, tensors(10 + index))
        await asyncio.to_thread(client.wait_until_durable, "step-2", 30)
    finally:
        client.close()


async def test_retention_keeps_the_last_n_and_every_kth_step(
    nats_url: str, store_dir: Path, shm_dir: Path
) -> None:
    settings = settings_for(nats_url, store_dir, shm_dir, retain_last=2, retain_every_steps=4)
    async with running_service(build, settings) as host:
        client = CheckpointClient(address(host), JOB)
        try:
            for step in range(1, 10):
                await asyncio.to_thread(client.save, step, tensors(step, 1000))
                await asyncio.to_thread(client.wait_until_durable, f"step-{step}", 30)
            # Retention runs just after each persist is visible.
            await assert_eventually(
                lambda: sorted(os.listdir(store_dir / JOB)) == ["step-4", "step-8", "step-9"]
            )
        finally:
            client.close()


async def test_a_save_overlaps_the_persistence_of_the_previous_one(
    nats_url: str, store_dir: Path, shm_dir: Path
) -> None:
    # 1 MiB/s: persisting one 2 MB checkpoint takes about two seconds.
    settings = settings_for(nats_url, store_dir, shm_dir, persist_bytes_per_second=1024 * 1024)
    async with running_service(build, settings) as host:
        client = CheckpointClient(address(host), JOB)
        try:
            big = tensors(1, 500_000)
            first = await asyncio.to_thread(client.save, 1, big)
            second = await asyncio.to_thread(client.save, 2, tensors(2, 500_000))
            assert first.blocking_seconds < 0.5 and second.blocking_seconds < 0.5
            async with aio_channel(address(host), "ckptcache") as opened:
                stub = pb_grpc.CheckpointCacheServiceStub(opened)
                assert not await durable(stub, "step-1")  # still being written
            restored = await asyncio.to_thread(client.restore)
            assert restored.step == 2 and restored.transport == "shared-memory"
            # Deleting step 1 while it is being written waits for the write, then removes
            # it: it never reappears from the durable tier.
            await asyncio.to_thread(client.delete, "step-1")
            assert [c.checkpoint_id for c in await asyncio.to_thread(client.list)] == ["step-2"]
            assert not (store_dir / JOB / "step-1").exists()
            await asyncio.to_thread(client.wait_until_durable, "step-2", 30)
        finally:
            client.close()


async def test_idle_checkpoints_leave_memory_and_restore_from_disk(
    nats_url: str, store_dir: Path, shm_dir: Path
) -> None:
    settings = settings_for(nats_url, store_dir, shm_dir, memory_ttl_seconds=0.5)
    async with running_service(build, settings) as host:
        client = CheckpointClient(address(host), JOB)
        try:
            await asyncio.to_thread(client.save, 1, tensors(1))
            await asyncio.to_thread(client.wait_until_durable, "step-1", 30)
            await assert_eventually(lambda: not (shm_dir / JOB / "step-1").exists(), timeout=5)
            restored = await asyncio.to_thread(client.restore)
            assert restored.transport == "stream" and same_tensors(restored.tensors, tensors(1))
            await assert_eventually(lambda: files_under(shm_dir / JOB / ".free") == [], timeout=5)
        finally:
            client.close()


async def test_a_corrupted_copy_is_refused_and_the_previous_checkpoint_is_used(
    cache: ServiceHost,
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
    store_dir: Path,
    shm_dir: Path,
) -> None:
    client = CheckpointClient(address(cache), JOB)
    try:
        for step in (1, 2):
            await asyncio.to_thread(client.save, step, tensors(step))
            await asyncio.to_thread(client.wait_until_durable, f"step-{step}", 30)
        # Damage step 2 in memory: the durable copy of step 2 is used.
        segment = shm_dir / JOB / "step-2" / "shard-00000.seg"
        await assert_eventually(segment.exists)
        flip_a_byte(segment, 1000)
        restored = await asyncio.to_thread(client.restore)
        assert restored.step == 2 and same_tensors(restored.tensors, tensors(2))
        # Damage the durable copy as well: step 1 is used, never the torn step 2.
        flip_a_byte(store_dir / JOB / "step-2" / "shard-00000.data", 1000)
        restored = await asyncio.to_thread(client.restore)
        assert restored.step == 1 and same_tensors(restored.tensors, tensors(1))
        # Asked for by name, the damaged checkpoint is DATA_LOSS, not wrong bytes.
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await load(stub, "step-2")
        assert raised.value.code() == grpc.StatusCode.DATA_LOSS
        assert "corrupt" in (raised.value.details() or "")
    finally:
        client.close()


def flip_a_byte(path: Path, offset: int) -> None:
    with path.open("r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([value[0] ^ 0xFF]))


async def test_too_little_shared_memory_stops_startup_with_the_fix(
    nats_url: str, store_dir: Path, shm_dir: Path
) -> None:
    settings = settings_for(nats_url, store_dir, shm_dir, shm_min_bytes=1 << 60)
    with pytest.raises(Exception, match=r"--shm-size.*medium: Memory") as raised:
        async with running_service(build, settings):
            pytest.fail("the cache started on too little shared memory")
    assert "SIGBUS" in str(raised.value)


async def test_health_follows_the_store_being_writable(
    channel: grpc.aio.Channel, store_dir: Path
) -> None:
    health = health_pb2_grpc.HealthStub(channel)

    async def status() -> int:
        reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        return int(reply.status)

    serving = health_pb2.HealthCheckResponse.SERVING
    assert await status() == serving
    moved = store_dir.with_name("moved")
    os.rename(store_dir, moved)
    replace_with_a_file(store_dir)  # now nothing can be created under it
    await assert_eventually(lambda: _status_is(status, health_pb2.HealthCheckResponse.NOT_SERVING))
    os.unlink(store_dir)
    os.rename(moved, store_dir)
    await assert_eventually(lambda: _status_is(status, serving))


def replace_with_a_file(path: Path) -> None:
    path.write_text("not a directory")


async def _status_is(status: object, expected: int) -> bool:
    return bool(await status() == expected)  # type: ignore[operator]


async def test_an_event_left_unpublished_by_a_crash_goes_out_on_start(
    nats_url: str, store_dir: Path, shm_dir: Path, tmp_path: Path
) -> None:
    # A previous process persisted the checkpoint and died before publishing.
    store = DirectoryStore(store_dir)
    store.prepare()
    data = b"x" * 1000
    source = tmp_path / "segment"
    source.write_bytes(data)
    blob = header(data, "step-7", 7).SerializeToString()
    info = CheckpointInfo(
        JOB, "step-7", 7, len(data), checksum(data), Tier.DURABLE, datetime.now(UTC)
    )
    store.persist(info, [ShardSource(0, blob, len(data), checksum(data), source)], lambda _: None)
    assert [s.info.checkpoint_id for s in store.unpublished()] == ["step-7"]

    async with running_service(build, settings_for(nats_url, store_dir, shm_dir)):
        events = await assert_eventually(lambda: persisted_events(nats_url, 1))
        assert checkpoint_pb2.CheckpointStored.FromString(events[0].data).step == 7
        await assert_eventually((store_dir / JOB / "step-7" / "published").exists)
    assert time.monotonic() > 0


def held_bytes(path: Path) -> int:
    """Bytes of memory the files under ``path`` hold (allocated blocks, not sizes)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


async def test_a_stream_that_declares_much_and_sends_nothing_holds_nothing(
    nats_url: str, store_dir: Path, shm_dir: Path
) -> None:
    """Pages are allocated as data arrives: three uploads that each declare 64 MiB and then
    wait hold no memory between them (they held 192 MiB when the declared size was
    allocated up front; the quota and budget count it), and each is discarded when its
    client goes away."""
    settings = settings_for(
        nats_url,
        store_dir,
        shm_dir,
        max_checkpoint_bytes=64 * 1024 * 1024,
        max_job_memory_bytes=3 * 64 * 1024 * 1024,
        max_uploads_per_job=3,
    )
    async with (
        running_service(build, settings) as host,
        aio_channel(address(host), "ckptcache") as opened,
    ):
        stub = pb_grpc.CheckpointCacheServiceStub(opened)
        release = asyncio.Event()

        async def header_only(index: int) -> AsyncIterator[pb.SaveCheckpointRequest]:
            declared = header(b"", checkpoint_id=f"big-{index}", size_bytes=64 * 1024 * 1024)
            yield pb.SaveCheckpointRequest(header=declared)
            await release.wait()

        before = held_bytes(shm_dir)
        calls = [stub.SaveCheckpoint(header_only(index), metadata=MD) for index in range(3)]
        await asyncio.sleep(1.0)  # each header is in, each segment created
        assert segments(shm_dir) == 3
        assert held_bytes(shm_dir) - before < 1024 * 1024
        for call in calls:
            call.cancel()
        release.set()
        await assert_eventually(lambda: no_segments(shm_dir))


def segments(path: Path) -> int:
    return len(list(path.rglob("*.seg")))


async def no_segments(path: Path) -> bool:
    return segments(path) == 0


async def test_a_job_past_its_memory_quota_is_refused_others_are_not(
    nats_url: str, store_dir: Path, shm_dir: Path
) -> None:
    settings = settings_for(nats_url, store_dir, shm_dir, max_job_memory_bytes=1024 * 1024)
    async with (
        running_service(build, settings) as host,
        aio_channel(address(host), "ckptcache") as opened,
    ):
        stub = pb_grpc.CheckpointCacheServiceStub(opened)
        first = payload(600 * 1024)
        saved = await save(stub, save_stream(header(first, "step-1", 1), first))
        assert saved.tier == MEMORY
        second = payload(600 * 1024, seed=2)
        # Refused after its header, while the client may still be writing. grpc.aio's client then
        # sometimes reports INTERNAL "Failed execute_batch" instead of the server's status
        # (grpc/grpc#36066); the blocking client reports the status the server sent.
        refused = save_blocking(address(host), save_stream(header(second, "step-2", 2), second))
        with pytest.raises(grpc.RpcError) as raised:
            await refused
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, raised.value
        details = raised.value.details() or ""
        assert details.startswith(f"job {JOB!r} holds 614,400 bytes"), details
        assert (
            "quota is 1,048,576" in details and "STRIDE_CKPTCACHE_MAX_JOB_MEMORY_BYTES" in details
        )
        # Nothing of the refused save is left, and the first one still loads.
        assert [c.checkpoint_id for c in await listed(stub)] == ["step-1"]
        _, data, _ = await load(stub, "step-1")
        assert data == first
        # Another job's quota is its own.
        other = header(second, "step-2", 2, job_id=OTHER)
        other_md = (("stride-job-id", OTHER),)
        assert (await save(stub, save_stream(other, second), other_md)).tier == MEMORY
