"""Transactional outbox: events are written in the same transaction as the state they
describe, and a relay publishes them afterwards.

This is what makes "store, then publish" safe. A crash after the commit loses nothing (the
relay publishes on restart), and a crash after the publish but before the row is removed
re-publishes with the same ``Nats-Msg-Id``, which JetStream drops as a duplicate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    delete,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from stride.db.engine import Database

log = structlog.get_logger(__name__)

PublishRaw = Callable[[str, bytes, str, Mapping[str, str]], Awaitable[object]]

PIPELINE = 16
"""Publishes awaited together. Small, so a burst of events does not hold the event loop
for long: the relay shares it with the service's requests, and its bursts set their tail."""


@dataclass(frozen=True)
class PendingEvent:
    """An outbox row as the relay needs it (for a service that reads rows its own way)."""

    seq: int
    subject: str
    payload: bytes
    message_id: str
    headers: dict[str, str]


ReadPending = Callable[[int], Awaitable[Sequence[PendingEvent]]]
"""Reads up to n outbox rows in order."""

DeleteUpTo = Callable[[int], Awaitable[None]]
"""Deletes the outbox rows up to a sequence number (inclusive), committed."""


def outbox_table(metadata: MetaData) -> Table:
    """The outbox table definition, added to a service's metadata (and its migrations)."""
    return Table(
        "outbox",
        metadata,
        Column("seq", Integer, primary_key=True, autoincrement=True),
        Column("message_id", String(200), nullable=False, unique=True),
        Column("subject", String(300), nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("headers", JSON, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
    )


class Outbox:
    """Adds events inside a caller's transaction and relays them to the bus."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.wakeup = asyncio.Event()
        # Built once: statement construction costs more CPU than running them (hot path).
        self._existing = select(table.c.seq).where(table.c.message_id == bindparam("b_message_id"))
        self._insert = table.insert()

    async def add(
        self,
        session: AsyncSession,
        subject: str,
        payload: bytes,
        message_id: str,
        headers: Mapping[str, str],
    ) -> None:
        """Queue an event in the caller's open transaction. Same id twice is ignored."""
        existing = await session.scalar(self._existing, {"b_message_id": message_id})
        if existing is not None:
            return
        await session.execute(
            self._insert,
            {
                "message_id": message_id,
                "subject": subject,
                "payload": payload,
                "headers": dict(headers),
                "created_at": datetime.now(UTC),
            },
        )

    def notify(self) -> None:
        """Wake the relay after a commit, so events go out without waiting for the poll."""
        self.wakeup.set()

    async def relay_once(
        self,
        database: Database,
        publish: PublishRaw,
        batch: int = 100,
        delete_up_to: DeleteUpTo | None = None,
        read_pending: ReadPending | None = None,
    ) -> int:
        """Publish up to ``batch`` pending events in order, then delete them; how many went out.

        Publishes of a chunk of :data:`PIPELINE` are in flight together (written in order on
        the one connection, acknowledged in parallel) instead of one round trip each. Only
        the acknowledged prefix is deleted, in one statement, also when a later publish
        fails; anything after it is published again next round and JetStream drops a copy
        by its ``Nats-Msg-Id``.

        ``read_pending`` and ``delete_up_to`` replace the read and the delete through
        ``database``: a service with its own connection for the hot path (the dispatcher's
        SQLite group commit) passes them so the relay joins that path instead of contending
        for the database lock.
        """
        rows: Sequence[Any]
        if read_pending is not None:
            rows = await read_pending(batch)
        else:
            async with database.sessions() as session:
                query = select(self.table).order_by(self.table.c.seq).limit(batch)
                rows = (await session.execute(query)).all()
        published = 0
        try:
            for first in range(0, len(rows), PIPELINE):
                chunk = rows[first : first + PIPELINE]
                results = await asyncio.gather(
                    *(publish(r.subject, r.payload, r.message_id, r.headers) for r in chunk),
                    return_exceptions=True,
                )
                for result in results:
                    if isinstance(result, BaseException):
                        raise result
                    published += 1
        finally:
            if published:
                last = rows[published - 1].seq
                if delete_up_to is not None:
                    await delete_up_to(last)
                else:
                    async with database.transaction() as session:
                        await session.execute(delete(self.table).where(self.table.c.seq <= last))
        return published

    async def run_relay(
        self,
        database: Database,
        publish: PublishRaw,
        stop: asyncio.Event,
        poll_seconds: float = 1.0,
        batch: int = 100,
        delete_up_to: DeleteUpTo | None = None,
        read_pending: ReadPending | None = None,
    ) -> None:
        """Relay until ``stop``; between rounds wait for the wakeup event or ``poll_seconds``.

        A failed publish (NATS down) or database error is retried on the next round;
        nothing is dropped. A full batch is followed at once by the next.
        """
        while not stop.is_set():
            try:
                sent = await self.relay_once(database, publish, batch, delete_up_to, read_pending)
            except Exception as error:
                log.warning(
                    "outbox relay failed; will retry", error=f"{type(error).__name__}: {error}"
                )
                sent = 0
            if sent == batch:
                continue
            self.wakeup.clear()
            waiters = [
                asyncio.ensure_future(self.wakeup.wait()),
                asyncio.ensure_future(stop.wait()),
            ]
            _, pending = await asyncio.wait(
                waiters, timeout=poll_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()


def create_outbox_table_v1(op: Any) -> None:
    """Create the outbox table as of its first version, for services' initial migrations.

    Frozen: a later change to the outbox gets a new function and new migrations.
    """
    import sqlalchemy as sa

    op.create_table(
        "outbox",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.String(200), nullable=False, unique=True),
        sa.Column("subject", sa.String(300), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("headers", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
