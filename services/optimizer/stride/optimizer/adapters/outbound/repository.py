"""The optimizer's storage: administrators, events and plans, with SQLAlchemy Core.

Events and plans are stored as their protobuf bytes (what the API returns), beside the
columns that are queried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession

from stride.db.rows import insert_new, rows_in
from stride.events.v1 import optimization_pb2, plan_pb2
from stride.optimizer.db.tables import (
    administrators,
    claims,
    observations,
    optimization_events,
    plans,
    shares,
)
from stride.optimizer.domain.administrator import Administrator, JobStage
from stride.optimizer.domain.observations import Observations, from_json, to_json


async def get_administrator(
    session: AsyncSession, job_id: str, for_update: bool = False
) -> Administrator | None:
    """The job's administrator, or None if the job is unknown."""
    query = select(administrators.c.stage, administrators.c.plan_version).where(
        administrators.c.job_id == job_id
    )
    if for_update:
        query = query.with_for_update()
    row = (await session.execute(query)).one_or_none()
    if row is None:
        return None
    return Administrator(job_id=job_id, stage=JobStage[row.stage], plan_version=row.plan_version)


@dataclass(frozen=True)
class DecisionInputs:
    """What a job's due decision reads: its administrator, metric view, admitted spec and
    newest plan (each None when missing)."""

    administrator: Administrator | None
    view: Observations | None
    spec: bytes | None
    newest: plan_pb2.ResourcePlan | None


async def decision_inputs(session: AsyncSession, job_id: str) -> DecisionInputs:
    """:class:`DecisionInputs` with one query (the newest plan is the administrator's plan
    version; read apart only if that row is missing)."""
    row = (
        await session.execute(
            select(
                administrators.c.stage,
                administrators.c.plan_version,
                administrators.c.spec,
                observations.c.view,
                plans.c.plan,
            )
            .select_from(
                administrators.outerjoin(
                    observations, observations.c.job_id == administrators.c.job_id
                ).outerjoin(
                    plans,
                    (plans.c.job_id == administrators.c.job_id)
                    & (plans.c.version == administrators.c.plan_version),
                )
            )
            .where(administrators.c.job_id == job_id)
        )
    ).one_or_none()
    if row is None:
        return DecisionInputs(None, None, None, None)
    administrator = Administrator(
        job_id=job_id, stage=JobStage[row.stage], plan_version=row.plan_version
    )
    newest = (
        plan_pb2.ResourcePlan.FromString(row.plan)
        if row.plan is not None
        else await newest_plan(session, job_id)
    )
    view = None if row.view is None else from_json(row.view)
    return DecisionInputs(administrator, view, row.spec, newest)


async def get_administrators(
    session: AsyncSession, job_ids: Sequence[str], for_update: bool = False
) -> dict[str, Administrator]:
    """The administrators of those of ``job_ids`` the optimizer knows (locked in order of
    job id with ``for_update``, so two batches never wait on each other in a cycle)."""
    query = select(
        administrators.c.job_id, administrators.c.stage, administrators.c.plan_version
    ).order_by(administrators.c.job_id)
    if for_update:
        query = query.with_for_update()
    rows = await rows_in(session, query, administrators.c.job_id, sorted(set(job_ids)))
    return {
        row.job_id: Administrator(
            job_id=row.job_id, stage=JobStage[row.stage], plan_version=row.plan_version
        )
        for row in rows
    }


def administrator_row(
    administrator: Administrator, spec: bytes | None, at: datetime
) -> dict[str, Any]:
    """A new administrator's row (with the admitted spec, if known)."""
    return {
        "job_id": administrator.job_id,
        "stage": administrator.stage.name,
        "plan_version": administrator.plan_version,
        "spec": spec,
        "created_at": at,
        "updated_at": at,
    }


