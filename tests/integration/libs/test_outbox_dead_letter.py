"""The outbox relay parks an event the bus refuses for good and goes on in order; it never
parks one that only failed for a while; and the dead-letter table's migration applies.

Real nats-server, real PostgreSQL and SQLite. The service under test is a host built the
way every service's ``app.py`` builds one (``stride.wiring``), on admission's tables.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.js.errors import NoStreamResponseError
from prometheus_client import REGISTRY
from sqlalchemy import MetaData, create_engine, delete, inspect, select
from structlog.testing import capture_logs

from stride.admission.app import MIGRATIONS as ADMISSION_MIGRATIONS
from stride.admission.app import SERVICE_NAME
from stride.admission.db.tables import outbox as admission_outbox
from stride.admission.settings import AdmissionSettings
from stride.bus import topics
from stride.db.engine import Database, schema_for, sync_url
from stride.db.migrations import current_and_head, downgrade, upgrade
from stride.db.outbox import HEALTH_NAME, Outbox, outbox_table
from stride.dispatcher.app import MIGRATIONS as DISPATCHER_MIGRATIONS
from stride.optimizer.app import MIGRATIONS as OPTIMIZER_MIGRATIONS
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.eventually import assert_eventually
from stride.testing.health import NOT_SERVING, SERVING, equals, health
from stride.testing.inprocess import local_settings, running_service
from stride.testing.outbox import OutboxHarness, published_ids
from stride.wiring import connect_bus, create_host, open_database, relay_outbox

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
STREAM = topics.JOBS.name
HEADERS = {topics.TYPE_HEADER: "stride.events.v1.JobSubmitted"}
SUBJECT = topics.JOB_SUBMITTED.subject("job-big")


class Relaying(OutboxHarness):
    """A host with only the outbox relay, built as ``app.py`` builds one; keeps what it
    built so the test can write events and look at the tables."""

    def __init__(self) -> None:
        super().__init__(SUBJECT, HEADERS)

    async def build(self, settings: AdmissionSettings) -> ServiceHost:
        host = create_host(settings, [SERVICE_NAME], {})  # no methods of its own are called
        bus = await connect_bus(settings, host)
        self.database = await open_database(settings, host, ADMISSION_MIGRATIONS)
        self.outbox = Outbox(admission_outbox)
        relay_outbox(host, self.outbox, self.database, bus, poll_seconds=0.05)
        return host


def sample(name: str) -> float:
    """The admission service's value of metric ``name`` in this process (0 if unset)."""
    return REGISTRY.get_sample_value(name, {"service": "admission"}) or 0.0


async def test_an_event_over_max_payload_is_parked_and_the_rest_go_out_in_order(
    database_url: str, nats_url: str
) -> None:
    settings = local_settings(AdmissionSettings, nats_url=nats_url, database_url=database_url)
    parked_before = sample("stride_outbox_parked_total")
    relaying = Relaying()
    async with running_service(relaying.build, settings) as host:
        port = host.server.port
        await assert_eventually(lambda: equals(health(port, HEALTH_NAME, "admission"), SERVING))
        await relaying.add(("first", b"first"), ("big", b"x" * (2 * MIB)), ("last", b"last"))

        await assert_eventually(lambda: equals(published_ids(nats_url, STREAM), ["first", "last"]))
        await assert_eventually(lambda: equals(relaying.left(), []))
        (row,) = await relaying.parked()
        assert row["message_id"] == "big" and row["subject"] == SUBJECT
        assert row["payload"] == b"x" * (2 * MIB) and row["headers"] == HEADERS
        assert (
            row["reason"]
            == "payload is 2,097,152 bytes, over the server's max_payload of 1,048,576"
        )
        assert row["created_at"] is not None and row["parked_at"] is not None

        # The alert: its own health name goes NOT_SERVING; the service itself still serves.
        await assert_eventually(lambda: equals(health(port, HEALTH_NAME, "admission"), NOT_SERVING))
        assert await health(port, SERVICE_NAME, "admission") == SERVING
        assert sample("stride_outbox_parked_messages") == 1
        assert sample("stride_outbox_parked_total") == parked_before + 1

    # A restarted relay finds nothing stuck, publishes nothing again, and still alerts.
    restarted = Relaying()
    async with running_service(restarted.build, settings) as host:
        port = host.server.port
        await assert_eventually(lambda: equals(health(port, HEALTH_NAME, "admission"), NOT_SERVING))
        await restarted.add(("after", b"after"))
        await assert_eventually(
            lambda: equals(published_ids(nats_url, STREAM), ["first", "last", "after"])
        )
        await assert_eventually(lambda: equals(restarted.left(), []))
        assert [row["message_id"] for row in await restarted.parked()] == ["big"]
        assert sample("stride_outbox_parked_messages") == 1

        # An operator deals with the parked event and removes its row: the alert clears.
        assert restarted.database is not None and restarted.outbox is not None
        async with restarted.database.transaction() as session:
            await session.execute(delete(restarted.outbox.dead_letter))
        await assert_eventually(lambda: equals(health(port, HEALTH_NAME, "admission"), SERVING))
        assert sample("stride_outbox_parked_messages") == 0
    assert await published_ids(nats_url, STREAM) == ["first", "last", "after"]


