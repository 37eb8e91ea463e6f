"""The checkpoint cache as a real process: SIGKILL in the middle of persisting, restarts
while checkpoints sit in shared memory, and a disk that fills up.

What a restart keeps: shared memory (tmpfs) outlives the cache process, so after the cache
alone restarts, every complete checkpoint that was in memory is restorable from memory
again and is persisted if it was not yet. When the node is lost (shared memory gone), the
newest complete durable checkpoint is restored; a persist the crash interrupted never
shows.
"""

from __future__ import annotations

import asyncio
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from stride.ckptclient import CheckpointClient
from stride.cli.supervisor import Child, remove_cache_memory
from stride.events.v1 import checkpoint_pb2
from stride.runtime.checkpoint_memory import default_shm_dir, remove_default_shm_dir
from stride.runtime.healthcheck import check
from stride.testing import ckptcache
from stride.testing.ckptcache import shm_folder
from stride.testing.eventually import assert_eventually
from stride.testing.processes import ServiceProcess

pytestmark = pytest.mark.integration

JOB = "job-crash01"
SERVICE = "stride.api.ckptcache.v1.CheckpointCacheService"


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    yield from shm_folder()


cache_process = ckptcache.cache_process


def serving(address: str) -> bool:
    return check(address, SERVICE, timeout=1)[0]


async def started(process: ServiceProcess) -> None:
    await assert_eventually(
        lambda: serving(process.address),
        timeout=30,
        interval=0.1,
        message=process.log_text()[-2000:],
    )


def state(seed: int, floats: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"weights": rng.standard_normal(floats).astype(np.float32), "step": np.array(seed)}


def same(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> bool:
    return left.keys() == right.keys() and all(np.array_equal(left[k], right[k]) for k in left)


def persisting(store: Path) -> bool:
    staging = store / ".staging"
    return staging.exists() and any(staging.rglob("shard-*.data"))


async def crash_while_persisting(process: ServiceProcess, store: Path) -> dict[str, np.ndarray]:
    """Save step 1 (durable), then step 2, and SIGKILL the cache while step 2 persists."""
    client = CheckpointClient(process.address, JOB)
    try:
        first = state(1, 250_000)  # 1 MB: about half a second at 2 MiB/s
        await asyncio.to_thread(client.save, 1, first)
        await asyncio.to_thread(client.wait_until_durable, "step-1", 30)
        await asyncio.to_thread(client.save, 2, state(2, 2_000_000))  # 8 MB: about 4 s
        await assert_eventually(lambda: persisting(store), timeout=10, interval=0.01)
    finally:
        client.close()
    process.kill()
    assert not (store / JOB / "step-2").exists()
    return first


async def test_sigkill_while_persisting_then_node_loss_restores_the_previous_checkpoint(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    store = tmp_path / "store"
    process = cache_process(nats_url, tmp_path, shm_dir, persist_bytes_per_second="2097152")
    process.start()
    try:
        await started(process)
        first = await crash_while_persisting(process, store)
        shutil.rmtree(shm_dir)  # the node is gone with its memory
        process.start()
        await started(process)
        client = CheckpointClient(process.address, JOB)
        try:
            restored = await asyncio.to_thread(client.restore)
            assert restored.step == 1 and same(restored.tensors, first)
            assert [c.checkpoint_id for c in await asyncio.to_thread(client.list)] == ["step-1"]
        finally:
            client.close()
        assert not (store / ".staging").exists() or not any((store / ".staging").iterdir())
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]


async def test_a_restarted_cache_restores_from_shared_memory_and_finishes_persisting(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    store = tmp_path / "store"
    process = cache_process(nats_url, tmp_path, shm_dir, persist_bytes_per_second="2097152")
    process.start()
    try:
        await started(process)
        await crash_while_persisting(process, store)
        process.env["STRIDE_CKPTCACHE_PERSIST_BYTES_PER_SECOND"] = "1073741824"
        process.start()
        await started(process)
        client = CheckpointClient(process.address, JOB)
        try:
            restored = await asyncio.to_thread(client.restore)
            assert restored.step == 2 and restored.transport == "shared-memory"
            assert same(restored.tensors, state(2, 2_000_000))
            info = await asyncio.to_thread(client.wait_until_durable, "step-2", 30)
            assert info.tier == checkpoint_pb2.CHECKPOINT_TIER_DURABLE
        finally:
            client.close()
        assert "checkpoints found in shared memory after a restart" in process.log_text()
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]


class FileSizeLimitedProcess(ServiceProcess):
    """The cache with RLIMIT_FSIZE set: no file it writes may grow past ``limit`` bytes.

    This stands in for a full disk. A tiny tmpfs would give the real ENOSPC but needs root
    to mount; the file-size limit makes the kernel fail the persist's write() the same way
    at the OS level, with EFBIG instead of ENOSPC.
    """

    def __init__(self, base: ServiceProcess, limit: int) -> None:
        self.__dict__.update(base.__dict__)
        self.limit = limit

    def start(self) -> ServiceProcess:
        limit = self.limit

        def limited() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stride.ckptcache"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=limited,  # noqa: PLW1509 - only setrlimit, before exec
        )
        log.close()
        return self


