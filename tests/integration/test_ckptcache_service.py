"""The checkpoint cache on real NATS and a real directory: save, load, list, delete, events,
torn uploads, corruption, health, bad input."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.msg import Msg

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc
from stride.ckptcache.adapters.directory_store import DirectoryStore
from stride.ckptcache.app import SERVICE_NAME, build
from stride.ckptcache.domain.checkpoints import CheckpointHeader
from stride.ckptcache.domain.checksum import checksum
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.events.v1 import checkpoint_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

JOB = "job-ckpt01"
CHUNK = 64 * 1024


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def settings_for(nats_url: str, store_dir: Path) -> CheckpointCacheSettings:
    return CheckpointCacheSettings(
        nats_url=nats_url,
        store_dir=store_dir,
        grpc_port=0,
        grpc_host="127.0.0.1",
        health_interval_seconds=0.1,
        chunk_bytes=CHUNK,
        max_checkpoint_bytes=8 * 1024 * 1024,
        publish_retry_seconds=0.2,
    )


@pytest.fixture
async def cache(nats_url: str, store_dir: Path) -> AsyncIterator[ServiceHost]:
    async with running_service(build, settings_for(nats_url, store_dir)) as host:
        yield host


@pytest.fixture
async def channel(cache: ServiceHost) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{cache.server.port}") as opened:
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
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, messages: Iterable[pb.SaveCheckpointRequest]
) -> pb.SaveCheckpointResponse:
    async def requests() -> AsyncIterator[pb.SaveCheckpointRequest]:
        for message in messages:
            yield message

    return await stub.SaveCheckpoint(requests())


async def load(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, checkpoint_id: str = ""
) -> tuple[pb.CheckpointHeader, bytes, int]:
    chunks = [
        reply
        async for reply in stub.LoadCheckpoint(
            pb.LoadCheckpointRequest(job_id=JOB, checkpoint_id=checkpoint_id)
        )
    ]
    assert chunks[0].WhichOneof("chunk") == "header"
    assert all(c.WhichOneof("chunk") == "data" for c in chunks[1:])
    return chunks[0].header, b"".join(c.data for c in chunks[1:]), len(chunks) - 1


async def expect_error(call: object, code: grpc.StatusCode, starts_with: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == code, raised.value.details()
    details = raised.value.details() or ""
    assert details.startswith(starts_with), details
    return details


async def persisted_events(nats_url: str, count: int) -> list[Msg]:
    found = await stream_messages(nats_url, f"stride.checkpoints.v1.{JOB}.persisted")
    assert len(found) >= count, f"{len(found)} of {count} events"
    return found


def visible_and_staging(store_dir: Path) -> tuple[list[str], list[str]]:
    job_dir = store_dir / JOB
    visible = sorted(p.name for p in job_dir.iterdir()) if job_dir.exists() else []
    staging_dir = store_dir / ".staging"
    staging = sorted(p.name for p in staging_dir.iterdir()) if staging_dir.exists() else []
    return visible, staging


async def test_save_then_load_round_trips_and_announces_it(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, nats_url: str, channel: grpc.aio.Channel
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING

    data = payload(300_000)
    saved = await save(stub, save_stream(header(data), data))
    assert saved.tier == checkpoint_pb2.CHECKPOINT_TIER_DURABLE
    loaded_header, loaded, chunks = await load(stub, "step-100")
    assert loaded == data and chunks == 5  # 300,000 bytes in 64 KiB chunks
    assert loaded_header == header(data)

    events = await assert_eventually(lambda: persisted_events(nats_url, 1))
    event = checkpoint_pb2.CheckpointStored.FromString(events[0].data)
    assert (event.checkpoint_id, event.step, event.size_bytes, event.shard_snapshot) == (
        "step-100",
        100,
        len(data),
        b"shards@100",
    )
    assert event.tier == checkpoint_pb2.CHECKPOINT_TIER_DURABLE
    headers = events[0].headers or {}
    assert headers["Nats-Msg-Id"] == f"{JOB}.step-100.persisted.{checksum(data):08x}"
    assert headers["Stride-Type"] == "stride.events.v1.CheckpointStored"

    # A retried save of the same checkpoint succeeds; its event has the same id, so
    # JetStream keeps one. (save publishes before it returns, so counting now is fair.)
    await save(stub, save_stream(header(data), data))
    assert len(await persisted_events(nats_url, 1)) == 1


async def test_list_is_newest_first_and_empty_id_loads_the_newest(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
) -> None:
    for step in (100, 300, 200):
        data = payload(1000 + step, seed=step)
        await save(stub, save_stream(header(data, f"step-{step}", step), data))
    listed = await stub.ListCheckpoints(pb.ListCheckpointsRequest(job_id=JOB))
    assert [c.checkpoint_id for c in listed.checkpoints] == ["step-300", "step-200", "step-100"]
    assert listed.checkpoints[0].size_bytes == 1300
    assert listed.checkpoints[0].saved_at.ToDatetime(tzinfo=UTC) <= datetime.now(UTC)
    newest_header, newest, _ = await load(stub)
    assert newest_header.checkpoint_id == "step-300" and newest == payload(1300, seed=300)
    other = await stub.ListCheckpoints(pb.ListCheckpointsRequest(job_id="job-other"))
    assert list(other.checkpoints) == []

    await stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(job_id=JOB, checkpoint_id="step-300"))
    assert (await load(stub))[0].checkpoint_id == "step-200"
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(job_id=JOB, checkpoint_id="step-300")).read(),
        grpc.StatusCode.NOT_FOUND,
    )
    await expect_error(
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(job_id=JOB, checkpoint_id="step-300")),
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
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, store_dir: Path, nats_url: str
) -> None:
    data = payload(10_000)
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[list[pb.SaveCheckpointRequest], str]] = [
        ([], "header:"),
        (save_stream(None, data), "header:"),
        (save_stream(header(data, job_id=""), data), "header.job_id:"),
        (save_stream(header(data, job_id="job.x"), data), "header.job_id:"),
        (save_stream(header(data, checkpoint_id="../../etc"), data), "header.checkpoint_id:"),
        (save_stream(header(data, step=-1), data), "header.step:"),
        (save_stream(header(data, size_bytes=9 * 1024 * 1024), data), "header.size_bytes:"),
        (save_stream(header(data), data[:-1]), "header.size_bytes:"),
        (save_stream(header(data, size_bytes=9_000), data), "header.size_bytes:"),
        (save_stream(header(data, crc32c=checksum(data) ^ 1), data), "header.crc32c:"),
        (save_stream(header(data), data)[:1] + save_stream(header(data), data), "header:"),
        ([*save_stream(header(data), data), pb.SaveCheckpointRequest()], "data:"),
    ]
    bad_tensor = header(data)
    bad_tensor.tensors[0].offset = 9_990
    cases.append((save_stream(bad_tensor, data), "header.tensors[0].length:"))
    for messages, prefix in cases:
        await expect_error(save(stub, messages), invalid, prefix)
    assert visible_and_staging(store_dir) == ([], [])
    listed = await stub.ListCheckpoints(pb.ListCheckpointsRequest(job_id=JOB))
    assert list(listed.checkpoints) == []
    assert await stream_messages(nats_url, "stride.checkpoints.v1.>") == []


async def test_an_abandoned_upload_leaves_nothing_visible(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, store_dir: Path
) -> None:
    data = payload(200_000)
    sent_some = asyncio.Event()

    async def torn() -> AsyncIterator[pb.SaveCheckpointRequest]:
        yield pb.SaveCheckpointRequest(header=header(data))
        yield pb.SaveCheckpointRequest(data=data[:50_000])
        sent_some.set()
        await asyncio.Event().wait()  # the client hangs, then goes away

    call = stub.SaveCheckpoint(torn())
    await sent_some.wait()
    await assert_eventually(lambda: visible_and_staging(store_dir)[1] != [])
    call.cancel()
    assert await assert_eventually(lambda: visible_and_staging(store_dir) == ([], []))
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(job_id=JOB)).read(), grpc.StatusCode.NOT_FOUND
    )


async def test_bad_reads_name_the_field_or_are_not_found(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await expect_error(stub.ListCheckpoints(pb.ListCheckpointsRequest()), invalid, "job_id:")
    await expect_error(stub.LoadCheckpoint(pb.LoadCheckpointRequest()).read(), invalid, "job_id:")
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(job_id=JOB, checkpoint_id="a/b")).read(),
        invalid,
        "checkpoint_id:",
    )
    await expect_error(
        stub.DeleteCheckpoint(pb.DeleteCheckpointRequest(job_id=JOB)), invalid, "checkpoint_id:"
    )
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(job_id=JOB)).read(), grpc.StatusCode.NOT_FOUND
    )
    await expect_error(
        stub.LoadCheckpoint(pb.LoadCheckpointRequest(job_id=JOB, checkpoint_id="nope")).read(),
        grpc.StatusCode.NOT_FOUND,
    )


async def test_a_corrupted_buffer_is_data_loss(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, store_dir: Path
) -> None:
    data = payload(100_000)
    await save(stub, save_stream(header(data), data))
    path = store_dir / JOB / "step-100" / "data"
    with path.open("r+b") as handle:
        handle.seek(70_000)
        handle.write(b"\x00\x01\x02")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await load(stub, "step-100")
    assert raised.value.code() == grpc.StatusCode.DATA_LOSS
    assert "corrupt" in (raised.value.details() or "")


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
    replace_with_a_file(store_dir, moved)
    await assert_eventually(lambda: _status_is(status, health_pb2.HealthCheckResponse.NOT_SERVING))
    put_back(store_dir, moved)
    await assert_eventually(lambda: _status_is(status, serving))


def replace_with_a_file(store_dir: Path, moved: Path) -> None:
    os.rename(store_dir, moved)
    store_dir.write_text("not a directory")  # now nothing can be created under it


def put_back(store_dir: Path, moved: Path) -> None:
    store_dir.unlink()
    os.rename(moved, store_dir)


async def _status_is(status: object, expected: int) -> bool:
    return bool(await status() == expected)  # type: ignore[operator]


async def test_an_event_left_unpublished_by_a_crash_goes_out_on_start(
    nats_url: str, store_dir: Path
) -> None:
    # A previous process committed the checkpoint and died before publishing.
    store = DirectoryStore(store_dir)
    store.prepare()
    data = b"x" * 1000
    blob = header(data, "step-7", 7).SerializeToString()
    upload = await store.begin(CheckpointHeader(JOB, "step-7", 7, len(data), checksum(data)), blob)
    await upload.write(data)
    await upload.commit(datetime.now(UTC))
    assert [s.info.checkpoint_id for s in await store.unpublished()] == ["step-7"]

    async with running_service(build, settings_for(nats_url, store_dir)):
        events = await assert_eventually(lambda: persisted_events(nats_url, 1))
        assert checkpoint_pb2.CheckpointStored.FromString(events[0].data).step == 7
        await assert_eventually((store_dir / JOB / "step-7" / "published").exists)
