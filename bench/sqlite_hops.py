"""Benchmark: the CPU of one SQLite transaction through SQLAlchemy, stock aiosqlite against
Stride's one-crossing cursors (``stride.db.sqlite``), with the synchronous driver as the floor.

Run: ``.venv/bin/python bench/sqlite_hops.py [--transactions 2000] [--rounds 3]`` (writes
``bench/results/sqlite_hops.txt``).

Each transaction has the shape of a service's use case: ``BEGIN IMMEDIATE`` (as
``Database.transaction`` begins), a read by key, two inserts, an update, a count, and the
commit, on a WAL database in a fresh folder, one after another on one event loop. Measured:
the process's CPU (every thread: the loop's and the connection's) and the wall time per
transaction, median over the rounds with the spread. The three variants take turns within a
round:
- ``aiosqlite``: SQLAlchemy's stock aiosqlite adapter (a cursor open, an execute, a fetch and
  a cursor close each cross to the connection's thread);
- ``stride``: ``stride.db.engine.Database``'s engine (one crossing per statement);
- ``sync``: the synchronous pysqlite driver, no event loop (what no async driver can beat).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import create_engine, event, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session
from suite import record

from stride.db.engine import (
    WRITER,
    Database,
    _sqlite_begin,
    _sqlite_pragmas,
    async_url,
    sync_url,
)

RESULT = Path(__file__).parent / "results" / "sqlite_hops.txt"
SCHEMA = "CREATE TABLE t (id INTEGER PRIMARY KEY, a TEXT, b INTEGER)"
STATEMENTS = 5


def _engine_stock(url: str) -> AsyncEngine:
    engine = create_async_engine(async_url(url))
    event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    event.listen(engine.sync_engine, "begin", _sqlite_begin)
    return engine.execution_options(**{WRITER: True})


def _engine_stride(url: str) -> AsyncEngine:
    return Database(url, "bench").engine.execution_options(**{WRITER: True})


async def _async_round(
    make: Callable[[str], AsyncEngine], folder: Path, count: int
) -> tuple[float, float]:
    engine = make(f"sqlite:///{folder / 'db.sqlite'}")
    async with engine.begin() as connection:
        await connection.execute(text(SCHEMA))
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(count):
        async with engine.begin() as connection:
            await connection.execute(text("SELECT * FROM t WHERE id = :i"), {"i": i})
            await connection.execute(text("INSERT INTO t (a, b) VALUES ('x', :b)"), {"b": i})
            await connection.execute(text("INSERT INTO t (a, b) VALUES ('y', :b)"), {"b": i})
            await connection.execute(text("UPDATE t SET b = b + 1 WHERE id = :i"), {"i": i})
            (await connection.execute(text("SELECT count(*) FROM t"))).scalar_one()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await engine.dispose()
    return cpu / count, wall / count


def _sync_round(folder: Path, count: int) -> tuple[float, float]:
    engine = create_engine(sync_url(f"sqlite:///{folder / 'db.sqlite'}"))
    event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "begin", _sqlite_begin)
    engine = engine.execution_options(**{WRITER: True})
    with engine.begin() as connection:
        connection.execute(text(SCHEMA))
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(count):
        with Session(engine) as session, session.begin():
            session.execute(text("SELECT * FROM t WHERE id = :i"), {"i": i})
            session.execute(text("INSERT INTO t (a, b) VALUES ('x', :b)"), {"b": i})
            session.execute(text("INSERT INTO t (a, b) VALUES ('y', :b)"), {"b": i})
            session.execute(text("UPDATE t SET b = b + 1 WHERE id = :i"), {"i": i})
            session.execute(text("SELECT count(*) FROM t")).scalar_one()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    engine.dispose()
    return cpu / count, wall / count


def _run(variant: str, count: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="stride-sqlite-hops-") as folder:
        if variant == "sync":
            return _sync_round(Path(folder), count)
        make = _engine_stock if variant == "aiosqlite" else _engine_stride
        return asyncio.run(_async_round(make, Path(folder), count))


def _figure(values: list[float]) -> str:
    ms = [1e3 * v for v in values]
    return f"{statistics.median(ms):6.3f} [{min(ms):.3f}-{max(ms):.3f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    variants = ("aiosqlite", "stride", "sync")
    measured: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            _run(variant, 100)  # warm the statement caches and the file system
            measured[variant].append(_run(variant, args.transactions))
    cpu = {v: statistics.median(c for c, _ in measured[v]) for v in variants}
    lines = [
        "# bench/sqlite_hops.py",
        f"command: .venv/bin/python bench/sqlite_hops.py --transactions {args.transactions}"
        f" --rounds {args.rounds}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"transaction: BEGIN IMMEDIATE + {STATEMENTS} statements + COMMIT, WAL; "
        f"{args.transactions} per round, {args.rounds} rounds, median [min-max]",
        "",
        f"{'variant':10} {'CPU ms/txn':>22} {'wall ms/txn':>22} {'x aiosqlite CPU':>16}",
    ]
    for variant in variants:
        lines.append(
            f"{variant:10} {_figure([c for c, _ in measured[variant]]):>22} "
            f"{_figure([w for _, w in measured[variant]]):>22} "
            f"{cpu[variant] / cpu['aiosqlite']:>15.2f}x"
        )
    record(RESULT, lines)


if __name__ == "__main__":
    main(sys.argv[1:])
