"""Which shard rows a dataset has after RestoreShards (DLRover sec. 5.3).

A snapshot records every shard that may differ from its planned form (ever leased, or split
off) and the epochs cut. Restoring writes those back, done or TODO at their offsets, and
leaves the rest of the newest epoch TODO without rows, as a cut does
(:func:`stride.dispatcher.domain.sharding.next_rows`): rows for positions ``[0, written)``
only. Shards leased since the snapshot keep a row with their lease counter, so a lease
number handed out before the restore is never handed out again for the same shard (it
fences the reports of the shard's earlier holders, and names its events).

Pure: the service reads the rows leased now, runs this (off the event loop: a snapshot may
hold half a million shards) and writes the result in the same transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from stride.dispatcher.domain.datasets import SPLIT_ID_BASE, DatasetParameters
from stride.dispatcher.domain.queue import ShardRecord, release
from stride.dispatcher.domain.sharding import plan_epoch, plan_positions


@dataclass(frozen=True)
class LeaseCount:
    """A shard row that was leased at least once, as it is before the restore."""

    leases: int
    epoch: int
    position: int


@dataclass(frozen=True)
class RestoredQueue:
    """The rows to write, and how many positions of the newest epoch have one."""

    shards: list[ShardRecord]
    written: int


def restored_queue(
    parameters: DatasetParameters,
    epochs_created: int,
    saved: Sequence[ShardRecord],
    leased: Mapping[int, LeaseCount],
) -> RestoredQueue:
    """The rows of a dataset restored to a snapshot of ``epochs_created`` epochs holding
    ``saved``, given the rows ``leased`` before the restore (by shard id).

    Raises :class:`~stride.dispatcher.domain.sharding.OrderNotReady` if the newest epoch's
    order is needed and not computed.
    """
    by_id = {shard.shard_id: shard for shard in saved}
    newest = epochs_created - 1
    # Every shard of an older epoch was leased before the next epoch was cut (a cut waits
    # for an empty TODO queue), so the snapshot holds them all; a missing one is planned.
    planned_per_epoch = Counter(s.epoch for s in saved if s.shard_id < SPLIT_ID_BASE)
    for epoch in range(max(newest, 0)):
        if planned_per_epoch[epoch] < parameters.shards_per_epoch:
            for planned in plan_epoch(parameters, epoch):
                by_id.setdefault(planned.shard_id, ShardRecord.planned(planned))
    # The newest epoch: rows up to the last position leased, then or now (leases go in
    # hand-out order, so that is a prefix); later positions stay TODO without a row.
    positions = [s.position for s in saved if s.epoch == newest] + [
        count.position for count in leased.values() if count.epoch == newest
    ]
    written = max(positions) + 1 if newest >= 0 and positions else 0
    if written:
        for planned in plan_positions(parameters, newest, 0, written):
            by_id.setdefault(planned.shard_id, ShardRecord.planned(planned))
    shards = []
    for shard in by_id.values():
        before = leased.get(shard.shard_id)
        leases = max(before.leases if before is not None else 0, shard.leases)
        shards.append(replace(release(shard), leases=leases))
    return RestoredQueue(shards, written)
