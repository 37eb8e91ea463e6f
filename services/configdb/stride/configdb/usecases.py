"""Configdb's use cases: record what happens to jobs, and answer questions about them.

Jobs are heard of through three independent durable consumers (submitted, plans,
finished), so their events arrive in any order. Two more (step metrics, pod usage) store
the measurements each job's runtime profile is built from
(:mod:`stride.configdb.domain.profiles`). Whichever comes first creates the job's
record; a plan or finish that beats the submitted event leaves a placeholder without a
spec, which the submitted event completes. Each handler is idempotent: a redelivered or
duplicated event finds its effect already stored and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

import structlog

from stride.bus.client import PermanentError
from stride.configdb.adapters.convert import OUTCOME_FROM_PROTO, features_from_spec, moment
from stride.configdb.adapters.outbound import repository
from stride.configdb.adapters.outbound.repository import StoredRecord
from stride.configdb.domain.features import JobFeatures
from stride.configdb.domain.profiles import StepWindow, UsageSample, check_sample, check_window
from stride.configdb.domain.similarity import PastJob, rank_similar
from stride.db.engine import Database, Session
from stride.events.v1 import job_pb2, plan_pb2
from stride.runtime.errors import InvalidArgument, NotFound
from stride.vocabulary import check_job_id

log = structlog.get_logger(__name__)

HISTORY_TTL_SECONDS = 5.0
"""How long the warm-start candidates read for one similarity query serve the next ones
(:meth:`JobHistory._candidates`)."""


def _check_job_id(job_id: str) -> None:
    check_job_id(job_id, raise_as=InvalidArgument)


After = Callable[[], None]
"""What a step does once its transaction committed (logs, the candidates' cache)."""
Outcomes = list[Exception | None]
E = TypeVar("E", job_pb2.JobSubmitted, plan_pb2.ResourcePlan, job_pb2.JobFinished)
Step = Callable[[Session, E], Awaitable[After]]
BatchStep = Callable[[Session, Sequence[E]], Awaitable[tuple[Outcomes, list[After]]]]


def _nothing() -> None:
    return None


def _job_of(event: job_pb2.JobSubmitted | plan_pb2.ResourcePlan | job_pb2.JobFinished) -> str:
    return event.job_id


class JobHistory:
    """Records jobs' specs, plans and outcomes, and finds similar past jobs."""

    def __init__(
        self,
        database: Database,
        warm_start_candidates: int,
        history_ttl_seconds: float = HISTORY_TTL_SECONDS,
    ) -> None:
        self.database = database
        self.warm_start_candidates = warm_start_candidates
        self.history_ttl_seconds = history_ttl_seconds
        self._history: tuple[float, list[PastJob]] | None = None
        """The warm-start candidates last read, and when (monotonic); None: read next time."""
        self._history_generation = 0
        """Counts recorded outcomes, so a read that raced one is not kept."""

    async def submitted_all(self, events: Sequence[job_pb2.JobSubmitted]) -> Outcomes:
        """Record submitted jobs' specs and features (completing placeholders), a fetched
        batch in one transaction of a few statements (:meth:`_batched`)."""
        return await self._batched(self._submitted_batch, events)

    async def plans_made(self, plans: Sequence[plan_pb2.ResourcePlan]) -> Outcomes:
        """Append plan versions to their jobs' records (the same version twice is stored
        once), a fetched batch in one transaction of a few statements (:meth:`_batched`)."""
        return await self._batched(self._plans_batch, plans)

    async def finished(self, event: job_pb2.JobFinished) -> None:
        """Record how and when a job ended; the first outcome sticks."""
        await self._alone(self._finished, event)

    async def finished_all(self, events: Sequence[job_pb2.JobFinished]) -> Outcomes:
        """:meth:`finished` for a fetched batch, in one transaction (:meth:`_together`)."""
        return await self._together(self._finished, events)

    async def _alone(self, step: Step[E], event: E) -> None:
        async with self.database.transaction() as session:
            after = await step(session, event)
        after()

    async def _together(self, step: Step[E], events: Sequence[E]) -> Outcomes:
        """Apply ``events`` in one transaction, in order of job (so two batches lock the
        same records in the same order); per event, None or the error it met.

        Each submission makes three events here (submitted, admitted's plan, finished),
        and a transaction each was most of configdb's work under a stream of submissions
        (``bench/submit_load.py``). If the batch fails, each event is applied alone, so a
        bad one fails alone with the error it would have met alone (dead-lettered or
        retried by the bus) and the others are stored."""
        if len(events) > 1:
            order = sorted(range(len(events)), key=lambda index: _job_of(events[index]))
            try:
                afters = []
                async with self.database.transaction() as session:
                    for index in order:
                        afters.append(await step(session, events[index]))
            except Exception as error:
                log.info("batch not stored together; one event at a time", why=str(error)[:200])
            else:
                for after in afters:
                    after()
                return [None] * len(events)
        outcomes: list[Exception | None] = []
        for event in events:
            try:
                await self._alone(step, event)
            except Exception as error:
                outcomes.append(error)
            else:
                outcomes.append(None)
        return outcomes

    async def _batched(self, batch_step: BatchStep[E], events: Sequence[E]) -> Outcomes:
        """Apply ``events`` with ``batch_step``: a few statements for the whole batch in one
        transaction, instead of a few per event (those were most of configdb's work under a
        stream of submissions, ``bench/submit_load.py``). An event the batch step refuses
        (invalid, or a conflict) fails alone without failing the batch; if the transaction
        fails, each event is applied alone, so a bad one fails alone with the error it would
        have met alone (dead-lettered or retried by the bus) and the others are stored."""
        try:
            async with self.database.transaction() as session:
                outcomes, afters = await batch_step(session, events)
        except Exception as error:
            if len(events) <= 1:
                return [error for _ in events]
            log.info("batch not stored together; one event at a time", why=str(error)[:200])
            outcomes = []
            for event in events:
                (outcome,) = await self._batched(batch_step, [event])
                outcomes.append(outcome)
            return outcomes
        for after in afters:
            after()
        return outcomes

    async def _submitted_batch(
        self, session: Session, events: Sequence[job_pb2.JobSubmitted]
    ) -> tuple[Outcomes, list[After]]:
        """Store what the batch's submitted events say, in a few statements."""
        outcomes: Outcomes = [None] * len(events)
        ready: list[tuple[job_pb2.JobSubmitted, JobFeatures]] = []
        for index, event in enumerate(events):
            try:
                _check_job_id(event.job_id)
                if not event.HasField("spec"):
                    raise InvalidArgument("spec", "is required")
                ready.append((event, features_from_spec(event.spec)))
            except InvalidArgument as error:
                outcomes[index] = error
        if not ready:
            return outcomes, []
        now = datetime.now(UTC)
        held = await repository.ensure_records(session, [e.job_id for e, _ in ready], now)
        specs = {
            job_id: job_pb2.JobSpec.FromString(record.spec)
            for job_id, record in held.items()
            if record.spec is not None
        }
        completions: list[repository.Completion] = []
        afters: list[After] = []
        for event, features in ready:
            existing = specs.get(event.job_id)
            if existing is not None:
                if existing != event.spec:
                    log.warning(
                        "conflicting submitted event ignored; first spec kept", job_id=event.job_id
                    )
                continue
            specs[event.job_id] = event.spec
            # Submission time orders the history; without it the record keeps the time
            # configdb first heard of the job.
            recorded_at = moment(event.submitted_at) if event.HasField("submitted_at") else None
            completions.append(
                repository.Completion(event.job_id, event.spec, features, recorded_at)
            )
            afters.append(self._recorded(event.job_id, features, held[event.job_id]))
        await repository.complete_records(session, completions, now)
        return outcomes, afters

    def _recorded(self, job_id: str, features: JobFeatures, held: repository.HeldRecord) -> After:
        def after() -> None:
            if held.ended:  # its spec came after its outcome: it may be a candidate now
                self._history_changed()
            log.info(
                "job recorded",
                job_id=job_id,
                model=features.model_name,
                completed_placeholder=not held.created,
            )

        return after

    async def _plans_batch(
        self, session: Session, plans: Sequence[plan_pb2.ResourcePlan]
    ) -> tuple[Outcomes, list[After]]:
        """Store the batch's plans, in a few statements."""
        outcomes: Outcomes = [None] * len(plans)
        ready: dict[tuple[str, int], plan_pb2.ResourcePlan] = {}
        for index, plan in enumerate(plans):
            try:
                _check_job_id(plan.job_id)
                if plan.version < 1:
                    raise InvalidArgument("version", f"must be at least 1, got {plan.version}")
            except InvalidArgument as error:
                outcomes[index] = error
            else:
                ready.setdefault((plan.job_id, plan.version), plan)
        if not ready:
            return outcomes, []
        now = datetime.now(UTC)
        records = await repository.ensure_records(session, [job for job, _ in ready], now)
        before = await repository.insert_plans(session, list(ready.values()), now)
        afters: list[After] = []
        for index, plan in enumerate(plans):
            key = (plan.job_id, plan.version)
            if outcomes[index] is not None:
                continue
            held = before[key] if key in before else ready[key]
            if held != plan:
                # A producer reused a version for a different plan: keep the history
                # truthful and make the conflict visible on the dead-letter stream.
                outcomes[index] = PermanentError(
                    f"plan version {plan.version} of job {plan.job_id} is already recorded "
                    "with different contents"
                )
            elif key not in before and ready[key] is plan:
                afters.append(self._plan_recorded(plan, records[plan.job_id]))
        return outcomes, afters

    def _plan_recorded(self, plan: plan_pb2.ResourcePlan, held: repository.HeldRecord) -> After:
        def after() -> None:
            if held.ended:  # a plan after the outcome: it may be a candidate now
                self._history_changed()
            log.info(
                "plan recorded", job_id=plan.job_id, version=plan.version, placeholder=held.created
            )

        return after

    async def _finished(self, session: Session, event: job_pb2.JobFinished) -> After:
        _check_job_id(event.job_id)
        outcome = OUTCOME_FROM_PROTO.get(event.outcome)
        if outcome is None:
            raise InvalidArgument("outcome", f"unknown job outcome {event.outcome}")
        now = datetime.now(UTC)
        finished_at = moment(event.finished_at) if event.HasField("finished_at") else now
        await repository.ensure_records(session, [event.job_id], now)
        existing = await repository.stored_outcome(session, event.job_id)
        if existing is not None:
            if existing is not outcome:
                log.warning(
                    "conflicting finished event ignored; first outcome kept",
                    job_id=event.job_id,
                    kept=existing.value,
                    got=outcome.value,
                )
            return _nothing
        await repository.record_outcome(session, event.job_id, outcome, finished_at, now)

        def after() -> None:
            self._history_changed()  # a new candidate, or one that now ranks first
            log.info("job outcome recorded", job_id=event.job_id, outcome=outcome.value)

        return after

    async def measured(
        self, batch: Sequence[tuple[StepWindow, datetime] | tuple[UsageSample, datetime]]
    ) -> list[Exception | None]:
        """Store a batch of step windows and usage samples in one transaction (each once,
        however often it is delivered); per item, None or the InvalidArgument naming why it
        cannot be stored (the bus dead-letters it; the others are stored)."""
        outcomes: list[Exception | None] = [None] * len(batch)
        valid = []
        for index, (item, at) in enumerate(batch):
            try:
                if isinstance(item, StepWindow):
                    check_window(item)
                else:
                    check_sample(item)
            except InvalidArgument as error:
                outcomes[index] = error
                continue
            valid.append((item, at))
        if valid:
            windows = [(item, at) for item, at in valid if isinstance(item, StepWindow)]
            samples = [(item, at) for item, at in valid if isinstance(item, UsageSample)]
            async with self.database.transaction() as session:
                await repository.insert_measurements(session, windows, samples)
        return outcomes

    async def get(self, job_id: str) -> StoredRecord:
        """One job's record, or NotFound."""
        _check_job_id(job_id)
        async with self.database.sessions() as session:
            record = await repository.get_record(session, job_id)
        if record is None:
            raise NotFound(f"job {job_id!r} not found")
        return record

    async def recent(self, page_size: int) -> list[StoredRecord]:
        """Records newest first; ``page_size`` 0 means 100."""
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument("page_size", f"must be between 0 and 1000, got {page_size}")
        async with self.database.sessions() as session:
            return await repository.list_records(session, page_size or 100)

    async def find_similar(self, spec: job_pb2.JobSpec, k: int) -> list[tuple[StoredRecord, float]]:
        """The ``k`` finished, succeeded jobs most similar to ``spec``, most similar first."""
        if k < 1 or k > 100:
            raise InvalidArgument("k", f"must be between 1 and 100, got {k}")
        query = features_from_spec(spec)  # the job-spec rules, on the values given
        if query.is_empty:
            raise InvalidArgument(
                "spec", "has no features to compare; set model.name, dataset or batch_size"
            )
        history = await self._candidates()
        if not history:
            return []
        # Ranking is CPU work over up to the whole candidate window: keep it off the loop.
        matches = await asyncio.to_thread(rank_similar, query, history, k)
        async with self.database.sessions() as session:
            records = await repository.get_records(session, [match.job_id for match in matches])
        return [
            (records[match.job_id], match.similarity)
            for match in matches
            if match.job_id in records
        ]

    def _history_changed(self) -> None:
        """A write here may have changed the warm-start candidates: read them anew."""
        self._history = None
        self._history_generation += 1

    async def _candidates(self) -> list[PastJob]:
        """The warm-start candidates, read at most once per ``history_ttl_seconds`` and
        again after an outcome is recorded here. Every submission asks for similar jobs
        (admission for a CPU job's curve, the optimizer for its first plan) and the read
        covers up to ``warm_start_candidates`` rows, while the candidates change only when
        a job ends (or, events out of order, when its spec or a plan comes after its
        outcome). The time limit bounds how late a candidate shows whose outcome another
        replica recorded."""
        loop = asyncio.get_running_loop()
        kept = self._history
        if kept is not None and loop.time() - kept[0] < self.history_ttl_seconds:
            return kept[1]
        generation, read_at = self._history_generation, loop.time()
        async with self.database.sessions() as session:
            history = await repository.warm_start_history(session, self.warm_start_candidates)
        if generation == self._history_generation:
            self._history = (read_at, history)
        return history
