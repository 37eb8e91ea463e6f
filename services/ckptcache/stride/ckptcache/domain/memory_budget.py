"""How much shared memory the cache may hold, and whether one more shard fits.

Shared memory is the node's RAM (tmpfs), shared with everything else on the node, and a
write past what it can back kills the writer with SIGBUS. So every shard the cache takes
in is reserved first, against four limits, and refused RESOURCE_EXHAUSTED naming the one
it would break:

- the job's streamed uploads in progress (a count), so one job token cannot open many;
- the job's quota (its kept shards plus its reservations);
- the cache's budget (every job's kept shards and reservations, plus the free segments
  kept for reuse);
- what the filesystem has free now, less what the uploads in progress will still write.

An upload counts at its declared size from its header on, so a save that cannot fit is
refused before any data is sent and nothing is refused half way. Its pages are still
allocated only as its data arrives; what it has written is already in the filesystem's
used space, so only the rest ("unbacked") is subtracted from its free space, and nothing
is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from stride.ckptcache.domain.shared_memory import no_room
from stride.runtime.errors import ResourceExhausted

DEFAULT_BUDGET_FRACTION = 0.5
"""Of the shared-memory filesystem's size, when no budget is configured (see the setting
``max_memory_bytes`` for why)."""


@dataclass(frozen=True)
class MemoryLimits:
    """The shared-memory limits the cache enforces."""

    budget_bytes: int
    job_quota_bytes: int
    uploads_per_job: int


def resolve_limits(
    *,
    budget_bytes: int | None,
    filesystem_bytes: int,
    job_quota_bytes: int | None,
    max_checkpoint_bytes: int,
    uploads_per_job: int,
) -> MemoryLimits:
    """The limits from the settings and the filesystem's size; ValueError, naming both
    settings, for a job quota above the budget (no job could ever use it)."""
    budget = (
        budget_bytes
        if budget_bytes is not None
        else int(filesystem_bytes * DEFAULT_BUDGET_FRACTION)
    )
    if job_quota_bytes is not None and job_quota_bytes > budget:
        source = (
            "STRIDE_CKPTCACHE_MAX_MEMORY_BYTES"
            if budget_bytes is not None
            else "half the shared-memory filesystem's size; STRIDE_CKPTCACHE_MAX_MEMORY_BYTES unset"
        )
        raise ValueError(
            f"the per-job quota STRIDE_CKPTCACHE_MAX_JOB_MEMORY_BYTES ({job_quota_bytes:,} "
            f"bytes) is more than the cache's shared-memory budget ({budget:,} bytes: "
            f"{source}); lower the quota or raise the budget"
        )
    if job_quota_bytes is None:
        job_quota_bytes = min(2 * max_checkpoint_bytes, budget)
    return MemoryLimits(budget, job_quota_bytes, uploads_per_job)


@dataclass(frozen=True)
class SharedMemoryState:
    """What the shared-memory filesystem holds at one moment, as the memory tier saw it."""

    path: str
    free_bytes: int
    """Free to an unprivileged writer (statvfs ``f_bavail``)."""
    pool_bytes: int
    """Held by the free segments the cache keeps for reuse (it can give them back)."""


@dataclass(frozen=True)
class HeldBytes:
    """Shared memory the cache's indexed shards hold: one job's and all jobs'."""

    job_bytes: int
    total_bytes: int


@dataclass(eq=False)
class Reservation:
    """Shared memory promised to one shard on its way in."""

    job_id: str
    size_bytes: int
    streamed: bool
    """A ``SaveCheckpoint`` upload (counted against the job's uploads in progress)."""
    written_bytes: int = 0
    """What is already in the filesystem (a registered segment is written whole)."""

    @property
    def unbacked_bytes(self) -> int:
        """What the filesystem must still find room for."""
        return self.size_bytes - self.written_bytes


@dataclass(frozen=True)
class Refusal:
    """Why a reservation does not fit."""

    message: str
    pool_would_help: bool
    """True when the limit is the budget or the free space, which giving back the free
    segments raises."""


class MemoryLedger:
    """The reservations in progress, and the decision whether one more fits."""

    def __init__(self, limits: MemoryLimits) -> None:
        self.limits = limits
        self._reservations: list[Reservation] = []

    def reserved_bytes(self, job_id: str | None = None) -> int:
        """Bytes reserved in progress (of one job, or of all)."""
        return sum(r.size_bytes for r in self._reservations if job_id is None or r.job_id == job_id)

    def uploads(self, job_id: str) -> int:
        """The job's streamed uploads in progress."""
        return sum(1 for r in self._reservations if r.job_id == job_id and r.streamed)

    def refusal(
        self, wanted: Reservation, held: HeldBytes, state: SharedMemoryState
    ) -> Refusal | None:
        """Why ``wanted`` does not fit now, or None if it does."""
        job, size, limits = wanted.job_id, wanted.size_bytes, self.limits
        if wanted.streamed and self.uploads(job) >= limits.uploads_per_job:
            return Refusal(
                f"job {job!r} has {self.uploads(job)} uploads in progress, the most it may "
                f"have at once (STRIDE_CKPTCACHE_MAX_UPLOADS_PER_JOB={limits.uploads_per_job}); "
                "wait for one to finish",
                pool_would_help=False,
            )
        job_held = held.job_bytes + self.reserved_bytes(job)
        if job_held + size > limits.job_quota_bytes:
            return Refusal(
                f"job {job!r} holds {job_held:,} bytes of checkpoints in this node's shared "
                f"memory and this save needs {size:,} more; its quota is "
                f"{limits.job_quota_bytes:,} (STRIDE_CKPTCACHE_MAX_JOB_MEMORY_BYTES). Delete "
                "old checkpoints or wait for them to persist and leave memory",
                pool_would_help=False,
            )
        total = held.total_bytes + self.reserved_bytes() + state.pool_bytes
        if total + size > limits.budget_bytes:
            return Refusal(
                f"the checkpoint cache holds {total:,} bytes of this node's shared memory for "
                f"all jobs and this save needs {size:,} more; its budget is "
                f"{limits.budget_bytes:,} (STRIDE_CKPTCACHE_MAX_MEMORY_BYTES). Retry once "
                "other checkpoints have persisted and left memory",
                pool_would_help=state.pool_bytes > 0,
            )
        unbacked = sum(r.unbacked_bytes for r in self._reservations)
        needed = wanted.unbacked_bytes
        problem = no_room(state.path, max(state.free_bytes - unbacked, 0), needed)
        if needed > 0 and problem is not None:
            return Refusal(
                f"{problem} (uploads in progress will still write {unbacked:,} bytes)",
                pool_would_help=state.pool_bytes > 0,
            )
        return None

    def reserve(self, wanted: Reservation, held: HeldBytes, state: SharedMemoryState) -> None:
        """Count ``wanted`` in, or raise ResourceExhausted naming the limit it would break."""
        refused = self.refusal(wanted, held, state)
        if refused is not None:
            raise ResourceExhausted(refused.message)
        self._reservations.append(wanted)

    def release(self, reservation: Reservation) -> None:
        """Count a reservation out (the shard became indexed, or failed); idempotent."""
        if reservation in self._reservations:
            self._reservations.remove(reservation)
