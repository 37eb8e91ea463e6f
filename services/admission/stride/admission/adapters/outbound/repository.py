"""Admission's storage: jobs and decisions, read and written with SQLAlchemy Core."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from stride.admission.db.tables import (
    capacity,
    decisions,
    holdings,
    jobs,
    ledger,
    outbox,
    quotas,
    share_requests,
)
from stride.admission.domain.quotas import Quota
from stride.events.v1 import job_pb2
from stride.vocabulary.jobspec import Priority

ACTIVE_STATES = ("ADMITTED", "QUEUED")
"""States of jobs that hold or wait for a share."""

TERMINAL_STATES = frozenset({"REJECTED", "SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class StoredJob:
    """A job row with its latest decision."""

    job_id: str
    spec: job_pb2.JobSpec
    state: str
    decision: job_pb2.AdmissionDecision | None
    submitted_at: datetime
    share: job_pb2.JobShare | None = None


@dataclass(frozen=True)
class LedgerRow:
    """A planned job's books as stored."""

    job_id: str
    kind: str
    deadline: float | None
    submitted: float
    total_steps: float
    remaining: float
    units: int
    paused_until: float
    last_update: float
    share_version: int
    spec: job_pb2.JobSpec
    state: str
    waiting_since: float | None = None
    share: job_pb2.JobShare | None = None
    """The share last published (its placement, for GPU jobs)."""
    curve: dict[str, Any] | None = None
    """A history curve (:func:`curve_to_json`), else None (the spec says the curve)."""


async def job_by_request_id(session: AsyncSession, request_id: str) -> str | None:
    """The job id an idempotency key was used for, if any."""
    return await session.scalar(select(jobs.c.job_id).where(jobs.c.request_id == request_id))


def job_row(
    job_id: str,
    request_id: str | None,
    spec: job_pb2.JobSpec,
    submitted_at: datetime,
    state: str = "SUBMITTED",
) -> dict[str, Any]:
    """A validated job's row, in state SUBMITTED unless it was decided already (then its
    decision goes in too: :func:`decision_row`), for :func:`insert_jobs`."""
    return {
        "job_id": job_id,
        "request_id": request_id,
        "name": spec.name,
        "user": spec.user,
        "state": state,
        "spec": spec.SerializeToString(),
        "submitted_at": submitted_at,
        "updated_at": submitted_at,
    }