async def test_a_full_disk_fails_persistence_clearly_without_blocking_training(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    store = tmp_path / "store"
    process = FileSizeLimitedProcess(cache_process(nats_url, tmp_path, shm_dir), 3 * 1024 * 1024)
    process.start()
    try:
        await started(process)
        client = CheckpointClient(process.address, JOB)
        try:
            small = state(1, 100_000)  # 400 KB: fits
            await asyncio.to_thread(client.save, 1, small)
            await asyncio.to_thread(client.wait_until_durable, "step-1", 30)
            big = state(2, 1_000_000)  # 4 MB: past the limit
            saved = await asyncio.to_thread(client.save, 2, big)
            assert saved.tier == "memory"  # training went on
            with pytest.raises(RuntimeError, match=r"File too large \(EFBIG\)"):
                await asyncio.to_thread(client.wait_until_durable, "step-2", 30)
            listed = {c.checkpoint_id: c for c in await asyncio.to_thread(client.list)}
            assert listed["step-1"].tier == checkpoint_pb2.CHECKPOINT_TIER_DURABLE
            assert listed["step-2"].tier == checkpoint_pb2.CHECKPOINT_TIER_MEMORY
            assert "EFBIG" in listed["step-2"].persist_error
            restored = await asyncio.to_thread(client.restore)
            assert restored.step == 2 and same(restored.tensors, big)
            assert sorted(p.name for p in (store / JOB).iterdir()) == ["step-1"]
            assert not any((store / ".staging").iterdir())
            # Room again (a smaller checkpoint): persistence resumes.
            await asyncio.to_thread(client.save, 3, state(3, 100_000))
            await asyncio.to_thread(client.wait_until_durable, "step-3", 30)
        finally:
            client.close()
        assert "checkpoint not persisted; it stays in memory only" in process.log_text()
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]


async def test_a_clean_stop_keeps_shared_memory_only_while_it_holds_the_only_copy(
    nats_url: str, tmp_path: Path, shm_dir: Path
) -> None:
    """A clean stop gives the shared memory back only when everything in it is durable: a
    checkpoint whose persist failed stays for the next start, which persists it."""
    base = cache_process(nats_url, tmp_path, shm_dir)
    process = FileSizeLimitedProcess(base, 3 * 1024 * 1024)
    process.start()
    try:
        await started(process)
        client = CheckpointClient(process.address, JOB)
        try:
            big = state(2, 1_000_000)  # 4 MB: past the limit, so only in memory
            await asyncio.to_thread(client.save, 2, big)
            with pytest.raises(RuntimeError, match=r"EFBIG"):
                await asyncio.to_thread(client.wait_until_durable, "step-2", 30)
        finally:
            client.close()
    finally:
        assert process.terminate() == 0, process.log_text()[-3000:]
    assert "shared memory kept" in process.log_text()
    assert (shm_dir / JOB / "step-2").is_dir()
    base.start()  # room on disk again
    try:
        await started(base)
        client = CheckpointClient(base.address, JOB)
        try:
            await asyncio.to_thread(client.wait_until_durable, "step-2", 30)
        finally:
            client.close()
    finally:
        assert base.terminate() == 0, base.log_text()[-3000:]
    assert gone(shm_dir)
    assert "shared memory released" in base.log_text()


def gone(path: Path) -> bool:
    return not path.exists()


async def test_stride_down_removes_what_a_killed_cache_left_in_shared_memory(
    nats_url: str, tmp_path: Path
) -> None:
    """The supervisor's end of ``stride down``: a cache killed with checkpoints in shared
    memory cannot remove its directory itself, so the supervisor removes the default one
    (derived from the store directory, as the cache derives it)."""
    store = tmp_path / "store"
    env = {
        "STRIDE_NATS_URL": nats_url,
        "STRIDE_CKPTCACHE_STORE_DIR": str(store),
        "STRIDE_CKPTCACHE_HEALTH_INTERVAL_SECONDS": "0.2",
    }
    process = ServiceProcess("ckptcache", env, tmp_path)
    directory = default_shm_dir(store)
    process.start()
    try:
        await started(process)
        client = CheckpointClient(process.address, JOB)
        try:
            await asyncio.to_thread(client.save, 1, state(1, 1000))
        finally:
            client.close()
        process.kill()
        assert (directory / JOB / "step-1").is_dir()
        remove_cache_memory([Child("ckptcache", process.port, process.env, tmp_path / "log")])
        assert gone(directory)
    finally:
        process.kill()
        remove_default_shm_dir(store)
