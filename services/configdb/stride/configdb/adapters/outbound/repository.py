"""Configdb's storage: job records, plan versions and runtime-profile measurements, read and
written with SQLAlchemy Core.

Every writer first makes sure its jobs' rows exist and locks them (:func:`ensure_records`,
``INSERT ... ON CONFLICT DO NOTHING`` for the missing ones). The three consumers
(submitted, plans, finished) run concurrently and may all be first to hear of a job; this
way none of them fails on a duplicate key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Table,
    bindparam,
    distinct,
    func,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from stride.configdb.db.tables import job_records, plans, step_windows, usage_samples
from stride.configdb.domain.features import JobFeatures
from stride.configdb.domain.profiles import (
    RoleUsage,
    RuntimeProfile,
    StepWindow,
    UsageSample,
    WindowTotals,
    build_profiles,
)
from stride.configdb.domain.similarity import Outcome, PastJob
from stride.events.v1 import job_pb2, plan_pb2
from stride.vocabulary import Role


@dataclass(frozen=True)
class StoredRecord:
    """A job record with its plans in version order; ``spec`` is None for a placeholder."""

    job_id: str
    spec: job_pb2.JobSpec | None
    plans: list[plan_pb2.ResourcePlan]
    outcome: Outcome | None
    recorded_at: datetime
    finished_at: datetime | None
    profiles: list[RuntimeProfile] = field(default_factory=list)


def aware(moment: datetime) -> datetime:
    """``moment`` as an aware UTC datetime (SQLite hands back naive ones)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _dialect_insert(session: AsyncSession, table: Table) -> Any:
    dialect = session.get_bind().dialect.name
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


@dataclass(frozen=True)
class HeldRecord:
    """What a batch of events needs to know of a job's row (:func:`ensure_records`)."""

    created: bool
    """The row was made now, as a placeholder."""
    ended: bool
    """Its outcome is recorded."""
    spec: bytes | None
    """Its spec (serialized), None for a placeholder."""


async def ensure_records(
    session: AsyncSession, job_ids: Sequence[str], now: datetime
) -> dict[str, HeldRecord]:
    """Make sure each job has a row (a placeholder if new) and lock it, in two statements
    (three if another writer made one of the rows meanwhile); what each row holds.

    The rows that exist are locked first, in order of job id, then the missing ones are
    inserted, in order of job id (an insert locks its row). Two batches over the same jobs
    then never wait for each other in a cycle: one waits at an insert only for a row the
    other inserted, after its own locks on rows that existed, and both insert in the same
    order. Nothing is written to a row that exists."""
    ids = sorted(set(job_ids))
    held = await _lock_records(session, ids)
    missing = [job_id for job_id in ids if job_id not in held]
    if missing:
        inserted = await session.execute(
            _dialect_insert(session, job_records)
            .on_conflict_do_nothing(index_elements=["job_id"])
            .returning(job_records.c.job_id),
            [
                {"job_id": job_id, "plan_count": 0, "recorded_at": now, "updated_at": now}
                for job_id in missing
            ],
        )
        for job_id in inserted.scalars():
            held[job_id] = HeldRecord(created=True, ended=False, spec=None)
        raced = [job_id for job_id in missing if job_id not in held]
        if raced:  # made by another writer since the first statement: locked now
            held |= await _lock_records(session, raced)
    return held


async def _lock_records(session: AsyncSession, ids: Sequence[str]) -> dict[str, HeldRecord]:
    rows = await session.execute(
        select(job_records.c.job_id, job_records.c.outcome, job_records.c.spec)
        .where(job_records.c.job_id.in_(ids))
        .order_by(job_records.c.job_id)
        .with_for_update()
    )
    return {row.job_id: HeldRecord(False, row.outcome is not None, row.spec) for row in rows}


@dataclass(frozen=True)
class Completion:
    """The spec and features that complete a placeholder record (:func:`complete_records`)."""

    job_id: str
    spec: job_pb2.JobSpec
    features: JobFeatures
    recorded_at: datetime | None


