"""The dispatcher's storage: datasets, shards and workers, read and written with SQLAlchemy Core.

Locking. Each call that changes a queue starts with an UPDATE of the row that guards it:
the dataset row for hand-outs, the worker row for reports. On PostgreSQL that UPDATE is a
row lock held until commit; on SQLite it takes the database write lock before anything is
read (pysqlite begins the transaction at the first write, so reads before it would see a
stale snapshot). Locks are always taken in the order dataset, worker, shard, so two calls
never wait on each other in a cycle.

The statements of the hot calls (a hand-out, a report) are built once, with bind
parameters: building them per call (columns, an aliased subquery) cost about as much CPU
as everything else in a PostgreSQL hand-out (py-spy, ``bench/dispatcher_vs_dlrover.py``).
SQLAlchemy caches their compiled form.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import psycopg
from sqlalchemy import bindparam, delete, func, literal_column, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession

from stride.dispatcher.db.tables import (
    DOING_STATE,
    TODO_STATE,
    datasets,
    shards,
    step_cursors,
    step_leases,
    workers,
)
from stride.dispatcher.domain.datasets import SPLIT_ID_BASE, DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import Holder, ShardRecord, ShardState, WorkerRecord
from stride.dispatcher.domain.restoring import LeaseCount, RestoredQueue


@dataclass(frozen=True)
class StoredDataset:
    """A dataset row."""

    id: int
    job_id: str
    dataset: str
    parameters: DatasetParameters
    epochs_created: int
    splits: int = 0
    written: int = 0
    """Positions of the newest epoch with a shard row (the rest are TODO without one)."""


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
        splits=row.splits,
        written=row.written,
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
        lease_expires_at=_aware(row.lease_expires_at),
        partition=row.partition,
    )


def _aware(moment: datetime | None) -> datetime | None:
    # SQLite hands timestamps back naive; every stored one is UTC.
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _shard_values(shard: ShardRecord) -> dict[str, Any]:
    return {
        "end_index": shard.end,
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


async def list_datasets(session: AsyncSession, job_id: str) -> list[StoredDataset]:
    """Every dataset of a job, by name."""
    rows = (
        await session.execute(
            select(datasets).where(datasets.c.job_id == job_id).order_by(datasets.c.dataset)
        )
    ).all()
    return [_dataset(row) for row in rows]


_LOCK_DATASET = (
    update(datasets)
    .where(datasets.c.job_id == bindparam("b_job_id"), datasets.c.dataset == bindparam("b_dataset"))
    .values(version=datasets.c.version + 1)
    .returning(*datasets.c)
)


async def lock_dataset(session: AsyncSession, job_id: str, dataset: str) -> StoredDataset | None:
    """Lock a dataset for the rest of the transaction and return it, or None if unknown.

    One statement: the UPDATE takes the lock and RETURNING reads the row under it.
    """
    row = (
        await session.execute(_LOCK_DATASET, {"b_job_id": job_id, "b_dataset": dataset})
    ).one_or_none()
    return None if row is None else _dataset(row)


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


async def write_rows(
    session: AsyncSession,
    dataset_id: int,
    new_shards: Sequence[ShardRecord],
    epochs_created: int,
    written: int,
    at: datetime,
) -> None:
    """Insert the next shards of the newest epoch (cutting it, if ``epochs_created`` counts
    it first) and record how many of its positions now have a row."""
    await insert_shards(session, dataset_id, new_shards, at)
    await session.execute(
        update(datasets)
        .where(datasets.c.id == dataset_id)
        .values(epochs_created=epochs_created, written=written)
    )


async def count_datasets(session: AsyncSession, job_id: str) -> int:
    """How many datasets the job has."""
    count: int = (
        await session.execute(
            select(func.count()).select_from(datasets).where(datasets.c.job_id == job_id)
        )
    ).scalar_one()
    return count


def is_contention(error: BaseException) -> bool:
    """Whether ``error`` says the database was busy rather than that the call was wrong:
    SQLite's lock still held by another connection past the busy timeout ("database is
    locked"), a PostgreSQL serialization failure, deadlock or lock timeout, or a connection
    lost. Such a transaction rolled back whole, so running it again is safe."""
    if isinstance(error, DBAPIError):
        if error.connection_invalidated:
            return True
        error = error.orig if error.orig is not None else error
    if isinstance(error, sqlite3.OperationalError):
        code = getattr(error, "sqlite_errorcode", 0) & 0xFF
        return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in str(error)
    return isinstance(error, psycopg.OperationalError)


INSERT_CHUNK = 5_000
"""Rows per INSERT of an epoch's shards: the event loop builds one chunk's parameters at a
time and serves other calls while the database writes it."""


async def insert_shards(
    session: AsyncSession, dataset_id: int, new_shards: Sequence[ShardRecord], at: datetime
) -> None:
    """Insert shards (a new epoch, a split-off part, a restored snapshot), in chunks of
    :data:`INSERT_CHUNK` within the caller's transaction."""
    for first in range(0, len(new_shards), INSERT_CHUNK):
        await session.execute(
            shards.insert(),
            [
                {
                    "dataset_id": dataset_id,
                    "shard_id": shard.shard_id,
                    "epoch": shard.epoch,
                    "position": shard.position,
                    "start_index": shard.start,
                    "partition": shard.partition,
                    "updated_at": at,
                    **_shard_values(shard),
                }
                for shard in new_shards[first : first + INSERT_CHUNK]
            ],
        )


