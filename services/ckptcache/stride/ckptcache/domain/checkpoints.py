"""What a valid checkpoint is, and how checkpoints are ordered.

A checkpoint has one or more shards (one per parameter server). Each shard is one buffer
of ``size_bytes`` bytes with a header that names the job, the checkpoint id, the global
step, the buffer's checksum and the tensors inside it (DLRover-RM sec. 5.2). A checkpoint
is complete only when every one of its ``shard_count`` shards is in; until then it is
invisible. Validation names the first bad field by its request path (``header.step``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import PurePath
from typing import TypeVar

from stride import vocabulary
from stride.runtime.errors import InvalidArgument

CHECKPOINT_ID_PATTERN = vocabulary.NAME_PATTERN
"""A checkpoint id is a vocabulary name, so a safe directory name (never '.' or '..');
kept under this name for the stores, which match the directories they find against it."""
MAX_SHARDS = 1024
"""More shards than any parameter-server count the optimizer would plan."""


class Tier(Enum):
    """Where a checkpoint lives; a higher value is more durable."""

    MEMORY = 1
    """Shared memory on the node: fastest to save and restore, lost with the node."""
    DURABLE = 2
    """A durable directory (local disk, a mounted volume or an object-store mount)."""


@dataclass(frozen=True)
class TensorSpan:
    """Where one named tensor sits in the buffer."""

    name: str
    dtype: str
    offset: int
    length: int
    shape: tuple[int, ...] = ()


@dataclass(frozen=True)
class CheckpointHeader:
    """The header of one shard of a checkpoint being saved."""

    job_id: str
    checkpoint_id: str
    step: int
    size_bytes: int
    crc32c: int
    tensors: tuple[TensorSpan, ...] = ()
    shard_index: int = 0
    shard_count: int = 1
    shard_snapshot_id: str = ""

    def same_checkpoint_as(self, other: CheckpointHeader) -> bool:
        """True if both shards claim the same checkpoint (step, shard count, snapshot)."""
        return (self.step, self.shard_count, self.shard_snapshot_id) == (
            other.step,
            other.shard_count,
            other.shard_snapshot_id,
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """A complete stored checkpoint (all shards)."""

    job_id: str
    checkpoint_id: str
    step: int
    size_bytes: int
    crc32c: int
    """The shard's checksum for one shard; for several, the checksum of their checksums."""
    tier: Tier
    saved_at: datetime
    shard_count: int = 1
    shard_snapshot_id: str = ""
    persist_error: str = ""

    def same_content(self, header: CheckpointHeader) -> bool:
        """True if ``header`` describes this very (single-shard) checkpoint: a retried save."""
        return (self.step, self.size_bytes, self.crc32c, self.shard_count) == (
            header.step,
            header.size_bytes,
            header.crc32c,
            header.shard_count,
        )


def check_job_id(value: str, field: str = "job_id") -> None:
    """Raise InvalidArgument unless ``value`` is a job id
    (:func:`stride.vocabulary.check_job_id`)."""
    vocabulary.check_job_id(value, field, raise_as=InvalidArgument)


def check_checkpoint_id(value: str, field: str = "checkpoint_id") -> None:
    """Raise InvalidArgument unless ``value`` is a checkpoint id (a vocabulary name)."""
    vocabulary.check_name(value, field, raise_as=InvalidArgument)


def validate_header(header: CheckpointHeader, max_size_bytes: int, path: str = "header") -> None:
    """Raise InvalidArgument naming the first bad field of ``header``."""
    check_job_id(header.job_id, f"{path}.job_id")
    check_checkpoint_id(header.checkpoint_id, f"{path}.checkpoint_id")
    if header.step < 0:
        raise InvalidArgument(f"{path}.step", f"must not be negative, got {header.step}")
    if not 1 <= header.shard_count <= MAX_SHARDS:
        raise InvalidArgument(
            f"{path}.shard_count", f"must be 1 to {MAX_SHARDS}, got {header.shard_count}"
        )
    if not 0 <= header.shard_index < header.shard_count:
        raise InvalidArgument(
            f"{path}.shard_index",
            f"must be 0 to {header.shard_count - 1} for {header.shard_count} shard(s), "
            f"got {header.shard_index}",
        )
    if header.size_bytes < 0:
        raise InvalidArgument(
            f"{path}.size_bytes", f"must not be negative, got {header.size_bytes}"
        )
    if header.size_bytes > max_size_bytes:
        raise InvalidArgument(
            f"{path}.size_bytes",
            f"{header.size_bytes} bytes is more than the cache accepts ({max_size_bytes})",
        )
    for index, tensor in enumerate(header.tensors):
        where = f"{path}.tensors[{index}]"
        if not tensor.name:
            raise InvalidArgument(f"{where}.name", "is required")
        if tensor.offset < 0:
            raise InvalidArgument(f"{where}.offset", f"must not be negative, got {tensor.offset}")
        if tensor.length < 0:
            raise InvalidArgument(f"{where}.length", f"must not be negative, got {tensor.length}")
        if any(dimension < 0 for dimension in tensor.shape):
            raise InvalidArgument(f"{where}.shape", f"has a negative dimension: {tensor.shape}")
        if tensor.offset + tensor.length > header.size_bytes:
            raise InvalidArgument(
                f"{where}.length",
                f"tensor {tensor.name!r} ends at byte {tensor.offset + tensor.length}, "
                f"past the {header.size_bytes}-byte buffer",
            )


def newest_first(checkpoints: Iterable[CheckpointInfo]) -> list[CheckpointInfo]:
    """Highest step first; the later save wins a tie, then the id decides."""
    ordered = sorted(checkpoints, key=lambda c: c.checkpoint_id)
    return sorted(ordered, key=lambda c: (c.step, c.saved_at), reverse=True)


def merge_tiers(checkpoints: Iterable[CheckpointInfo]) -> list[CheckpointInfo]:
    """One entry per checkpoint id, at the highest tier it reached, newest first."""
    best: dict[str, CheckpointInfo] = {}
    for info in checkpoints:
        known = best.get(info.checkpoint_id)
        if known is None or info.tier.value > known.tier.value:
            best[info.checkpoint_id] = info
    return newest_first(best.values())


_P = TypeVar("_P", bound=PurePath)


def checkpoint_directory(root: _P, job_id: str, checkpoint_id: str | None = None) -> _P:
    """``root/job_id[/checkpoint_id]`` for a store, re-checking both names.

    They are validated when a request arrives; checked again here because they become paths
    (a store must never be talked into leaving its root).
    """
    if not vocabulary.JOB_ID_PATTERN.match(job_id):
        raise ValueError(f"job_id {job_id!r} is not a safe directory name")
    if checkpoint_id is None:
        return root / job_id
    if not CHECKPOINT_ID_PATTERN.match(checkpoint_id):
        raise ValueError(f"checkpoint_id {checkpoint_id!r} is not a safe directory name")
    return root / job_id / checkpoint_id
