"""SQLite statements run on the event loop, commits and lock waits on the connection's thread
(``stride.db.sqlite``), and nothing about a transaction's outcome changes.

Each crossing to aiosqlite's thread cost about 0.24 ms of CPU on two cores, and the stock
adapter crossed three or four times per statement (``bench/sqlite_hops.py``). These tests
hold the two things that make running statements on the loop safe: a statement that meets
another writer's lock waits for it off the loop (the loop keeps running, the lock holder
commits), and results (rows, counts, errors, rollbacks) are what the driver gives.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select, text, update
from sqlalchemy.engine import CursorResult

from stride.db import sqlite as stride_sqlite
from stride.db.engine import ConflictingWrite, Database

metadata = MetaData()
items = Table(
    "items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String, unique=True, nullable=False),
    Column("n", Integer, nullable=False),
)


async def _database(path: Path) -> Database:
    database = Database(f"sqlite:///{path / 'items.db'}", "sqlitetest")
    async with database.engine.begin() as connection:
        await connection.run_sync(metadata.create_all)
    return database


@pytest.fixture
def crossings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The calls each connection sends to its thread, by function name."""
    seen: list[str] = []
    original = stride_sqlite.Connection._execute

    async def counting(self: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(getattr(function, "__name__", repr(function)))
        return await original(self, function, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(stride_sqlite.Connection, "_execute", counting)
    return seen


async def test_a_transaction_crosses_to_the_thread_once_to_commit_and_a_read_never(
    tmp_path: Path, crossings: list[str]
) -> None:
    database = await _database(tmp_path)
    try:
        async with database.engine.connect() as connection:
            raw = await connection.get_raw_connection()
            assert isinstance(raw.driver_connection, stride_sqlite.Connection)
        crossings.clear()
        async with database.transaction() as session:
            await session.execute(insert(items).values(name="a", n=1))
            await session.execute(insert(items).values(name="b", n=2))
            await session.execute(update(items).where(items.c.name == "a").values(n=3))
            ordered = await session.execute(select(items.c.n).order_by(items.c.id))
            assert ordered.scalars().all() == [3, 2]
        assert crossings == ["_waiting"]  # the commit
        crossings.clear()
        async with database.sessions() as session:
            assert await session.scalar(select(items.c.n).where(items.c.name == "b")) == 2
        assert crossings == []
    finally:
        await database.dispose()


async def test_results_counts_and_errors_are_the_drivers(tmp_path: Path) -> None:
    database = await _database(tmp_path)
    try:
        async with database.transaction() as session:
            result = await session.execute(
                insert(items), [{"name": f"r{i}", "n": i} for i in range(5)]
            )
            assert cast(CursorResult[Any], result).rowcount == 5
            changed = await session.execute(update(items).where(items.c.n >= 3).values(n=0))
            assert cast(CursorResult[Any], changed).rowcount == 2
            returned = await session.execute(
                insert(items).values(name="x", n=9).returning(items.c.id, items.c.n)
            )
            assert returned.one().n == 9
        # A constraint broken mid-transaction: the error names it, and nothing of the
        # transaction stays (the insert before it is rolled back too).
        with pytest.raises(ConflictingWrite, match=r"UNIQUE constraint failed: items\.name"):
            async with database.transaction() as session:
                await session.execute(insert(items).values(name="new", n=1))
                await session.execute(insert(items).values(name="r0", n=1))
        with pytest.raises(Exception, match="no such table: missing"):
            async with database.sessions() as session:
                await session.execute(text("SELECT * FROM missing"))
        async with database.sessions() as session:
            names = (await session.execute(select(items.c.name).order_by(items.c.id))).scalars()
            assert list(names) == ["r0", "r1", "r2", "r3", "r4", "x"]
            assert await session.scalar(select(items.c.n).where(items.c.name == "r4")) == 0
    finally:
        await database.dispose()


async def test_a_writer_that_meets_the_lock_waits_off_the_loop_while_the_holder_commits(
    tmp_path: Path, crossings: list[str]
) -> None:
    """Two transactions of one service on two pooled connections. The second meets the
    first's write lock: it must wait for it on its thread while the loop runs on, so the
    first can finish. Waiting on the loop would freeze the holder for the whole busy timeout
    and then fail; not waiting at all would fail at once with "database is locked"."""
    database = await _database(tmp_path)
    try:
        holding, release = asyncio.Event(), asyncio.Event()
        ticks = 0

        async def first() -> None:
            async with database.transaction() as session:
                await session.execute(insert(items).values(name="first", n=1))
                holding.set()
                await release.wait()

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        holder = asyncio.create_task(first())
        beat = asyncio.create_task(ticker())
        await holding.wait()
        crossings.clear()
        started = time.monotonic()
        second = asyncio.create_task(_insert(database, "second"))
        await asyncio.sleep(0.3)
        assert not second.done()  # waiting for the lock ...
        assert ticks >= 10  # ... while the loop runs
        release.set()
        await asyncio.wait_for(asyncio.gather(holder, second), 5)
        assert time.monotonic() - started < 2
        beat.cancel()
        assert crossings.count("_waiting") >= 3  # the wait, and the two commits
        async with database.sessions() as session:
            names = (await session.execute(select(items.c.name).order_by(items.c.id))).scalars()
            assert list(names) == ["first", "second"]
    finally:
        await database.dispose()


async def _insert(database: Database, name: str) -> None:
    async with database.transaction() as session:
        await session.execute(insert(items).values(name=name, n=0))


async def test_a_lock_held_by_another_process_is_waited_for_then_given_up_naming_it(
    tmp_path: Path,
) -> None:
    """Another program (here a plain sqlite3 connection on a thread of its own) holds the
    write lock: a transaction waits for it while the loop runs, succeeds once it is released,
    and fails with SQLite's "database is locked" after the busy timeout."""
    database = await _database(tmp_path)
    try:
        path = tmp_path / "items.db"

        def hold(seconds: float, taken: threading.Event) -> None:
            other = sqlite3.connect(path, isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            taken.set()
            time.sleep(seconds)
            other.execute("ROLLBACK")
            other.close()

        taken = threading.Event()
        thread = threading.Thread(target=hold, args=(0.5, taken))
        thread.start()
        await asyncio.to_thread(taken.wait)
        loop_ran = asyncio.create_task(asyncio.sleep(0.05))
        await _insert(database, "after-the-other")
        assert loop_ran.done()
        thread.join()

        # A deferred transaction meets the lock at its first write, here an executemany:
        # waited for, and its rows go in once.
        taken = threading.Event()
        thread = threading.Thread(target=hold, args=(0.5, taken))
        thread.start()
        await asyncio.to_thread(taken.wait)
        async with database.sessions() as session:
            await session.execute(insert(items), [{"name": f"m{i}", "n": i} for i in range(3)])
            await session.commit()
        thread.join()

        taken = threading.Event()
        thread = threading.Thread(
            target=hold, args=(stride_sqlite.DEFAULT_BUSY_TIMEOUT + 1.5, taken)
        )
        thread.start()
        await asyncio.to_thread(taken.wait)
        with pytest.raises(Exception, match="database is locked"):
            await _insert(database, "given-up")
        thread.join()
        async with database.sessions() as session:
            names = (await session.execute(select(items.c.name))).scalars()
            assert list(names) == ["after-the-other", "m0", "m1", "m2"]
    finally:
        await database.dispose()