_TODO = shards.alias("todo")  # not correlated with the row being updated
_LEASE_NEXT = (
    update(shards)
    .where(
        shards.c.dataset_id == bindparam("b_dataset_id"),
        shards.c.shard_id
        == (
            select(_TODO.c.shard_id)
            .where(
                _TODO.c.dataset_id == bindparam("b_dataset_id"),
                _TODO.c.state == literal_column("'TODO'"),  # as ix_shards_todo's predicate
            )
            .order_by(_TODO.c.epoch, _TODO.c.position, _TODO.c.shard_id)
            .limit(1)
            .scalar_subquery()
        ),
    )
    .values(
        state=ShardState.DOING.value,
        worker=bindparam("b_worker"),
        incarnation=bindparam("b_incarnation"),
        leases=shards.c.leases + 1,
        lease_expires_at=bindparam("b_expires"),
        updated_at=bindparam("b_at"),
    )
    .returning(*shards.c)
)


async def lease_next(
    session: AsyncSession, dataset_id: int, holder: Holder, expires: datetime, at: datetime
) -> ShardRecord | None:
    """Lease the next TODO shard to ``holder`` in one statement; None if none is TODO.

    The caller holds the dataset lock, so no other hand-out races for the same row.
    """
    row = (
        await session.execute(
            _LEASE_NEXT,
            {
                "b_dataset_id": dataset_id,
                "b_worker": holder.worker,
                "b_incarnation": holder.incarnation,
                "b_expires": expires,
                "b_at": at,
            },
        )
    ).one_or_none()
    return None if row is None else _shard(row)


async def any_doing(session: AsyncSession, dataset_id: int) -> bool:
    """True if some shard of the dataset is leased."""
    row = (
        await session.execute(
            select(shards.c.shard_id)
            .where(shards.c.dataset_id == dataset_id, shards.c.state == ShardState.DOING.value)
            .limit(1)
        )
    ).first()
    return row is not None


async def set_splits(session: AsyncSession, dataset_id: int, splits: int) -> None:
    """Record how many shards were split off (split ids are allotted from this count)."""
    await session.execute(update(datasets).where(datasets.c.id == dataset_id).values(splits=splits))


async def next_todo(session: AsyncSession, dataset_id: int) -> ShardRecord | None:
    """The TODO shard to hand out next: oldest epoch first, then hand-out order."""
    row = (
        await session.execute(
            select(shards)
            .where(shards.c.dataset_id == dataset_id, TODO_STATE)
            .order_by(shards.c.epoch, shards.c.position, shards.c.shard_id)
            .limit(1)
        )
    ).one_or_none()
    return None if row is None else _shard(row)


