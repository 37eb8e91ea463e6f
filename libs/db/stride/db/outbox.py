"""Transactional outbox: events are written in the same transaction as the state they
describe, and a relay publishes them afterwards.

This is what makes "store, then publish" safe. A crash after the commit loses nothing (the
relay publishes on restart), and a crash after the publish but before the row is removed
re-publishes with the same ``Nats-Msg-Id``, which JetStream drops as a duplicate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
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
    delete,
    select,
)
from sqlalchemy.ext.asyncio import AsyncSession

from stride.db.engine import Database

log = structlog.get_logger(__name__)

PublishRaw = Callable[[str, bytes, str, Mapping[str, str]], Awaitable[object]]


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

    async def add(
        self,
        session: AsyncSession,
        subject: str,
        payload: bytes,
        message_id: str,
        headers: Mapping[str, str],
    ) -> None:
        """Queue an event in the caller's open transaction. Same id twice is ignored."""
        existing = await session.scalar(
            select(self.table.c.seq).where(self.table.c.message_id == message_id)
        )
        if existing is not None:
            return
        await session.execute(
            self.table.insert().values(
                message_id=message_id,
                subject=subject,
                payload=payload,
                headers=dict(headers),
                created_at=datetime.now(UTC),
            )
        )

    def notify(self) -> None:
        """Wake the relay after a commit, so events go out without waiting for the poll."""
        self.wakeup.set()

    async def relay_once(self, database: Database, publish: PublishRaw, batch: int = 100) -> int:
        """Publish pending events in order; returns how many went out.

        Each event is published (and acknowledged) in order; then everything published is
        deleted in one statement, also when a later publish fails, so a busy outbox costs one
        delete per batch rather than one transaction per event. An event published but not
        yet deleted when the process dies is published again: its ``Nats-Msg-Id`` makes
        JetStream drop the duplicate.
        """
        async with database.sessions() as session:
            rows = (
                await session.execute(select(self.table).order_by(self.table.c.seq).limit(batch))
            ).all()
        published: list[int] = []
        try:
            for row in rows:
                await publish(row.subject, row.payload, row.message_id, row.headers)
                published.append(row.seq)
        finally:
            if published:
                async with database.transaction() as session:
                    await session.execute(delete(self.table).where(self.table.c.seq.in_(published)))
        return len(published)

    async def run_relay(
        self,
        database: Database,
        publish: PublishRaw,
        stop: asyncio.Event,
        poll_seconds: float = 1.0,
    ) -> None:
        """Relay until ``stop``; waits on the wakeup event or the poll interval between rounds.

        A failed publish (NATS down) is retried on the next round; nothing is dropped.
        """
        while not stop.is_set():
            try:
                sent = await self.relay_once(database, publish)
            except Exception as error:
                log.warning(
                    "outbox relay failed; will retry", error=f"{type(error).__name__}: {error}"
                )
                sent = 0
            if sent:
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
