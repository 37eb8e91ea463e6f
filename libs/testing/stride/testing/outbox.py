"""What outbox tests share: writing events into a service's outbox, reading what is left
and what was parked, and the stream's message ids."""

from __future__ import annotations

from collections.abc import Mapping

import nats
from sqlalchemy import select

from stride.bus.client import MSG_ID_HEADER
from stride.bus.signing import logical_message_id
from stride.db.engine import Database
from stride.db.outbox import Outbox


class OutboxHarness:
    """Set ``database`` and ``outbox`` when the service under test is built; then ``add``
    events to ``subject`` and look at the outbox and dead-letter tables."""

    def __init__(self, subject: str, headers: Mapping[str, str]) -> None:
        self.subject = subject
        self.headers = dict(headers)
        self.database: Database | None = None
        self.outbox: Outbox | None = None

    async def add(self, *events: tuple[str, bytes]) -> None:
        """Queue (message id, payload) events in one transaction and wake the relay."""
        assert self.outbox is not None and self.database is not None
        async with self.database.transaction() as session:
            for message_id, payload in events:
                await self.outbox.add(session, self.subject, payload, message_id, self.headers)
        self.outbox.notify()

    async def left(self) -> list[str]:
        """Message ids still in the outbox, in order."""
        assert self.outbox is not None and self.database is not None
        async with self.database.sessions() as session:
            query = select(self.outbox.table.c.message_id).order_by(self.outbox.table.c.seq)
            return list((await session.execute(query)).scalars())

    async def parked(self) -> list[dict[str, object]]:
        """The dead-letter rows."""
        assert self.outbox is not None and self.database is not None
        async with self.database.sessions() as session:
            query = select(self.outbox.dead_letter).order_by(self.outbox.dead_letter.c.id)
            return [dict(row._mapping) for row in await session.execute(query)]


async def published_ids(url: str, stream: str) -> list[str]:
    """The logical ``Nats-Msg-Id`` of every message in ``stream``, in stream order."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        if not info.state.messages:
            return []
        ids = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            message = await js.get_msg(stream, seq)
            ids.append(logical_message_id((message.headers or {}).get(MSG_ID_HEADER, "")))
        return ids
    finally:
        await nc.close()
