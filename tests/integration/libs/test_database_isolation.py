"""A read-modify-write in ``Database.transaction`` never loses a concurrent one's write.

Use cases read a row "for update", change it and write it back (the optimizer's metric view,
the administrators). On PostgreSQL the row lock serializes them; SQLite has no FOR UPDATE,
and its driver used to begin the transaction only at the first write, so the reads ran
outside it and interleaved writers lost updates (20 concurrent increments ended at 1).
"""

from __future__ import annotations

import asyncio

from sqlalchemy import Column, Integer, MetaData, Table, select, text, update

from stride.db.engine import Database

metadata = MetaData()
counters = Table(
    "counters", metadata, Column("id", Integer, primary_key=True), Column("n", Integer)
)


async def _database(database_url: str) -> Database:
    database = Database(database_url, "isolationtest")
    async with database.engine.begin() as connection:
        if database.schema is not None:
            await connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{database.schema}"'))
        await connection.run_sync(metadata.drop_all)
        await connection.run_sync(metadata.create_all)
    async with database.transaction() as session:
        await session.execute(counters.insert().values(id=1, n=0))
    return database


async def test_concurrent_read_modify_writes_are_serialized(database_url: str) -> None:
    database = await _database(database_url)
    try:

        async def increment() -> None:
            async with database.transaction() as session:
                query = select(counters.c.n).where(counters.c.id == 1).with_for_update()
                n = (await session.execute(query)).scalar_one()
                await asyncio.sleep(0.005)  # another writer would interleave here
                await session.execute(update(counters).where(counters.c.id == 1).values(n=n + 1))

        await asyncio.gather(*(increment() for _ in range(20)))
        async with database.sessions() as session:
            assert await session.scalar(select(counters.c.n)) == 20
    finally:
        await database.dispose()


async def test_a_reader_beside_a_writer_sees_the_committed_value(database_url: str) -> None:
    database = await _database(database_url)
    try:
        writing = asyncio.Event()
        release = asyncio.Event()

        async def writer() -> None:
            async with database.transaction() as session:
                await session.execute(update(counters).where(counters.c.id == 1).values(n=7))
                writing.set()
                await release.wait()

        task = asyncio.create_task(writer())
        await writing.wait()
        async with database.sessions() as session:
            # Not blocked by the open write, and not seeing it: the last committed value.
            assert await session.scalar(select(counters.c.n)) == 0
        release.set()
        await task
        async with database.sessions() as session:
            assert await session.scalar(select(counters.c.n)) == 7
    finally:
        await database.dispose()
