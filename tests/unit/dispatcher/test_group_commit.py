"""Group commit on the SQLite fast path: concurrent calls share one transaction, and a failed
commit leaves the queue as it was and answers every call of the batch UNAVAILABLE."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from stride.db.engine import Database
from stride.db.migrations import upgrade
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.sqlite_fastpath import SqliteFastPath
from stride.dispatcher.app import MIGRATIONS
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.dispatching import ShardDispatcher, ShardGrant, WorkerRef
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.runtime.errors import FailedPrecondition, Unavailable

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


@pytest.fixture
async def dispatcher(tmp_path: Path) -> AsyncIterator[ShardDispatcher]:
    path = tmp_path / "dispatcher.db"
    upgrade(f"sqlite:///{path}", "dispatcher", MIGRATIONS)
    database = Database(f"sqlite:///{path}", "dispatcher")
    dispatcher = ShardDispatcher(database, Outbox(outbox_table), LEASE)
    fast = SqliteFastPath(str(path), LEASE, timedelta(seconds=30), sync_commits=False)
    dispatcher.fast = fast
    await dispatcher.create_dataset(JOB, DATASET, PARAMETERS)
    try:
        yield dispatcher
    finally:
        await fast.close()
        await database.dispose()


async def _first_shards(dispatcher: ShardDispatcher) -> list[tuple[WorkerRef, ShardGrant]]:
    held = []
    for number in range(WORKERS):
        worker = f"w{number}"
        ref = WorkerRef(JOB, DATASET, worker, await dispatcher.register_worker(JOB, worker))
        held.append((ref, await dispatcher.get_shard(ref)))
    return held


def _fast(dispatcher: ShardDispatcher) -> SqliteFastPath:
    assert dispatcher.fast is not None
    return dispatcher.fast


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


async def test_a_failed_commit_changes_nothing_and_answers_unavailable(
    dispatcher: ShardDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = await _first_shards(dispatcher)
    before = await dispatcher.dataset_state(JOB, DATASET)
    outbox_before = await _outbox_rows(dispatcher)

    def failing_commit(connection: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")

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
