"""Podwatcher's storage: accepted plans and their state, jobs and pods, with SQLAlchemy Core."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from stride.events.v1 import job_pb2, plan_pb2
from stride.podwatcher.db.tables import jobs, plans, pods
from stride.podwatcher.domain.cluster import PlanState, PodPhase
from stride.podwatcher.domain.reconcile import PodRecord
from stride.vocabulary import Role


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


async def newest_versions(session: AsyncSession, job_ids: Iterable[str]) -> dict[str, int]:
    """The highest plan version recorded for each of ``job_ids`` that has a plan, in one
    statement."""
    rows = await session.execute(
        select(plans.c.job_id, func.max(plans.c.version))
        .where(plans.c.job_id.in_(sorted(set(job_ids))))
        .group_by(plans.c.job_id)
    )
    return {job_id: int(version) for job_id, version in rows}


async def insert_plans(
    session: AsyncSession,
    accepted: Sequence[tuple[plan_pb2.ResourcePlan, PlanState, str]],
    now: datetime,
) -> None:
    """Store accepted plans (each with its state and message), in one statement."""
    if not accepted:
        return
    await session.execute(
        plans.insert(),
        [
            {
                "job_id": plan.job_id,
                "version": plan.version,
                "plan": plan.SerializeToString(),
                "state": state.value,
                "message": message,
                "recorded_at": now,
                "updated_at": now,
            }
            for plan, state, message in accepted
        ],
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


# --- jobs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredJob:
    """A job the podwatcher runs pods for."""

    job_id: str
    spec: job_pb2.JobSpec
    state: str
    message: str
    reconfigure_version: int = 0
    reconfigure_since: datetime | None = None


async def insert_jobs(
    session: AsyncSession, admitted: Sequence[tuple[str, job_pb2.JobSpec]], now: datetime
) -> set[str]:
    """Store admitted jobs (id and spec) that are not stored yet, in two statements; the
    ids stored now (the others were stored before: a redelivery)."""
    ids = sorted({job_id for job_id, _ in admitted})
    stored = set((await session.scalars(select(jobs.c.job_id).where(jobs.c.job_id.in_(ids)))).all())
    new: dict[str, job_pb2.JobSpec] = {}
    for job_id, spec in admitted:
        if job_id not in stored:
            new.setdefault(job_id, spec)
    if new:
        await session.execute(
            jobs.insert(),
            [
                {
                    "job_id": job_id,
                    "spec": spec.SerializeToString(),
                    "state": "RUNNING",
                    "message": "",
                    "reconfigure_version": 0,
                    "reconfigure_since": None,
                    "created_at": now,
                    "updated_at": now,
                }
                for job_id, spec in new.items()
            ],
        )
    return set(new)


async def get_job(
    session: AsyncSession, job_id: str, *, for_update: bool = False
) -> StoredJob | None:
    """One job, or None."""
    query = select(jobs).where(jobs.c.job_id == job_id)
    if for_update:
        query = query.with_for_update()
    row = (await session.execute(query)).one_or_none()
    return None if row is None else _stored_job(row)


async def get_jobs(session: AsyncSession, job_ids: Iterable[str]) -> dict[str, StoredJob]:
    """The stored ones of ``job_ids``, by id, in one statement."""
    rows = await session.execute(select(jobs).where(jobs.c.job_id.in_(sorted(set(job_ids)))))
    return {row.job_id: _stored_job(row) for row in rows}


def _stored_job(row: Any) -> StoredJob:
    return StoredJob(
        row.job_id,
        job_pb2.JobSpec.FromString(row.spec),
        row.state,
        row.message,
        row.reconfigure_version,
        None if row.reconfigure_since is None else _aware(row.reconfigure_since),
    )


async def set_reconfigure(
    session: AsyncSession, job_id: str, version: int, since: datetime | None, now: datetime
) -> None:
    """Record the plan version whose cluster the chief must confirm (0: none pending)."""
    await session.execute(
        update(jobs)
        .where(jobs.c.job_id == job_id)
        .values(reconfigure_version=version, reconfigure_since=since, updated_at=now)
    )


async def pending_reconfigures(session: AsyncSession) -> list[StoredJob]:
    """Running jobs waiting for their chief to confirm a new cluster."""
    rows = await session.execute(
        select(jobs.c.job_id).where(jobs.c.state == "RUNNING", jobs.c.reconfigure_version > 0)
    )
    found = [await get_job(session, row.job_id) for row in rows]
    return [job for job in found if job is not None]


async def running_jobs(session: AsyncSession) -> list[str]:
    """The ids of the jobs still running."""
    rows = await session.execute(select(jobs.c.job_id).where(jobs.c.state == "RUNNING"))
    return [row.job_id for row in rows]


async def set_job_state(
    session: AsyncSession, job_id: str, state: str, message: str, now: datetime
) -> None:
    """Record that a job ended (or anything else about its state)."""
    await session.execute(
        update(jobs)
        .where(jobs.c.job_id == job_id)
        .values(state=state, message=message[:4000], updated_at=now)
    )


# --- pods -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredPod:
    """A pod row: the domain record plus what the backend needs to run it again."""

    record: PodRecord
    port: int
    agent_port: int
    plan_version: int
    last_failure: str = ""
    last_message: str = ""
    failed_at: datetime | None = None
    retire_after: int | None = None


def _pod(row: Any) -> StoredPod:
    return StoredPod(
        record=PodRecord(
            name=row.name,
            job_id=row.job_id,
            role=Role(row.role),
            index=row.pod_index,
            generation=row.generation,
            cpu=row.cpu,
            memory_bytes=row.memory_bytes,
            node=row.node,
            phase=PodPhase(row.phase),
            restarts=row.restarts,
        ),
        port=row.port,
        agent_port=row.agent_port,
        plan_version=row.plan_version,
        last_failure=row.last_failure,
        last_message=row.last_message,
        failed_at=None if row.failed_at is None else _aware(row.failed_at),
        retire_after=row.retire_after,
    )


async def job_pods(session: AsyncSession, job_id: str) -> list[StoredPod]:
    """Every pod row of a job (any phase), by role, index and generation."""
    rows = await session.execute(
        select(pods)
        .where(pods.c.job_id == job_id)
        .order_by(pods.c.role, pods.c.pod_index, pods.c.generation)
    )
    return [_pod(row) for row in rows]


async def live_pods(session: AsyncSession) -> list[StoredPod]:
    """Every pod holding resources, of every job."""
    rows = await session.execute(
        select(pods).where(pods.c.phase.in_(("PENDING", "RUNNING", "FAILED")))
    )
    return [_pod(row) for row in rows]


async def get_pod(session: AsyncSession, name: str) -> StoredPod | None:
    """One pod row, or None."""
    row = (await session.execute(select(pods).where(pods.c.name == name))).one_or_none()
    return None if row is None else _pod(row)


async def upsert_pod(session: AsyncSession, pod: StoredPod, now: datetime) -> None:
    """Insert or replace a pod's row."""
    record = pod.record
    values = {
        "job_id": record.job_id,
        "role": record.role.value,
        "pod_index": record.index,
        "generation": record.generation,
        "cpu": record.cpu,
        "memory_bytes": record.memory_bytes,
        "node": record.node,
        "port": pod.port,
        "agent_port": pod.agent_port,
        "plan_version": pod.plan_version,
        "phase": record.phase.value,
        "restarts": record.restarts,
        "last_failure": pod.last_failure,
        "last_message": pod.last_message[:4000],
        "failed_at": pod.failed_at,
        "retire_after": pod.retire_after,
        "updated_at": now,
    }
    exists = await session.scalar(select(pods.c.name).where(pods.c.name == record.name))
    if exists is None:
        await session.execute(pods.insert().values(name=record.name, **values))
    else:
        await session.execute(update(pods).where(pods.c.name == record.name).values(**values))