_GET_SHARD = (
    select(shards)
    .where(
        shards.c.dataset_id == bindparam("b_dataset_id"),
        shards.c.shard_id == bindparam("b_shard_id"),
    )
    .with_for_update()
)
_SAVE_SHARD = (
    update(shards)
    .where(
        shards.c.dataset_id == bindparam("b_dataset_id"),
        shards.c.shard_id == bindparam("b_shard_id"),
    )
    .values(
        updated_at=bindparam("b_at"),
        end_index=bindparam("b_end_index"),
        consumed=bindparam("b_consumed"),
        state=bindparam("b_state"),
        worker=bindparam("b_worker"),
        incarnation=bindparam("b_incarnation"),
        leases=bindparam("b_leases"),
        lease_expires_at=bindparam("b_lease_expires_at"),
    )
)


async def get_shard(session: AsyncSession, dataset_id: int, shard_id: int) -> ShardRecord | None:
    """One shard, locked for update, or None."""
    row = (
        await session.execute(_GET_SHARD, {"b_dataset_id": dataset_id, "b_shard_id": shard_id})
    ).one_or_none()
    return None if row is None else _shard(row)


async def save_shard(
    session: AsyncSession, dataset_id: int, shard: ShardRecord, at: datetime
) -> None:
    """Write a shard's mutable fields."""
    values = {f"b_{key}": value for key, value in _shard_values(shard).items()}
    values.update(b_dataset_id=dataset_id, b_shard_id=shard.shard_id, b_at=at)
    await session.execute(_SAVE_SHARD, values)


async def renew_held(
    session: AsyncSession,
    dataset_id: int,
    holder: Holder,
    except_shard_id: int,
    expires: datetime,
    at: datetime,
) -> None:
    """Renew the lease of every DOING shard ``holder`` holds in the dataset but one (the
    shard the heartbeat is about, which the domain renews itself)."""
    await session.execute(
        update(shards)
        .where(
            shards.c.dataset_id == dataset_id,
            shards.c.worker == holder.worker,
            shards.c.incarnation == holder.incarnation,
            DOING_STATE,
            shards.c.shard_id != except_shard_id,
        )
        .values(lease_expires_at=expires, updated_at=at)
    )


_TOUCH_WORKER = (
    update(workers)
    .where(workers.c.job_id == bindparam("b_job_id"), workers.c.worker == bindparam("b_worker"))
    .values(last_seen_at=bindparam("b_at"))
    .returning(
        workers.c.incarnation,
        workers.c.lost,
        workers.c.straggler,
        workers.c.rate,
        workers.c.rate_at,
    )
)


async def touch_worker(
    session: AsyncSession, job_id: str, worker: str, at: datetime
) -> WorkerRate | None:
    """Lock a worker row, noting it was seen, and return it (None if never registered)."""
    row = (
        await session.execute(_TOUCH_WORKER, {"b_job_id": job_id, "b_worker": worker, "b_at": at})
    ).one_or_none()
    if row is None:
        return None
    return WorkerRate(
        WorkerRecord(worker, row.incarnation, row.lost, row.straggler),
        row.rate,
        _aware(row.rate_at),
    )


@dataclass(frozen=True)
class WorkerRate:
    """A worker record with its progress rate, as read under its row lock."""

    record: WorkerRecord
    rate: float
    rate_at: datetime | None


_SET_RATE = (
    update(workers)
    .where(workers.c.job_id == bindparam("b_job_id"), workers.c.worker == bindparam("b_worker"))
    .values(rate=bindparam("b_rate"), rate_at=bindparam("b_at"))
)


async def set_rate(
    session: AsyncSession, job_id: str, worker: str, rate: float, at: datetime
) -> None:
    """Store a worker's new progress rate."""
    await session.execute(
        _SET_RATE, {"b_job_id": job_id, "b_worker": worker, "b_rate": rate, "b_at": at}
    )


@dataclass(frozen=True)
class RatedWorker:
    """An active worker's rate and verdict, for straggler judgement."""

    job_id: str
    worker: str
    incarnation: int
    rate: float
    straggler: bool
    measured: float = 0.0
    """Seconds from its registration to its last report (the rate's history)."""


