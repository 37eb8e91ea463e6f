"""The checkpoint cache's shared memory is bounded, on the real cache process: one job token
that opens many large uploads and goes idle (issue 37, finding 4), a budget across jobs, a
budget bigger than the filesystem's free space, a per-job quota above the budget, and the
memory given back when the cache stops."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc
from stride.ckptcache.domain.checksum import checksum
from stride.events.v1.checkpoint_pb2 import CHECKPOINT_TIER_DURABLE, CHECKPOINT_TIER_MEMORY
from stride.runtime.healthcheck import check
from stride.testing import ckptcache
from stride.testing.channels import aio_channel, job_token
from stride.testing.ckptcache import shm_folder
from stride.testing.eventually import assert_eventually
from stride.testing.processes import ServiceProcess

pytestmark = pytest.mark.integration

JOB = "job-shmlim01"
OTHER = "job-shmlim02"
SERVICE = "stride.api.ckptcache.v1.CheckpointCacheService"
MIB = 1024 * 1024
CHUNK = 256 * 1024
UPLOAD = 2 * MIB
"""Each upload's declared size; it sends three quarters of it, then goes idle."""


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    yield from shm_folder()


def cache_process(nats_url: str, tmp_path: Path, shm_dir: Path, **settings: str) -> ServiceProcess:
    """The cache with small chunks and checkpoints, so the limits are reached fast."""
    small = {"chunk_bytes": str(CHUNK), "max_checkpoint_bytes": str(8 * MIB)}
    return ckptcache.cache_process(nats_url, tmp_path, shm_dir, **{**small, **settings})


async def started(process: ServiceProcess) -> None:
    await assert_eventually(
        lambda: check(process.address, SERVICE, timeout=1)[0],
        timeout=30,
        interval=0.1,
        message=process.log_text()[-2000:],
    )


