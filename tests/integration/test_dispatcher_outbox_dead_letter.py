"""The dispatcher's outbox relay parks an event the bus refuses for good through the fast
path's group commit (never the general path's connection, which would contend for SQLite's
write lock), and goes on in order. Real nats-server, PostgreSQL and SQLite."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, select

from stride.bus import topics
from stride.db.engine import Database
from stride.db.migrations import upgrade
from stride.db.outbox import HEALTH_NAME, Outbox
from stride.dispatcher.adapters.outbound.fastpath import FastPath
from stride.dispatcher.app import MIGRATIONS, SERVICE_NAME, open_fast_path
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.settings import DispatcherSettings
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.eventually import assert_eventually
from stride.testing.health import NOT_SERVING, SERVING, equals, health
from stride.testing.inprocess import local_settings, running_service
from stride.testing.outbox import OutboxHarness, published_ids
from stride.wiring import connect_bus, create_host, open_database, relay_outbox

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
STREAM = topics.SHARDS.name
HEADERS = {topics.TYPE_HEADER: "stride.events.v1.ShardProgress"}
SUBJECT = topics.SHARD_DONE.subject("job-big")


class FastRelaying(OutboxHarness):
    """A dispatcher host with only the outbox relay, its reads and writes on the fast path
    (``Outbox(..., hooks=fast.relay_hooks())``, as the dispatcher's ``app.py`` wires it)."""

    def __init__(self) -> None:
        super().__init__(SUBJECT, HEADERS)
        self.fast: FastPath | None = None

    async def build(self, settings: DispatcherSettings) -> ServiceHost:
        host = create_host(settings, [SERVICE_NAME], {})  # no methods of its own are called
        bus = await connect_bus(settings, host)
        database = self.database = await open_database(settings, host, MIGRATIONS)
        fast = self.fast = open_fast_path(
            database, settings.lease_duration, settings.rate_window, settings.sync_commits
        )

        async def always() -> bool:
            return True

        host.add_dependency(Dependency("fast-path", always, fast.close, closes_early=False))
        self.outbox = Outbox(outbox_table, hooks=fast.relay_hooks())
        relay_outbox(host, self.outbox, database, bus, poll_seconds=0.05)
        return host


async def test_the_fast_path_parks_an_event_over_max_payload_and_goes_on(
    database_url: str, nats_url: str
) -> None:
    settings = local_settings(DispatcherSettings, nats_url=nats_url, database_url=database_url)
    relaying = FastRelaying()
    async with running_service(relaying.build, settings) as host:
        port = host.server.port
        await relaying.add(("first", b"first"), ("big", b"x" * (2 * MIB)), ("last", b"last"))
        await assert_eventually(lambda: equals(published_ids(nats_url, STREAM), ["first", "last"]))
        await assert_eventually(lambda: equals(relaying.left(), []))
        (row,) = await relaying.parked()
        assert (row["message_id"], row["subject"], row["headers"]) == ("big", SUBJECT, HEADERS)
        assert row["payload"] == b"x" * (2 * MIB)
        assert row["reason"] == (
            "payload is 2,097,152 bytes, over the server's max_payload of 1,048,576"
        )
        assert row["created_at"] is not None and row["parked_at"] is not None
        assert relaying.fast is not None and relaying.fast.commits > 0
        await assert_eventually(
            lambda: equals(health(port, HEALTH_NAME, "dispatcher"), NOT_SERVING)
        )
        assert await health(port, SERVICE_NAME) == SERVING

    restarted = FastRelaying()
    async with running_service(restarted.build, settings) as host:
        port = host.server.port
        await assert_eventually(
            lambda: equals(health(port, HEALTH_NAME, "dispatcher"), NOT_SERVING)
        )
        await restarted.add(("after", b"after"))
        await assert_eventually(
            lambda: equals(published_ids(nats_url, STREAM), ["first", "last", "after"])
        )
        await assert_eventually(lambda: equals(restarted.left(), []))
        assert [row["message_id"] for row in await restarted.parked()] == ["big"]
        assert restarted.database is not None and restarted.outbox is not None
        async with restarted.database.transaction() as session:
            await session.execute(delete(restarted.outbox.dead_letter))
        await assert_eventually(lambda: equals(health(port, HEALTH_NAME, "dispatcher"), SERVING))


async def test_the_relay_reads_deletes_and_parks_only_through_the_fast_path(
    tmp_path: Path, nats_url: str
) -> None:
    # The relay is handed a database without any table: had it read, deleted or parked
    # through the general path (its own SQLite connection and lock), the round would fail.
    url = f"sqlite:///{tmp_path / 'dispatcher.db'}"
    upgrade(url, "dispatcher", MIGRATIONS)
    database = Database(url, "dispatcher")
    elsewhere = Database(f"sqlite:///{tmp_path / 'empty.db'}", "dispatcher")
    fast = open_fast_path(database, timedelta(seconds=60), timedelta(seconds=30), False)
    outbox = Outbox(outbox_table, hooks=fast.relay_hooks())
    bus = await producer_bus(nats_url, "dispatcher-test")
    try:
        await bus.ensure_streams()
        async with database.transaction() as session:
            await outbox.add(session, SUBJECT, b"first", "first", HEADERS)
            await outbox.add(session, SUBJECT, b"x" * (2 * MIB), "big", HEADERS)
            await outbox.add(session, SUBJECT, b"last", "last", HEADERS)
        sent = await outbox.relay_once(
            elsewhere, bus.publish_raw, max_payload=lambda: bus.nc.max_payload
        )
        assert sent == 3
        assert await published_ids(nats_url, STREAM) == ["first", "last"]
        async with database.sessions() as session:
            assert (await session.execute(select(outbox.table))).all() == []
            parked = (await session.execute(select(outbox.dead_letter))).all()
        assert [(row.seq, row.message_id) for row in parked] == [(2, "big")]
        assert parked[0].reason.endswith("over the server's max_payload of 1,048,576")
    finally:
        await bus.close()
        await fast.close()
        await database.dispose()
        await elsewhere.dispose()
