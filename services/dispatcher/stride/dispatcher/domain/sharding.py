"""Cutting an epoch into shards.

DLRover sec. 5.2: the dataset is not split by the number of workers but into many small
shards of sample indices, all placed in a TODO queue. Here a shard is a contiguous index
range of ``shard_batches * batch_size`` records; the last shard of an epoch is shorter.

Shard ids are ``epoch * shards_per_epoch + index`` (``index`` counts ranges from the start
of the dataset), so ids are unique per dataset, stable across restarts and need no counter.
With ``shuffle`` the order in which an epoch's shards are handed out is a permutation that
depends only on the seed and the epoch: a dispatcher restarted from its database, or a
simulator, hands out the same order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from stride.dispatcher.domain.datasets import DatasetParameters


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


def plan_epoch(parameters: DatasetParameters, epoch: int) -> list[PlannedShard]:
    """Every shard of ``epoch``, in hand-out order."""
    ranges = cut_ranges(parameters.record_count, parameters.shard_records)
    first_id = epoch * len(ranges)
    return [
        PlannedShard(
            shard_id=first_id + index,
            epoch=epoch,
            position=position,
            start=ranges[index].start,
            end=ranges[index].end,
        )
        for position, index in enumerate(hand_out_order(parameters, epoch))
    ]
