"""Transactional outbox: events are written in the same transaction as the state they
describe, and a relay publishes them afterwards.

This is what makes "store, then publish" safe. A crash after the commit loses nothing (the
relay publishes on restart), and a crash after the publish but before the row is removed
re-publishes with the same ``Nats-Msg-Id``, which JetStream drops as a duplicate.

The relay publishes in order, so one event the bus refuses for good would hold back every
later event of the service, across restarts. Such an event (bigger than the server's
``max_payload``, a subject or header NATS cannot carry, a size or header JetStream rejects)
is parked instead: moved into the ``outbox_dead_letter`` table, with the reason, in the
same transaction that removes it from the outbox, and the relay goes on with the next
events. An operator sees it on the ``stride_outbox_parked_messages`` gauge and on the gRPC
health name :data:`HEALTH_NAME` (NOT_SERVING while anything is parked), removes the cause,
and re-queues or deletes the row. Every other failure (NATS down or reconnecting, no stream
for the subject yet, JetStream busy or restarting, a timeout) is retried: when in doubt a
failure counts as transient, because a parked event has lost its place in the order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import nats.errors
import nats.js.errors
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
    Text,
    bindparam,
    delete,
    func,
    select,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from stride.bus.client import MSG_ID_HEADER
from stride.bus.topics import Outgoing
from stride.db.engine import Database
from stride.db.rows import insert_new
from stride.obs.metrics import OUTBOX_PARKED, OUTBOX_PARKED_TOTAL

log = structlog.get_logger(__name__)

PublishRaw = Callable[[str, bytes, str, Mapping[str, str]], Awaitable[object]]

PIPELINE = 16
"""Publishes awaited together. Small, so a burst of events does not hold the event loop
for long: the relay shares it with the service's requests, and its bursts set their tail."""

HEALTH_NAME: Final = "stride.outbox"
"""The gRPC health name that reports the outbox: SERVING while no event is parked,
NOT_SERVING while the dead-letter table holds any. The same name in every service that has
an outbox (admission, optimizer, dispatcher), so one probe definition fits them all; it is
apart from the service's own name, which stays SERVING (the service works) and drives
readiness. Probe it with ``python -m stride.runtime.healthcheck --service stride.outbox``."""

DEAD_LETTER_TABLE: Final = "outbox_dead_letter"
"""Where refused events are parked, beside the outbox in the service's own schema."""

REASON_LENGTH: Final = 1000
"""Characters of a reason kept: enough for any reason built here, bounded for the log."""

_HEADER_LINE: Final = b"NATS/1.0\r\n"

# JetStream errors (server/errors.json) that say the message itself can never be stored,
# whatever the server's state: only these are parked. Errors that depend on the state
# (10060 expected stream, 10071 wrong last sequence, 10077 store failed, 503s) are retried.
_JETSTREAM_REFUSALS: Final = {
    10054: "message size exceeds maximum allowed",
    10097: "header size exceeds maximum allowed of 64k",
    10165: "invalid per-message TTL",
}


COALESCE_SECONDS: Final = 0.01
"""Under a stream of commits, the shortest time between two relay rounds: about a commit's
time on PostgreSQL, so a busy service's events leave in rounds of several (each round costs
two transactions) for at most this much more latency."""


@dataclass(frozen=True)
class PendingEvent:
    """An outbox row as the relay needs it (for a service that reads rows its own way)."""

    seq: int
    subject: str
    payload: bytes
    message_id: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Refusal:
    """An outbox row the bus refuses for good, and why (naming the problem and the limit)."""

    seq: int
    message_id: str
    subject: str
    reason: str


ReadPending = Callable[[int], Awaitable[Sequence[PendingEvent]]]
"""Reads up to n outbox rows in order."""

DeleteUpTo = Callable[[int], Awaitable[None]]
"""Deletes the outbox rows up to a sequence number (inclusive), committed."""

Park = Callable[[Sequence[Refusal], int], Awaitable[None]]
"""Copies the refused rows into the dead-letter table with their reasons and deletes the
outbox rows up to a sequence number (inclusive), in ONE committed transaction."""


@dataclass(frozen=True)
class RelayHooks:
    """The relay's reads and writes, for a service that runs them on its own connection.

    The dispatcher's SQLite group commit holds the one write lock for its hand-outs; the
    relay's delete and park join that path (one more statement of a batch) instead of
    waiting for the lock in SQLite's busy handler.
    """

    read_pending: ReadPending
    delete_up_to: DeleteUpTo
    park: Park


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


