"""Admission's use cases: submit, decide, cancel and finish jobs, and keep their shares.

Admission owns each job's share of the cluster (``DESIGN.md``, who owns which decision). It
keeps one :class:`~stride.admission.domain.ledger.Pool` per resource kind in memory, built
from its books in storage, and changes it only under one lock: every decision, completion
and cancellation advances the pool, decides, and commits the decision, the books of every
job whose units changed and their ``share`` events in one transaction. If that commit fails
the pools are dropped and rebuilt from storage, so memory is never ahead of what is stored.
Admission is therefore one active replica.

Each step commits its state change and its events (through the outbox) in one transaction,
so a job is never stored without its ``submitted`` event or decided without its decision
event. A new job is decided first and stored with its decision in one transaction; a job
left SUBMITTED (by a version that stored before deciding) is decided by
:meth:`Submissions.decide_pending` on the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import structlog

from stride.admission.adapters.convert import (
    decision_to_proto,
    inventory_from_proto,
    share_to_proto,
    spec_from_proto,
    timestamp,
)
from stride.admission.adapters.outbound import repository
from stride.admission.adapters.outbound.repository import StoredJob
from stride.admission.domain.gputree import GpuTree, TreeError
from stride.admission.domain.jobs import JobSpec, Priority, check_request_id, validate
from stride.admission.domain.ledger import Entry, Pool
from stride.admission.domain.limits import (
    Refusal,
    Submitter,
    active_cap,
    over_active_cap,
    privilege_refusal,
)
from stride.admission.domain.policy import (
    POLICY,
    Decision,
    Outcome,
    Share,
    curve_from_json,
    curve_to_json,
    history_curve,
    in_words,
    job_curve,
)
from stride.admission.domain.quotas import Quota, check_scope, violation
from stride.bus import topics
from stride.bus.topics import Outgoing, Topic
from stride.db.engine import ConflictingWrite, Database
from stride.db.outbox import Outbox
from stride.events.v1 import auth_pb2, cluster_pb2, job_pb2
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import SCALING_PAUSE_SECONDS, SLOT_SECONDS
from stride.policy.elasticflow.priorities import HIGH, LOW, NORMAL
from stride.policy.elasticflow.units import GIB, CpuUnit, JobCurve, cpu_capacity
from stride.policy.warm_start import MeasuredRun
from stride.runtime.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from stride.vocabulary.jobspec import ResourceKind

__all__ = ["StoredJob", "Submissions", "new_job_id"]

log = structlog.get_logger(__name__)

_STATE_BY_OUTCOME = {
    Outcome.ADMITTED: "ADMITTED",
    Outcome.REJECTED: "REJECTED",
    Outcome.QUEUED: "QUEUED",
    Outcome.SOFT: "ADMITTED",
}
_STATE_BY_JOB_OUTCOME = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: "SUCCEEDED",
    job_pb2.JOB_OUTCOME_FAILED: "FAILED",
    job_pb2.JOB_OUTCOME_CANCELLED: "CANCELLED",
}


def _decided_state(ruling: _Ruling) -> str:
    """The state a job is in once its ruling is stored."""
    decision, entry = ruling.decision, ruling.entry
    if decision.outcome in (Outcome.SOFT, Outcome.ADMITTED) and entry is not None:
        return "ADMITTED" if entry.units else "QUEUED"
    return _STATE_BY_OUTCOME[decision.outcome]


def new_job_id() -> str:
    """A short, subject-safe, pod-name-safe job id."""
    return f"job-{uuid.uuid4().hex[:12]}"


def _same_job(stored: job_pb2.JobSpec, submitted: job_pb2.JobSpec) -> bool:
    """Whether a resubmission asks for the stored job. The deadline is left out: a retried
    ``stride submit`` of a spec with a relative deadline (``+6h``) resolves it anew each
    time, and the CLI's request id is derived from the deadline as written."""
    left, right = job_pb2.JobSpec(), job_pb2.JobSpec()
    left.CopyFrom(stored)
    right.CopyFrom(submitted)
    left.ClearField("deadline")
    right.ClearField("deadline")
    return left.SerializeToString(deterministic=True) == right.SerializeToString(deterministic=True)


Clock = Callable[[], datetime]

RESUBMIT_GRACE_SECONDS = 60.0
"""A refusal names the earliest deadline that still holds for the job resubmitted within
this long: it is worked out as of this much later. What shrinks while the user resubmits is
the rest of the current slot (deadlines fall on the slot grid), so a job that just fit in it
at the refusal did not fit a few seconds later, and the deadline the refusal named was
refused in turn. (This was added to the named deadline before, which moved it past a slot
end by a minute but gave the job no more slots; found under load by
``test_an_impossible_deadline_is_refused_with_one_that_works``.)"""


def request_key(user: str, request_id: str) -> str:
    """What a request id is stored as: one user's key (two users choosing the same request
    id, as two CLIs submitting the same file do, name two jobs, and neither gets the other's
    job back), of a fixed length whatever the id's."""
    digest = hashlib.sha256(f"{user}\0{request_id}".encode()).hexdigest()
    return f"u1:{digest}"


def wall_clock() -> datetime:
    return datetime.now(UTC)


class ExactMoment(datetime):
    """A datetime that remembers the float seconds it was made from: ``timestamp()`` gives
    them back exactly (a datetime keeps microseconds; a replay's event times are floats,
    and the simulator plans with them to the last bit)."""

    exact: float

    @classmethod
    def of(cls, seconds: float) -> ExactMoment:
        """The moment ``seconds`` after the epoch, exactly."""
        moment = cls.fromtimestamp(seconds, UTC)
        moment.exact = seconds
        return moment

    def timestamp(self) -> float:
        return self.exact


class SteppedClock:
    """A clock that stands still until told to move (``stride replay --clock stepped``):
    no decision then waits on the wall clock, so a replay's decisions are the simulator's
    whatever the machine's speed. It keeps float seconds, exactly as the replay gives them."""

    def __init__(self, start: float) -> None:
        self.seconds = start

    @property
    def value(self) -> datetime:
        """The clock as a datetime (whose ``timestamp()`` is exact)."""
        return ExactMoment.of(self.seconds)

    def __call__(self) -> datetime:
        return self.value


DRAIN_SECONDS = 30.0
"""How long a stepped clock's Advance waits for the outbox to reach the bus."""


class RunSource(Protocol):
    """What similar finished jobs measured (the config DB's adapter)."""

    async def similar(self, spec: job_pb2.JobSpec) -> tuple[MeasuredRun, ...]: ...


@dataclass(frozen=True)
class Cluster:
    """What admission plans on: GPUs, CPU units, and the curves table for known models."""

    gpus: int = 0
    cpu_units: int = 0
    unit: CpuUnit = field(default_factory=CpuUnit)
    curves: Mapping[tuple[str, int], ScalingCurve] = field(default_factory=dict)
    """(model name, global batch size) -> concave curve (GPU jobs of a known model)."""
    pause_seconds: float = SCALING_PAUSE_SECONDS
    tree: GpuTree | None = None
    """The GPU tree from settings (``cluster_topology``), until an inventory gives one."""


@dataclass
class _Ruling:
    """A decision on one job, taken in memory, before it is stored."""

    job_id: str
    spec: JobSpec
    moment: datetime
    decision: Decision
    pool: Pool | None
    """The pool it was decided in (None: refused before, over quota or without a curve)."""
    entry: Entry | None
    """Its books there (None: it did not join)."""
    changed: dict[str, int]
    """The jobs whose share the round changed."""


@dataclass(frozen=True)
class _Announcement:
    """A decision's event, built once the decision carries the job's new share."""

    decision: job_pb2.AdmissionDecision
    topic: Topic[job_pb2.AdmissionDecision]
    message_id: str

    def event(self) -> Outgoing:
        return self.topic.outgoing(self.decision.job_id, self.decision, self.message_id)


