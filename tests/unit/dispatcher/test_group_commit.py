"""Group commit on the SQLite fast path: concurrent calls share one transaction, and a failed
commit leaves the queue as it was and answers every call of the batch UNAVAILABLE."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from contextlib import closing
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from stride.db.engine import Database
from stride.db.migrations import upgrade
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.outbound import fastpath
from stride.dispatcher.adapters.outbound.fastpath import FastPath, SqliteFastPath
from stride.dispatcher.app import MIGRATIONS, open_fast_path
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.db.tables import shards, workers
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.usecases import ShardDispatcher, ShardGrant, WorkerRef
from stride.runtime.errors import FailedPrecondition, NotFound, Unavailable

JOB, DATASET = "job-group", "train"
LEASE = timedelta(seconds=60)
WORKERS = 8
PARAMETERS = DatasetParameters(
    record_count=1000,
    batch_size=10,
    shard_batches=1,
    epochs=2,
    shuffle=False,
    seed=0,
    kind=ShardingKind.INDEX_RANGE,
    partitions=0,
)


async def _open(url: str) -> AsyncIterator[ShardDispatcher]:
    upgrade(url, "dispatcher", MIGRATIONS)
    database = Database(url, "dispatcher")
    fast = open_fast_path(database, LEASE, timedelta(seconds=30), sync_commits=False)
    dispatcher = ShardDispatcher(database, Outbox(outbox_table), LEASE, fast=fast)
    await dispatcher.create_dataset(JOB, DATASET, PARAMETERS)
    try:
        yield dispatcher
    finally:
        await fast.close()
        await database.dispose()


@pytest.fixture
async def dispatcher(database_url: str) -> AsyncIterator[ShardDispatcher]:
    """The fast path on each dialect (PostgreSQL and SQLite)."""
    async for opened in _open(database_url):
        yield opened


@pytest.fixture
async def sqlite_dispatcher(tmp_path: Path) -> AsyncIterator[ShardDispatcher]:
    """For what only SQLite has: one write lock for the whole database, and a WAL."""
    async for opened in _open(f"sqlite:///{tmp_path / 'dispatcher.db'}"):
        yield opened


async def _first_shards(dispatcher: ShardDispatcher) -> list[tuple[WorkerRef, ShardGrant]]:
    held = []
    for number in range(WORKERS):
        worker = f"w{number}"
        ref = WorkerRef(JOB, DATASET, worker, await dispatcher.register_worker(JOB, worker))
        held.append((ref, await dispatcher.get_shard(ref)))
    return held


def _fast(dispatcher: ShardDispatcher) -> FastPath:
    assert dispatcher.fast is not None
    return dispatcher.fast


def _sqlite(dispatcher: ShardDispatcher) -> SqliteFastPath:
    fast = _fast(dispatcher)
    assert isinstance(fast, SqliteFastPath)
    return fast


async def test_concurrent_calls_share_one_commit(dispatcher: ShardDispatcher) -> None:
    held = await _first_shards(dispatcher)
    commits = _fast(dispatcher).commits
    grants = await asyncio.gather(
        *(
            dispatcher.get_shard(ref, grant.shard.shard_id, grant.shard.leases)
            for ref, grant in held
            if grant.shard is not None
        )
    )
    assert _fast(dispatcher).commits == commits + 1  # eight calls, one transaction
    leased = [grant.shard.shard_id for grant in grants if grant.shard is not None]
    assert len(set(leased)) == WORKERS
    counts = (await dispatcher.dataset_state(JOB, DATASET)).counts
    assert (counts.doing, counts.done) == (WORKERS, WORKERS)


async def test_a_refused_call_does_not_undo_the_others_of_its_batch(
    dispatcher: ShardDispatcher,
) -> None:
    held = await _first_shards(dispatcher)
    (ref, grant), *others = held
    assert grant.shard is not None
    stale = WorkerRef(JOB, DATASET, ref.worker, ref.incarnation + 5)
    results = await asyncio.gather(
        dispatcher.report_done(stale, grant.shard.shard_id),
        *(dispatcher.report_done(r, g.shard.shard_id) for r, g in others if g.shard is not None),
        return_exceptions=True,
    )
    assert isinstance(results[0], FailedPrecondition)
    assert results[1:] == [None] * (WORKERS - 1)
    counts = (await dispatcher.dataset_state(JOB, DATASET)).counts
    assert (counts.doing, counts.done) == (1, WORKERS - 1)


async def test_heartbeats_of_a_batch_renew_leases_and_a_bad_one_is_refused_alone(
    dispatcher: ShardDispatcher,
) -> None:
    """ReportProgress, the busiest call (on PostgreSQL its own two statements): offsets,
    leases and rates are kept, and a stale incarnation or an unknown shard in the same
    batch is refused with the error that names it, leaving the others committed."""
    held = await _first_shards(dispatcher)
    (ref, grant), (other_ref, other_grant), *rest = held
    assert grant.shard is not None and other_grant.shard is not None
    before = {row.shard_id: row for row in await _shard_rows(dispatcher)}
    stale = WorkerRef(JOB, DATASET, ref.worker, ref.incarnation + 5)
    results = await asyncio.gather(
        dispatcher.report_progress(stale, grant.shard.shard_id, 5),
        dispatcher.report_progress(other_ref, 999_999, 5),
        *(dispatcher.report_progress(r, g.shard.shard_id, 7) for r, g in rest if g.shard),
        return_exceptions=True,
    )
    assert isinstance(results[0], FailedPrecondition), results[0]
    assert isinstance(results[1], NotFound) and "shard_id" in str(results[1]), results[1]
    assert results[2:] == [None] * (WORKERS - 2)
    after = {row.shard_id: row for row in await _shard_rows(dispatcher)}
    for _, g in rest:
        assert g.shard is not None
        row = after[g.shard.shard_id]
        assert (
            row.consumed == 7 and row.lease_expires_at > before[g.shard.shard_id].lease_expires_at
        )
    for untouched in (grant.shard.shard_id, other_grant.shard.shard_id):
        assert after[untouched] == before[untouched]
    async with dispatcher.database.sessions() as session:
        rates = dict((await session.execute(sa.select(workers.c.worker, workers.c.rate))).all())
    assert all(rates[r.worker] > 0 for r, _ in rest)
    assert not rates[ref.worker] and not rates[other_ref.worker]

    # A lower offset arriving late renews the lease and keeps the higher one.
    r, g = rest[0]
    assert g.shard is not None
    await dispatcher.report_progress(r, g.shard.shard_id, 3)
    assert {row.shard_id: row for row in await _shard_rows(dispatcher)}[
        g.shard.shard_id
    ].consumed == 7


async def _shard_rows(dispatcher: ShardDispatcher) -> list[sa.Row[Any]]:
    async with dispatcher.database.sessions() as session:
        return list((await session.execute(sa.select(shards))).all())


async def test_a_failed_commit_changes_nothing_and_answers_unavailable(
    dispatcher: ShardDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await _first_shards(dispatcher)
    before = await dispatcher.dataset_state(JOB, DATASET)
    outbox_before = await _outbox_rows(dispatcher)

    def failing_commit(connection: object) -> None:
        raise _fast(dispatcher).errors[0]("disk I/O error")  # the dialect's driver error

    monkeypatch.setattr(_fast(dispatcher), "_commit", failing_commit)
    results = await asyncio.gather(
        *(
            dispatcher.get_shard(ref, grant.shard.shard_id, grant.shard.leases)
            for ref, grant in held
            if grant.shard is not None
        ),
        return_exceptions=True,
    )
    assert all(isinstance(result, Unavailable) for result in results), results
    assert "commit failed" in str(results[0])
    assert await dispatcher.dataset_state(JOB, DATASET) == before
    assert await _outbox_rows(dispatcher) == outbox_before

    # Once the database is back, the same calls go through: nothing was half-applied.
    monkeypatch.undo()
    grants = await asyncio.gather(
        *(
            dispatcher.get_shard(ref, grant.shard.shard_id, grant.shard.leases)
            for ref, grant in held
            if grant.shard is not None
        )
    )
    assert all(grant.shard is not None for grant in grants)
    counts = (await dispatcher.dataset_state(JOB, DATASET)).counts
    assert (counts.doing, counts.done) == (WORKERS, WORKERS)


async def _outbox_rows(dispatcher: ShardDispatcher) -> int:
    async with dispatcher.database.sessions() as session:
        result = await session.execute(outbox_table.select())
        return len(result.all())


def _hold_write_lock(path: str, seconds: float) -> threading.Thread:
    """Another writer (a thread with its own connection) holds SQLite's write lock."""
    locked = threading.Event()

    def hold() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(seconds)
        other.execute("ROLLBACK")
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(5)
    return thread


