"""The dispatcher's storage: datasets, shards and workers, read and written with SQLAlchemy Core.

Locking. Each call that changes a queue starts with an UPDATE of the row that guards it:
the dataset row for hand-outs, the worker row for reports. On PostgreSQL that UPDATE is a
row lock held until commit; on SQLite it takes the database write lock before anything is
read (pysqlite begins the transaction at the first write, so reads before it would see a
stale snapshot). Locks are always taken in the order dataset, worker, shard, so two calls
never wait on each other in a cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from stride.dispatcher.db.tables import datasets, shards, workers
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import Holder, ShardRecord, ShardState, WorkerRecord


@dataclass(frozen=True)
class StoredDataset:
    """A dataset row."""

    id: int
    job_id: str
    dataset: str
    parameters: DatasetParameters
    epochs_created: int


@dataclass(frozen=True)
class HeldShard:
    """A shard a worker holds, with the dataset it belongs to."""

    dataset_id: int
    dataset: str
    shard: ShardRecord


def _dataset(row: Any) -> StoredDataset:
    return StoredDataset(
        id=row.id,
        job_id=row.job_id,
        dataset=row.dataset,
        parameters=DatasetParameters(
            record_count=row.record_count,
            batch_size=row.batch_size,
            shard_batches=row.shard_batches,
            epochs=row.epochs,
            shuffle=row.shuffle,
            seed=row.seed,
            kind=ShardingKind(row.kind),
            partitions=row.partitions,
        ),
        epochs_created=row.epochs_created,
    )


def _shard(row: Any) -> ShardRecord:
    holder = None if row.worker is None else Holder(row.worker, row.incarnation)
    return ShardRecord(
        shard_id=row.shard_id,
        epoch=row.epoch,
        position=row.position,
        start=row.start_index,
        end=row.end_index,
        offset=row.consumed,
        state=ShardState(row.state),
        holder=holder,
        leases=row.leases,
        lease_expires_at=row.lease_expires_at,
    )


def _shard_values(shard: ShardRecord) -> dict[str, Any]:
    return {
        "consumed": shard.offset,
        "state": shard.state.value,
        "worker": None if shard.holder is None else shard.holder.worker,
        "incarnation": None if shard.holder is None else shard.holder.incarnation,
        "leases": shard.leases,
        "lease_expires_at": shard.lease_expires_at,
    }


async def find_dataset(session: AsyncSession, job_id: str, dataset: str) -> StoredDataset | None:
    """A dataset without locking it, or None."""
    row = (
        await session.execute(
            select(datasets).where(datasets.c.job_id == job_id, datasets.c.dataset == dataset)
        )
    ).one_or_none()
    return None if row is None else _dataset(row)


async def lock_dataset(session: AsyncSession, job_id: str, dataset: str) -> StoredDataset | None:
    """Lock a dataset for the rest of the transaction and return it, or None if unknown."""
    result = await session.execute(
        update(datasets)
        .where(datasets.c.job_id == job_id, datasets.c.dataset == dataset)
        .values(version=datasets.c.version + 1)
    )
    if result.rowcount == 0:  # type: ignore[attr-defined]
        return None
    return await find_dataset(session, job_id, dataset)


async def insert_dataset(
    session: AsyncSession, job_id: str, dataset: str, parameters: DatasetParameters, at: datetime
) -> None:
    """Store a validated dataset with no epoch cut yet."""
    if parameters.kind is None:
        raise ValueError("a stored dataset has a kind")
    await session.execute(
        datasets.insert().values(
            job_id=job_id,
            dataset=dataset,
            kind=parameters.kind.value,
            record_count=parameters.record_count,
            batch_size=parameters.batch_size,
            shard_batches=parameters.shard_batches,
            epochs=parameters.epochs,
            shuffle=parameters.shuffle,
            seed=parameters.seed,
            partitions=parameters.partitions,
            epochs_created=0,
            version=0,
            created_at=at,
        )
    )


async def add_epoch(
    session: AsyncSession,
    dataset_id: int,
    epoch: int,
    new_shards: Sequence[ShardRecord],
    at: datetime,
) -> None:
    """Insert an epoch's shards and count the epoch as created."""
    await session.execute(
        shards.insert(),
        [
            {
                "dataset_id": dataset_id,
                "shard_id": shard.shard_id,
                "epoch": shard.epoch,
                "position": shard.position,
                "start_index": shard.start,
                "end_index": shard.end,
                "updated_at": at,
                **_shard_values(shard),
            }
            for shard in new_shards
        ],
    )
    await session.execute(
        update(datasets).where(datasets.c.id == dataset_id).values(epochs_created=epoch + 1)
    )


async def next_todo(session: AsyncSession, dataset_id: int) -> ShardRecord | None:
    """The TODO shard to hand out next: oldest epoch first, then hand-out order."""
    row = (
        await session.execute(
            select(shards)
            .where(shards.c.dataset_id == dataset_id, shards.c.state == ShardState.TODO.value)
            .order_by(shards.c.epoch, shards.c.position)
            .limit(1)
        )
    ).one_or_none()
    return None if row is None else _shard(row)


async def get_shard(session: AsyncSession, dataset_id: int, shard_id: int) -> ShardRecord | None:
    """One shard, locked for update, or None."""
    row = (
        await session.execute(
            select(shards)
            .where(shards.c.dataset_id == dataset_id, shards.c.shard_id == shard_id)
            .with_for_update()
        )
    ).one_or_none()
    return None if row is None else _shard(row)


async def save_shard(
    session: AsyncSession, dataset_id: int, shard: ShardRecord, at: datetime
) -> None:
    """Write a shard's mutable fields."""
    await session.execute(
        update(shards)
        .where(shards.c.dataset_id == dataset_id, shards.c.shard_id == shard.shard_id)
        .values(updated_at=at, **_shard_values(shard))
    )