_COMPLETE = (
    update(job_records)
    .where(job_records.c.job_id == bindparam("b_job_id"))
    .values(
        updated_at=bindparam("b_now", type_=job_records.c.updated_at.type),
        recorded_at=func.coalesce(
            bindparam("b_recorded_at", type_=job_records.c.recorded_at.type),
            job_records.c.recorded_at,
        ),
        spec=bindparam("b_spec"),
        simulated=bindparam("b_simulated"),
        user=bindparam("b_user"),
        model_name=bindparam("b_model_name"),
        model_family=bindparam("b_model_family"),
        dataset_name=bindparam("b_dataset_name"),
        dataset_format=bindparam("b_dataset_format"),
        record_count=bindparam("b_record_count"),
        batch_size=bindparam("b_batch_size"),
        embedding_dim=bindparam("b_embedding_dim"),
        parameter_count=bindparam("b_parameter_count"),
    )
)


async def complete_records(
    session: AsyncSession, completions: Sequence[Completion], now: datetime
) -> None:
    """Fill in the spec and features of (placeholder) records, and ``recorded_at`` where
    given, in one statement."""
    if not completions:
        return
    await session.execute(
        _COMPLETE,
        [
            {
                "b_job_id": done.job_id,
                "b_now": now,
                "b_recorded_at": done.recorded_at,
                "b_spec": done.spec.SerializeToString(),
                "b_simulated": done.spec.simulated,
                "b_user": done.spec.user[:128] or None,
                "b_model_name": done.features.model_name,
                "b_model_family": done.features.model_family,
                "b_dataset_name": done.features.dataset_name,
                "b_dataset_format": done.features.dataset_format,
                "b_record_count": done.features.record_count,
                "b_batch_size": done.features.batch_size,
                "b_embedding_dim": done.features.embedding_dim,
                "b_parameter_count": done.features.parameter_count,
            }
            for done in completions
        ],
    )


_COUNT_PLANS = (
    update(job_records)
    .where(job_records.c.job_id == bindparam("b_job_id"))
    .values(
        plan_count=job_records.c.plan_count + bindparam("b_added"),
        updated_at=bindparam("b_now", type_=job_records.c.updated_at.type),
    )
)


async def insert_plans(
    session: AsyncSession, accepted: Sequence[plan_pb2.ResourcePlan], now: datetime
) -> dict[tuple[str, int], plan_pb2.ResourcePlan]:
    """Store plan versions (one plan per job and version) and count them on their records,
    in at most three statements; the plans already held for the versions that were stored
    before, by job and version (the others are stored now)."""
    if not accepted:
        return {}
    inserted = await session.execute(
        _dialect_insert(session, plans)
        .on_conflict_do_nothing(index_elements=["job_id", "version"])
        .returning(plans.c.job_id, plans.c.version),
        [
            {
                "job_id": plan.job_id,
                "version": plan.version,
                "plan": plan.SerializeToString(),
                "recorded_at": now,
            }
            for plan in accepted
        ],
    )
    stored = {(job_id, int(version)) for job_id, version in inserted}
    added: dict[str, int] = {}
    for job_id, _ in stored:
        added[job_id] = added.get(job_id, 0) + 1
    if added:
        await session.execute(
            _COUNT_PLANS,
            [
                {"b_job_id": job_id, "b_added": n, "b_now": now}
                for job_id, n in sorted(added.items())
            ],
        )
    before = [
        (plan.job_id, plan.version)
        for plan in accepted
        if (plan.job_id, plan.version) not in stored
    ]
    if not before:
        return {}
    rows = await session.execute(
        select(plans.c.job_id, plans.c.version, plans.c.plan).where(
            plans.c.job_id.in_(sorted({job_id for job_id, _ in before}))
        )
    )
    wanted = set(before)
    held = {
        (row.job_id, int(row.version)): plan_pb2.ResourcePlan.FromString(row.plan)
        for row in rows
        if (row.job_id, int(row.version)) in wanted
    }
    if len(held) != len(wanted):
        raise RuntimeError(f"plans {sorted(wanted - set(held))} conflicted but are not stored")
    return held


async def stored_outcome(session: AsyncSession, job_id: str) -> Outcome | None:
    """How the job ended, or None while it runs."""
    raw = await session.scalar(select(job_records.c.outcome).where(job_records.c.job_id == job_id))
    return None if raw is None else Outcome(raw)


async def record_outcome(
    session: AsyncSession, job_id: str, outcome: Outcome, finished_at: datetime, now: datetime
) -> None:
    """Store how and when the job ended."""
    await session.execute(
        update(job_records)
        .where(job_records.c.job_id == job_id)
        .values(outcome=outcome.value, finished_at=finished_at, updated_at=now)
    )


