"""What a valid dataset is, and the names the dispatcher accepts.

A dataset is cut into shards of ``shard_batches * batch_size`` records (DLRover-RM sec. 5.1:
"numerous, much smaller ... shards (e.g., 64, 128, or 256 data batches)"). Validation names
the first bad field by its request path (``parameters.batch_size``) so a gRPC error points
at the exact thing to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from stride import vocabulary
from stride.runtime.errors import InvalidArgument, ResourceExhausted
from stride.vocabulary.jobspec import (
    MAX_EPOCHS,
    MAX_LIST_RECORDS,
    MAX_RECORD_COUNT,
    MAX_SHARDS_PER_EPOCH,
)

__all__ = [
    "MAX_EPOCHS",
    "MAX_LIST_RECORDS",
    "MAX_PARTITIONS",
    "MAX_RECORD_COUNT",
    "MAX_SHARDS_PER_EPOCH",
    "SPLIT_ID_BASE",
    "DatasetLimits",
    "DatasetParameters",
    "ShardingKind",
    "check_dataset",
    "check_dataset_count",
    "check_job_id",
    "check_worker",
    "validate",
]

# The limits a job spec must respect too (MAX_RECORD_COUNT, MAX_LIST_RECORDS,
# MAX_SHARDS_PER_EPOCH, MAX_EPOCHS) live in the shared vocabulary (stride.vocabulary.jobspec),
# so admission refuses at submit what this service would refuse when the trainer starts.
SPLIT_ID_BASE = 100_000_000_000
"""Shards split off for stragglers get ids from here up, above every planned id
(``MAX_EPOCHS * MAX_SHARDS_PER_EPOCH``; stored ids depend on it, so it is spelled out)."""
MAX_PARTITIONS = 4096
"""Stream partitions per dataset; every partition is cut into at least one shard per epoch."""


@dataclass(frozen=True)
class DatasetLimits:
    """Per-job caps from the dispatcher's settings (``DispatcherSettings``), within the hard
    limits above."""

    max_shards_per_epoch: int = MAX_SHARDS_PER_EPOCH
    """Shards one epoch of a dataset may have (at most :data:`MAX_SHARDS_PER_EPOCH`)."""
    max_datasets_per_job: int = 16
    """Datasets one job may create."""


class ShardingKind(Enum):
    """How a dataset is cut into shards."""

    INDEX_RANGE = "INDEX_RANGE"
    """Contiguous index ranges ``[start, end)``."""
    INDEX_LIST = "INDEX_LIST"
    """Explicit index lists: an epoch is a (seeded, shuffled) permutation of the records,
    and a shard is a slice ``[start, end)`` of that permutation."""
    STREAM = "STREAM"
    """Streaming partitions: a shard is offsets ``[start, end)`` of one partition, and epoch
    ``e`` covers offsets ``[e * record_count, (e + 1) * record_count)`` of every partition."""


SUPPORTED_KINDS = frozenset(ShardingKind)


@dataclass(frozen=True)
class DatasetParameters:
    """How to shard a dataset; two datasets with equal parameters are the same dataset."""

    record_count: int
    batch_size: int
    shard_batches: int
    epochs: int
    shuffle: bool
    seed: int
    kind: ShardingKind | None
    partitions: int

    @property
    def shard_records(self) -> int:
        """Records in every shard but possibly the last of an epoch."""
        return self.batch_size * self.shard_batches

    @property
    def ranges_per_partition(self) -> int:
        """Shards each partition (the whole dataset, if not a stream) is cut into per epoch."""
        return -(-self.record_count // self.shard_records)

    @property
    def partition_count(self) -> int:
        """Stream partitions, or 1 for the index kinds."""
        return self.partitions if self.kind is ShardingKind.STREAM else 1

    @property
    def shards_per_epoch(self) -> int:
        """Shards one epoch is cut into (the last one of each partition may be shorter)."""
        return self.ranges_per_partition * self.partition_count

    @property
    def records_per_epoch(self) -> int:
        """Records one epoch covers (over all partitions of a stream)."""
        return self.record_count * self.partition_count


def check_job_id(value: str, field: str = "job_id") -> None:
    """Raise :class:`InvalidArgument` unless ``value`` is a job id
    (:func:`stride.vocabulary.check_job_id`)."""
    vocabulary.check_job_id(value, field, raise_as=InvalidArgument)


def check_dataset(value: str, field: str = "dataset") -> None:
    """Raise :class:`InvalidArgument` unless ``value`` is a dataset name (a vocabulary
    name: :func:`stride.vocabulary.check_name`)."""
    vocabulary.check_name(value, field, raise_as=InvalidArgument)


def check_worker(value: str, field: str = "worker") -> None:
    """Raise :class:`InvalidArgument` unless ``value`` is a worker name. Workers are named
    after their pods (:func:`stride.vocabulary.check_pod_name`)."""
    vocabulary.check_pod_name(value, field, raise_as=InvalidArgument)


def validate(
    parameters: DatasetParameters,
    path: str = "parameters",
    limits: DatasetLimits = DatasetLimits(),
) -> None:
    """Raise :class:`InvalidArgument` naming the first bad field of ``parameters``, within
    the hard limits and ``limits``."""
    if parameters.kind is None:
        raise InvalidArgument(
            f"{path}.kind",
            "is required (SHARDING_KIND_INDEX_RANGE, SHARDING_KIND_INDEX_LIST or "
            "SHARDING_KIND_STREAM)",
        )
    if parameters.kind not in SUPPORTED_KINDS:  # pragma: no cover - every kind is supported
        raise InvalidArgument(f"{path}.kind", f"{parameters.kind.value} is not supported")
    if parameters.record_count <= 0:
        raise InvalidArgument(
            f"{path}.record_count", f"must be positive, got {parameters.record_count}"
        )
    if parameters.record_count > MAX_RECORD_COUNT:
        raise InvalidArgument(
            f"{path}.record_count",
            f"must be at most {MAX_RECORD_COUNT}, got {parameters.record_count}",
        )
    if parameters.kind is ShardingKind.INDEX_LIST and parameters.record_count > MAX_LIST_RECORDS:
        raise InvalidArgument(
            f"{path}.record_count",
            f"an index list holds at most {MAX_LIST_RECORDS} records (MAX_LIST_RECORDS), got "
            f"{parameters.record_count}; use SHARDING_KIND_INDEX_RANGE with shuffle",
        )
    if parameters.batch_size <= 0:
        raise InvalidArgument(
            f"{path}.batch_size", f"must be positive, got {parameters.batch_size}"
        )
    if parameters.batch_size > parameters.record_count:
        raise InvalidArgument(
            f"{path}.batch_size",
            f"{parameters.batch_size} is larger than the dataset "
            f"({parameters.record_count} records)",
        )
    if parameters.shard_batches <= 0:
        raise InvalidArgument(
            f"{path}.shard_batches", f"must be positive, got {parameters.shard_batches}"
        )
    if parameters.epochs <= 0:
        raise InvalidArgument(f"{path}.epochs", f"must be positive, got {parameters.epochs}")
    if parameters.epochs > MAX_EPOCHS:
        raise InvalidArgument(
            f"{path}.epochs", f"must be at most {MAX_EPOCHS}, got {parameters.epochs}"
        )
    if parameters.kind is ShardingKind.STREAM:
        if not 0 < parameters.partitions <= MAX_PARTITIONS:
            raise InvalidArgument(
                f"{path}.partitions",
                f"must be between 1 and {MAX_PARTITIONS} for SHARDING_KIND_STREAM, "
                f"got {parameters.partitions}",
            )
    elif parameters.partitions != 0:
        raise InvalidArgument(f"{path}.partitions", "is only for SHARDING_KIND_STREAM; leave it 0")
    if parameters.shard_records > MAX_RECORD_COUNT:
        raise InvalidArgument(
            f"{path}.shard_batches",
            f"{parameters.shard_batches} batches of {parameters.batch_size} records is absurd; "
            f"a shard holds at most {MAX_RECORD_COUNT} records",
        )
    if parameters.shards_per_epoch > limits.max_shards_per_epoch:
        raise InvalidArgument(
            f"{path}.shard_batches",
            f"{parameters.shard_batches} batches of {parameters.batch_size} cut "
            f"{parameters.record_count} records into {parameters.shards_per_epoch} shards; "
            f"at most {limits.max_shards_per_epoch} per epoch are allowed "
            "(max_shards_per_epoch), use bigger shards",
        )


def check_dataset_count(job_id: str, existing: int, limits: DatasetLimits) -> None:
    """Raise :class:`ResourceExhausted` if job ``job_id``, which has ``existing`` datasets,
    may not create another."""
    if existing >= limits.max_datasets_per_job:
        raise ResourceExhausted(
            f"job {job_id!r} has {existing} datasets, the most a job may create "
            f"(max_datasets_per_job={limits.max_datasets_per_job}); reuse one, or split the "
            "work over jobs"
        )