async def touch_worker(
    session: AsyncSession, job_id: str, worker: str, at: datetime
) -> WorkerRecord | None:
    """Lock a worker row, noting it was seen, and return it (None if never registered)."""
    result = await session.execute(
        update(workers)
        .where(workers.c.job_id == job_id, workers.c.worker == worker)
        .values(last_seen_at=at)
    )
    if result.rowcount == 0:  # type: ignore[attr-defined]
        return None
    row = (
        await session.execute(
            select(workers.c.incarnation, workers.c.lost).where(
                workers.c.job_id == job_id, workers.c.worker == worker
            )
        )
    ).one()
    return WorkerRecord(worker, row.incarnation, row.lost)


async def bump_incarnation(
    session: AsyncSession, job_id: str, worker: str, at: datetime
) -> int | None:
    """Give a known worker its next incarnation (clearing ``lost``); None if unknown."""
    result = await session.execute(
        update(workers)
        .where(workers.c.job_id == job_id, workers.c.worker == worker)
        .values(
            incarnation=workers.c.incarnation + 1, lost=False, registered_at=at, last_seen_at=at
        )
    )
    if result.rowcount == 0:  # type: ignore[attr-defined]
        return None
    incarnation: int = (
        await session.execute(
            select(workers.c.incarnation).where(
                workers.c.job_id == job_id, workers.c.worker == worker
            )
        )
    ).scalar_one()
    return incarnation


async def insert_worker(session: AsyncSession, job_id: str, worker: str, at: datetime) -> None:
    """Register a worker for the first time, as incarnation 1."""
    await session.execute(
        workers.insert().values(
            job_id=job_id,
            worker=worker,
            incarnation=1,
            lost=False,
            registered_at=at,
            last_seen_at=at,
        )
    )


async def mark_lost(session: AsyncSession, job_id: str, worker: str, at: datetime) -> bool:
    """Fence a worker's current token; False if the worker is unknown."""
    result = await session.execute(
        update(workers)
        .where(workers.c.job_id == job_id, workers.c.worker == worker)
        .values(lost=True, last_seen_at=at)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def held_shards(session: AsyncSession, job_id: str, worker: str) -> list[HeldShard]:
    """Every DOING shard of the job's datasets held by ``worker`` (any incarnation), locked."""
    rows = (
        await session.execute(
            select(shards, datasets.c.dataset)
            .join(datasets, datasets.c.id == shards.c.dataset_id)
            .where(
                datasets.c.job_id == job_id,
                shards.c.worker == worker,
                shards.c.state == ShardState.DOING.value,
            )
            .order_by(shards.c.dataset_id, shards.c.shard_id)
            .with_for_update(of=shards)
        )
    ).all()
    return [HeldShard(row.dataset_id, row.dataset, _shard(row)) for row in rows]


@dataclass(frozen=True)
class StateCounts:
    """Per-state shard counts of a dataset."""

    todo: int
    doing: int
    done_in_epoch: int
    unfinished: int


async def state_counts(session: AsyncSession, dataset_id: int, epoch: int) -> StateCounts:
    """Shards TODO and DOING (all epochs), DONE in ``epoch``, and not DONE overall."""
    rows = (
        await session.execute(
            select(shards.c.state, shards.c.epoch, func.count())
            .where(shards.c.dataset_id == dataset_id)
            .group_by(shards.c.state, shards.c.epoch)
        )
    ).all()
    by_state: dict[str, int] = {}
    done_in_epoch = 0
    for state, shard_epoch, count in rows:
        by_state[state] = by_state.get(state, 0) + count
        if state == ShardState.DONE.value and shard_epoch == epoch:
            done_in_epoch += count
    todo = by_state.get(ShardState.TODO.value, 0)
    doing = by_state.get(ShardState.DOING.value, 0)
    return StateCounts(todo=todo, doing=doing, done_in_epoch=done_in_epoch, unfinished=todo + doing)


@dataclass(frozen=True)
class WorkerShards:
    """A worker's view in one dataset: what it holds and what it consumed this epoch."""

    worker: str
    shard_ids: list[int]
    records_consumed: int


async def worker_shards(
    session: AsyncSession, job_id: str, dataset_id: int, epoch: int
) -> list[WorkerShards]:
    """Every active worker of the job with its held shards and this epoch's consumption.

    Consumption is credited to a shard's last holder, so a shard finished by a second
    worker after a failure counts wholly for the second one.
    """
    names = (
        await session.scalars(
            select(workers.c.worker)
            .where(workers.c.job_id == job_id, workers.c.lost.is_(False))
            .order_by(workers.c.worker)
        )
    ).all()
    by_worker = {name: WorkerShards(name, [], 0) for name in names}
    rows = (
        await session.execute(
            select(
                shards.c.worker,
                shards.c.shard_id,
                shards.c.state,
                shards.c.epoch,
                shards.c.consumed,
            )
            .where(shards.c.dataset_id == dataset_id, shards.c.worker.is_not(None))
            .where((shards.c.state == ShardState.DOING.value) | (shards.c.epoch == epoch))
            .order_by(shards.c.shard_id)
        )
    ).all()
    consumed: dict[str, int] = {}
    for row in rows:
        entry = by_worker.get(row.worker)
        if entry is None:
            continue
        if row.state == ShardState.DOING.value:
            entry.shard_ids.append(row.shard_id)
        if row.epoch == epoch:
            consumed[row.worker] = consumed.get(row.worker, 0) + row.consumed
    return [
        WorkerShards(w.worker, w.shard_ids, consumed.get(w.worker, 0)) for w in by_worker.values()
    ]
