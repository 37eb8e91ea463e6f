"""The outbox relay publishes in order, deletes a whole batch at once, and keeps what failed."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from sqlalchemy import MetaData, func, select, text

from stride.db.engine import Database
from stride.db.outbox import Outbox, outbox_table
from stride.testing.eventually import assert_eventually


async def _outbox(database_url: str) -> tuple[Database, Outbox]:
    database = Database(database_url, "outboxtest")
    metadata = MetaData()
    outbox = Outbox(outbox_table(metadata))
    async with database.engine.begin() as connection:
        if database.schema is not None:
            await connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{database.schema}"'))
        await connection.run_sync(metadata.create_all)
    return database, outbox


async def test_a_failed_publish_keeps_the_rest_in_order_and_drops_what_went_out(
    database_url: str,
) -> None:
    database, outbox = await _outbox(database_url)
    try:
        async with database.transaction() as session:
            for index in range(5):
                await outbox.add(session, f"s.{index}", b"x", f"id-{index}", {"k": "v"})
        sent: list[str] = []

        async def flaky(subject: str, payload: bytes, msg_id: str, h: Mapping[str, str]) -> None:
            if msg_id == "id-3":
                raise ConnectionError("NATS went away")
            sent.append(msg_id)

        with pytest.raises(ConnectionError):
            await outbox.relay_once(database, flaky)
        # Publishes of a chunk are in flight together, so id-4 went out too; only the
        # acknowledged prefix is deleted, and id-4 goes again (JetStream drops the copy).
        assert sent == ["id-0", "id-1", "id-2", "id-4"]
        async with database.sessions() as session:
            left = (await session.execute(select(outbox.table.c.message_id))).scalars().all()
        assert sorted(left) == ["id-3", "id-4"]

        async def working(subject: str, payload: bytes, msg_id: str, h: Mapping[str, str]) -> None:
            sent.append(msg_id)

        assert await outbox.relay_once(database, working) == 2
        assert sent[4:] == ["id-3", "id-4"]  # in order
        async with database.sessions() as session:
            assert await session.scalar(select(func.count()).select_from(outbox.table)) == 0
    finally:
        await database.dispose()


async def test_a_commit_notified_during_a_round_is_relayed_without_waiting_for_the_poll(
    database_url: str,
) -> None:
    database, outbox = await _outbox(database_url)
    stop = asyncio.Event()
    sent: list[str] = []
    try:
        async with database.transaction() as session:
            await outbox.add(session, "s.first", b"x", "first", {})

        async def publish(subject: str, payload: bytes, msg_id: str, h: Mapping[str, str]) -> None:
            sent.append(msg_id)
            if msg_id == "first":
                # Another use case commits and notifies while this round is publishing.
                async with database.transaction() as session:
                    await outbox.add(session, "s.second", b"x", "second", {})
                outbox.notify()

        relay = asyncio.create_task(outbox.run_relay(database, publish, stop, poll_seconds=60))
        await assert_eventually(lambda: sent == ["first", "second"], timeout=5)
    finally:
        stop.set()
        await relay
        await database.dispose()
