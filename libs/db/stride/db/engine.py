"""The async engine and sessions of one service's database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from stride.db import sqlite
from stride.runtime.errors import StartupError


def _base_url(url: str) -> URL:
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("postgresql", "sqlite"):
        raise StartupError(
            f"database URL {parsed.render_as_string()}: only postgresql and sqlite are supported"
        )
    return parsed


def async_url(url: str) -> URL:
    """The URL with the async driver (psycopg 3 for PostgreSQL, aiosqlite for SQLite)."""
    parsed = _base_url(url)
    driver = (
        "postgresql+psycopg" if parsed.get_backend_name() == "postgresql" else "sqlite+aiosqlite"
    )
    return parsed.set(drivername=driver)


def sync_url(url: str) -> URL:
    """The URL with a synchronous driver (for Alembic)."""
    parsed = _base_url(url)
    driver = "postgresql+psycopg" if parsed.get_backend_name() == "postgresql" else "sqlite"
    return parsed.set(drivername=driver)


def schema_for(url: str, service: str) -> str | None:
    """The schema the service's tables live in: the service name on PostgreSQL, none on SQLite."""
    return service if _base_url(url).get_backend_name() == "postgresql" else None


WRITER = "stride_writer"
"""Execution option of the engine :meth:`Database.transaction` uses (see _sqlite_begin)."""


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # The driver's own BEGIN is off: it begins a transaction only at the first write, so
    # the reads of a read-modify-write ran outside it (see _sqlite_begin).
    dbapi_connection.isolation_level = None
    # WAL lets readers proceed during a write. A statement that meets another writer's lock
    # waits for it (up to sqlite.DEFAULT_BUSY_TIMEOUT) off the event loop: .sqlite.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin(connection: Any) -> None:
    """Begin SQLite transactions ourselves (SQLAlchemy's recipe for pysqlite/aiosqlite).

    Left to the driver, a transaction began at its first INSERT or UPDATE: a use case that
    read a row "for update" and wrote it back had read it outside the transaction, and two
    such use cases interleaved lost one's write (SQLite has no SELECT ... FOR UPDATE). Now
    a :meth:`Database.transaction` begins IMMEDIATE, taking the write lock before its
    first read, so read-modify-write transactions run one at a time as they do on
    PostgreSQL under FOR UPDATE; a read-only session begins a plain (deferred) transaction
    and reads one consistent snapshot, beside a writer (WAL)."""
    immediate = connection.get_execution_options().get(WRITER, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


Session = AsyncSession
"""The unit of work a use case opens with :meth:`Database.transaction` and hands to its
repository functions. Use cases name this, not SQLAlchemy, so the storage library stays an
adapter's concern."""


class ConflictingWrite(Exception):
    """A transaction broke a uniqueness or integrity constraint: typically a concurrent
    writer inserted the same row first. Retrying, or reading the winner's row, resolves it."""


POOL_SIZE = 10
"""Connections a service keeps open to its database."""
POOL_OVERFLOW = 5
"""Connections it opens past those under load, closed when returned."""


class Database:
    """A service's database: engine, session factory, health ping and disposal."""

    def __init__(self, url: str, service: str) -> None:
        self.url = url
        self.service = service
        self.schema = schema_for(url, service)
        engine_url = async_url(url)
        # Ten kept open and five more on demand (SQLAlchemy's default: five and ten, the
        # same fifteen at most): a loaded service has more sessions at once than five
        # (decisions, metric consumers, the outbox relay, its API), and each one past the
        # pool was a new PostgreSQL backend. In bench/optimizer_loop.py's saturation run,
        # 996 connections in 50 s with five kept, 246 with ten.
        options: dict[str, Any] = {
            "pool_pre_ping": True,
            "pool_size": POOL_SIZE,
            "max_overflow": POOL_OVERFLOW,
        }
        if self.schema is None:
            # Statements on the loop, commits on the connection's thread (.sqlite).
            options = {"connect_args": {"async_creator_fn": sqlite.connect}}
        self.engine: AsyncEngine = create_async_engine(engine_url, **options)
        if self.schema is not None:
            self.engine = self.engine.execution_options(schema_translate_map={None: self.schema})
        else:
            event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)
            event.listen(self.engine.sync_engine, "begin", _sqlite_begin)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._writers = async_sessionmaker(
            self.engine.execution_options(**{WRITER: True}), expire_on_commit=False
        )

    @property
    def display_url(self) -> str:
        """The URL with any password hidden, for logs and errors."""
        return make_url(self.url).render_as_string(hide_password=True)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction that commits on success and rolls back on error."""
        try:
            async with self._writers() as session, session.begin():
                yield session
        except IntegrityError as error:
            raise ConflictingWrite(str(error.orig)) from error

    async def ping(self, timeout: float = 2.0) -> bool:
        """True if a trivial query succeeds within ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout), self.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except (TimeoutError, SQLAlchemyError, OSError):
            return False
        return True

    async def check_reachable(self, timeout: float) -> None:
        """Fail startup with one clear line if the database cannot be reached."""
        try:
            async with asyncio.timeout(timeout), self.engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except TimeoutError:
            raise StartupError(
                f"cannot reach database {self.display_url} within {timeout:g}s"
            ) from None
        except (DBAPIError, OSError) as error:
            reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
            raise StartupError(f"cannot reach database {self.display_url}: {reason}") from None

    async def dispose(self) -> None:
        """Close every pooled connection."""
        await self.engine.dispose()