async def _plans_of(
    session: AsyncSession, job_ids: Sequence[str]
) -> dict[str, list[plan_pb2.ResourcePlan]]:
    found: dict[str, list[plan_pb2.ResourcePlan]] = {job_id: [] for job_id in job_ids}
    if not job_ids:
        return found
    rows = await session.execute(
        select(plans.c.job_id, plans.c.plan)
        .where(plans.c.job_id.in_(job_ids))
        .order_by(plans.c.job_id, plans.c.version)
    )
    for job_id, raw in rows:
        found[job_id].append(plan_pb2.ResourcePlan.FromString(raw))
    return found


WINDOW_KEYS = ("job_id", "pod_name", "plan_version", "global_step")
SAMPLE_KEYS = ("job_id", "pod_name", "sampled_at")


def _window_row(window: StepWindow, reported_at: datetime) -> dict[str, Any]:
    return {
        "job_id": window.job_id,
        "pod_name": window.pod_name,
        "plan_version": window.plan_version,
        "global_step": window.global_step,
        "steps": window.steps,
        "step_seconds": window.step_seconds,
        "samples_per_second": window.samples_per_second,
        "reported_at": reported_at,
    }


def _sample_row(sample: UsageSample, sampled_at: datetime) -> dict[str, Any]:
    return {
        "job_id": sample.job_id,
        "pod_name": sample.pod_name,
        "sampled_at": sampled_at,
        "plan_version": sample.plan_version,
        "role": sample.role.value,
        "cpu_used": sample.cpu_used,
        "memory_used_bytes": sample.memory_used_bytes,
        "cpu_limit": sample.cpu_limit,
        "memory_limit_bytes": sample.memory_limit_bytes,
    }


async def insert_measurements(
    session: AsyncSession,
    windows: Sequence[tuple[StepWindow, datetime]],
    samples: Sequence[tuple[UsageSample, datetime]],
) -> None:
    """Store step windows and usage samples, each once however often it is delivered: one
    statement per table for the whole batch (a row per statement cost configdb most of its
    CPU under 1,000 agents, ``bench/agents_load.py``)."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    for table, rows, keys in (
        (step_windows, [_window_row(w, at) for w, at in windows], WINDOW_KEYS),
        (usage_samples, [_sample_row(u, at) for u, at in samples], SAMPLE_KEYS),
    ):
        if rows:
            await session.execute(
                insert(table).values(rows).on_conflict_do_nothing(index_elements=list(keys))
            )


async def _profiles_of(
    session: AsyncSession, job_ids: Sequence[str]
) -> dict[str, list[RuntimeProfile]]:
    """Each job's runtime profile, summed up by the database."""
    if not job_ids:
        return {}
    seconds = step_windows.c.steps * step_windows.c.step_seconds
    window_rows = await session.execute(
        select(
            step_windows.c.job_id,
            step_windows.c.plan_version,
            func.count(),
            func.sum(step_windows.c.steps),
            func.sum(seconds),
            func.sum(seconds * step_windows.c.samples_per_second),
        )
        .where(step_windows.c.job_id.in_(job_ids))
        .group_by(step_windows.c.job_id, step_windows.c.plan_version)
    )
    totals: dict[str, list[WindowTotals]] = {}
    for job_id, version, count, steps, total_seconds, samples in window_rows:
        totals.setdefault(job_id, []).append(
            WindowTotals(int(version), int(count), int(steps), float(total_seconds), float(samples))
        )
    usage_rows = await session.execute(
        select(
            usage_samples.c.job_id,
            usage_samples.c.plan_version,
            usage_samples.c.role,
            func.count(distinct(usage_samples.c.pod_name)),
            func.count(),
            func.avg(usage_samples.c.cpu_used),
            func.max(usage_samples.c.cpu_used),
            func.max(usage_samples.c.memory_used_bytes),
            func.max(usage_samples.c.cpu_limit),
            func.max(usage_samples.c.memory_limit_bytes),
        )
        .where(usage_samples.c.job_id.in_(job_ids))
        .group_by(usage_samples.c.job_id, usage_samples.c.plan_version, usage_samples.c.role)
    )
    usage: dict[str, tuple[list[RoleUsage], list[int]]] = {}
    for (
        job_id,
        version,
        role,
        pods,
        count,
        mean,
        peak,
        memory,
        cpu_limit,
        memory_limit,
    ) in usage_rows:
        found, versions = usage.setdefault(job_id, ([], []))
        found.append(
            RoleUsage(
                role=Role(role),
                pods=int(pods),
                samples=int(count),
                cpu_used_mean=float(mean),
                cpu_used_max=float(peak),
                memory_used_max_bytes=int(memory),
                cpu_limit=float(cpu_limit),
                memory_limit_bytes=int(memory_limit),
            )
        )
        versions.append(int(version))
    return {
        job_id: build_profiles(totals.get(job_id, []), *usage.get(job_id, ([], [])))
        for job_id in job_ids
    }


