"""Cutting an epoch into shards.

DLRover sec. 5.2: the dataset is not split by the number of workers but into many small
shards of sample indices, all placed in a TODO queue. Here a shard is a contiguous index
range of ``shard_batches * batch_size`` records; the last shard of an epoch is shorter.

An index-list shard is a slice ``[start, end)`` of the epoch's record permutation
(:func:`epoch_permutation`); a stream shard is offsets ``[start, end)`` of one partition.

Shard ids are ``epoch * shards_per_epoch + index`` (``index`` counts ranges from the start
of the dataset), so ids are unique per dataset, stable across restarts and need no counter.
With ``shuffle`` the order in which an epoch's shards are handed out is a permutation that
depends only on the seed and the epoch: a dispatcher restarted from its database, or a
simulator, hands out the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind


@dataclass(frozen=True)
class IndexRange:
    """Records ``[start, end)`` of the dataset."""

    start: int
    end: int

    @property
    def size(self) -> int:
        """Records in the range."""
        return self.end - self.start


def cut_ranges(record_count: int, shard_records: int) -> list[IndexRange]:
    """Contiguous ranges of ``shard_records`` covering ``[0, record_count)``, the last shorter."""
    if record_count <= 0 or shard_records <= 0:
        raise ValueError("record_count and shard_records must be positive")
    return [
        IndexRange(start, min(start + shard_records, record_count))
        for start in range(0, record_count, shard_records)
    ]


def epoch_seed(seed: int, epoch: int) -> int:
    """The shuffle seed of one epoch: distinct per epoch, fixed for a dataset seed.

    Integer seeds make :class:`random.Random` deterministic across processes and Python
    builds (unlike ``hash()`` of a string, which is salted per process).
    """
    return (seed & 0xFFFFFFFFFFFFFFFF) * 1_000_003 + epoch


def hand_out_order(parameters: DatasetParameters, epoch: int) -> list[int]:
    """Range indices of one epoch in the order they are handed out."""
    order = list(range(parameters.shards_per_epoch))
    if parameters.shuffle:
        random.Random(epoch_seed(parameters.seed, epoch)).shuffle(order)
    return order


@dataclass(frozen=True)
class PlannedShard:
    """A shard of a new epoch, before anyone leased it."""

    shard_id: int
    epoch: int
    position: int
    """Place in the epoch's hand-out order; lower goes first."""
    start: int
    end: int
    partition: int = 0
    """Stream partition (0 for the index kinds)."""


def plan_epoch(parameters: DatasetParameters, epoch: int) -> list[PlannedShard]:
    """Every shard of ``epoch``, in hand-out order."""
    ranges = cut_ranges(parameters.record_count, parameters.shard_records)
    per_partition = len(ranges)
    first_id = epoch * parameters.shards_per_epoch
    # A stream's epoch is the next window of every partition, not a re-read of the same one.
    base = epoch * parameters.record_count if parameters.kind is ShardingKind.STREAM else 0
    planned = []
    for position, index in enumerate(hand_out_order(parameters, epoch)):
        partition, piece = divmod(index, per_partition)
        planned.append(
            PlannedShard(
                shard_id=first_id + index,
                epoch=epoch,
                position=position,
                start=base + ranges[piece].start,
                end=base + ranges[piece].end,
                partition=partition,
            )
        )
    return planned


@lru_cache(maxsize=8)
def _permutation(record_count: int, shuffle: bool, seed: int, epoch: int) -> tuple[int, ...]:
    order = list(range(record_count))
    if shuffle:
        random.Random(epoch_seed(seed, epoch) ^ 0x5EED).shuffle(order)
    return tuple(order)


def epoch_permutation(parameters: DatasetParameters, epoch: int) -> tuple[int, ...]:
    """The record order of an index-list epoch: a seeded shuffle (identity without shuffle).

    Deterministic in (seed, epoch) like the shard order, so a restarted dispatcher slices
    the same indices. Cached: consecutive hand-outs slice the same epoch.
    """
    return _permutation(parameters.record_count, parameters.shuffle, parameters.seed, epoch)


def shard_indices(parameters: DatasetParameters, epoch: int, start: int, end: int) -> list[int]:
    """The record indices of an index-list shard ``[start, end)``."""
    return list(epoch_permutation(parameters, epoch)[start:end])