def held_bytes(path: Path) -> int:
    """Memory the files under ``path`` hold (allocated blocks, not sizes)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def segments(path: Path) -> list[Path]:
    return list(path.rglob("*.seg"))


def leftover(path: Path) -> list[str] | None:
    """What is under ``path``, or None if it is gone."""
    return sorted(str(p) for p in path.rglob("*")) if path.exists() else None


def payload(size: int, seed: int) -> bytes:
    return bytes((index * 31 + seed) % 251 for index in range(256)) * (size // 256)


def header(data: bytes, checkpoint_id: str, **changes: object) -> pb.CheckpointHeader:
    message = pb.CheckpointHeader(
        checkpoint_id=checkpoint_id,
        step=1,
        size_bytes=len(data),
        crc32c=checksum(data),
    )
    for key, value in changes.items():
        setattr(message, key, value)
    return message


async def idle_upload(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub,
    checkpoint_id: str,
    hang: asyncio.Event,
    sent: int = 3 * UPLOAD // 4,
) -> pb.SaveCheckpointResponse:
    """Declare ``UPLOAD`` bytes, send ``sent`` of them, then send nothing until ``hang``."""
    data = payload(UPLOAD, seed=len(checkpoint_id))

    async def messages() -> AsyncIterator[pb.SaveCheckpointRequest]:
        yield pb.SaveCheckpointRequest(header=header(data, checkpoint_id))
        for start in range(0, sent, CHUNK):
            yield pb.SaveCheckpointRequest(data=data[start : start + CHUNK])
        await hang.wait()

    reply: pb.SaveCheckpointResponse = await stub.SaveCheckpoint(messages())
    return reply


async def header_only(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, checkpoint_id: str, size: int = UPLOAD
) -> pb.SaveCheckpointResponse:
    """Declare a save of ``size`` bytes and send nothing more: what the cache answers to the
    header alone. (A refusal then reaches grpc's asyncio client whole: one still writing
    chunks when it comes now and then reports its own failed write instead.)"""
    declared = header(payload(size, seed=7), checkpoint_id)
    never = asyncio.Event()

    async def messages() -> AsyncIterator[pb.SaveCheckpointRequest]:
        yield pb.SaveCheckpointRequest(header=declared)
        await never.wait()

    reply: pb.SaveCheckpointResponse = await asyncio.wait_for(
        stub.SaveCheckpoint(messages()), timeout=10
    )
    return reply


async def full_save(
    stub: pb_grpc.CheckpointCacheServiceAsyncStub, checkpoint_id: str, size: int = UPLOAD
) -> pb.SaveCheckpointResponse:
    data = payload(size, seed=7)

    async def messages() -> AsyncIterator[pb.SaveCheckpointRequest]:
        yield pb.SaveCheckpointRequest(header=header(data, checkpoint_id))
        for start in range(0, size, CHUNK):
            yield pb.SaveCheckpointRequest(data=data[start : start + CHUNK])

    reply: pb.SaveCheckpointResponse = await stub.SaveCheckpoint(messages())
    return reply


def status_of(outcome: object) -> tuple[grpc.StatusCode, str]:
    assert isinstance(outcome, grpc.aio.AioRpcError), outcome
    return outcome.code(), outcome.details() or ""


async def test_eight_idle_uploads_of_one_job_token_are_refused_or_timed_out_and_memory_returns(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    """The finding: one job token, 8 large SaveCheckpoint streams, then idle, held their
    data in /dev/shm for as long as they stayed open. Now two may be in progress at once
    (the other six are refused before any data is sent), the two time out when idle, and
    their data and reservations go at once: the memory is back to what it was."""
    process = cache_process(nats_url, tmp_path, shm_dir, upload_idle_seconds="3")
    process.start()
    try:
        await started(process)
        baseline = held_bytes(shm_dir)
        hang = asyncio.Event()
        async with aio_channel(process.address, "ckptcache", token=job_token(JOB)) as channel:
            stub = pb_grpc.CheckpointCacheServiceStub(channel)
            uploads = [
                asyncio.ensure_future(idle_upload(stub, f"step-{index}", hang))
                for index in range(8)
            ]
            # The two admitted uploads hold what they sent while they idle.
            await assert_eventually(
                lambda: held_bytes(shm_dir) - baseline >= 2 * (3 * UPLOAD // 4), timeout=2.5
            )
            outcomes = await asyncio.wait_for(
                asyncio.gather(*uploads, return_exceptions=True), timeout=20
            )
            hang.set()
            codes = [status_of(outcome)[0] for outcome in outcomes]
            assert codes.count(grpc.StatusCode.DEADLINE_EXCEEDED) == 2, outcomes
            for outcome in outcomes:
                code, details = status_of(outcome)
                if code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    assert "nothing for 3 s (STRIDE_CKPTCACHE_UPLOAD_IDLE_SECONDS)" in details
                elif code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    assert "STRIDE_CKPTCACHE_MAX_UPLOADS_PER_JOB=2" in details, details
                else:
                    # grpc's asyncio client, still writing its chunks when the server
                    # answered, now and then reports its own failed write instead of the
                    # server's status (the trainer's client is the synchronous one).
                    assert (code, details) == (
                        grpc.StatusCode.INTERNAL,
                        "Internal error from Core",
                    ), outcomes
            # The server refused the six, naming the limit, before any data.
            refused = process.log_text().count("STRIDE_CKPTCACHE_MAX_UPLOADS_PER_JOB=2")
            assert refused == 6, process.log_text()[-3000:]
            # Released at once: no partial segment, the memory back to what it was.
            await assert_eventually(lambda: segments(shm_dir) == [], timeout=2)
            assert held_bytes(shm_dir) == baseline
            # And the reservations with it: the job saves again.
            assert (await full_save(stub, "step-9")).tier == CHECKPOINT_TIER_MEMORY
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]


async def test_the_budget_bounds_every_job_together_and_a_refused_upload_leaves_nothing(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    process = cache_process(
        nats_url,
        tmp_path,
        shm_dir,
        max_memory_bytes=str(3 * MIB),
        max_job_memory_bytes=str(3 * MIB),
        upload_idle_seconds="30",
    )
    process.start()
    try:
        await started(process)
        hang = asyncio.Event()
        async with (
            aio_channel(process.address, "ckptcache", token=job_token(JOB)) as first,
            aio_channel(process.address, "ckptcache", token=job_token(OTHER)) as second,
        ):
            holding = asyncio.ensure_future(
                idle_upload(pb_grpc.CheckpointCacheServiceStub(first), "step-1", hang)
            )
            await assert_eventually(lambda: len(segments(shm_dir)) == 1, timeout=5)
            other = pb_grpc.CheckpointCacheServiceStub(second)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await header_only(other, "step-1")
            code, details = status_of(refused.value)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "budget is 3,145,728 (STRIDE_CKPTCACHE_MAX_MEMORY_BYTES)" in details, details
            assert len(segments(shm_dir)) == 1  # nothing of the refused save
            assert not (shm_dir / OTHER / "step-1").exists()
            hang.set()  # the first upload ends short: discarded, its budget back
            with pytest.raises(grpc.aio.AioRpcError):
                await holding
            await assert_eventually(lambda: segments(shm_dir) == [], timeout=5)
            assert (await full_save(other, "step-1")).tier == CHECKPOINT_TIER_MEMORY
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]


async def test_a_budget_bigger_than_the_free_shared_memory_is_held_to_what_is_free(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    huge = str(1 << 50)  # a petabyte: more than any /dev/shm
    process = cache_process(
        nats_url, tmp_path, shm_dir, max_memory_bytes=huge, max_checkpoint_bytes=huge
    )
    process.start()
    try:
        await started(process)
        assert "more than the filesystem has free" in process.log_text()
        free = shutil.disk_usage("/dev/shm").free
        async with aio_channel(process.address, "ckptcache", token=job_token(JOB)) as channel:
            stub = pb_grpc.CheckpointCacheServiceStub(channel)

            async def declares_more_than_is_free() -> AsyncIterator[pb.SaveCheckpointRequest]:
                declared = header(b"", "step-1", size_bytes=free + 64 * 1024 * MIB, crc32c=0)
                yield pb.SaveCheckpointRequest(header=declared)
                yield pb.SaveCheckpointRequest(data=b"x" * CHUNK)

            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.SaveCheckpoint(declares_more_than_is_free())
            code, details = status_of(refused.value)
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"shared memory at {shm_dir} has" in details and "MiB free" in details
            assert segments(shm_dir) == []
            # What fits still saves.
            assert (await full_save(stub, "step-2")).tier == CHECKPOINT_TIER_MEMORY
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]


async def test_a_job_quota_above_the_budget_stops_the_cache_at_start(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    process = cache_process(
        nats_url,
        tmp_path,
        shm_dir,
        max_memory_bytes=str(4 * MIB),
        max_job_memory_bytes=str(8 * MIB),
    )
    process.start()
    assert process.process is not None
    assert await asyncio.to_thread(process.process.wait, 30) == 2
    said = process.log_text()
    assert "STRIDE_CKPTCACHE_MAX_JOB_MEMORY_BYTES (8,388,608 bytes)" in said, said
    assert "budget (4,194,304 bytes: STRIDE_CKPTCACHE_MAX_MEMORY_BYTES)" in said, said


async def test_a_clean_stop_gives_the_shared_memory_back(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    process = cache_process(nats_url, tmp_path, shm_dir)
    process.start()
    try:
        await started(process)
        async with aio_channel(process.address, "ckptcache", token=job_token(JOB)) as channel:
            stub = pb_grpc.CheckpointCacheServiceStub(channel)
            await full_save(stub, "step-1")

            async def durable() -> bool:
                reply = await stub.ListCheckpoints(pb.ListCheckpointsRequest())
                return [c.tier for c in reply.checkpoints] == [CHECKPOINT_TIER_DURABLE]

            await assert_eventually(durable, timeout=10)
        assert segments(shm_dir) != []  # the newest checkpoint stays in memory while it runs
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]
    assert leftover(shm_dir) is None
    assert "shared memory released" in process.log_text()