async def profiles_of(session: AsyncSession, job_id: str) -> list[RuntimeProfile]:
    """One job's runtime profile, oldest plan version first (empty if nothing measured)."""
    return (await _profiles_of(session, [job_id])).get(job_id, [])


async def _records(session: AsyncSession, query: Any) -> list[StoredRecord]:
    rows = (await session.execute(query)).all()
    plans_by_job = await _plans_of(session, [row.job_id for row in rows])
    profiles_by_job = await _profiles_of(session, [row.job_id for row in rows])
    return [
        StoredRecord(
            job_id=row.job_id,
            spec=None if row.spec is None else job_pb2.JobSpec.FromString(row.spec),
            plans=plans_by_job[row.job_id],
            outcome=None if row.outcome is None else Outcome(row.outcome),
            recorded_at=aware(row.recorded_at),
            finished_at=None if row.finished_at is None else aware(row.finished_at),
            profiles=profiles_by_job.get(row.job_id, []),
        )
        for row in rows
    ]


_RECORD_COLUMNS = (
    job_records.c.job_id,
    job_records.c.spec,
    job_records.c.outcome,
    job_records.c.recorded_at,
    job_records.c.finished_at,
)


async def get_record(session: AsyncSession, job_id: str) -> StoredRecord | None:
    """One job's record with its plans, or None."""
    found = await _records(session, select(*_RECORD_COLUMNS).where(job_records.c.job_id == job_id))
    return found[0] if found else None


async def get_records(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, StoredRecord]:
    """The records of ``job_ids`` that exist, by job id."""
    if not job_ids:
        return {}
    found = await _records(
        session, select(*_RECORD_COLUMNS).where(job_records.c.job_id.in_(job_ids))
    )
    return {record.job_id: record for record in found}


async def list_records(session: AsyncSession, limit: int) -> list[StoredRecord]:
    """Records newest first (by when the job was submitted, else first heard of)."""
    return await _records(
        session,
        select(*_RECORD_COLUMNS)
        .order_by(job_records.c.recorded_at.desc(), job_records.c.job_id)
        .limit(limit),
    )


async def warm_start_history(session: AsyncSession, limit: int) -> list[PastJob]:
    """The ``limit`` most recently finished jobs that can be warm-start candidates.

    The query narrows to succeeded jobs with a spec and a plan; the domain's
    :func:`~stride.configdb.domain.similarity.is_warm_start_candidate` states the rule.
    """
    rows = await session.execute(
        select(
            job_records.c.job_id,
            job_records.c.model_name,
            job_records.c.model_family,
            job_records.c.dataset_name,
            job_records.c.dataset_format,
            job_records.c.record_count,
            job_records.c.batch_size,
            job_records.c.embedding_dim,
            job_records.c.parameter_count,
            job_records.c.outcome,
            job_records.c.finished_at,
            job_records.c.plan_count,
        )
        .where(
            job_records.c.outcome == Outcome.SUCCEEDED.value,
            job_records.c.spec.is_not(None),
            job_records.c.plan_count > 0,
            job_records.c.simulated.is_(False),
        )
        .order_by(job_records.c.finished_at.desc(), job_records.c.job_id)
        .limit(limit)
    )
    return [
        PastJob(
            job_id=row.job_id,
            features=JobFeatures(
                model_name=row.model_name,
                model_family=row.model_family,
                dataset_name=row.dataset_name,
                dataset_format=row.dataset_format,
                record_count=row.record_count,
                batch_size=row.batch_size,
                embedding_dim=row.embedding_dim,
                parameter_count=row.parameter_count,
            ),
            outcome=Outcome(row.outcome),
            finished_at=None if row.finished_at is None else aware(row.finished_at),
            plan_count=row.plan_count,
        )
        for row in rows
    ]
