"""The shared-memory budget: its limits from the settings, and which limit refuses a shard."""

from __future__ import annotations

from pathlib import Path

import pytest

from stride.ckptcache.domain.memory_budget import (
    HeldBytes,
    MemoryLedger,
    MemoryLimits,
    Reservation,
    SharedMemoryState,
    resolve_limits,
)
from stride.runtime.checkpoint_memory import (
    DIRECTORY_PREFIX,
    default_shm_dir,
    remove_default_shm_dir,
)
from stride.runtime.errors import ResourceExhausted

MIB = 1024 * 1024
NOTHING_HELD = HeldBytes(0, 0)


def roomy(free: int = 1024 * MIB, pool: int = 0) -> SharedMemoryState:
    return SharedMemoryState("/dev/shm/stride-ckptcache-x", free, pool)


def upload(size: int, job: str = "job-1") -> Reservation:
    return Reservation(job, size, streamed=True)


def test_the_default_budget_is_half_the_filesystem_and_the_quota_fits_in_it() -> None:
    limits = resolve_limits(
        budget_bytes=None,
        filesystem_bytes=1000 * MIB,
        job_quota_bytes=None,
        max_checkpoint_bytes=64 * 1024 * MIB,
        uploads_per_job=2,
    )
    assert limits == MemoryLimits(500 * MIB, 500 * MIB, 2)
    small = resolve_limits(
        budget_bytes=None,
        filesystem_bytes=1000 * MIB,
        job_quota_bytes=None,
        max_checkpoint_bytes=100 * MIB,
        uploads_per_job=2,
    )
    assert small.job_quota_bytes == 200 * MIB


@pytest.mark.parametrize(
    ("budget", "names"),
    [(100 * MIB, "STRIDE_CKPTCACHE_MAX_MEMORY_BYTES)"), (None, "half the shared-memory")],
)
def test_a_job_quota_above_the_budget_is_refused_naming_both(
    budget: int | None, names: str
) -> None:
    with pytest.raises(ValueError, match="STRIDE_CKPTCACHE_MAX_JOB_MEMORY_BYTES") as raised:
        resolve_limits(
            budget_bytes=budget,
            filesystem_bytes=100 * MIB,
            job_quota_bytes=200 * MIB,
            max_checkpoint_bytes=MIB,
            uploads_per_job=2,
        )
    assert names in str(raised.value) and "209,715,200" in str(raised.value)


def test_a_job_has_at_most_its_uploads_in_progress_and_a_release_frees_one() -> None:
    ledger = MemoryLedger(MemoryLimits(100 * MIB, 100 * MIB, 2))
    first, second = upload(MIB), upload(MIB)
    ledger.reserve(first, NOTHING_HELD, roomy())
    ledger.reserve(second, NOTHING_HELD, roomy())
    with pytest.raises(ResourceExhausted, match="MAX_UPLOADS_PER_JOB=2"):
        ledger.reserve(upload(MIB), NOTHING_HELD, roomy())
    ledger.reserve(upload(MIB, job="job-2"), NOTHING_HELD, roomy())  # its own count
    # A registered segment is no upload: it is not counted against the streams.
    ledger.reserve(Reservation("job-1", MIB, False, MIB), NOTHING_HELD, roomy())
    ledger.release(first)
    ledger.release(first)  # idempotent
    ledger.reserve(upload(MIB), NOTHING_HELD, roomy())
    assert ledger.uploads("job-1") == 2


def test_the_quota_counts_kept_shards_and_declared_uploads() -> None:
    ledger = MemoryLedger(MemoryLimits(100 * MIB, 10 * MIB, 4))
    ledger.reserve(upload(4 * MIB), HeldBytes(4 * MIB, 4 * MIB), roomy())
    with pytest.raises(ResourceExhausted, match="quota is 10,485,760") as raised:
        ledger.reserve(upload(3 * MIB), HeldBytes(4 * MIB, 4 * MIB), roomy())
    assert "job 'job-1' holds 8,388,608 bytes" in raised.value.message


def test_the_budget_counts_every_job_and_the_free_pool() -> None:
    ledger = MemoryLedger(MemoryLimits(10 * MIB, 10 * MIB, 4))
    ledger.reserve(upload(4 * MIB, job="job-2"), NOTHING_HELD, roomy())
    held = HeldBytes(0, 4 * MIB)  # job-2's kept shards
    fits = upload(2 * MIB)
    assert ledger.refusal(fits, held, roomy()) is None
    refused = ledger.refusal(fits, held, roomy(pool=MIB))
    assert refused is not None and refused.pool_would_help
    assert "budget is 10,485,760 (STRIDE_CKPTCACHE_MAX_MEMORY_BYTES)" in refused.message
    assert "holds 9,437,184 bytes" in refused.message


def test_free_space_less_what_uploads_will_still_write_bounds_a_budget_too_big() -> None:
    ledger = MemoryLedger(MemoryLimits(1 << 40, 1 << 40, 4))
    going = upload(6 * MIB, job="job-2")
    ledger.reserve(going, NOTHING_HELD, roomy(free=10 * MIB))
    refused = ledger.refusal(upload(5 * MIB), NOTHING_HELD, roomy(free=10 * MIB))
    assert refused is not None and not refused.pool_would_help
    assert "has 4 MiB free" in refused.message and "still write 6,291,456" in refused.message
    # What an upload has written is in the filesystem's used space: not counted twice.
    going.written_bytes = 4 * MIB
    assert ledger.refusal(upload(5 * MIB), NOTHING_HELD, roomy(free=6 * MIB)) is not None
    assert ledger.refusal(upload(4 * MIB), NOTHING_HELD, roomy(free=6 * MIB)) is None
    # A registered segment is written already: the free space does not limit it.
    written = Reservation("job-1", 8 * MIB, False, 8 * MIB)
    assert ledger.refusal(written, NOTHING_HELD, roomy(free=0)) is None


def test_the_default_shared_memory_dir_is_the_stores_and_is_removed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    directory = default_shm_dir(store)
    assert directory.name.startswith(DIRECTORY_PREFIX)
    assert directory == default_shm_dir(tmp_path / "." / "store")
    assert directory != default_shm_dir(tmp_path / "other")
    assert remove_default_shm_dir(store) is None
    try:
        (directory / "job-1").mkdir(parents=True)
        assert remove_default_shm_dir(store) == directory
        assert not directory.exists()
    finally:
        remove_default_shm_dir(store)