@pytest.fixture
async def sqlite_outbox(tmp_path: Path) -> AsyncIterator[tuple[Database, Outbox]]:
    """An outbox and its dead-letter table in a fresh SQLite file."""
    database = Database(f"sqlite:///{tmp_path / 'outbox.db'}", "outboxtest")
    outbox = Outbox(outbox_table(MetaData()))  # defines the dead-letter table beside it
    async with database.engine.begin() as connection:
        await connection.run_sync(outbox.table.metadata.create_all)
    yield database, outbox
    await database.dispose()


async def _left(database: Database, outbox: Outbox) -> list[str]:
    async with database.sessions() as session:
        query = select(outbox.table.c.message_id).order_by(outbox.table.c.seq)
        return list((await session.execute(query)).scalars())


async def _parked(database: Database, outbox: Outbox) -> list[tuple[str, str]]:
    async with database.sessions() as session:
        query = select(outbox.dead_letter.c.message_id, outbox.dead_letter.c.reason)
        return [(row[0], row[1]) for row in await session.execute(query)]


async def test_an_event_its_headers_push_over_max_payload_is_parked_unsent(
    sqlite_outbox: tuple[Database, Outbox], nats_url: str
) -> None:
    # nats-py checks the payload alone; the server checks payload and headers together and
    # closes the connection of a client over the limit. The relay checks before sending.
    database, outbox = sqlite_outbox
    bus = await producer_bus(nats_url, "outbox-test")
    try:
        await bus.ensure_streams()
        limit = bus.nc.max_payload
        async with database.transaction() as session:
            await outbox.add(session, SUBJECT, b"y" * (limit - 20), "edge", HEADERS)
            await outbox.add(session, SUBJECT, b"after", "after", HEADERS)
        with capture_logs() as logs:
            sent = await outbox.relay_once(
                database, bus.publish_raw, max_payload=lambda: bus.nc.max_payload
            )
        assert sent == 2
        ((message_id, reason),) = await _parked(database, outbox)
        assert message_id == "edge"
        (error,) = [entry for entry in logs if entry["log_level"] == "error"]
        assert (error["message_id"], error["subject"], error["reason"]) == ("edge", SUBJECT, reason)
        assert reason.startswith("payload and headers are 1,048,")
        assert reason.endswith("bytes, over the server's max_payload of 1,048,576")
        assert bus.is_connected
        assert await published_ids(nats_url, STREAM) == ["after"]
        assert await _left(database, outbox) == []
    finally:
        await bus.close()


async def test_a_transient_failure_is_retried_never_parked(
    sqlite_outbox: tuple[Database, Outbox], nats_server: NatsServer
) -> None:
    database, outbox = sqlite_outbox
    bus = await producer_bus(nats_server.url, "outbox-test")
    stop = asyncio.Event()
    relay: asyncio.Task[None] | None = None
    try:
        async with database.transaction() as session:
            await outbox.add(session, SUBJECT, b"early", "early", HEADERS)

        # No stream for the subject yet (no responders): services create the streams at
        # start, so this passes; the event waits.
        with pytest.raises(NoStreamResponseError):
            await outbox.relay_once(database, bus.publish_raw, max_payload=lambda: 1 << 20)
        assert await _left(database, outbox) == ["early"]
        await bus.ensure_streams()

        # NATS goes away while an event waits, then comes back.
        nats_server.kill()
        async with database.transaction() as session:
            await outbox.add(session, SUBJECT, b"during", "during", HEADERS)
        with capture_logs() as logs:
            relay = asyncio.create_task(
                outbox.run_relay(
                    database,
                    bus.publish_raw,
                    stop,
                    poll_seconds=0.05,
                    max_payload=lambda: bus.nc.max_payload,
                )
            )
            await assert_eventually(
                lambda: any(entry["event"] == "outbox relay failed; will retry" for entry in logs),
                timeout=15,
            )
        assert await _parked(database, outbox) == []
        assert await _left(database, outbox) == ["early", "during"]

        nats_server.start()
        await assert_eventually(lambda: equals(_left(database, outbox), []), timeout=20)
        assert await published_ids(nats_server.url, STREAM) == ["early", "during"]
        assert await _parked(database, outbox) == []
    finally:
        stop.set()
        if relay is not None:
            await relay
        await bus.close()


MIGRATED = [
    ("admission", ADMISSION_MIGRATIONS, "0001"),
    ("optimizer", OPTIMIZER_MIGRATIONS, "0001"),
    ("dispatcher", DISPATCHER_MIGRATIONS, "0003"),
]


def _columns(url: str, service: str) -> list[str] | None:
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            inspector = inspect(connection)
            schema = schema_for(url, service)
            if not inspector.has_table("outbox_dead_letter", schema=schema):
                return None
            columns = inspector.get_columns("outbox_dead_letter", schema=schema)
            return [column["name"] for column in columns]
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("service", "migrations", "before"), MIGRATED, ids=[service for service, _, _ in MIGRATED]
)
def test_the_dead_letter_migration_applies_and_reverts(
    database_url: str, service: str, migrations: Path, before: str
) -> None:
    upgrade(database_url, service, migrations)
    current, head = current_and_head(database_url, service, migrations)
    assert current == head
    assert _columns(database_url, service) == [
        "id",
        "seq",
        "message_id",
        "subject",
        "payload",
        "headers",
        "reason",
        "created_at",
        "parked_at",
    ]
    downgrade(database_url, service, migrations, before)
    assert _columns(database_url, service) is None
    upgrade(database_url, service, migrations)
    assert _columns(database_url, service) is not None
