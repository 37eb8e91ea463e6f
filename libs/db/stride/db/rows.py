"""Batched row writes shared by the services' repositories."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, Select, Table, select
from sqlalchemy.ext.asyncio import AsyncSession

IN_CHUNK = 500
"""Keys per ``IN (...)`` query: well under every driver's bound-parameter limit."""


async def rows_in(
    session: AsyncSession, query: Select[Any], column: ColumnElement[Any], keys: Sequence[Any]
) -> list[Row[Any]]:
    """The rows of ``query`` whose ``column`` is one of ``keys``, with one query per
    :data:`IN_CHUNK` keys (in the order given: sort them first where the query locks)."""
    found: list[Row[Any]] = []
    for start in range(0, len(keys), IN_CHUNK):
        found += (
            await session.execute(query.where(column.in_(keys[start : start + IN_CHUNK])))
        ).all()
    return found


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
    stored = await rows_in(session, select(column), column, [row[key] for row in rows])
    present: set[Any] = {found[0] for found in stored}
    fresh = []
    for row in rows:
        if row[key] in present:
            continue
        present.add(row[key])
        fresh.append(dict(row))
    if fresh:
        await session.execute(table.insert(), fresh)
    return len(fresh)