async def rated_workers(session: AsyncSession, warm_since: datetime) -> list[RatedWorker]:
    """Active workers that reported progress (a rate above zero: reports of no records do
    not count) and registered before ``warm_since``."""
    rows = (
        await session.execute(
            select(
                workers.c.job_id,
                workers.c.worker,
                workers.c.incarnation,
                workers.c.rate,
                workers.c.straggler,
                workers.c.registered_at,
                workers.c.rate_at,
            )
            .where(
                workers.c.lost.is_(False),
                workers.c.rate > 0,
                workers.c.rate_at.is_not(None),
                workers.c.registered_at <= warm_since,
            )
            .order_by(workers.c.job_id, workers.c.worker)
        )
    ).all()
    return [
        RatedWorker(
            r.job_id,
            r.worker,
            r.incarnation,
            r.rate,
            r.straggler,
            _measured(r.registered_at, r.rate_at),
        )
        for r in rows
    ]


def _measured(registered_at: datetime | None, rate_at: datetime | None) -> float:
    """Seconds from registration to the last report (0: unknown)."""
    since, until = _aware(registered_at), _aware(rate_at)
    if since is None or until is None:
        return 0.0
    return max((until - since).total_seconds(), 0.0)


async def set_straggler(
    session: AsyncSession, job_id: str, worker: str, incarnation: int, straggler: bool
) -> bool:
    """Store a verdict if the incarnation is still current; False if it moved on."""
    result = await session.execute(
        update(workers)
        .where(
            workers.c.job_id == job_id,
            workers.c.worker == worker,
            workers.c.incarnation == incarnation,
            workers.c.straggler.is_not(straggler),
        )
        .values(straggler=straggler)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ExpiredLease:
    """A shard whose lease lapsed, as released by the sweeper."""

    dataset_id: int
    shard: ShardRecord


async def expired_leases(session: AsyncSession, now: datetime, limit: int) -> list[ExpiredLease]:
    """DOING shards whose lease lapsed (skipping rows another call holds locked)."""
    rows = (
        await session.execute(
            select(shards)
            .where(
                DOING_STATE,
                shards.c.lease_expires_at <= now,
            )
            .order_by(shards.c.dataset_id, shards.c.shard_id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    ).all()
    return [ExpiredLease(row.dataset_id, _shard(row)) for row in rows]


async def release_if_expired(
    session: AsyncSession, dataset_id: int, shard: ShardRecord, now: datetime
) -> bool:
    """Return a shard to TODO if it is still DOING by the same holder with a lapsed lease.

    Conditional, so a heartbeat that renewed the lease in between wins (SQLite reads the
    candidates before its write lock; PostgreSQL has them locked already).
    """
    if shard.holder is None:
        return False
    result = await session.execute(
        update(shards)
        .where(
            shards.c.dataset_id == dataset_id,
            shards.c.shard_id == shard.shard_id,
            shards.c.state == ShardState.DOING.value,
            shards.c.worker == shard.holder.worker,
            shards.c.incarnation == shard.holder.incarnation,
            shards.c.lease_expires_at <= now,
        )
        .values(state=ShardState.TODO.value, lease_expires_at=None, updated_at=now)
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


async def dataset_names(session: AsyncSession, ids: set[int]) -> dict[int, tuple[str, str]]:
    """(job_id, dataset) of each dataset id."""
    rows = (
        await session.execute(
            select(datasets.c.id, datasets.c.job_id, datasets.c.dataset).where(
                datasets.c.id.in_(ids)
            )
        )
    ).all()
    return {row.id: (row.job_id, row.dataset) for row in rows}


async def snapshot_shards(session: AsyncSession, dataset_id: int) -> list[ShardRecord]:
    """Every shard that may differ from its planned, untouched form: ever leased, or split off."""
    rows = (
        await session.execute(
            select(shards)
            .where(
                shards.c.dataset_id == dataset_id,
                (shards.c.leases > 0) | (shards.c.shard_id >= SPLIT_ID_BASE),
            )
            .order_by(shards.c.shard_id)
        )
    ).all()
    return [_shard(row) for row in rows]


async def lease_counts(session: AsyncSession, dataset_id: int) -> dict[int, LeaseCount]:
    """The shards ever leased, with their lease counters (kept across a restore, for event
    ids and lease fencing) and place in hand-out order."""
    rows = (
        await session.execute(
            select(shards.c.shard_id, shards.c.leases, shards.c.epoch, shards.c.position).where(
                shards.c.dataset_id == dataset_id, shards.c.leases > 0
            )
        )
    ).all()
    return {row.shard_id: LeaseCount(row.leases, row.epoch, row.position) for row in rows}


async def replace_shards(
    session: AsyncSession,
    dataset_id: int,
    restored: RestoredQueue,
    epochs_created: int,
    splits: int,
    at: datetime,
) -> int:
    """Replace every shard of the dataset with ``restored``; returns the leases revoked."""
    revoked = (
        await session.execute(
            select(func.count())
            .select_from(shards)
            .where(shards.c.dataset_id == dataset_id, shards.c.state == ShardState.DOING.value)
        )
    ).scalar_one()
    await session.execute(delete(shards).where(shards.c.dataset_id == dataset_id))
    await insert_shards(session, dataset_id, restored.shards, at)
    await session.execute(
        update(datasets)
        .where(datasets.c.id == dataset_id)
        .values(epochs_created=epochs_created, splits=splits, written=restored.written)
    )
    return int(revoked)


async def bump_incarnation(
    session: AsyncSession, job_id: str, worker: str, at: datetime
) -> int | None:
    """Give a known worker its next incarnation (clearing ``lost``); None if unknown.

    The new incarnation is a new process, perhaps on another node, so it starts afresh, as
    a first registration does: no straggler verdict, and a rate of zero measured from now.
    Kept, the old verdict cut its shards through the warm-up window, in which it cannot be
    judged, and the old rate's time made its first report measure the restart's gap as
    progress at the old pace, so a fast new process came out a straggler again (and the
    optimizer was told so)."""
    result = await session.execute(
        update(workers)
        .where(workers.c.job_id == job_id, workers.c.worker == worker)
        .values(
            incarnation=workers.c.incarnation + 1,
            lost=False,
            registered_at=at,
            last_seen_at=at,
            straggler=False,
            rate=0.0,
            rate_at=at,
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
    """Register a worker for the first time, as incarnation 1, with a rate of zero measured
    from now (its first report's rate is measured from its registration, see
    ``stragglers.judged_rate``)."""
    await session.execute(
        workers.insert().values(
            job_id=job_id,
            worker=worker,
            incarnation=1,
            lost=False,
            registered_at=at,
            last_seen_at=at,
            rate=0.0,
            rate_at=at,
        )
    )


async def mark_lost(
    session: AsyncSession,
    job_id: str,
    worker: str,
    at: datetime,
    registered_by: datetime | None = None,
) -> bool:
    """Fence a worker's current token; False if the worker is unknown (or, with
    ``registered_by``, registered after that moment: a newer incarnation)."""
    condition = [workers.c.job_id == job_id, workers.c.worker == worker]
    if registered_by is not None:
        condition.append(workers.c.registered_at <= registered_by)
    result = await session.execute(
        update(workers).where(*condition).values(lost=True, last_seen_at=at)
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
                DOING_STATE,
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
    rate: float = 0.0
    straggler: bool = False
    measured: float = 0.0
    """Seconds from its registration to its last report (see :class:`RatedWorker`)."""


async def worker_shards(
    session: AsyncSession, job_id: str, dataset_id: int, epoch: int
) -> list[WorkerShards]:
    """Every active worker of the job with its held shards and this epoch's consumption.

    Consumption is credited to a shard's last holder, so a shard finished by a second
    worker after a failure counts wholly for the second one.
    """
    active = (
        await session.execute(
            select(
                workers.c.worker,
                workers.c.rate,
                workers.c.straggler,
                workers.c.registered_at,
                workers.c.rate_at,
            )
            .where(workers.c.job_id == job_id, workers.c.lost.is_(False))
            .order_by(workers.c.worker)
        )
    ).all()
    by_worker = {
        w.worker: WorkerShards(
            w.worker, [], 0, w.rate, w.straggler, _measured(w.registered_at, w.rate_at)
        )
        for w in active
    }
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
    return [replace(w, records_consumed=consumed.get(w.worker, 0)) for w in by_worker.values()]


@dataclass(frozen=True)
class StepCursor:
    """A dataset's data-worker cursor: the next step to dispatch and the last consumed."""

    next_step: int
    consumed_step: int


async def step_cursor(session: AsyncSession, dataset_id: int) -> StepCursor:
    """The cursor (created at its start the first time)."""
    row = (
        await session.execute(
            select(step_cursors.c.next_step, step_cursors.c.consumed_step).where(
                step_cursors.c.dataset_id == dataset_id
            )
        )
    ).one_or_none()
    if row is None:
        await session.execute(
            step_cursors.insert().values(dataset_id=dataset_id, next_step=0, consumed_step=-1)
        )
        return StepCursor(0, -1)
    return StepCursor(row.next_step, row.consumed_step)


async def find_step_cursor(session: AsyncSession, dataset_id: int) -> StepCursor | None:
    """The cursor, or None for a dataset never read by steps (nothing is created)."""
    row = (
        await session.execute(
            select(step_cursors.c.next_step, step_cursors.c.consumed_step).where(
                step_cursors.c.dataset_id == dataset_id
            )
        )
    ).one_or_none()
    return None if row is None else StepCursor(row.next_step, row.consumed_step)


async def rewind_steps(session: AsyncSession, dataset_id: int, consumed_step: int) -> int:
    """Put the steps back to ``consumed_step`` consumed: every later step is dispatched again
    (its lease, if any, goes). Returns the leases dropped."""
    await step_cursor(session, dataset_id)  # created if it is not yet
    await save_step_cursor(session, dataset_id, StepCursor(consumed_step + 1, consumed_step))
    dropped = await session.execute(
        delete(step_leases).where(
            step_leases.c.dataset_id == dataset_id, step_leases.c.step_id > consumed_step
        )
    )
    return int(dropped.rowcount or 0)  # type: ignore[attr-defined]


async def save_step_cursor(session: AsyncSession, dataset_id: int, cursor: StepCursor) -> None:
    """Store the cursor."""
    await session.execute(
        update(step_cursors)
        .where(step_cursors.c.dataset_id == dataset_id)
        .values(next_step=cursor.next_step, consumed_step=cursor.consumed_step)
    )


async def take_timed_out_steps(
    session: AsyncSession,
    dataset_id: int,
    consumed_step: int,
    now: datetime,
    limit: int,
    data_worker: str,
    deadline: datetime,
) -> list[int]:
    """Re-lease up to ``limit`` timed-out steps (not yet consumed) to ``data_worker``."""
    if limit <= 0:
        return []
    steps = list(
        (
            await session.scalars(
                select(step_leases.c.step_id)
                .where(
                    step_leases.c.dataset_id == dataset_id,
                    step_leases.c.deadline <= now,
                    step_leases.c.step_id > consumed_step,
                )
                .order_by(step_leases.c.step_id)
                .limit(limit)
            )
        ).all()
    )
    if steps:
        await session.execute(
            update(step_leases)
            .where(step_leases.c.dataset_id == dataset_id, step_leases.c.step_id.in_(steps))
            .values(data_worker=data_worker, deadline=deadline)
        )
    return steps


async def lease_steps(
    session: AsyncSession, dataset_id: int, steps: range, data_worker: str, deadline: datetime
) -> None:
    """Record newly dispatched steps."""
    if not steps:
        return
    await session.execute(
        step_leases.insert(),
        [
            {
                "dataset_id": dataset_id,
                "step_id": step,
                "data_worker": data_worker,
                "deadline": deadline,
            }
            for step in steps
        ],
    )


async def expire_steps_of(
    session: AsyncSession, job_id: str, data_worker: str, leased_before: datetime, now: datetime
) -> int:
    """Make the steps ``data_worker`` fetched before ``leased_before`` (its deadline less the
    batch time-out) due for another now: that pod is gone. How many."""
    result = await session.execute(
        update(step_leases)
        .where(
            step_leases.c.data_worker == data_worker,
            step_leases.c.deadline < leased_before,
            step_leases.c.deadline > now,
            step_leases.c.dataset_id.in_(select(datasets.c.id).where(datasets.c.job_id == job_id)),
        )
        .values(deadline=now)
    )
    return int(getattr(result, "rowcount", 0) or 0)


async def forget_consumed_steps(session: AsyncSession, dataset_id: int, consumed_step: int) -> None:
    """Drop the leases of consumed steps."""
    await session.execute(
        delete(step_leases).where(
            step_leases.c.dataset_id == dataset_id, step_leases.c.step_id <= consumed_step
        )
    )