GROUP_COMMIT_LIMIT = 64
"""The most submissions stored in one transaction."""

CAP_SETTING = "STRIDE_ADMISSION_DEFAULT_MAX_ACTIVE_JOBS"
"""The setting a refusal by the default cap on a user's active jobs names."""


@dataclass
class _Arrival:
    """A new job waiting to be decided and stored (group commit)."""

    job_id: str
    spec: job_pb2.JobSpec
    request_id: str
    now: datetime
    curve: JobCurve | None
    done: asyncio.Future[StoredJob]
    cap: int = 0
    """The most active jobs its user may hold under the default cap (0: none applies)."""


@dataclass
class _Writes:
    """A group commit's rows and events, written together (:meth:`flush`): a statement per
    table for the batch instead of four per job (``bench/submit_load.py``)."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    events: list[Outgoing] = field(default_factory=list)

    async def flush(self, session: Any, outbox: Outbox) -> None:
        """Write what waits, in order (a ruling that reads or writes other rows flushes
        first: it must see the batch's earlier jobs, and queue its events after theirs)."""
        await repository.insert_jobs(session, self.jobs)
        await repository.insert_decisions(session, self.decisions)
        await outbox.add_events(session, self.events)
        self.jobs, self.decisions, self.events = [], [], []


def _settle(arrival: _Arrival, outcome: StoredJob | BaseException) -> None:
    if arrival.done.done():
        return
    if isinstance(outcome, BaseException):
        arrival.done.set_exception(outcome)
    else:
        arrival.done.set_result(outcome)


GRANTED, QUEUED, REFUSED = "granted", "queued", "refused"
"""States of a share request (``stride.admission.share_requests``)."""


class CapacityFreed(Protocol):
    """Settles the queued share requests after capacity freed, in the caller's transaction."""

    async def __call__(self, session: Any, pool: Pool, reason: str, moment: datetime) -> int: ...


@dataclass(frozen=True)
class _Floors:
    """What a CPU job's share never falls below: what its granted share request wanted
    (``JobShare.granted``) and what its plan holds, since a round that divides the units
    anew must not order a plan below its pods' memory, which no shrink can cut."""

    granted: Mapping[str, repository.StoredRequest]
    holdings: Mapping[str, repository.Holding]

    @classmethod
    async def read(cls, session: Any, kind: ResourceKind, job_ids: Sequence[str]) -> _Floors:
        if kind is not ResourceKind.CPU or not job_ids:
            return cls({}, {})
        granted = await repository.requests_in(session, [GRANTED], job_ids)
        holdings = await repository.holdings_of(session, job_ids)
        return cls({r.job_id: r for r in granted}, holdings)

    def raise_share(self, share: job_pb2.JobShare, entry: Entry) -> None:
        """Raise a running job's ``share`` to its floors."""
        if not entry.units:
            return
        holding = self.holdings.get(entry.job_id)
        if holding is not None:
            share.share.cpu = max(share.share.cpu, holding.cpu)
            share.share.memory_bytes = max(
                share.share.memory_bytes, math.ceil(holding.memory_gib * GIB)
            )
        request = self.granted.get(entry.job_id)
        if request is None:
            return
        cpu = float(request.request["wanted_cpu"])
        memory = math.ceil(float(request.request["wanted_memory_gib"]) * GIB)
        share.granted.cpu = cpu
        share.granted.memory_bytes = memory
        share.share.cpu = max(share.share.cpu, cpu)
        share.share.memory_bytes = max(share.share.memory_bytes, memory)


class Submissions:
    """Submits, decides and ends jobs against the database, outbox and policy."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        cluster: Cluster,
        clock: Clock = wall_clock,
        speedup: float = 1.0,
        history: RunSource | None = None,
        default_max_active_jobs: int = 0,
    ) -> None:
        self.default_max_active_jobs = default_max_active_jobs
        """Active jobs a user may hold when no quota of theirs says (0: no cap;
        :func:`~stride.admission.domain.limits.active_cap`)."""
        self.history = history
        """Where similar finished jobs' measurements come from (the config DB); None: a
        job without a profile (or a known model) is planned without a curve."""
        self.stepped = clock if isinstance(clock, SteppedClock) else None
        """The replay's stepped clock, when admission runs on one: rounds then run when
        :meth:`advance` passes their time instead of on timers."""
        self._advancing = asyncio.Lock()
        self.speedup = speedup
        """How much faster ``clock`` runs than the wall clock (a replay's; timers scale)."""
        self.database = database
        self.outbox = outbox
        self.cluster = cluster
        self.clock = clock
        self._lock = asyncio.Lock()
        self._pools: dict[ResourceKind, Pool] = {}
        self._versions: dict[str, int] = {}
        """Each planned job's last published share version."""
        self._timers: dict[ResourceKind, tuple[float, asyncio.TimerHandle | None]] = {}
        self._trees: dict[ResourceKind, GpuTree | None] = {}
        """The tree each pool places on (GPUs only), to name the nodes in shares."""
        self._ticks: set[asyncio.Task[None]] = set()
        self._quotas: tuple[Quota, ...] | None = None
        """Every stored quota (:meth:`_all_quotas`; None: read them on the next use)."""
        self._quota_generation = 0
        """Counts quota writes, so a read that raced one is not kept."""
        self._arrivals: list[_Arrival] = []
        """Submissions waiting for the group commit, oldest first."""
        self._committer: asyncio.Task[None] | None = None
        self.capacity_freed: CapacityFreed | None = None
        """Settles the queued share requests when a job ends (``stride.admission.
        share_requests``); None: none are taken."""

    async def submit(
        self, spec: job_pb2.JobSpec, request_id: str, submitter: Submitter | None = None
    ) -> StoredJob:
        """Validate, store and decide a job. Invalid specs raise before anything is written.

        ``submitter``: who submits, as verified (None: trusted, as an admin). An untrusted
        one is refused PERMISSION_DENIED for a spec field only a granting quota allows, and
        RESOURCE_EXHAUSTED past the default cap on their active jobs
        (:mod:`stride.admission.domain.limits`).

        A retry (the same request id) is found by the job row's unique request key when the
        new row is stored, not by a read before: a retry is rare, and reading first cost
        every submission a transaction (``bench/submit_load.py``). A retry is answered
        before the clock-based rules too, so a retried submission whose absolute deadline
        has just passed still gets its job back."""
        check_request_id(request_id)
        view = spec_from_proto(spec)
        validate(view, None)
        cap = await self._check_submitter(submitter, spec)
        now = self.clock()
        try:
            validate(view, now)
        except InvalidArgument:
            earlier = await self._earlier_submission(request_id, spec) if request_id else None
            if earlier is None:
                raise
            return earlier
        try:
            return await self._store_and_decide(spec, request_id, now, cap)
        except ConflictingWrite:
            # This request id stored a job before (a retry, or a concurrent twin).
            earlier = await self._earlier_submission(request_id, spec) if request_id else None
            if earlier is None:
                raise
            return earlier

    async def _earlier_submission(self, request_id: str, spec: job_pb2.JobSpec) -> StoredJob | None:
        """The job an earlier submission of the same user with ``request_id`` created, if
        any. The same key with another spec is a client bug: reusing it would silently drop
        the new spec."""
        async with self.database.sessions() as session:
            existing = await repository.job_by_request_id(
                session, request_key(spec.user, request_id)
            )
        if existing is None:
            return None
        job = await self.get(existing)
        if not _same_job(job.spec, spec):
            raise AlreadyExists(
                f"request_id {request_id[:60]!r} was used for job {existing} with another spec; "
                "use a new request id (or none) to submit a different job"
            )
        log.info("duplicate submission", job_id=existing, request_id=request_id)
        return job

    async def _check_submitter(self, submitter: Submitter | None, spec: job_pb2.JobSpec) -> int:
        """Refuse a field ``submitter`` may not set; the default cap on their active jobs
        (0: none applies). The quotas are kept in memory: this reads no storage."""
        if submitter is None or submitter.trusted:
            return 0
        quotas = await self._all_quotas()
        binding = [q for q in quotas if q.binds(spec.user)]
        refusal = privilege_refusal(submitter, spec.priority, spec.simulated, binding)
        if refusal is not None:
            raise PermissionDenied(f"{refusal.field}: {refusal.problem}")
        return active_cap(spec.user, quotas, self.default_max_active_jobs)

    async def _store_and_decide(
        self, spec: job_pb2.JobSpec, request_id: str, now: datetime, cap: int = 0
    ) -> StoredJob:
        """Decide a new job and store it with its ``submitted`` event, its decision and the
        shares that changed, in one transaction; the job as stored (read back in that
        transaction). Deciding before anything is stored saves the submission a commit and
        two reads of its own row (``bench/admission_grpc.py``); a crash before the commit
        stores nothing, and the client, which got no answer, retries (with its request id,
        safely). A request id stored before raises :class:`ConflictingWrite`, and the pools,
        which took the job in, are rebuilt from storage (:meth:`_changing`).

        Group commit: submissions that arrive while one is being stored wait, and are then
        decided one after another, in arrival order, exactly as if each came alone, and
        stored in one transaction (:meth:`_commit_arrivals`). The pools' lock is held for
        a decision and a share of a commit instead of a whole commit per job
        (``bench/submit_load.py``)."""
        job_id = new_job_id()
        # Asked before the lock: the config DB's answer is a round trip that other
        # submissions need not wait behind.
        curve = await self._curve(job_id, spec)
        arrival = _Arrival(
            job_id, spec, request_id, now, curve, asyncio.get_running_loop().create_future(), cap
        )
        # Its outcome is read by the caller, unless the caller went away first.
        arrival.done.add_done_callback(lambda done: done.cancelled() or done.exception())
        self._arrivals.append(arrival)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_arrivals())
        # Shielded: a caller that goes away leaves the others' batch alone (its job is
        # stored or not with the batch; a retry with its request id finds out which).
        return await asyncio.shield(arrival.done)

    async def _commit_arrivals(self) -> None:
        """Store the waiting submissions, a batch per transaction, until none wait. A batch
        that fails is stored again one job per transaction, so one bad submission (a
        request id used before) fails alone, with the error it would have met alone."""
        try:
            while self._arrivals:
                batch = self._arrivals[:GROUP_COMMIT_LIMIT]
                del self._arrivals[: len(batch)]
                try:
                    batch = await self._under_caps(batch)
                except Exception as error:
                    for arrival in batch:
                        _settle(arrival, error)
                    continue
                if not batch:
                    continue
                try:
                    async with self._changing():
                        stored = await self._store_batch(batch)
                except Exception as error:
                    if len(batch) == 1:
                        _settle(batch[0], error)
                        continue
                    for arrival in batch:
                        try:
                            async with self._changing():
                                (alone,) = await self._store_batch([arrival])
                        except Exception as failure:
                            _settle(arrival, failure)
                        else:
                            _settle(arrival, alone)
                    continue
                for arrival, job in zip(batch, stored, strict=True):
                    _settle(arrival, job)
        except BaseException:
            pending, self._arrivals = self._arrivals, []
            for arrival in pending:
                _settle(arrival, Unavailable("admission is stopping; submit again"))
            raise

    async def _under_caps(self, batch: list[_Arrival]) -> list[_Arrival]:
        """The arrivals the default cap on their users' active jobs lets in, in order; the
        others are refused, RESOURCE_EXHAUSTED. Counted once a batch, before it is stored:
        this task alone stores new jobs, so no job joins the counts meanwhile (an end only
        lowers them), and each arrival let in counts for the ones after it. A refused
        arrival whose request id stored a job before gets that job back (a retry)."""
        if not any(arrival.cap for arrival in batch):
            return batch
        async with self.database.sessions() as session:
            active = await repository.active_jobs(session, [a.spec.user for a in batch])
            kept: list[_Arrival] = []
            for arrival in batch:
                user = arrival.spec.user
                refusal = over_active_cap(user, active.get(user, 0), arrival.cap, CAP_SETTING)
                if refusal is None:
                    kept.append(arrival)
                    active[user] = active.get(user, 0) + 1
                elif arrival.request_id and await repository.job_by_request_id(
                    session, request_key(user, arrival.request_id)
                ):
                    _settle(arrival, ConflictingWrite("a retry of a stored job"))
                else:
                    _settle(arrival, _exhausted(refusal))
        return kept

    async def _store_batch(self, batch: Sequence[_Arrival]) -> list[StoredJob]:
        """Decide each arrival in order and store them all in one transaction (the pools'
        lock held by the caller)."""
        rulings = [await self._rule(a.job_id, a.spec, a.curve) for a in batch]
        async with self.database.transaction() as session:
            writes = _Writes()
            for arrival, ruling in zip(batch, rulings, strict=True):
                job_id, spec, now = arrival.job_id, arrival.spec, arrival.now
                key = request_key(spec.user, arrival.request_id) if arrival.request_id else None
                writes.jobs.append(
                    repository.job_row(job_id, key, spec, now, _decided_state(ruling))
                )
                event = job_pb2.JobSubmitted(job_id=job_id, spec=spec, submitted_at=timestamp(now))
                submitted = topics.JOB_SUBMITTED.outgoing(job_id, event, f"{job_id}.submitted")
                await self._record(session, ruling, spec, first=[submitted], writes=writes)
            await writes.flush(session, self.outbox)
            # Read back as stored, the batch at once.
            found = await repository.get_jobs(session, [arrival.job_id for arrival in batch])
            stored = [found[arrival.job_id] for arrival in batch]
        for arrival, ruling in zip(batch, rulings, strict=True):
            log.info(
                "job submitted",
                job_id=arrival.job_id,
                user=arrival.spec.user,
                name=arrival.spec.name,
            )
            self._decided(ruling)
        return stored

    async def decide(self, job_id: str) -> None:
        """Decide a SUBMITTED job (one a crash left undecided) against its pool and publish
        the decision and the shares that changed, in one transaction."""
        async with self._changing():
            async with self.database.sessions() as session:
                pending = await repository.get_job(session, job_id)
            if pending is None or pending.state != "SUBMITTED":
                return
            ruling = await self._rule(job_id, pending.spec, await self._curve(job_id, pending.spec))
            async with self.database.transaction() as session:
                job = await repository.get_job(session, job_id, for_update=True)
                if job is None or job.state != "SUBMITTED":
                    raise ConflictingWrite(f"job {job_id} was decided concurrently")
                await self._record(session, ruling, job.spec)
            self._decided(ruling)

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """Hold the pools' lock for one step; if it fails, drop the pools, which may be
        ahead of storage now, so the next step rebuilds them from there."""
        async with self._lock:
            try:
                yield
            except BaseException:
                self._pools.clear()
                raise

    def changing(self) -> contextlib.AbstractAsyncContextManager[None]:
        """:meth:`_changing`, for the share requests' steps."""
        return self._changing()

    async def pool(self, kind: ResourceKind) -> Pool:
        """:meth:`_pool`, for the share requests' steps."""
        return await self._pool(kind)

    async def publish_shares(
        self,
        session: Any,
        kind: ResourceKind,
        pool: Pool,
        changed: dict[str, int],
        reason: str,
        moment: datetime,
    ) -> None:
        """:meth:`_publish_shares`, for the share requests' steps."""
        await self._publish_shares(session, kind, pool, changed, reason, moment)

    async def _curve(self, job_id: str, message: job_pb2.JobSpec) -> JobCurve | None:
        """The job's scaling curve: its own (declared profile, known model), else for a CPU
        job what similar past jobs measured, else None."""
        spec = spec_from_proto(message)
        curve = job_curve(spec, self.cluster.unit, self.cluster.curves)
        if curve is None and spec.kind is ResourceKind.CPU and self.history is not None:
            curve = await self._history_curve(job_id, message)
        return curve

    async def _rule(self, job_id: str, message: job_pb2.JobSpec, curve: JobCurve | None) -> _Ruling:
        """Decide a job with ``curve`` (:meth:`_curve`) against its pool (which it joins if
        it runs); nothing is stored."""
        spec = spec_from_proto(message)
        moment = self.clock()
        now = moment.timestamp()
        deadline_at = spec.deadline_at
        deadline = None if deadline_at is None else deadline_at.timestamp()
        pool: Pool | None = None
        entry: Entry | None = None
        changed: dict[str, int] = {}
        over = await self._over_quota(spec.user, job_id, moment)
        if over is not None:
            decision = Decision(Outcome.REJECTED, over, POLICY, None)
        elif curve is None:
            decision = _without_curve(spec)
        else:
            pool = await self._pool(spec.kind)
            total = float(spec.total_steps)
            entry = Entry(job_id, curve, deadline, now, total, total, priority=_class(spec))
            guaranteed = True
            earliest: float | None = None
            blocked = False
            if deadline is not None and not pool.join(now, entry):
                guaranteed = False
                earliest = pool.earliest_deadline(now + RESUBMIT_GRACE_SECONDS, entry)
                if earliest is None:  # answered by the search already (one re-fill per instant)
                    blocked = pool.blocked(now)
                if spec.soft_deadline:
                    entry.deadline = None
                    pool.join(now, entry)
                else:
                    entry = None
            elif deadline is None:
                pool.join(now, entry)
            if entry is not None:
                changed = pool.round(now)
            else:
                pool.settle(now)  # refused: the instant's last round still stands
            decision = self._decision(
                spec, pool, entry, guaranteed, earliest, now, curve.source, curve.basis, blocked
            )
        return _Ruling(job_id, spec, moment, decision, pool, entry, changed)

    async def _record(
        self,
        session: Any,
        ruling: _Ruling,
        message: job_pb2.JobSpec,
        *,
        first: Sequence[Outgoing] = (),
        writes: _Writes | None = None,
    ) -> None:
        """Store a ruling on a job: the decision, its event, and the shares that changed
        with their events, queued after ``first`` in one batch. ``writes``: a new job's
        group commit, where its row waits in its decided state; its decision and events
        wait there too unless it changed shares."""
        job_id, decision, entry = ruling.job_id, ruling.decision, ruling.entry
        state = _decided_state(ruling)
        proto = decision_to_proto(job_id, decision, message, ruling.moment)
        if writes is not None:
            writes.decisions.append(repository.decision_row(proto, ruling.moment))
        else:
            await repository.record_decision(session, proto, state, ruling.moment)
        topic = decision.outcome.value if state != "QUEUED" else "queued"
        announce = _Announcement(proto, topics.DECISION_TOPICS[topic], f"{job_id}.decision.1")
        if ruling.pool is None or entry is None:
            if writes is not None:
                writes.events += [*first, announce.event()]
            else:
                await self.outbox.add_events(session, [*first, announce.event()])
            return
        if writes is not None:
            await writes.flush(session, self.outbox)
        changed = dict(ruling.changed)
        changed.setdefault(job_id, entry.units)
        await self._publish_shares(
            session,
            ruling.spec.kind,
            ruling.pool,
            changed,
            f"arrival of {job_id}",
            ruling.moment,
            job_id,
            leading=first,
            announce=announce,
        )

    def _decided(self, ruling: _Ruling) -> None:
        """After a ruling was committed: relay its events, arm the pool's next round."""
        self.outbox.notify()
        if ruling.pool is not None:
            self._schedule(ruling.spec.kind, ruling.pool)
        decision = ruling.decision
        log.info(
            "job decided",
            job_id=ruling.job_id,
            outcome=decision.outcome.value,
            policy=decision.policy,
            curve=decision.curve_source,
            reason=decision.reason,
        )

    async def _history_curve(self, job_id: str, spec: job_pb2.JobSpec) -> JobCurve | None:
        """The job's curve from what similar finished jobs measured (the config DB), or None
        (none measured anything, or the config DB did not answer: logged, and the job is
        decided without a curve)."""
        assert self.history is not None
        try:
            runs = await self.history.similar(spec)
        except Exception as error:  # the config DB's trouble must not fail a submission
            log.warning(
                "config DB unreachable; no warm-start curve", job_id=job_id, error=str(error)
            )
            return None
        curve = history_curve(runs, self.cluster.unit)
        if curve is not None:
            log.info("curve from similar jobs", job_id=job_id, basis=curve.basis)
        return curve

    def _decision(
        self,
        spec: JobSpec,
        pool: Pool,
        entry: Entry | None,
        guaranteed: bool,
        earliest: float | None,
        now: float,
        source: str,
        basis: str = "",
        blocked: bool = False,
    ) -> Decision:
        """The words and numbers of a decision on a job with a curve."""
        unit_name = "GPUs" if spec.kind is ResourceKind.GPU else "CPU units"
        deadline_at = spec.deadline_at
        earliest_at = None if earliest is None else datetime.fromtimestamp(earliest, UTC)

        def could() -> str:
            """What deadline would work (asked only of a job that was not guaranteed)."""
            if earliest is not None and earliest_at is not None:
                return f"could guarantee by {in_words(earliest - now)} ({_iso(earliest_at)})"
            if blocked:
                return (
                    "no deadline can be guaranteed now: the jobs already guaranteed hold "
                    f"every slot Algorithm 1 can prove on the cluster's {pool.capacity} "
                    f"{unit_name}, until some of them end"
                )
            return f"it does not fit the cluster's {pool.capacity} {unit_name} even alone"

        if entry is None:
            assert deadline_at is not None
            return Decision(
                Outcome.REJECTED,
                f"cannot guarantee the deadline {_iso(deadline_at)} beside the jobs already "
                f"guaranteed; {could()}. Resubmit with a later deadline "
                "(stride submit --deadline), soft_deadline: true, or none",
                POLICY,
                None,
                earliest_deadline=earliest_at,
                curve_source=source,
            )
        if deadline_at is not None and guaranteed:
            minimum = pool.minimum_shares(now).get(entry.job_id, 0)
            plan = pool.reservations(now).get(entry.job_id, ())
            finish = datetime.fromtimestamp(now + len(plan) * SLOT_SECONDS, UTC)
            finish = min(finish, deadline_at)
            return Decision(
                Outcome.ADMITTED,
                f"deadline {_iso(deadline_at)} guaranteed under the model "
                f"(curve from the {source}{': ' + basis if basis else ''}): at least "
                f"{minimum} {unit_name} now, "
                f"done by {_iso(finish)}; running on {entry.units}",
                POLICY,
                self._share(spec.kind, entry.curve, minimum),
                curve_source=source,
                guaranteed_finish=finish,
            )
        if deadline_at is not None:
            return Decision(
                Outcome.SOFT,
                f"soft deadline {_iso(deadline_at)} cannot be guaranteed ({could()}); "
                + (
                    f"runs best effort on {entry.units} {unit_name}"
                    if entry.units
                    else "waits for spare capacity, then runs best effort"
                ),
                POLICY,
                None,
                earliest_deadline=earliest_at,
                curve_source=source,
            )
        return Decision(
            Outcome.ADMITTED if entry.units else Outcome.QUEUED,
            (
                f"best effort (no deadline): runs on {entry.units} spare {unit_name}"
                if entry.units
                else "best effort (no deadline): waits for spare capacity"
            ),
            POLICY,
            None,
            curve_source=source,
        )

    def _share(self, kind: ResourceKind, curve: JobCurve, units: int, headroom: int = 0) -> Share:
        """What ``units`` of a kind are: GPUs, or CPU units' cores and memory (with the
        workers the job's profile runs at that size), and the ``headroom`` lent beside them."""
        if kind is ResourceKind.GPU:
            return Share(workers=units, cpu=0.0, memory_bytes=0, devices=units)
        size = curve.size_at(units)
        unit = self.cluster.unit
        held = units + headroom if units else 0
        return Share(
            workers=size.workers if size is not None and units else 0,
            cpu=held * unit.cpu,
            memory_bytes=held * unit.memory_bytes,
        )

    async def _publish_shares(
        self,
        session: Any,
        kind: ResourceKind,
        pool: Pool,
        changed: dict[str, int],
        reason: str,
        moment: datetime,
        decided: str = "",
        leading: Sequence[Outgoing] = (),
        announce: _Announcement | None = None,
    ) -> None:
        """Save the books of every job whose units changed and publish its new share; a
        queued job that got units is admitted (a decision of its own, carrying its share).
        ``leading``: events queued before the shares', in the same batch; ``announce``: the
        decision on ``decided``, queued right after them, carrying the job's new share."""
        now = moment.timestamp()
        minimum = pool.minimum_shares(now) if changed else {}
        states = await repository.job_states(session, [j for j in changed if j != decided])
        books: list[repository.Books] = []
        events = list(leading)
        admitted: list[tuple[str, Entry, job_pb2.JobShare]] = []
        preempted: list[tuple[str, Entry, str]] = []
        notes = pool.notes
        floors = await _Floors.read(session, kind, list(changed))
        for job_id in changed:
            entry = pool.entries.get(job_id)
            if entry is None:
                continue
            version = self._versions.get(job_id, 0) + 1
            why = f"{notes[job_id]} ({reason})" if job_id in notes else reason
            share = self._share_event(kind, pool, entry, version, minimum, why, moment)
            floors.raise_share(share, entry)
            books.append(
                repository.Books(
                    job_id=job_id,
                    kind=kind.value,
                    deadline=entry.deadline,
                    submitted=entry.submitted,
                    total_steps=entry.total_steps,
                    remaining=entry.remaining,
                    units=entry.units,
                    paused_until=entry.paused_until,
                    last_update=entry.last_update,
                    share=share,
                    waiting_since=entry.waiting_since,
                    curve=curve_to_json(entry.curve),
                )
            )
            events.append(topics.JOB_SHARE.outgoing(job_id, share, f"{job_id}.share.{version}"))
            if announce is not None and job_id == decided:
                announce.decision.share.CopyFrom(share)
            if states.get(job_id) == "QUEUED" and entry.units:
                admitted.append((job_id, entry, share))
            elif states.get(job_id) == "ADMITTED" and not entry.units and job_id not in minimum:
                # It runs no more: back to the queue, told why (its pods checkpoint and go).
                preempted.append(
                    (job_id, entry, notes.get(job_id, f"its units went to other jobs ({reason})"))
                )
        if announce is not None:
            events.insert(len(leading), announce.event())
        await repository.save_books_many(session, books)
        await self.outbox.add_events(session, events)
        for entry_books in books:
            self._versions[entry_books.job_id] = entry_books.share.version
        for job_id, entry, share in admitted:
            await self._admit_queued(session, job_id, entry, kind, reason, moment, share)
        for job_id, entry, note in preempted:
            await self._requeue(session, job_id, entry, note, moment)

    def _share_event(
        self,
        kind: ResourceKind,
        pool: Pool,
        entry: Entry,
        version: int,
        minimum: Mapping[str, int],
        why: str,
        moment: datetime,
    ) -> job_pb2.JobShare:
        """A job's share as the round left it: its units, the headroom lent and the units a
        granted request holds, its reservation, and for GPUs where its devices are."""
        job_id = entry.job_id
        headroom, granted = pool.headroom.get(job_id, 0), pool.granted.get(job_id, 0)
        share = job_pb2.JobShare(
            job_id=job_id,
            version=version,
            share=share_to_proto(self._share(kind, entry.curve, entry.units, headroom + granted)),
            headroom_units=headroom,
            granted_units=granted,
            minimum=share_to_proto(self._share(kind, entry.curve, minimum.get(job_id, 0))),
            units=entry.units,
            guaranteed=job_id in minimum,
            reason=why,
            decided_at=timestamp(moment),
        )
        tree = self._trees.get(kind)
        if tree is not None:
            for node, index in tree.where(pool.devices(job_id)):
                share.gpus.add(node=node, index=index)
        return share

    async def _requeue(
        self, session: Any, job_id: str, entry: Entry, note: str, moment: datetime
    ) -> None:
        """A running job left without units (preempted for a higher class, or its units
        went to others) goes back to the queue, told why; it is admitted again (``capacity
        freed``) when a round gives it units."""
        decision = Decision(
            Outcome.QUEUED,
            f"{note}: waits for capacity, then resumes from its newest checkpoint",
            POLICY,
            None,
            curve_source=entry.curve.source,
        )
        await self._further(session, job_id, "ADMITTED", decision, "QUEUED", "queued", moment)

    async def _admit_queued(
        self,
        session: Any,
        job_id: str,
        entry: Entry,
        kind: ResourceKind,
        reason: str,
        moment: datetime,
        share: job_pb2.JobShare,
    ) -> None:
        """A queued job a round gave units is admitted, told why, with its ``share``."""
        unit_name = "GPUs" if kind is ResourceKind.GPU else "CPU units"
        decision = Decision(
            Outcome.ADMITTED,
            f"capacity freed ({reason}): runs on {entry.units} {unit_name}"
            + (" (best effort)" if entry.deadline is None else " (its deadline is guaranteed)"),
            POLICY,
            None,
            curve_source=entry.curve.source,
        )
        await self._further(
            session, job_id, "QUEUED", decision, "ADMITTED", "admitted", moment, share
        )

    async def _further(
        self,
        session: Any,
        job_id: str,
        expected: str,
        decision: Decision,
        state: str,
        topic: str,
        moment: datetime,
        share: job_pb2.JobShare | None = None,
    ) -> None:
        """Record one more decision on a job in state ``expected`` (else nothing: a later
        decision got there first), move it to ``state`` and announce it on ``topic``
        (``stride.jobs.v1.<topic>``), numbered after its earlier decisions, with the share
        it comes with if any."""
        job = await repository.get_job(session, job_id, for_update=True)
        if job is None or job.state != expected:
            return
        message = decision_to_proto(job_id, decision, job.spec, moment)
        if share is not None:
            message.share.CopyFrom(share)
        number = await repository.decision_count(session, job_id) + 1
        await repository.record_decision(session, message, state, moment)
        await self.outbox.add_event(
            session,
            topics.DECISION_TOPICS[topic].outgoing(job_id, message, f"{job_id}.decision.{number}"),
        )

    def _schedule(self, kind: ResourceKind, pool: Pool) -> None:
        """Arm a round at the pool's wakeup (the policy's next slot boundary), unless one is
        armed earlier: as in the simulator, a later wakeup never cancels an earlier one."""
        wakeup = pool.wakeup
        armed = self._timers.get(kind)
        if wakeup is None or (armed is not None and armed[0] <= wakeup):
            return
        if armed is not None and armed[1] is not None:
            armed[1].cancel()
        if self.stepped is not None:  # run by advance() when the clock passes it
            self._timers[kind] = (wakeup, None)
            return
        delay = max(0.0, wakeup - self.clock().timestamp()) / self.speedup
        handle = asyncio.get_running_loop().call_later(delay, self._start_tick, kind)
        self._timers[kind] = (wakeup, handle)

    def _start_tick(self, kind: ResourceKind) -> None:
        self._timers.pop(kind, None)
        task = asyncio.get_running_loop().create_task(self.tick(kind))
        self._ticks.add(task)
        task.add_done_callback(self._ticks.discard)

    async def tick(self, kind: ResourceKind) -> None:
        """A round with no arrival or end: a guaranteed job's reservation grew at a slot
        boundary (:meth:`GuaranteePolicy.wakeup`); shares that change are published."""
        try:
            async with self._changing():
                pool = self._pools.get(kind)
                if pool is None:
                    return
                async with self.database.transaction() as session:
                    moment = self.clock()
                    changed = pool.round(moment.timestamp())
                    await self._publish_shares(
                        session, kind, pool, changed, "next slot of a reservation", moment
                    )
        except Exception:
            log.exception("admission round at a slot boundary failed", kind=kind.value)
            return
        self.outbox.notify()
        self._schedule(kind, pool)

    async def advance(self, target: float, inclusive: bool) -> tuple[float, float | None, int]:
        """Move the stepped clock to ``target`` (seconds after the epoch), running every round
        due before it (each at its own time; with ``inclusive`` those due then too), and
        return once their events are on the bus: the clock, the next round due (None:
        none) and the rounds run."""
        clock = self.stepped
        if clock is None:
            raise FailedPrecondition("the clock is the wall clock; only a stepped replay moves it")
        async with self._advancing:
            if target < clock.seconds:
                raise InvalidArgument(
                    "to",
                    f"{_iso(ExactMoment.of(target))} is before the clock ({_iso(clock.value)}); "
                    "it only moves on",
                )
            rounds = 0
            while True:
                due = [
                    (wakeup, kind.value, kind)
                    for kind, (wakeup, _) in self._timers.items()
                    if wakeup < target or (inclusive and wakeup <= target)
                ]
                if not due:
                    break
                wakeup, _, kind = min(due)
                self._timers.pop(kind)
                clock.seconds = max(clock.seconds, wakeup)
                await self.tick(kind)
                rounds += 1
            clock.seconds = target
            await self._drained()
            armed = [wakeup for wakeup, _ in self._timers.values()]
            return clock.seconds, min(armed) if armed else None, rounds

    async def _drained(self) -> None:
        """Wait until every event written so far has left the outbox for the bus."""
        patience = asyncio.get_running_loop().time() + DRAIN_SECONDS
        while True:
            async with self.database.sessions() as session:
                if not await repository.outbox_pending(session):
                    return
            if asyncio.get_running_loop().time() > patience:
                raise Unavailable(
                    f"the outbox did not reach the bus within {DRAIN_SECONDS:g} s; is NATS up?"
                )
            self.outbox.notify()
            await asyncio.sleep(0.002)

    def close(self) -> None:
        """Cancel pending rounds (at shutdown)."""
        for _, handle in self._timers.values():
            if handle is not None:
                handle.cancel()
        self._timers.clear()
        for task in self._ticks:
            task.cancel()

    async def _pool(self, kind: ResourceKind) -> Pool:
        """The pool of a resource kind, rebuilt from storage the first time (and after a
        failed write)."""
        pool = self._pools.get(kind)
        if pool is not None:
            return pool
        capacity = self.cluster.gpus if kind is ResourceKind.GPU else self.cluster.cpu_units
        tree = self.cluster.tree if kind is ResourceKind.GPU else None
        async with self.database.sessions() as session:
            rows = await repository.active_ledger(session, kind.value)
            stored = (await repository.capacities(session)).get(kind.value)
        if stored is not None:  # the newest node inventory beats the start-up settings
            capacity = stored.capacity
            tree = _stored_tree(stored.tree) if kind is ResourceKind.GPU else None
        self._trees[kind] = tree
        pool = Pool(
            capacity,
            self.cluster.pause_seconds,
            tree.topology if tree else None,
            headroom=kind is ResourceKind.CPU,
        )
        for row in rows:
            curve = (
                curve_from_json(row.curve, self.cluster.unit)
                if row.curve
                else job_curve(spec_from_proto(row.spec), self.cluster.unit, self.cluster.curves)
            )
            if curve is None:
                log.warning("job has books but no curve now; left out", job_id=row.job_id)
                continue
            pool.entries[row.job_id] = Entry(
                row.job_id,
                curve,
                row.deadline,
                row.submitted,
                row.total_steps,
                row.remaining,
                row.units,
                row.paused_until,
                row.last_update,
                priority=_class(spec_from_proto(row.spec)),
                waiting_since=row.waiting_since,
            )
            self._versions[row.job_id] = row.share_version
            pool.clock = max(pool.clock, row.last_update)
            devices = _devices_of(row.share, tree)
            headroom = int(row.share.headroom_units) if row.share is not None else 0
            granted = int(row.share.granted_units) if row.share is not None else 0
            pool.published[row.job_id] = (row.units, devices, headroom + granted)
            if headroom:
                pool.headroom[row.job_id] = headroom
            pinned = row.share is not None and row.share.granted.cpu > 0 and row.deadline is None
            if pinned:  # a best-effort job a grant holds (ledger: granted units)
                pool.pinned[row.job_id] = row.units
            elif granted:
                pool.granted[row.job_id] = granted
            if pool.placements is not None and devices and len(devices) == row.units:
                pool.placements.placed[row.job_id] = devices
        self._pools[kind] = pool
        if rows:
            log.info("pool rebuilt from storage", kind=kind.value, jobs=len(pool.entries))
        return pool

    async def _release(
        self, session: Any, job: StoredJob, reason: str, moment: datetime
    ) -> tuple[ResourceKind, Pool] | None:
        """Take an ended job out of its pool and re-decide the others' shares; the pool it
        left, if it was in one."""
        kind = spec_from_proto(job.spec).kind
        pool = await self._pool(kind)
        await repository.forget_requests(session, job.job_id)
        freed = self.capacity_freed if kind is ResourceKind.CPU else None
        if job.job_id not in pool.entries:
            if freed is not None:  # a job without a share held its plan all the same
                await freed(session, pool, reason, moment)
            return None
        now = moment.timestamp()
        pool.leave(now, job.job_id)
        self._versions.pop(job.job_id, None)
        changed = pool.round(now)
        await self._publish_shares(session, kind, pool, changed, reason, moment)
        if freed is not None:
            await freed(session, pool, reason, moment)
        return kind, pool

    async def inventory(self, event: cluster_pb2.NodeInventory) -> None:
        """The podwatcher's node inventory: the cluster's capacity from now on.

        Each kind's pool is resized and re-decided when its capacity changed; a job whose
        guarantee a node loss took away is told in a decision of its own (outcome SOFT: it
        runs best effort, and the reason names the capacity), and so is a job that is
        guaranteed again when nodes come back. An inventory older than the newest one seen
        changes nothing (redelivery, or a late message from before a drain).
        """
        seen = inventory_from_proto(event)
        totals = {
            ResourceKind.GPU: seen.gpus,
            ResourceKind.CPU: cpu_capacity(seen.cpu, seen.memory_bytes, self.cluster.unit),
        }
        resized: list[tuple[ResourceKind, Pool]] = []
        async with self._changing():
            pools = {kind: await self._pool(kind) for kind in totals}
            moment = self.clock()
            async with self.database.transaction() as session:
                stored = await repository.capacities(session)
                if any(seen.observed_at <= row.observed_at for row in stored.values()):
                    log.info("stale node inventory ignored", reason=seen.reason)
                    return
                tree = GpuTree.from_nodes(seen.gpu_nodes)
                for kind, units in totals.items():
                    kind_tree = tree if kind is ResourceKind.GPU else None
                    await repository.save_capacity(
                        session,
                        kind.value,
                        units,
                        seen.observed_at,
                        seen.reason,
                        kind_tree.to_text() if kind_tree is not None else None,
                    )
                    pool = pools[kind]
                    if pool.capacity != units or self._trees.get(kind) != kind_tree:
                        self._trees[kind] = kind_tree
                        await self._resize(
                            session, kind, pool, units, seen.reason, moment, kind_tree
                        )
                        resized.append((kind, pool))
        self.outbox.notify()
        for kind, pool in resized:
            self._schedule(kind, pool)
        log.info(
            "capacity from node inventory",
            nodes=seen.nodes,
            gpus=totals[ResourceKind.GPU],
            cpu_units=totals[ResourceKind.CPU],
            reason=seen.reason,
        )

    async def _resize(
        self,
        session: Any,
        kind: ResourceKind,
        pool: Pool,
        units: int,
        why: str,
        moment: datetime,
        tree: GpuTree | None = None,
    ) -> None:
        """Re-decide a pool on a new capacity (and GPU tree); tell jobs whose guarantee
        changed."""
        now = moment.timestamp()
        unit_name = "GPUs" if kind is ResourceKind.GPU else "CPU units"
        before = pool.guaranteed(now)
        old = pool.capacity
        pool.resize(now, units, tree.topology if tree is not None else None)
        changed = pool.round(now)
        after = pool.guaranteed(now)
        lost = sorted(job for job in before - after if job in pool.entries)
        regained = sorted(
            job
            for job in after - before
            if job in pool.entries and pool.entries[job].deadline is not None
        )
        for job_id in (*lost, *regained):
            changed.setdefault(job_id, pool.entries[job_id].units)
        reason = f"capacity {old} -> {units} {unit_name} ({why})"
        await self._publish_shares(session, kind, pool, changed, reason, moment)
        for job_id in lost:
            await self._tell(
                session,
                job_id,
                Outcome.SOFT,
                f"guarantee withdrawn: {reason} leaves too little to keep this job's deadline "
                "beside the jobs guaranteed before it; it runs best effort on "
                f"{pool.entries[job_id].units} {unit_name} and is guaranteed again if "
                "capacity returns in time",
                pool.entries[job_id],
                moment,
            )
        for job_id in regained:
            await self._tell(
                session,
                job_id,
                Outcome.ADMITTED,
                f"guaranteed again: {reason}; its deadline is kept under the model",
                pool.entries[job_id],
                moment,
            )
        if lost or regained:
            log.warning("guarantees changed with capacity", lost=lost, regained=regained)

    async def _tell(
        self,
        session: Any,
        job_id: str,
        outcome: Outcome,
        reason: str,
        entry: Entry,
        moment: datetime,
    ) -> None:
        """A further decision on an admitted job (its guarantee changed), announced as
        admitted with the new outcome."""
        decision = Decision(outcome, reason, POLICY, None, curve_source=entry.curve.source)
        await self._further(
            session, job_id, "ADMITTED", decision, "ADMITTED", outcome.value, moment
        )

    # --- quotas (ElasticFlow sec. 4.4: checked before the job is planned) -------------

    async def _all_quotas(self) -> tuple[Quota, ...]:
        """Every stored quota, read once and kept until one is set, removed or loaded
        (admission is the only writer of its quotas; a submission then reads none)."""
        if self._quotas is not None:
            return self._quotas
        generation = self._quota_generation
        async with self.database.sessions() as session:
            stored = tuple(await repository.all_quotas(session))
        if generation == self._quota_generation:  # no write committed meanwhile
            self._quotas = stored
        return stored

    def _quotas_changed(self) -> None:
        self._quotas = None
        self._quota_generation += 1

    async def _over_quota(self, user: str, job_id: str, moment: datetime) -> str | None:
        """Why the job breaks a quota that binds its user, or None."""
        binding = [q for q in await self._all_quotas() if q.binds(user)]
        if not binding:
            return None
        async with self.database.sessions() as session:
            for quota in binding:
                since = moment - timedelta(seconds=quota.window_seconds)
                times, active = await repository.scope_use(session, quota.users(), since, job_id)
                problem = violation(quota, moment.timestamp(), times, active)
                if problem is not None:
                    return (
                        f"over the quota of {quota.scope}: {problem}; resubmit when one of "
                        "its jobs ends (stride quota show " + quota.scope + ")"
                    )
        return None

    async def _use(self, session: Any, quota: Quota, moment: datetime) -> tuple[int, int]:
        since = moment - timedelta(seconds=quota.window_seconds)
        times, active = await repository.scope_use(session, quota.users(), since)
        return len(times), active

    async def set_quota(self, quota: Quota) -> tuple[Quota, int, int]:
        """Store a quota set through the API (it wins over the quotas file). The quota and
        the scope's submissions and active jobs.

        A quota below what the scope holds now is stored too: its admitted and queued jobs
        stay, and its next jobs are rejected, naming the quota and the use, until the use
        falls below it. That is how an admin clamps a user who floods (issue 37: refusing
        it left the admin no way to)."""
        moment = self.clock()
        async with self.database.transaction() as session:
            submissions, active = await self._use(session, quota, moment)
            await repository.put_quota(session, quota, moment)
        self._quotas_changed()
        below = (quota.max_active_jobs and active > quota.max_active_jobs) or (
            quota.max_submissions and submissions > quota.max_submissions
        )
        log.info(
            "quota set",
            scope=quota.scope,
            source=quota.source,
            active_jobs=active,
            submissions=submissions,
            below_use=bool(below),
        )
        return quota, submissions, active

    async def quota(self, scope: str) -> tuple[Quota, int, int]:
        """A scope's quota and its use; NotFound if it has none."""
        check_scope(scope)
        async with self.database.sessions() as session:
            quota = await repository.get_quota(session, scope)
            if quota is None:
                raise NotFound(f"no quota for {scope!r}")
            return (quota, *await self._use(session, quota, self.clock()))

    async def quotas(self) -> list[tuple[Quota, int, int]]:
        """Every quota with its use."""
        moment = self.clock()
        async with self.database.sessions() as session:
            return [
                (quota, *await self._use(session, quota, moment))
                for quota in await repository.all_quotas(session)
            ]

    async def revoke_tokens(
        self, *, token_id: str, user: str, reason: str, revoked_by: str
    ) -> auth_pb2.TokenRevocation:
        """Revoke one token (``token_id``) or every token of ``user`` issued until now.
        Stored with the outbox and answered once it is on the bus, from where every server
        follows it."""
        revocation, event = _revocation(
            token_id=token_id, user=user, revoked_by=revoked_by, reason=reason
        )
        async with self.database.transaction() as session:
            await self.outbox.add_event(session, event)
        self.outbox.notify()
        await self._drained()
        log.info("tokens revoked", token_id=token_id or None, user=user or None, by=revoked_by)
        return revocation

    async def delete_quota(self, scope: str) -> None:
        """Remove a scope's quota (none: no-op)."""
        check_scope(scope)
        async with self.database.transaction() as session:
            await repository.delete_quota(session, scope)
        self._quotas_changed()
        log.info("quota removed", scope=scope)

    async def load_quotas(self, configured: tuple[Quota, ...]) -> None:
        """The quotas file's quotas replace the file's earlier ones; a scope set through
        the API keeps its quota."""
        moment = self.clock()
        async with self.database.transaction() as session:
            stored = {q.scope: q for q in await repository.all_quotas(session)}
            names = {q.scope for q in configured}
            for scope, quota in stored.items():
                if quota.source == "config" and scope not in names:
                    await repository.delete_quota(session, scope)
            for quota in configured:
                kept = stored.get(quota.scope)
                if kept is not None and kept.source == "api":
                    log.info("quota set through the API kept over the file's", scope=quota.scope)
                    continue
                await repository.put_quota(session, quota, moment)
        self._quotas_changed()
        if configured:
            log.info("quotas loaded from the quotas file", count=len(configured))

    async def resume(self) -> None:
        """On start: rebuild the pools that hold jobs from storage and arm their next
        slot-boundary rounds (a crash lost the timers)."""
        async with self._changing():
            for kind in ResourceKind:
                pool = await self._pool(kind)
                if self.stepped is not None and pool.clock > self.stepped.seconds:
                    # A stepped clock restarts where its books stopped, not at its origin.
                    self.stepped.seconds = pool.clock
                if pool.entries:
                    pool.recover(self.clock().timestamp())
                    self._schedule(kind, pool)

    async def decide_pending(self) -> int:
        """Decide every job a crash left undecided; returns how many."""
        async with self.database.sessions() as session:
            pending = await repository.undecided_job_ids(session)
        for job_id in pending:
            await self.decide(job_id)
        if pending:
            log.info("decided jobs left pending", count=len(pending))
        return len(pending)

    async def get(self, job_id: str) -> StoredJob:
        """One job, or NotFound."""
        if not job_id:
            raise InvalidArgument("job_id", "is required")
        async with self.database.sessions() as session:
            job = await repository.get_job(session, job_id)
        if job is None:
            raise NotFound(f"job {job_id!r} not found")
        return job

    async def list(self, user: str, page_size: int) -> list[StoredJob]:
        """Jobs newest first."""
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument("page_size", f"must be between 0 and 1000, got {page_size}")
        async with self.database.sessions() as session:
            return await repository.list_jobs(session, user or None, page_size or 100)

    async def cancel(self, job_id: str) -> StoredJob:
        """Cancel a job (no-op if it already ended), free its share and publish that it
        finished."""
        await self.get(job_id)
        await self._ended(job_id, "CANCELLED", "cancelled by user", True)
        log.info("job cancelled", job_id=job_id)
        return await self.get(job_id)

    async def _ended(self, job_id: str, state: str, message: str, announce: bool) -> None:
        async with self._changing():
            released = await self._end(job_id, state, message, announce)
        self.outbox.notify()
        if released is not None:
            self._schedule(*released)

    async def _end(
        self, job_id: str, state: str, message: str, announce: bool
    ) -> tuple[ResourceKind, Pool] | None:
        moment = self.clock()
        async with self.database.transaction() as session:
            job = await repository.get_job(session, job_id, for_update=True)
            if job is None or job.state in repository.TERMINAL_STATES:
                return None
            await repository.set_state(session, job_id, state, moment)
            released = await self._release(session, job, f"{job_id} {state.lower()}", moment)
            await self.outbox.add_event(session, _job_tokens_revoked(job_id, state))
            if announce:
                event = job_pb2.JobFinished(
                    job_id=job_id,
                    outcome=job_pb2.JOB_OUTCOME_CANCELLED,
                    message=message,
                    finished_at=timestamp(moment),
                )
                await self.outbox.add_event(
                    session, topics.JOB_FINISHED.outgoing(job_id, event, f"{job_id}.finished")
                )
        return released

    async def finished(self, event: job_pb2.JobFinished) -> None:
        """Record that a job ended (from the bus) and free its share; idempotent, and a
        terminal state sticks."""
        if not event.job_id:
            raise InvalidArgument("job_id", "is required")
        state = _STATE_BY_JOB_OUTCOME.get(event.outcome)
        if state is None:
            raise InvalidArgument("outcome", f"unknown job outcome {event.outcome}")
        await self._ended(event.job_id, state, event.message, False)


def _exhausted(refusal: Refusal) -> ResourceExhausted:
    return ResourceExhausted(f"{refusal.field}: {refusal.problem}")


def _job_tokens_revoked(job_id: str, state: str) -> Outgoing:
    """The revocation of an ended job's job tokens: a pod's token, copied anywhere, opens
    none of the job's data any more."""
    return _revocation(
        job_id=job_id, revoked_by="admission", reason=f"the job ended ({state.lower()})"
    )[1]


def _revocation(
    *, token_id: str = "", user: str = "", job_id: str = "", revoked_by: str, reason: str
) -> tuple[auth_pb2.TokenRevocation, Outgoing]:
    """A revocation of one token, or of a user's or a job's tokens minted until now (wall
    time, as tokens are stamped, whatever the replay clock says), and its event."""
    stamp = int(time.time() * 1e9)
    revocation = auth_pb2.TokenRevocation(
        token_id=token_id, user=user, job_id=job_id, revoked_by=revoked_by, reason=reason
    )
    revocation.revoked_at.FromNanoseconds(stamp)
    if user or job_id:
        revocation.issued_before.FromNanoseconds(stamp)
    if token_id:
        key = topics.revoked_token_key(token_id)
    elif user:
        key = topics.revoked_user_key(user)
    else:
        key = topics.revoked_job_key(job_id)
    return revocation, topics.TOKEN_REVOKED.outgoing(key, revocation, f"{key}.{stamp}")


def _stored_tree(text: str | None) -> GpuTree | None:
    """The GPU tree stored beside the capacity (None: counted GPUs, or unreadable)."""
    if not text:
        return None
    try:
        return GpuTree.from_text(text)
    except TreeError as error:
        log.warning("stored GPU tree unreadable; GPUs are counted", error=str(error))
        return None


def _devices_of(share: job_pb2.JobShare | None, tree: GpuTree | None) -> tuple[int, ...]:
    """A stored share's GPUs as device indexes on ``tree`` (empty if any is not on it)."""
    if share is None or tree is None or not share.gpus:
        return ()
    position = {name: n for n, name in enumerate(tree.nodes)}
    per_node = tree.fanouts[2]
    devices = []
    for gpu in share.gpus:
        node = position.get(gpu.node)
        if node is None or not 0 <= gpu.index < per_node:
            return ()
        devices.append(node * per_node + gpu.index)
    return tuple(devices)


def _class(spec: JobSpec) -> int:
    """The spec's priority as a class number (:mod:`stride.policy.elasticflow.priorities`)."""
    return {Priority.LOW: LOW, Priority.NORMAL: NORMAL, Priority.HIGH: HIGH}[spec.priority_level]


def _without_curve(spec: JobSpec) -> Decision:
    """The decision on a job no curve is known for: nothing can be guaranteed."""
    what = f"no scaling curve is known for model {spec.model.name!r}"
    if spec.kind is ResourceKind.GPU:
        what += f" at batch size {spec.batch_size}"
    fix = "declare its speed at a few sizes under `profile:` in the spec"
    deadline_at = spec.deadline_at
    if deadline_at is not None and not spec.soft_deadline:
        return Decision(
            Outcome.REJECTED,
            f"cannot guarantee the deadline {_iso(deadline_at)}: {what}; {fix}, or submit "
            "it with soft_deadline: true or without a deadline",
            POLICY,
            None,
        )
    if deadline_at is not None:
        return Decision(
            Outcome.SOFT,
            f"soft deadline {_iso(deadline_at)} cannot be guaranteed: {what}; runs best "
            "effort, sized by the optimizer",
            POLICY,
            None,
        )
    return Decision(
        Outcome.ADMITTED,
        f"best effort (no deadline); {what}, so it holds no share and the optimizer sizes it",
        POLICY,
        None,
    )


def _iso(moment: datetime | None) -> str:
    if moment is None:
        return "never"
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
