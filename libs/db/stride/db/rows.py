"""Batched row writes shared by the services' repositories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncSession

IN_CHUNK = 500
"""Keys per ``IN (...)`` query: well under every driver's bound-parameter limit."""


async def insert_new(
    session: AsyncSession, table: Table, key: str, rows: Sequence[Mapping[str, Any]]
) -> int:
    """Insert, in order, the ``rows`` whose ``key`` column value is not stored yet (nor
    earlier in ``rows``), with one query per :data:`IN_CHUNK` keys for the stored ones and
    one insert for the rest (a statement pair per row costs a round trip each). How many
    rows were inserted."""
    if not rows:
        return 0
    column = table.c[key]
    keys = [row[key] for row in rows]
    present: set[Any] = set()
    for start in range(0, len(keys), IN_CHUNK):
        found = await session.execute(
            select(column).where(column.in_(keys[start : start + IN_CHUNK]))
        )
        present.update(found.scalars())
    fresh = []
    for row in rows:
        if row[key] in present:
            continue
        present.add(row[key])
        fresh.append(dict(row))
    if fresh:
        await session.execute(table.insert(), fresh)
    return len(fresh)