async def insert_administrators(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Store new administrators (:func:`administrator_row`) with one statement."""
    if rows:
        await session.execute(administrators.insert(), list(rows))


async def update_administrator(
    session: AsyncSession, administrator: Administrator, at: datetime
) -> None:
    """Store an administrator's new stage and newest plan version."""
    await session.execute(
        update(administrators)
        .where(administrators.c.job_id == administrator.job_id)
        .values(
            stage=administrator.stage.name, plan_version=administrator.plan_version, updated_at=at
        )
    )


async def insert_events(
    session: AsyncSession, events: Sequence[optimization_pb2.OptimizationEvent]
) -> int:
    """Store events in order, with one query for the ids stored before and one insert; an
    id stored before (or twice in ``events``) is skipped. How many were stored."""
    return await insert_new(
        session,
        optimization_events,
        "event_id",
        [
            {
                "event_id": event.event_id,
                "job_id": event.job_id,
                "root_cause": optimization_pb2.RootCause.Name(event.root_cause),
                "event": event.SerializeToString(),
                "created_at": event.created_at.ToDatetime(tzinfo=UTC),
            }
            for event in events
        ],
    )


def plan_row(plan: plan_pb2.ResourcePlan, explanation: str | None = None) -> dict[str, Any]:
    """A plan version's row, with why it was chosen (JSON), for :func:`insert_plans`."""
    return {
        "job_id": plan.job_id,
        "version": plan.version,
        "algorithm": plan.algorithm,
        "plan": plan.SerializeToString(),
        "created_at": plan.created_at.ToDatetime(tzinfo=UTC),
        "explanation": explanation,
    }


async def insert_plans(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Store plan versions (:func:`plan_row`) with one statement (the primary key refuses
    a version stored twice)."""
    if rows:
        await session.execute(plans.insert(), list(rows))


async def list_explanations(
    session: AsyncSession, job_id: str
) -> list[tuple[plan_pb2.ResourcePlan, str | None]]:
    """Every plan version of the job with its explanation (JSON or None), oldest first."""
    rows = await session.execute(
        select(plans.c.plan, plans.c.explanation)
        .where(plans.c.job_id == job_id)
        .order_by(plans.c.version)
    )
    return [(plan_pb2.ResourcePlan.FromString(row.plan), row.explanation) for row in rows]


async def get_observations(
    session: AsyncSession, job_id: str, for_update: bool = False
) -> Observations | None:
    """The job's metric view, or None before its first plan."""
    query = select(observations.c.view).where(observations.c.job_id == job_id)
    if for_update:
        query = query.with_for_update()
    text = await session.scalar(query)
    return None if text is None else from_json(text)


def observations_row(
    job_id: str, view: Observations, at: datetime, held: tuple[float, float] | None = None
) -> dict[str, Any]:
    """The job's metric view as stored, with ``held`` the cores and GiB its current plan
    holds (a new row without ``held`` holds nothing)."""
    values: dict[str, Any] = {
        "job_id": job_id,
        "view": to_json(view),
        "updated_at": at,
        "pending": view.pending,
        "tuning_due": view.feeding.due,
        "elastic": view.feeding.elastic,
    }
    if held is not None:
        values["held_cpu"], values["held_memory_gib"] = held
    return values


async def insert_observations(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Store jobs' first metric views (:func:`observations_row`) with one statement; a row
    without ``held`` holds nothing."""
    if rows:
        empty = {"held_cpu": 0.0, "held_memory_gib": 0.0}
        await session.execute(observations.insert(), [{**empty, **row} for row in rows])


async def put_observations(
    session: AsyncSession,
    job_id: str,
    view: Observations,
    at: datetime,
    new: bool,
    held: tuple[float, float] | None = None,
) -> None:
    """Store the job's metric view (``new``: its first), and with ``held`` the cores and
    GiB its current plan holds."""
    values = observations_row(job_id, view, at, held)
    if new:
        await session.execute(observations.insert().values(**values))
    else:
        del values["job_id"]
        await session.execute(
            update(observations).where(observations.c.job_id == job_id).values(**values)
        )


async def get_observations_many(
    session: AsyncSession, job_ids: Sequence[str], for_update: bool = False
) -> dict[str, Observations]:
    """The metric views of those of ``job_ids`` that have one, with one query (locked in
    order of job id with ``for_update``)."""
    query = select(observations.c.job_id, observations.c.view).order_by(observations.c.job_id)
    if for_update:
        query = query.with_for_update()
    rows = await rows_in(session, query, observations.c.job_id, sorted(set(job_ids)))
    return {row.job_id: from_json(row.view) for row in rows}


_PUT_VIEW = (
    update(observations)
    .where(observations.c.job_id == bindparam("b_job_id"))
    .values(
        view=bindparam("b_view"),
        updated_at=bindparam("b_at", type_=observations.c.updated_at.type),
        pending=bindparam("b_pending"),
        tuning_due=bindparam("b_tuning_due"),
        elastic=bindparam("b_elastic"),
    )
)


async def put_observations_many(
    session: AsyncSession, views: Mapping[str, Observations], at: datetime
) -> None:
    """Store the metric views of jobs that have one, with one statement."""
    if views:
        await session.execute(
            _PUT_VIEW,
            [
                {
                    "b_job_id": job_id,
                    "b_view": to_json(view),
                    "b_at": at,
                    "b_pending": view.pending,
                    "b_tuning_due": view.feeding.due,
                    "b_elastic": view.feeding.elastic,
                }
                for job_id, view in views.items()
            ],
        )


async def jobs_with_due_decisions(session: AsyncSession) -> list[str]:
    """Jobs whose view has a window waiting for its decision, or a tuning step due."""
    rows = await session.scalars(
        select(observations.c.job_id)
        .where((observations.c.pending >= 0) | observations.c.tuning_due)
        .order_by("job_id")
    )
    return list(rows)


@dataclass(frozen=True)
class ElasticRow:
    """A running job whose data workers the cluster level divides CPUs to."""

    job_id: str
    view: Observations
    spec: bytes | None
    newest: plan_pb2.ResourcePlan


async def elastic_jobs(session: AsyncSession) -> list[ElasticRow]:
    """Every running job whose view is elastic, with its spec and newest plan, by job id."""
    rows = await session.execute(
        select(administrators.c.job_id, administrators.c.spec, observations.c.view, plans.c.plan)
        .select_from(
            administrators.join(
                observations, observations.c.job_id == administrators.c.job_id
            ).join(
                plans,
                (plans.c.job_id == administrators.c.job_id)
                & (plans.c.version == administrators.c.plan_version),
            )
        )
        .where(observations.c.elastic & (administrators.c.stage != JobStage.FINISHED.name))
        .order_by(administrators.c.job_id)
    )
    return [
        ElasticRow(
            row.job_id, from_json(row.view), row.spec, plan_pb2.ResourcePlan.FromString(row.plan)
        )
        for row in rows
    ]


async def get_spec(session: AsyncSession, job_id: str) -> bytes | None:
    """The admitted spec (JobSpec bytes) of the job, or None."""
    payload: bytes | None = await session.scalar(
        select(administrators.c.spec).where(administrators.c.job_id == job_id)
    )
    return payload


async def newest_plan(session: AsyncSession, job_id: str) -> plan_pb2.ResourcePlan | None:
    """The job's highest plan version, or None."""
    payload = await session.scalar(
        select(plans.c.plan)
        .where(plans.c.job_id == job_id)
        .order_by(plans.c.version.desc())
        .limit(1)
    )
    return None if payload is None else plan_pb2.ResourcePlan.FromString(payload)


async def list_plans(session: AsyncSession, job_id: str) -> list[plan_pb2.ResourcePlan]:
    """Every plan version of the job, oldest first."""
    rows = await session.scalars(
        select(plans.c.plan).where(plans.c.job_id == job_id).order_by(plans.c.version)
    )
    return [plan_pb2.ResourcePlan.FromString(payload) for payload in rows]


async def list_events(
    session: AsyncSession, job_id: str
) -> list[optimization_pb2.OptimizationEvent]:
    """The job's optimization events, oldest first."""
    rows = await session.scalars(
        select(optimization_events.c.event)
        .where(optimization_events.c.job_id == job_id)
        .order_by(optimization_events.c.seq)
    )
    return [optimization_pb2.OptimizationEvent.FromString(payload) for payload in rows]


async def has_event(session: AsyncSession, event_id: str) -> bool:
    """Whether an optimization event with this id was recorded."""
    found = await session.scalar(
        select(optimization_events.c.event_id).where(optimization_events.c.event_id == event_id)
    )
    return found is not None


async def lock_capacity(session: AsyncSession) -> None:
    """Serialize the transactions that may take cluster capacity, until this one ends.

    On PostgreSQL a transaction-scoped advisory lock (two jobs' plans checked at once would
    each see the other's room as free); on SQLite every write transaction already runs
    alone (``BEGIN IMMEDIATE``, see ``stride.db.engine``)."""
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": CAPACITY_LOCK})


CAPACITY_LOCK = 0x5354524944450001
"""The advisory lock key of the optimizer's capacity check ("STRIDE" and 1)."""


def _reserved(held: Any, minimum: Any) -> Any:
    """The larger of a job's held resource and its share's reservation (none: held)."""
    floor = func.coalesce(minimum, 0.0)
    return case((floor > held, floor), else_=held)


async def held_capacity(session: AsyncSession, job_id: str) -> tuple[float, float, float, float]:
    """Cores and GiB held by every running job (its current plan, or the reservation its
    share keeps for its guarantee if that is larger), and by ``job_id``."""
    running = administrators.c.stage != JobStage.FINISHED.name
    cpu = _reserved(observations.c.held_cpu, shares.c.minimum_cpu)
    memory = _reserved(observations.c.held_memory_gib, shares.c.minimum_memory_gib)
    joined = observations.join(administrators).outerjoin(
        shares, shares.c.job_id == observations.c.job_id
    )
    query = (
        select(func.coalesce(func.sum(cpu), 0.0), func.coalesce(func.sum(memory), 0.0))
        .select_from(joined)
        .where(running)
    )
    total = (await session.execute(query)).one()
    own = (
        await session.execute(
            select(cpu.label("cpu"), memory.label("memory"))
            .select_from(observations.outerjoin(shares, shares.c.job_id == observations.c.job_id))
            .where(observations.c.job_id == job_id)
        )
    ).one_or_none()
    own_cpu, own_memory = (own.cpu, own.memory) if own is not None else (0.0, 0.0)
    return float(total[0]), float(total[1]), float(own_cpu), float(own_memory)


# --- Claims and shares -------------------------------------------------------------------


async def put_claim(
    session: AsyncSession, job_id: str, plan_version: int, claim: str, at: datetime
) -> None:
    """Store (or replace) the job's open claim, made against its plan ``plan_version``."""
    await session.execute(delete(claims).where(claims.c.job_id == job_id))
    await session.execute(
        insert(claims).values(job_id=job_id, plan_version=plan_version, claim=claim, created_at=at)
    )


async def delete_claims(session: AsyncSession, job_ids: list[str]) -> None:
    """Close the claims of ``job_ids`` (granted, replaced by a decision, or void)."""
    if job_ids:
        await session.execute(delete(claims).where(claims.c.job_id.in_(job_ids)))


async def current_claim(session: AsyncSession, job_id: str) -> str | None:
    """The job's open claim (JSON) if it is current (:func:`open_claims`), else None."""
    claim: str | None = await session.scalar(
        select(claims.c.claim)
        .select_from(claims.join(administrators))
        .where(
            claims.c.job_id == job_id,
            claims.c.plan_version == administrators.c.plan_version,
            administrators.c.stage != JobStage.FINISHED.name,
        )
    )
    return claim


async def open_claims(session: AsyncSession) -> list[tuple[str, int, str, bool]]:
    """Every open claim: (job, plan version it was made against, claim JSON, whether it is
    still current: the job runs that plan version and has not finished)."""
    current = (claims.c.plan_version == administrators.c.plan_version) & (
        administrators.c.stage != JobStage.FINISHED.name
    )
    rows = await session.execute(
        select(claims.c.job_id, claims.c.plan_version, claims.c.claim, current.label("current"))
        .select_from(claims.join(administrators))
        .order_by(claims.c.job_id)
    )
    return [(r.job_id, r.plan_version, r.claim, bool(r.current)) for r in rows]


async def get_share(session: AsyncSession, job_id: str) -> dict[str, Any] | None:
    """The job's newest share as stored (version, cpu, memory_gib, minimums, ...)."""
    return (await get_shares(session, [job_id])).get(job_id)


async def get_shares(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The newest shares stored of those of ``job_ids`` that have one (:func:`get_share`)."""
    rows = await rows_in(session, select(shares), shares.c.job_id, sorted(set(job_ids)))
    return {row.job_id: dict(row._mapping) for row in rows}


async def put_share(session: AsyncSession, values: dict[str, Any]) -> bool:
    """Store a share if it is newer than the job's stored one; False if it is not."""
    stored = await session.scalar(
        select(shares.c.version).where(shares.c.job_id == values["job_id"]).with_for_update()
    )
    if stored is not None and stored >= values["version"]:
        return False
    if stored is None:
        await session.execute(insert(shares).values(**values))
    else:
        await session.execute(
            update(shares).where(shares.c.job_id == values["job_id"]).values(**values)
        )
    return True