async def insert_jobs(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Store jobs (:func:`job_row`) with one statement; a request id stored before raises
    the unique constraint's error, and nothing of the batch is stored."""
    if rows:
        await session.execute(jobs.insert(), list(rows))


async def record_decision(
    session: AsyncSession, decision: job_pb2.AdmissionDecision, state: str, at: datetime
) -> None:
    """Store a decision and move the job to ``state``."""
    await insert_decision(session, decision, at)
    await set_state(session, decision.job_id, state, at)


def decision_row(decision: job_pb2.AdmissionDecision, at: datetime) -> dict[str, Any]:
    """A decision's row, for :func:`insert_decisions`."""
    return {
        "job_id": decision.job_id,
        "outcome": job_pb2.AdmissionOutcome.Name(decision.outcome),
        "decision": decision.SerializeToString(),
        "decided_at": at,
    }


async def insert_decision(
    session: AsyncSession, decision: job_pb2.AdmissionDecision, at: datetime
) -> None:
    """Store a decision (the job's state is the caller's)."""
    await insert_decisions(session, [decision_row(decision, at)])


async def insert_decisions(session: AsyncSession, rows: Sequence[dict[str, Any]]) -> None:
    """Store decisions (:func:`decision_row`) with one statement, in order."""
    if rows:
        await session.execute(decisions.insert(), list(rows))


async def set_state(session: AsyncSession, job_id: str, state: str, at: datetime) -> None:
    """Move a job to ``state``."""
    await session.execute(
        update(jobs).where(jobs.c.job_id == job_id).values(state=state, updated_at=at)
    )


def _jobs_query() -> Any:
    """Jobs with the latest decision and the share of each (one round trip)."""
    latest = (
        select(decisions.c.decision)
        .where(decisions.c.job_id == jobs.c.job_id)
        .order_by(decisions.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    share = select(ledger.c.share).where(ledger.c.job_id == jobs.c.job_id).scalar_subquery()
    return select(jobs, latest.label("latest_decision"), share.label("ledger_share"))


def _stored_job(row: Any) -> StoredJob:
    decision = row.latest_decision
    return StoredJob(
        job_id=row.job_id,
        spec=job_pb2.JobSpec.FromString(row.spec),
        state=row.state,
        decision=None if decision is None else job_pb2.AdmissionDecision.FromString(decision),
        submitted_at=row.submitted_at,
        share=None if row.ledger_share is None else job_pb2.JobShare.FromString(row.ledger_share),
    )


async def get_job(session: AsyncSession, job_id: str, for_update: bool = False) -> StoredJob | None:
    """One job with its latest decision and its share, or None (one round trip: a
    submission reads its job three times)."""
    query = _jobs_query().where(jobs.c.job_id == job_id)
    if for_update:
        query = query.with_for_update(of=jobs)
    row = (await session.execute(query)).one_or_none()
    return None if row is None else _stored_job(row)


async def get_jobs(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, StoredJob]:
    """:func:`get_job` of each of ``job_ids`` that exists, by id, in one round trip."""
    rows = await session.execute(_jobs_query().where(jobs.c.job_id.in_(sorted(set(job_ids)))))
    return {row.job_id: _stored_job(row) for row in rows}


async def list_jobs(session: AsyncSession, user: str | None, limit: int) -> list[StoredJob]:
    """Jobs newest first, optionally of one user."""
    query = select(jobs.c.job_id).order_by(jobs.c.submitted_at.desc(), jobs.c.job_id).limit(limit)
    if user:
        query = query.where(jobs.c.user == user)
    ids = (await session.scalars(query)).all()
    found = await get_jobs(session, ids)
    return [found[job_id] for job_id in ids if job_id in found]


async def undecided_job_ids(session: AsyncSession) -> list[str]:
    """Jobs stored but not yet decided (left so by a crash between the two steps)."""
    query = select(jobs.c.job_id).where(jobs.c.state == "SUBMITTED").order_by(jobs.c.submitted_at)
    return list((await session.scalars(query)).all())


async def decision_count(session: AsyncSession, job_id: str) -> int:
    """How many decisions a job has had (numbers its decision events)."""
    count = await session.scalar(
        select(func.count()).select_from(decisions).where(decisions.c.job_id == job_id)
    )
    return int(count or 0)


async def active_ledger(session: AsyncSession, kind: str) -> list[LedgerRow]:
    """The books of every active job of a resource kind, in admission order: by arrival,
    then by first decision (jobs that arrived together, in the order they were decided; the
    policy breaks ties by that order, as the simulator by its trace's)."""
    first = (
        select(decisions.c.job_id, func.min(decisions.c.id).label("first"))
        .group_by(decisions.c.job_id)
        .subquery()
    )
    query = (
        select(ledger, jobs.c.spec, jobs.c.state)
        .join(jobs, jobs.c.job_id == ledger.c.job_id)
        .join(first, first.c.job_id == ledger.c.job_id, isouter=True)
        .where(ledger.c.kind == kind, jobs.c.state.in_(ACTIVE_STATES))
        .order_by(ledger.c.submitted, first.c.first, ledger.c.job_id)
    )
    rows = (await session.execute(query)).all()
    return [
        LedgerRow(
            job_id=row.job_id,
            kind=row.kind,
            deadline=row.deadline,
            submitted=row.submitted,
            total_steps=row.total_steps,
            remaining=row.remaining,
            units=row.units,
            paused_until=row.paused_until,
            last_update=row.last_update,
            share_version=row.share_version,
            waiting_since=row.waiting_since,
            share=job_pb2.JobShare.FromString(row.share) if row.share else None,
            curve=row.curve,
            spec=job_pb2.JobSpec.FromString(row.spec),
            state=row.state,
        )
        for row in rows
    ]


async def job_states(session: AsyncSession, job_ids: list[str]) -> dict[str, str]:
    """The states of some jobs."""
    if not job_ids:
        return {}
    rows = await session.execute(
        select(jobs.c.job_id, jobs.c.state).where(jobs.c.job_id.in_(job_ids))
    )
    return {row.job_id: row.state for row in rows}


@dataclass(frozen=True)
class Books:
    """One job's books as :func:`save_books_many` writes them."""

    job_id: str
    kind: str
    deadline: float | None
    submitted: float
    total_steps: float
    remaining: float
    units: int
    paused_until: float
    last_update: float
    share: job_pb2.JobShare
    waiting_since: float | None = None
    curve: dict[str, Any] | None = None


async def save_books_many(session: AsyncSession, books: list[Books]) -> None:
    """Insert or update many jobs' books: one query for which exist, one batched update,
    one batched insert (a round on a busy cluster changes hundreds of jobs at once)."""
    if not books:
        return
    ids = [entry.job_id for entry in books]
    existing: set[str] = set()
    for start in range(0, len(ids), 500):
        rows = await session.execute(
            select(ledger.c.job_id).where(ledger.c.job_id.in_(ids[start : start + 500]))
        )
        existing.update(row.job_id for row in rows)
    values = [
        {
            "b_job_id": entry.job_id,
            "kind": entry.kind,
            "deadline": entry.deadline,
            "submitted": entry.submitted,
            "total_steps": entry.total_steps,
            "remaining": entry.remaining,
            "units": entry.units,
            "paused_until": entry.paused_until,
            "last_update": entry.last_update,
            "share_version": entry.share.version,
            "share": entry.share.SerializeToString(),
            "waiting_since": entry.waiting_since,
            "curve": entry.curve,
        }
        for entry in books
    ]
    updates = [row for row in values if row["b_job_id"] in existing]
    inserts = [
        {("job_id" if key == "b_job_id" else key): value for key, value in row.items()}
        for row in values
        if row["b_job_id"] not in existing
    ]
    if updates:
        await session.execute(
            update(ledger)
            .where(ledger.c.job_id == bindparam("b_job_id"))
            .values({key: bindparam(key) for key in updates[0] if key != "b_job_id"}),
            updates,
        )
    if inserts:
        await session.execute(ledger.insert(), inserts)


@dataclass(frozen=True)
class StoredCapacity:
    """One resource kind's units in the newest node inventory."""

    capacity: int
    observed_at: float
    reason: str
    tree: str | None = None
    """The GPU tree (:meth:`GpuTree.to_text`), for GPUs."""


async def capacities(session: AsyncSession) -> dict[str, StoredCapacity]:
    """Each resource kind's capacity from the newest inventory, by kind."""
    rows = await session.execute(select(capacity))
    return {
        row.kind: StoredCapacity(row.capacity, row.observed_at, row.reason, row.tree)
        for row in rows
    }


async def save_capacity(
    session: AsyncSession,
    kind: str,
    units: int,
    observed_at: float,
    reason: str,
    tree: str | None = None,
) -> None:
    """Insert or update a resource kind's capacity (and, for GPUs, its tree)."""
    values = {"capacity": units, "observed_at": observed_at, "reason": reason[:200], "tree": tree}
    updated = await session.execute(
        update(capacity).where(capacity.c.kind == kind).values(**values)
    )
    if not updated.rowcount:  # type: ignore[attr-defined]
        await session.execute(capacity.insert().values(kind=kind, **values))


def _quota(row: Any) -> Quota:
    return Quota(
        row.scope,
        row.max_active_jobs,
        row.max_submissions,
        row.window_seconds,
        tuple(row.members),
        row.source,
        Priority(row.max_priority) if row.max_priority else None,
        bool(row.allow_simulated),
    )


async def all_quotas(session: AsyncSession) -> list[Quota]:
    """Every quota, by scope."""
    rows = await session.execute(select(quotas).order_by(quotas.c.scope))
    return [_quota(row) for row in rows]


async def get_quota(session: AsyncSession, scope: str) -> Quota | None:
    """One scope's quota, or None."""
    row = (await session.execute(select(quotas).where(quotas.c.scope == scope))).first()
    return None if row is None else _quota(row)


async def put_quota(session: AsyncSession, quota: Quota, at: datetime) -> None:
    """Insert or replace a quota."""
    values = {
        "max_active_jobs": quota.max_active_jobs,
        "max_submissions": quota.max_submissions,
        "window_seconds": quota.window_seconds,
        "members": list(quota.members),
        "source": quota.source,
        "updated_at": at,
        "max_priority": quota.max_priority.value if quota.max_priority is not None else None,
        "allow_simulated": quota.allow_simulated,
    }
    updated = await session.execute(
        update(quotas).where(quotas.c.scope == quota.scope).values(**values)
    )
    if not updated.rowcount:  # type: ignore[attr-defined]
        await session.execute(quotas.insert().values(scope=quota.scope, **values))


async def delete_quota(session: AsyncSession, scope: str) -> None:
    """Remove a scope's quota (none: nothing happens)."""
    await session.execute(quotas.delete().where(quotas.c.scope == scope))


async def scope_use(
    session: AsyncSession, users: tuple[str, ...], since: datetime, leave_out: str = ""
) -> tuple[tuple[float, ...], int]:
    """The users' submission times since ``since`` and their active (admitted or queued)
    jobs, leaving out the job ``leave_out`` (the one being decided)."""
    if not users:
        return (), 0
    recent = await session.execute(
        select(jobs.c.submitted_at).where(
            jobs.c.user.in_(users), jobs.c.submitted_at > since, jobs.c.job_id != leave_out
        )
    )
    times = tuple(_aware(row.submitted_at).timestamp() for row in recent)
    active = await session.scalar(
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.user.in_(users), jobs.c.state.in_(ACTIVE_STATES), jobs.c.job_id != leave_out)
    )
    return times, int(active or 0)


async def active_jobs(session: AsyncSession, users: Sequence[str]) -> dict[str, int]:
    """Each user's active (admitted or queued) jobs; a user with none is left out."""
    if not users:
        return {}
    rows = await session.execute(
        select(jobs.c.user, func.count())
        .where(jobs.c.user.in_(sorted(set(users))), jobs.c.state.in_(ACTIVE_STATES))
        .group_by(jobs.c.user)
    )
    return {user: int(count) for user, count in rows}


def _aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


async def outbox_pending(session: AsyncSession) -> int:
    """Events still in the outbox (not yet on the bus)."""
    return int((await session.execute(select(func.count()).select_from(outbox))).scalar_one())


# --- Share requests (issue 39) -------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """What a job's newest plan holds, whole."""

    plan_version: int
    cpu: float
    memory_gib: float


async def put_holding(
    session: AsyncSession, job_id: str, version: int, cpu: float, memory_gib: float
) -> bool:
    """Record what plan ``version`` of a job holds, unless a newer plan's is recorded;
    False when it was older (nothing changed)."""
    row = (
        await session.execute(
            select(holdings.c.plan_version).where(holdings.c.job_id == job_id).with_for_update()
        )
    ).first()
    values = {"plan_version": version, "cpu": cpu, "memory_gib": memory_gib}
    if row is None:
        await session.execute(holdings.insert().values(job_id=job_id, **values))
        return True
    if row.plan_version >= version:
        return False
    await session.execute(update(holdings).where(holdings.c.job_id == job_id).values(**values))
    return True


async def all_holdings(session: AsyncSession) -> dict[str, Holding]:
    """Every running job's holding, by job id."""
    rows = await session.execute(select(holdings))
    return {row.job_id: Holding(row.plan_version, row.cpu, row.memory_gib) for row in rows}


async def holdings_of(session: AsyncSession, job_ids: Sequence[str]) -> dict[str, Holding]:
    """The holdings of ``job_ids`` that have one, by job id."""
    if not job_ids:
        return {}
    rows = await session.execute(select(holdings).where(holdings.c.job_id.in_(list(job_ids))))
    return {row.job_id: Holding(row.plan_version, row.cpu, row.memory_gib) for row in rows}


@dataclass(frozen=True)
class StoredRequest:
    """A job's newest share request and admission's answer."""

    job_id: str
    plan_version: int
    state: str
    request: dict[str, Any]
    reason: str


async def put_request(
    session: AsyncSession,
    job_id: str,
    version: int,
    state: str,
    request: dict[str, Any],
    reason: str,
    at: datetime,
) -> None:
    """Insert or replace the job's share request with its answer."""
    values = {
        "plan_version": version,
        "state": state,
        "request": request,
        "reason": reason,
        "updated_at": at,
    }
    updated = await session.execute(
        update(share_requests).where(share_requests.c.job_id == job_id).values(**values)
    )
    if not updated.rowcount:  # type: ignore[attr-defined]
        await session.execute(share_requests.insert().values(job_id=job_id, **values))


async def requests_in(
    session: AsyncSession, states: Sequence[str], job_ids: Sequence[str] | None = None
) -> list[StoredRequest]:
    """The share requests in one of ``states`` (of ``job_ids`` only, if given), by job id."""
    query = select(share_requests).where(share_requests.c.state.in_(list(states)))
    if job_ids is not None:
        query = query.where(share_requests.c.job_id.in_(list(job_ids)))
    rows = await session.execute(query.order_by(share_requests.c.job_id))
    return [
        StoredRequest(row.job_id, row.plan_version, row.state, dict(row.request), row.reason)
        for row in rows
    ]


async def get_request(session: AsyncSession, job_id: str) -> StoredRequest | None:
    """The job's newest share request, if any."""
    row = (
        await session.execute(select(share_requests).where(share_requests.c.job_id == job_id))
    ).first()
    if row is None:
        return None
    return StoredRequest(row.job_id, row.plan_version, row.state, dict(row.request), row.reason)


async def forget_requests(session: AsyncSession, job_id: str) -> None:
    """An ended job holds nothing and asks for nothing."""
    await session.execute(share_requests.delete().where(share_requests.c.job_id == job_id))
    await session.execute(holdings.delete().where(holdings.c.job_id == job_id))
