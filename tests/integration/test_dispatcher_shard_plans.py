"""The shard queue's indexes (migration 0005) and PostgreSQL's plans for the fast path's
hand-outs: a new job's dataset, which the planner's statistics have never seen, is still
served by key lookups on the hand-out's own connection, after the table grew past the size
its plans were first made for.

Both failures were found under ``bench/dispatcher_vs_dlrover.py`` (auto_explain): with
``dataset_id = ? AND shard_id = ANY(?)`` the planner read all of a dataset's rows to fetch
16 (it estimated an unknown dataset at one row), and the plan cache kept a generic plan made
while the table was small, a hash join over a scan of the whole table.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, inspect, make_url, text

from stride.db.engine import Database, schema_for, sync_url
from stride.db.migrations import current_and_head, downgrade, upgrade
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.outbound import fastpath
from stride.dispatcher.adapters.outbound.fastpath import PostgresFastPath
from stride.dispatcher.app import MIGRATIONS, open_fast_path
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.usecases import DoneReport, ShardDispatcher, WorkerRef

pytestmark = pytest.mark.integration

JOB = "job-plans"
LEASE = timedelta(minutes=10)


def _parameters(shards: int) -> DatasetParameters:
    return DatasetParameters(
        record_count=shards,
        batch_size=1,
        shard_batches=1,
        epochs=1,
        shuffle=False,
        seed=0,
        kind=ShardingKind.INDEX_RANGE,
        partitions=0,
    )


@pytest.fixture
async def dispatcher(postgres_url: str) -> AsyncIterator[ShardDispatcher]:
    upgrade(postgres_url, "dispatcher", MIGRATIONS)
    database = Database(postgres_url, "dispatcher")
    # Every shard of an epoch written by its first call, so the table has grown when the
    # plans are checked (by default the rows come a batch at a time).
    fast = open_fast_path(
        database, LEASE, timedelta(seconds=30), sync_commits=True, rows_per_write=20_000
    )
    dispatcher = ShardDispatcher(
        database, Outbox(outbox_table), LEASE, fast=fast, rows_per_write=20_000
    )
    try:
        yield dispatcher
    finally:
        await fast.close()
        await database.dispose()


def _numbered(sql: str) -> str:
    """The fast path's ``?`` placeholders as PREPARE's ``$1``, ``$2``, ..."""
    count = iter(range(1, sql.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(count)}", sql)


def _literal(value: Any) -> str:
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


Statements = dict[str, tuple[str, tuple[Any, ...]]]
"""Prepared statement name: (the fast path's SQL, its parameters)."""


async def _explain(fast: PostgresFastPath, statements: Statements, runs: int = 1) -> dict[str, str]:
    """PREPARE each statement on the fast path's own connection (with its session settings),
    plan it ``runs`` times (EXPLAIN EXECUTE counts as a run for the plan cache: past five
    it may settle on a generic plan for the table as it is then), and return the last plans.
    Nothing is executed, and no ROLLBACK is sent (psycopg answers one with DEALLOCATE ALL)."""

    def explain() -> dict[str, str]:
        connection = fast._connect().connection
        plans = {}
        for name, (sql, parameters) in statements.items():
            prepared = connection.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE name = %s", (name,)
            ).fetchone()
            if prepared is None or prepared[0] == 0:
                connection.execute(f"PREPARE {name} AS {_numbered(sql)}")
            arguments = ", ".join(_literal(p) for p in parameters)
            for _ in range(runs):
                rows = connection.execute(f"EXPLAIN EXECUTE {name}({arguments})").fetchall()
            plans[name] = "\n".join(row[0] for row in rows)
        return plans

    return await fast._on_connection_thread(explain)


async def _explain_each_time(fast: PostgresFastPath, statements: Statements) -> dict[str, str]:
    """The plans of statements planned at every execution (not prepared), on the fast
    path's own connection."""

    def explain() -> dict[str, str]:
        connection = fast._connect().connection
        plans = {}
        for name, (sql, parameters) in statements.items():
            assert sql in fastpath._PgConnection.REPLANNED, name
            text = _numbered(sql)
            for number, parameter in reversed(list(enumerate(parameters, start=1))):
                text = text.replace(f"${number}", _literal(parameter))
            rows = connection.execute(f"EXPLAIN {text}").fetchall()
            plans[name] = "\n".join(row[0] for row in rows)
        return plans

    return await fast._on_connection_thread(explain)


