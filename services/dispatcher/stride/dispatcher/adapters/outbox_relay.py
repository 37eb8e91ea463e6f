"""The dispatcher's outbox relay: publish pending events in order, delete them in one go.

The shared relay (:meth:`stride.db.outbox.Outbox.run_relay`) deletes each event in its own
transaction right after publishing it. The dispatcher writes an event for every finished
shard, hundreds a second, and those per-event transactions took about half of its time.
This relay publishes a batch in order, then deletes everything up to the last published
sequence number in one statement. The guarantees are the same: a crash between publish
and delete re-publishes, and JetStream drops the copy by its ``Nats-Msg-Id``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import delete, select

from stride.db.engine import Database
from stride.db.outbox import Outbox, PublishRaw

log = structlog.get_logger(__name__)

PIPELINE = 16
"""Publishes awaited together. Small, so a burst of events does not hold the event loop
for long: the relay shares it with the hand-outs, and its bursts set their tail latency."""


@dataclass(frozen=True)
class PendingEvent:
    """An outbox row as the relay needs it."""

    seq: int
    subject: str
    payload: bytes
    message_id: str
    headers: dict[str, str]


ReadPending = Callable[[int], Awaitable[Sequence[PendingEvent]]]
"""Reads up to n outbox rows in order."""


DeleteUpTo = Callable[[int], Awaitable[None]]
"""Deletes the outbox rows up to a sequence number (inclusive), committed."""


async def relay_batch(
    outbox: Outbox,
    database: Database,
    publish: PublishRaw,
    batch: int,
    delete_up_to: DeleteUpTo | None = None,
    read_pending: ReadPending | None = None,
) -> int:
    """Publish up to ``batch`` pending events in order, then delete them; how many went out.

    ``delete_up_to`` and ``read_pending`` replace the delete and the read through
    ``database`` (the SQLite fast path passes its own: the delete joins its group commit
    instead of contending for the lock, and rows are read without SQLAlchemy's per-row
    cost on the event loop).
    """
    table = outbox.table
    rows: Sequence[Any]
    if read_pending is not None:
        rows = await read_pending(batch)
    else:
        async with database.sessions() as session:
            query = select(table).order_by(table.c.seq).limit(batch)
            rows = (await session.execute(query)).all()
    if not rows:
        return 0
    published = 0
    try:
        # The publishes of a chunk are in flight together (one write, acks in parallel)
        # instead of one round trip each: the relay is otherwise the busiest thing on the
        # event loop, since every finished shard is an event. NATS receives them in order
        # on the one connection. Only the prefix that was acknowledged is deleted; a later
        # one that went through too is re-published next round and dropped by its id.
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
                    await session.execute(delete(table).where(table.c.seq <= last))
    return published


async def run_relay(
    outbox: Outbox,
    database: Database,
    publish: PublishRaw,
    stop: asyncio.Event,
    poll_seconds: float = 1.0,
    batch: int = 500,
    delete_up_to: DeleteUpTo | None = None,
    read_pending: ReadPending | None = None,
) -> None:
    """Relay until ``stop``; between rounds wait for a wakeup or ``poll_seconds``."""
    while not stop.is_set():
        try:
            sent = await relay_batch(outbox, database, publish, batch, delete_up_to, read_pending)
        except Exception as error:  # NATS or the database away: retry next round
            log.warning("outbox relay failed; will retry", error=f"{type(error).__name__}: {error}")
            sent = 0
        if sent == batch:
            continue
        outbox.wakeup.clear()
        waiters = [
            asyncio.ensure_future(outbox.wakeup.wait()),
            asyncio.ensure_future(stop.wait()),
        ]
        _, pending = await asyncio.wait(
            waiters, timeout=poll_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        for waiter in pending:
            waiter.cancel()
