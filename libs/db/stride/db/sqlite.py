"""SQLite connections for SQLAlchemy's aiosqlite dialect that run statements on the event
loop and cross to the connection's thread only to commit, or to wait for a lock.

aiosqlite runs every sqlite3 call on the connection's own thread, and SQLAlchemy's adapter
makes several calls per statement: it opens a cursor, executes, fetches the rows and closes
the cursor, each a crossing (a queue put, a thread wake-up, a ``call_soon_threadsafe``, a
loop wake-up, the GIL handed over twice). On this project's two-core machines a crossing
costs about 0.24 ms of CPU, several times the statement itself: a use case's transaction of
five statements took 4.1 ms of CPU where the synchronous driver takes 0.75 ms
(``bench/sqlite_hops.py``), and the work that follows each job submission runs a dozen such
transactions across the services.

:class:`Connection` is aiosqlite's (its thread, queue, connect, close), with two changes:

- **Statements run on the loop's thread,** in one call (execute, fetch every row, close the
  sqlite3 cursor), with SQLite's busy timeout at 0: a statement never waits inside SQLite
  there, where waiting would stall the very coroutine that holds the lock. One that finds
  the database locked (``SQLITE_BUSY``: another connection of the pool, or another process,
  writes) fails at once, having changed nothing, and is run again on the connection's thread
  with the busy timeout set, so the loop goes on while it waits.
  A statement reads pages from the operating system's cache and appends to SQLite's own;
  the file is written and synced at commit. So a statement blocks the loop about as long as
  the Python code that handles its rows.
- **Commits cross to the thread,** with the busy timeout set: a commit writes and syncs the
  write-ahead log, and may run a checkpoint. A rollback stays on the loop: in WAL mode it
  only drops pages from SQLite's cache and releases locks.

The sqlite3 connection is opened with ``check_same_thread=False`` (aiosqlite does the same)
and is used by one thread at a time: SQLAlchemy hands a pooled connection to one session,
which awaits each call before the next. The module's SQLite is built thread-safe
(``sqlite3.threadsafety`` 3), so a mistake there would still not corrupt anything.
"""

from __future__ import annotations

import collections
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

_Outcome = tuple[Any, int, int | None, list[Any]]

DEFAULT_BUSY_TIMEOUT = 5.0
"""Seconds a statement or commit waits (on the connection's thread) for another writer's
lock before it fails with "database is locked"."""


def _statement(connection: sqlite3.Connection, sql: str, parameters: Any, many: bool) -> _Outcome:
    """One statement, start to finish, and what SQLAlchemy reads of its cursor afterwards."""
    cursor = connection.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, parameters)
        rows = cursor.fetchall() if cursor.description else []
        return cursor.description, cursor.rowcount, cursor.lastrowid, rows
    finally:
        cursor.close()


def _waiting(connection: sqlite3.Connection, milliseconds: int, call: Callable[[], Any]) -> Any:
    """Run ``call`` (on the connection's thread) allowing SQLite to wait for locks."""
    connection.execute(f"PRAGMA busy_timeout={milliseconds}")
    try:
        return call()
    finally:
        connection.execute("PRAGMA busy_timeout=0")


def is_busy(error: BaseException) -> bool:
    """True if SQLite refused because another connection holds a lock it needs."""
    return (
        isinstance(error, sqlite3.OperationalError)
        and error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
    )


class Cursor:
    """The async cursor SQLAlchemy's aiosqlite adapter drives (see the module docstring)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self.arraysize = 1
        self._rows: collections.deque[Any] = collections.deque()

    async def __aenter__(self) -> Cursor:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def _keep(self, outcome: _Outcome) -> Cursor:
        self.description, self.rowcount, self.lastrowid, rows = outcome
        self._rows = collections.deque(rows)
        return self

    async def _run(self, sql: str, parameters: Any, many: bool) -> Cursor:
        connection = self._connection
        raw = connection._conn
        changes = raw.total_changes
        try:
            return self._keep(_statement(raw, sql, parameters, many))
        except sqlite3.OperationalError as error:
            # Only a statement that changed nothing is run again: a lock is met at the first
            # write, so an executemany that went in part way holds the lock already and is
            # never refused busy. The check keeps a retry from repeating rows regardless.
            if not is_busy(error) or raw.total_changes != changes:
                raise
        return self._keep(await connection.waiting(_statement, sql, parameters, many))

    async def execute(self, sql: str, parameters: Any = ()) -> Cursor:
        return await self._run(sql, parameters, many=False)

    async def executemany(self, sql: str, parameters: Iterable[Any]) -> Cursor:
        return await self._run(sql, list(parameters), many=True)

    async def fetchone(self) -> Any:
        return self._rows.popleft() if self._rows else None

    async def fetchmany(self, size: int | None = None) -> Sequence[Any]:
        count = min(self.arraysize if size is None else size, len(self._rows))
        return [self._rows.popleft() for _ in range(count)]

    async def fetchall(self) -> Sequence[Any]:
        rows = list(self._rows)
        self._rows.clear()
        return rows

    async def close(self) -> None:
        self._rows.clear()


class Connection(aiosqlite.Connection):
    """aiosqlite's connection, with statements on the loop (see the module docstring)."""

    def __init__(self, connector: Callable[[], sqlite3.Connection], busy_timeout: float) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self.busy_milliseconds = round(1000 * busy_timeout)

    def cursor(self) -> Cursor:  # type: ignore[override]
        return Cursor(self)

    async def waiting(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(sqlite3_connection, *args)`` on the connection's thread, allowed to
        wait up to the busy timeout for another writer's lock."""
        connection = self._conn
        return await self._on_thread(lambda: function(connection, *args))

    async def commit(self) -> None:
        await self._on_thread(self._conn.commit)

    async def _on_thread(self, call: Callable[[], Any]) -> Any:
        return await self._execute(  # type: ignore[no-untyped-call]
            _waiting, self._conn, self.busy_milliseconds, call
        )

    async def rollback(self) -> None:
        # On the loop: in WAL mode a rollback drops the transaction's pages from SQLite's
        # cache and releases its locks, with no file I/O and nothing to wait for. (The pool
        # also rolls back each connection it gets back, mostly with no transaction open.)
        self._conn.rollback()


def connect(
    database: str | Path, busy_timeout: float = DEFAULT_BUSY_TIMEOUT, **kwargs: Any
) -> Connection:
    """What ``aiosqlite.connect`` does, with :class:`Connection`; SQLAlchemy calls it as
    ``connect_args={"async_creator_fn": connect}``. The thread is a daemon, as SQLAlchemy
    makes aiosqlite's."""
    kwargs = {**kwargs, "timeout": 0.0, "check_same_thread": False}

    def connector() -> sqlite3.Connection:
        opened: sqlite3.Connection = sqlite3.connect(str(database), **kwargs)
        return opened

    connection = Connection(connector, busy_timeout)
    connection._thread.daemon = True
    return connection