def outbox_dead_letter_table(metadata: MetaData) -> Table:
    """The dead-letter table of the outbox, added to a service's metadata (and migrations).

    ``id`` is its own key: SQLite reuses an outbox ``seq`` once the outbox is empty, and
    the same message id may be queued and refused again after an operator removed it.
    """
    return Table(
        DEAD_LETTER_TABLE,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("seq", Integer, nullable=False),
        Column("message_id", String(200), nullable=False),
        Column("subject", String(300), nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("headers", JSON, nullable=False),
        Column("reason", Text, nullable=False),
        Column("created_at", DateTime(timezone=True), nullable=False),
        Column("parked_at", DateTime(timezone=True), nullable=False),
    )


def header_size(event: PendingEvent) -> int:
    """Bytes of the header block the relay's publish sends (``Bus.publish_raw`` adds the
    ``Nats-Msg-Id``), encoded as nats-py encodes it. The server checks ``max_payload``
    against payload plus headers, and closes the connection of a client that exceeds it."""
    headers = {**event.headers, MSG_ID_HEADER: event.message_id}
    size = len(_HEADER_LINE) + 2
    for key, value in headers.items():
        name = key.strip()
        if name:  # nats-py skips empty names
            size += len(name.encode()) + 2 + len(value.strip().encode()) + 2
    return size


def refusal_before_publish(event: PendingEvent, max_payload: int | None) -> str | None:
    """Why the server would refuse ``event`` for its size, or None if it fits.

    Checked before publishing: nats-py checks the payload alone, and a message that only
    its headers push over the limit would make the server close the connection (and the
    relay would do it again on every round).
    """
    if max_payload is None:
        return None
    payload = len(event.payload)
    if payload > max_payload:
        return f"payload is {payload:,} bytes, over the server's max_payload of {max_payload:,}"
    total = payload + header_size(event)
    if total > max_payload:
        return (
            f"payload and headers are {total:,} bytes, "
            f"over the server's max_payload of {max_payload:,}"
        )
    return None


def refusal_reason(
    error: BaseException, event: PendingEvent, max_payload: int | None
) -> str | None:
    """Why the bus will never take ``event``, judging by the ``error`` its publish raised;
    None if the failure may pass (then the relay retries it).

    Permanent: a payload over the server's ``max_payload`` (nats-py's ``MaxPayloadError``),
    a subject or header name NATS cannot carry, and the JetStream errors that are about the
    message itself (size over the stream's limit, headers over 64 KiB, a malformed TTL).
    Everything else is transient, notably no responders (no stream for the subject yet, or
    JetStream restarting), timeouts, a closed or reconnecting connection and 503s.
    """
    if isinstance(error, nats.errors.MaxPayloadError):
        return refusal_before_publish(event, max_payload) or (
            f"payload is {len(event.payload):,} bytes, over the server's max_payload"
        )
    if isinstance(error, nats.errors.BadSubjectError):
        return f"subject {event.subject[:300]!r} is not a valid NATS subject"
    if isinstance(error, nats.errors.BadHeaderError):
        return f"header name {error.key[:200]!r} is not a valid NATS header name"
    if isinstance(error, nats.js.errors.APIError) and error.err_code in _JETSTREAM_REFUSALS:
        code = error.err_code
        what = error.description or _JETSTREAM_REFUSALS[code]
        if code == 10054:
            return (
                f"payload is {len(event.payload):,} bytes, over the stream's max message "
                f"size (JetStream error {code}: {what})"
            )
        if code == 10097:
            return (
                f"headers are {header_size(event):,} bytes, over JetStream's header limit "
                f"(JetStream error {code}: {what})"
            )
        return f"JetStream refuses it for good (error {code}: {what})"
    return None


def _current_limit(max_payload: Callable[[], int] | None) -> int | None:
    # Read per round: after a reconnect to another server the limit may differ.
    if max_payload is None:
        return None
    limit = max_payload()
    return limit if limit > 0 else None


class Outbox:
    """Adds events inside a caller's transaction and relays them to the bus, parking those
    the bus refuses for good.

    The dead-letter table is the one named :data:`DEAD_LETTER_TABLE` in the outbox table's
    metadata (a service's ``tables.py`` defines it there); if the metadata has none, it is
    defined there. ``hooks`` replace the relay's reads and writes through the database
    (see :class:`RelayHooks`).
    """

    def __init__(self, table: Table, hooks: RelayHooks | None = None) -> None:
        self.table = table
        existing = table.metadata.tables.get(DEAD_LETTER_TABLE)
        self.dead_letter = (
            existing if existing is not None else outbox_dead_letter_table(table.metadata)
        )
        self.hooks = hooks
        self.wakeup = asyncio.Event()
        self.parked: int | None = None
        """Events in the dead-letter table as last counted; None before the first count."""
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

    async def add_event(self, session: AsyncSession, event: Outgoing) -> None:
        """Queue an event built by a bus topic (``Topic.outgoing``) in the caller's open
        transaction. Same id twice is ignored."""
        await self.add(session, event.subject, event.payload, event.message_id, event.headers)

    async def add_events(self, session: AsyncSession, events: Sequence[Outgoing]) -> None:
        """Queue many events in the caller's open transaction, in order, with one query for
        the ids already queued and one batched insert (a decision that changes hundreds of
        jobs' shares would otherwise pay two round trips per event). Same id twice is
        ignored, within the batch too."""
        now = datetime.now(UTC)
        await insert_new(
            session,
            self.table,
            "message_id",
            [
                {
                    "message_id": event.message_id,
                    "subject": event.subject,
                    "payload": event.payload,
                    "headers": dict(event.headers),
                    "created_at": now,
                }
                for event in events
            ],
        )

    def notify(self) -> None:
        """Wake the relay after a commit, so events go out without waiting for the poll."""
        self.wakeup.set()

    async def relay_once(
        self,
        database: Database,
        publish: PublishRaw,
        batch: int = 100,
        *,
        max_payload: Callable[[], int] | None = None,
    ) -> int:
        """Publish up to ``batch`` pending events in order, park those the bus refuses for
        good, then delete them; how many left the outbox (published or parked).

        Publishes of a chunk of :data:`PIPELINE` are in flight together (written in order on
        the one connection, acknowledged in parallel) instead of one round trip each. Only
        the prefix that was acknowledged or refused for good is removed, in one transaction
        that also parks the refused ones; after a transient failure, anything after it is
        published again next round and JetStream drops a copy by its ``Nats-Msg-Id``.

        ``max_payload`` gives the server's limit (from its INFO), so an event over it is
        parked without being sent. The outbox's :class:`RelayHooks`, when it has them,
        replace the reads and writes through ``database``.
        """
        hooks = self.hooks
        read_pending = hooks.read_pending if hooks is not None else None
        delete_up_to = hooks.delete_up_to if hooks is not None else None
        park = hooks.park if hooks is not None else None
        rows: Sequence[PendingEvent]
        if read_pending is not None:
            rows = await read_pending(batch)
        else:
            async with database.sessions() as session:
                query = select(self.table).order_by(self.table.c.seq).limit(batch)
                rows = [
                    PendingEvent(r.seq, r.subject, r.payload, r.message_id, r.headers)
                    for r in await session.execute(query)
                ]
        settled = 0
        refused: list[Refusal] = []
        try:
            for first in range(0, len(rows), PIPELINE):
                chunk = rows[first : first + PIPELINE]
                limit = _current_limit(max_payload)
                early = [refusal_before_publish(row, limit) for row in chunk]
                results = iter(
                    await asyncio.gather(
                        *(
                            publish(row.subject, row.payload, row.message_id, row.headers)
                            for row, too_big in zip(chunk, early, strict=True)
                            if too_big is None
                        ),
                        return_exceptions=True,
                    )
                )
                for row, too_big in zip(chunk, early, strict=True):
                    reason = too_big
                    if too_big is None:
                        result = next(results)
                        if isinstance(result, BaseException):
                            reason = refusal_reason(result, row, _current_limit(max_payload))
                            if reason is None:
                                raise result
                    if reason is not None:
                        refused.append(
                            Refusal(row.seq, row.message_id, row.subject, reason[:REASON_LENGTH])
                        )
                    settled += 1
        finally:
            if settled:
                await self._settle(database, rows[settled - 1].seq, refused, delete_up_to, park)
        return settled

    async def _settle(
        self,
        database: Database,
        last: int,
        refused: Sequence[Refusal],
        delete_up_to: DeleteUpTo | None,
        park: Park | None,
    ) -> None:
        """Remove the rows up to ``last``, parking ``refused`` in the same transaction."""
        if not refused:
            if delete_up_to is not None:
                await delete_up_to(last)
            else:
                async with database.transaction() as session:
                    await session.execute(delete(self.table).where(self.table.c.seq <= last))
            return
        if park is not None:
            await park(refused, last)
        else:
            await self._park(database, refused, last)
        for refusal in refused:
            log.error(
                "outbox event refused for good by the bus; parked",
                table=DEAD_LETTER_TABLE,
                seq=refusal.seq,
                message_id=refusal.message_id,
                subject=refusal.subject,
                reason=refusal.reason,
            )
        OUTBOX_PARKED_TOTAL.labels(service=database.service).inc(len(refused))
        try:
            await self.count_parked(database)
        except (SQLAlchemyError, OSError, TimeoutError) as error:
            # The park is committed; the gauge catches up at the next health check.
            log.warning("could not count parked outbox events", error=str(error))

    async def _park(self, database: Database, refused: Sequence[Refusal], last: int) -> None:
        """:data:`Park` through ``database``: copy the rows, then delete up to ``last``."""
        reasons = {refusal.seq: refusal.reason for refusal in refused}
        now = datetime.now(UTC)
        async with database.transaction() as session:
            query = select(self.table).where(self.table.c.seq.in_(list(reasons)))
            rows = (await session.execute(query)).all()
            if rows:  # none if another relay of the service removed them first
                await session.execute(
                    self.dead_letter.insert(),
                    [
                        {
                            "seq": row.seq,
                            "message_id": row.message_id,
                            "subject": row.subject,
                            "payload": row.payload,
                            "headers": row.headers,
                            "reason": reasons[row.seq],
                            "created_at": row.created_at,
                            "parked_at": now,
                        }
                        for row in rows
                    ],
                )
            await session.execute(delete(self.table).where(self.table.c.seq <= last))

    async def count_parked(self, database: Database, timeout: float = 2.0) -> int:
        """Count the parked events (and set the ``stride_outbox_parked_messages`` gauge)."""
        async with asyncio.timeout(timeout), database.sessions() as session:
            count = await session.scalar(select(func.count()).select_from(self.dead_letter))
        self.parked = int(count or 0)
        OUTBOX_PARKED.labels(service=database.service).set(self.parked)
        return self.parked

    async def nothing_parked(self, database: Database) -> bool:
        """The check behind :data:`HEALTH_NAME`: True while no event is parked.

        An event stays parked until an operator removes its row, so this counts the table
        each time. If the database cannot be asked, the last count answers: the outage is
        the service's own health name's to report, not a parked event.
        """
        try:
            return await self.count_parked(database) == 0
        except (SQLAlchemyError, OSError, TimeoutError):
            if self.parked is None:
                raise
            return self.parked == 0

    async def run_relay(
        self,
        database: Database,
        publish: PublishRaw,
        stop: asyncio.Event,
        poll_seconds: float = 1.0,
        batch: int = 100,
        *,
        max_payload: Callable[[], int] | None = None,
        coalesce_seconds: float = COALESCE_SECONDS,
    ) -> None:
        """Relay until ``stop``; between rounds wait for the wakeup event or ``poll_seconds``.

        A transient failure (NATS down) or a database error is retried on the next round;
        nothing is dropped. An event refused for good is parked and the relay goes on. A
        full batch is followed at once by the next. While events keep coming, a round
        starts no sooner than ``coalesce_seconds`` after the one before it relayed
        something, so the commits of that moment go out in one round (one read, one
        delete) instead of a round each; an event after a quiet spell goes out at once.
        """
        try:
            await self.count_parked(database)  # the gauge tells from the start
        except (SQLAlchemyError, OSError, TimeoutError) as error:
            log.warning("could not count parked outbox events", error=str(error))
        loop = asyncio.get_running_loop()
        busy_since: float | None = None
        """When the last round that relayed something started (None: it relayed nothing)."""
        while not stop.is_set():
            if busy_since is not None:
                await asyncio.sleep(max(0.0, busy_since + coalesce_seconds - loop.time()))
            # Cleared before the round reads the outbox, never after it: a commit notified
            # while the round was publishing is relayed by the next round at once instead
            # of waiting out the poll.
            self.wakeup.clear()
            started = loop.time()
            try:
                sent = await self.relay_once(database, publish, batch, max_payload=max_payload)
            except Exception as error:
                log.warning(
                    "outbox relay failed; will retry", error=f"{type(error).__name__}: {error}"
                )
                sent = 0
            busy_since = started if sent else None
            if sent == batch:
                continue
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


def create_outbox_dead_letter_table_v1(op: Any) -> None:
    """Create the outbox's dead-letter table as of its first version, for services'
    migrations.

    Frozen: a later change to the table gets a new function and new migrations.
    """
    import sqlalchemy as sa

    op.create_table(
        "outbox_dead_letter",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("message_id", sa.String(200), nullable=False),
        sa.Column("subject", sa.String(300), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("headers", sa.JSON, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("parked_at", sa.DateTime(timezone=True), nullable=False),
    )