async def test_a_batch_waits_for_another_writer_without_blocking_the_loop(
    sqlite_dispatcher: ShardDispatcher,
) -> None:
    # The fast path runs on the event loop's thread; waiting inside SQLite there would stall
    # the loop (and the general path's connection holding the lock): it must yield instead.
    held = await _first_shards(sqlite_dispatcher)
    ref, grant = held[0]
    assert grant.shard is not None
    holder = _hold_write_lock(_sqlite(sqlite_dispatcher).path, 0.3)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while holder.is_alive():
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    granted = await sqlite_dispatcher.get_shard(ref, grant.shard.shard_id, grant.shard.leases)
    waited = time.monotonic() - started
    holder.join()
    await ticker
    assert granted.shard is not None and waited >= 0.2
    assert ticks >= 10  # the loop kept running while the batch waited for the lock
    counts = (await sqlite_dispatcher.dataset_state(JOB, DATASET)).counts
    assert (counts.doing, counts.done) == (WORKERS, 1)


async def test_a_lock_held_too_long_answers_unavailable_and_changes_nothing(
    sqlite_dispatcher: ShardDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await _first_shards(sqlite_dispatcher)
    ref, grant = held[0]
    assert grant.shard is not None
    before = await sqlite_dispatcher.dataset_state(JOB, DATASET)
    monkeypatch.setattr(fastpath, "BUSY_TIMEOUT", 0.1)
    holder = _hold_write_lock(_sqlite(sqlite_dispatcher).path, 0.5)
    with pytest.raises(Unavailable, match="still locked by another writer"):
        await sqlite_dispatcher.get_shard(ref, grant.shard.shard_id, grant.shard.leases)
    holder.join()
    assert await sqlite_dispatcher.dataset_state(JOB, DATASET) == before


def _doing_in_database_file(path: str, copy: Path) -> int:
    """Shards in DOING as the database file alone says, without its WAL."""
    shutil.copyfile(path, copy)
    with closing(sqlite3.connect(copy)) as alone:
        return int(alone.execute("SELECT count(*) FROM shards WHERE state = 'DOING'").fetchone()[0])


async def test_the_hot_connection_never_checkpoints_the_background_task_does(
    sqlite_dispatcher: ShardDispatcher, tmp_path: Path
) -> None:
    fast = _sqlite(sqlite_dispatcher)
    await _first_shards(sqlite_dispatcher)
    # The leases are committed, but only to the WAL: the hot path did not checkpoint.
    assert _doing_in_database_file(fast.path, tmp_path / "before.db") == 0
    stop = asyncio.Event()
    checkpoints = asyncio.create_task(fast.run_checkpoints(stop, interval=0.05))
    await asyncio.sleep(0.3)
    stop.set()
    await checkpoints
    assert _doing_in_database_file(fast.path, tmp_path / "after.db") == WORKERS


async def test_the_wal_is_rewound_once_it_grows_past_its_bound(
    sqlite_dispatcher: ShardDispatcher,
) -> None:
    """Under steady writes a PASSIVE checkpoint never lets SQLite rewind the WAL (it grew to
    540 MB in 30 s); past the bound the hot connection truncates it between two batches."""
    fast = _sqlite(sqlite_dispatcher)
    fast.wal_reset_frames = 64  # 256 KiB: reached within a second here
    wal = Path(f"{fast.path}-wal")
    stop = asyncio.Event()
    checkpoints = asyncio.create_task(fast.run_checkpoints(stop, interval=0.02))
    await sqlite_dispatcher.create_dataset(
        JOB, "big", replace(PARAMETERS, record_count=100_000)
    )  # 10,000 shards an epoch
    refs = [
        WorkerRef(JOB, "big", f"w{n}", await sqlite_dispatcher.register_worker(JOB, f"w{n}"))
        for n in range(4)
    ]
    held = {ref: await sqlite_dispatcher.get_shard(ref) for ref in refs}
    largest = 0
    try:
        for _ in range(150):  # steady writes: each call completes a shard and leases one
            grants = await asyncio.gather(
                *(
                    sqlite_dispatcher.get_shard(ref, g.shard.shard_id, g.shard.leases)
                    for ref, g in held.items()
                    if g.shard is not None
                )
            )
            held = dict(zip(held, grants, strict=True))
            largest = max(largest, (await asyncio.to_thread(wal.stat)).st_size)
            await asyncio.sleep(0)
    finally:
        stop.set()
        await checkpoints
    assert fast.rewinds >= 1
    # Bounded: the bound plus what arrives before the next check (a few batches' pages).
    assert largest < 4 * 64 * 4096 + 2**20, largest
    state = await sqlite_dispatcher.dataset_state(JOB, "big")
    assert (state.counts.doing, state.counts.done) == (len(refs), 150 * len(refs))