async def test_a_new_jobs_dataset_is_served_by_key_lookups_after_the_table_grew(
    dispatcher: ShardDispatcher, postgres_url: str
) -> None:
    fast = dispatcher.fast
    assert isinstance(fast, PostgresFastPath)
    # A small dataset, analyzed: the statistics know only it.
    await dispatcher.create_dataset(JOB, "small", _parameters(64))
    ref = WorkerRef(JOB, "small", "w0", await dispatcher.register_worker(JOB, "w0"))
    grant = await dispatcher.get_shard(ref, max_shards=16)
    assert grant.shard is not None
    engine = create_engine(sync_url(postgres_url), isolation_level="AUTOCOMMIT")
    schema = schema_for(postgres_url, "dispatcher")
    with engine.connect() as connection:
        connection.execute(text(f'ANALYZE "{schema}".shards'))
        small_id = connection.execute(
            text(f"SELECT id FROM \"{schema}\".datasets WHERE dataset = 'small'")
        ).scalar_one()

    now = "2026-01-01 00:00:00"

    def joins(dataset_id: int, shard_ids: list[int]) -> Statements:
        return {
            "locked": (fastpath._PG_SHARDS_LOCKED, ([dataset_id] * len(shard_ids), shard_ids)),
            "lease": (fastpath._PG_LEASE_MANY, ("w0", 1, now, now, dataset_id, -1, -1, 16)),
        }

    def lookups(dataset_id: int, shard_id: int) -> Statements:
        saved = (1, 0, "DOING", "w0", 1, 1, now, now, dataset_id, shard_id)
        return {
            "save": (fastpath._SAVE_SHARD, saved),
            "lease_one": (fastpath._LEASE_ONE, ("w0", 1, now, now, dataset_id, dataset_id, -1, -1)),
        }

    # Key lookups are prepared: their plans are made (and cached, generic or not) while the
    # table holds the small dataset alone.
    await _explain(fast, lookups(small_id, 1), runs=8)

    # A new job's big dataset: an epoch of 15,000 shards, cut by its first batched call.
    await dispatcher.create_dataset(JOB, "big", _parameters(15_000))
    big = WorkerRef(JOB, "big", "w0", await dispatcher.register_worker(JOB, "w0"))
    grant = await dispatcher.get_shard(big, max_shards=16)
    leased = [grant.shard, *grant.more]
    assert len(leased) == 16
    with engine.connect() as connection:
        big_id = connection.execute(
            text(f"SELECT id FROM \"{schema}\".datasets WHERE dataset = 'big'")
        ).scalar_one()
    engine.dispose()

    def deallocate() -> None:
        for name in cached:
            fast._connect().connection.execute(f"DEALLOCATE {name}")

    # The key lookups as cached above, now about the big dataset: still by index.
    cached = lookups(big_id, 1)
    plans = await _explain(fast, cached)
    await fast._on_connection_thread(deallocate)
    for name, plan in plans.items():
        assert "Seq Scan" not in plan, (name, plan)
        assert "Index" in plan, (name, plan)
    # The joins, planned at each execution, for the big dataset the statistics never saw.
    plans = await _explain_each_time(
        fast, joins(big_id, [shard.shard_id for shard in leased if shard is not None])
    )
    for name, plan in plans.items():
        assert "Seq Scan on shards" not in plan, (name, plan)
        assert "Hash Join" not in plan, (name, plan)
        # Each shard found by its whole key, not by a scan of the dataset filtered.
        assert re.search(r"Index Cond: \(\(dataset_id = \S+\) AND \(shard_id = \S+\)\)", plan), (
            name,
            plan,
        )
        assert not re.search(r"Filter: \(shard_id = ANY", plan), (name, plan)

    # And the hand-outs themselves: every shard of the epoch exactly once, in order.
    seen = [shard.shard_id for shard in leased if shard is not None]
    while True:
        grant = await dispatcher.get_shard(
            big,
            done=[DoneReport(shard_id) for shard_id in seen[-16:]],
            max_shards=16,
        )
        if grant.shard is None:
            break
        seen += [shard.shard_id for shard in (grant.shard, *grant.more)]
    assert seen == sorted(seen) == list(range(15_000))


def test_migration_0005_makes_the_shard_indexes_partial_and_back(database_url: str) -> None:
    upgrade(database_url, "dispatcher", MIGRATIONS)
    schema = schema_for(database_url, "dispatcher")
    engine = create_engine(sync_url(database_url))

    def indexes() -> dict[str, list[str | None]]:
        found = inspect(engine).get_indexes("shards", schema=schema)
        return {index["name"]: list(index["column_names"]) for index in found if index["name"]}

    try:
        assert indexes() == {
            "ix_shards_todo": ["dataset_id", "epoch", "position", "shard_id"],
            "ix_shards_held": ["worker"],
            "ix_shards_lease": ["lease_expires_at"],
        }
        downgrade(database_url, "dispatcher", MIGRATIONS, "0004")
        assert indexes() == {
            "ix_shards_next": ["dataset_id", "state", "epoch", "position"],
            "ix_shards_worker": ["worker", "state"],
            "ix_shards_lease": ["state", "lease_expires_at"],
        }
        upgrade(database_url, "dispatcher", MIGRATIONS)
        assert current_and_head(database_url, "dispatcher", MIGRATIONS) == ("0006", "0006")
        assert set(indexes()) == {"ix_shards_todo", "ix_shards_held", "ix_shards_lease"}
    finally:
        engine.dispose()


def test_array_literals_reach_postgresql_as_the_values_they_spell(postgres_url: str) -> None:
    """The fast path sends its ``unnest`` arrays as literals (``fastpath._pg_array``): worker
    names, job ids and timestamps arrive exactly, whatever characters they hold."""
    texts = ['a"b', "c\\d", None, "NULL", "", "x,y{}", " padded ", "ü", "'quoted'"]
    numbers = [0, -1, 2**62, None]
    floats = [0.1, 1e-300, None]
    url = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT %s::text[], %s::bigint[], %s::float8[], %s::int[]",
            (
                fastpath._pg_array(texts),
                fastpath._pg_array(numbers),
                fastpath._pg_array(floats),
                fastpath._pg_array([]),
            ),
        ).fetchone()
    assert row == (texts, numbers, floats, [])
