"""Podwatcher's storage: accepted plans and their state, with SQLAlchemy Core."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from stride.events.v1 import plan_pb2
from stride.podwatcher.db.tables import plans
from stride.podwatcher.domain.cluster import PlanState


@dataclass(frozen=True)
class StoredPlan:
    """An accepted plan and how far applying it has got."""

    plan: plan_pb2.ResourcePlan
    state: PlanState
    message: str
    recorded_at: datetime


def _aware(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes; everything stored is UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def newest_version(session: AsyncSession, job_id: str) -> int | None:
    """The highest plan version recorded for the job, or None."""
    value = await session.scalar(select(func.max(plans.c.version)).where(plans.c.job_id == job_id))
    return None if value is None else int(value)


async def insert_plan(
    session: AsyncSession, plan: plan_pb2.ResourcePlan, state: PlanState, now: datetime
) -> None:
    """Store an accepted plan."""
    await session.execute(
        plans.insert().values(
            job_id=plan.job_id,
            version=plan.version,
            plan=plan.SerializeToString(),
            state=state.value,
            message="",
            recorded_at=now,
            updated_at=now,
        )
    )


async def set_state(
    session: AsyncSession, job_id: str, version: int, state: PlanState, message: str, now: datetime
) -> None:
    """Record how far applying a plan has got."""
    await session.execute(
        update(plans)
        .where(plans.c.job_id == job_id, plans.c.version == version)
        .values(state=state.value, message=message, updated_at=now)
    )


async def newest_plan(session: AsyncSession, job_id: str) -> StoredPlan | None:
    """The job's newest accepted plan, or None."""
    row = (
        await session.execute(
            select(plans.c.plan, plans.c.state, plans.c.message, plans.c.recorded_at)
            .where(plans.c.job_id == job_id)
            .order_by(plans.c.version.desc())
            .limit(1)
        )
    ).one_or_none()
    if row is None:
        return None
    return StoredPlan(
        plan=plan_pb2.ResourcePlan.FromString(row.plan),
        state=PlanState(row.state),
        message=row.message,
        recorded_at=_aware(row.recorded_at),
    )
