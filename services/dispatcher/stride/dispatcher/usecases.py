"""The dispatcher's use cases: create datasets, register workers, hand out and take back shards.

Every call is one database transaction (on SQLite the hot calls share one with the calls
queued beside them: group commit, see :mod:`stride.dispatcher.adapters.outbound.fastpath`)
that applies the domain's transitions (:mod:`stride.dispatcher.domain.queue`) to the rows it
locked, and queues the events the change causes in the outbox in that same transaction.
A call is answered only after that transaction committed. Nothing lives only in memory, so a
dispatcher killed at any point restarts into a consistent queue: a shard handed out in a
committed call stays DOING for its worker, and one whose call did not commit is still TODO.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import statistics
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import structlog
import tenacity

from stride.bus import topics
from stride.db.engine import ConflictingWrite, Database, Session
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.convert import (
    SnapshotContent,
    decode_snapshot,
    encode_snapshot,
    shard_progress,
    shards_done,
    shards_done_id,
    straggler_detected,
)
from stride.dispatcher.adapters.outbound import repository
from stride.dispatcher.adapters.outbound.fastpath import FastPath, SlowPath
from stride.dispatcher.adapters.outbound.repository import StoredDataset, WorkerRate, WorkerShards
from stride.dispatcher.domain import queue, sharding, steps
from stride.dispatcher.domain.datasets import (
    SPLIT_ID_BASE,
    DatasetLimits,
    DatasetParameters,
    ShardingKind,
    check_dataset,
    check_dataset_count,
    check_job_id,
    check_worker,
    validate,
)
from stride.dispatcher.domain.queue import Grant, Holder, QueueCounts, ShardRecord, ShardState
from stride.dispatcher.domain.restoring import restored_queue
from stride.dispatcher.domain.sharding import ROWS_PER_WRITE, OrderNotReady, Shuffle
from stride.dispatcher.domain.stragglers import (
    decayed_rate,
    judge,
    judged_rate,
    straggler_shard_records,
)
from stride.runtime.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)

log = structlog.get_logger(__name__)
P = ParamSpec("P")
T = TypeVar("T")

CONTENTION_ATTEMPTS = 4
"""Times a general-path call runs its transaction while the database answers "busy" (SQLite's
write lock still held past the driver's 5 s busy timeout, a PostgreSQL deadlock, serialization
failure or lost connection) before it answers UNAVAILABLE. The transaction rolled back whole,
so running it again is safe; letting the error through answered INTERNAL, which clients do
not retry (issue 37: a SnapshotShards beside a long epoch cut crashed a chief)."""
CONTENTION_FIRST_DELAY = 0.05
"""Seconds before the first retry (with full jitter, doubling after each)."""
ORDER_ATTEMPTS = 3
"""Times a call that needs a big shuffled epoch's order computes it and runs again; more
would mean the order cache evicts orders as fast as they are computed."""


def _retried_on_contention(
    method: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Run ``method`` again while the database is busy (:data:`CONTENTION_ATTEMPTS`, with
    full-jitter exponential back-off), then answer UNAVAILABLE (retryable), never INTERNAL."""
    name = getattr(method, "__name__", "call")

    def note(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning("database busy; retrying", call=name, error=_busy_reason(error))

    @functools.wraps(method)
    async def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            async for attempt in tenacity.AsyncRetrying(
                stop=tenacity.stop_after_attempt(CONTENTION_ATTEMPTS),
                wait=tenacity.wait_random_exponential(multiplier=CONTENTION_FIRST_DELAY),
                retry=tenacity.retry_if_exception(repository.is_contention),
                before_sleep=note,
                reraise=True,
            ):
                with attempt:
                    return await method(*args, **kwargs)
        except Exception as error:
            if not repository.is_contention(error):
                raise
            raise Unavailable(
                f"database busy ({_busy_reason(error)}) after {CONTENTION_ATTEMPTS} attempts; retry"
            ) from error
        raise AssertionError("unreachable")  # pragma: no cover

    return retried


def _busy_reason(error: BaseException | None) -> str:
    return str(getattr(error, "orig", None) or error).splitlines()[0]


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Log the failure of a shielded call whose caller had gone (nobody else sees it)."""
    if not task.cancelled() and task.exception() is not None:
        log.info("a call finished after its caller left", error=str(task.exception()))


@dataclass(frozen=True)
class WorkerRef:
    """Who calls: a worker incarnation working on one dataset of a job."""

    job_id: str
    dataset: str
    worker: str
    incarnation: int

    def validate(self, path: str = "worker") -> None:
        """Raise InvalidArgument naming the first bad field."""
        check_job_id(self.job_id, f"{path}.job_id")
        check_dataset(self.dataset, f"{path}.dataset")
        check_worker(self.worker, f"{path}.worker")
        if self.incarnation <= 0:
            raise InvalidArgument(
                f"{path}.incarnation", "is required: the token RegisterWorker returned"
            )


MAX_SHARDS_PER_CALL = 64
"""Most shards one GetShard may lease, and most it may report done."""


@dataclass(frozen=True)
class DoneReport:
    """A finished shard reported with a GetShard: its id and the lease it came with."""

    shard_id: int
    lease: int | None = None


@dataclass(frozen=True)
class ShardGrant:
    """GetShard's answer: leased shards (the first, then ``more``), or why there are none."""

    shard: ShardRecord | None
    parameters: DatasetParameters
    why_none: Grant | None = None
    straggler: bool = False
    more: tuple[ShardRecord, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """A serialized shard snapshot and what it holds."""

    data: bytes
    snapshot_id: str
    done: int
    doing: int


@dataclass(frozen=True)
class DatasetState:
    """Queue sizes and per-worker progress of one dataset."""

    counts: QueueCounts
    workers: list[WorkerShards]
    consumed_step: int | None = None
    """Data-worker mode: the last step consumed (-1 before any); None for a dataset never
    read by steps."""


def _check_shard_id(shard_id: int, field: str = "shard_id") -> None:
    if shard_id < 0:
        raise InvalidArgument(field, f"must not be negative, got {shard_id}")


def _done_reports(
    done_shard_id: int | None, done_lease: int | None, done: Sequence[DoneReport]
) -> list[tuple[str, DoneReport]]:
    """The shards a GetShard reports done, checked, each with the request field that names
    it in an error: ``done_shard_id`` first, then ``done``."""
    if len(done) > MAX_SHARDS_PER_CALL:
        raise InvalidArgument(
            "done_shards", f"must hold at most {MAX_SHARDS_PER_CALL} shards, got {len(done)}"
        )
    reports: list[tuple[str, DoneReport]] = []
    if done_shard_id is not None:
        _check_shard_id(done_shard_id, "done_shard_id")
        reports.append(("done_shard_id", DoneReport(done_shard_id, done_lease)))
    for index, report in enumerate(done):
        field = f"done_shards[{index}].shard_id"
        _check_shard_id(report.shard_id, field)
        if report.lease is not None and report.lease < 0:
            raise InvalidArgument(
                f"done_shards[{index}].lease", f"must not be negative, got {report.lease}"
            )
        reports.append((field, report))
    # A shard named twice is reported once (a repeated done report is harmless).
    seen: set[int] = set()
    unique = []
    for field, report in reports:
        if report.shard_id not in seen:
            seen.add(report.shard_id)
            unique.append((field, report))
    return unique


def _snapshot_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class ShardDispatcher:
    """Dataset and shard-queue operations against the database and outbox."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        lease_duration: timedelta,
        rate_window: timedelta = timedelta(seconds=30),
        batch_timeout: timedelta = timedelta(seconds=30),
        fast: FastPath | None = None,
        steps_in_flight: int = steps.MAX_IN_FLIGHT,
        *,
        limits: DatasetLimits | None = None,
        rows_per_write: int = ROWS_PER_WRITE,
        shuffler: Executor | None = None,
    ) -> None:
        self.database = database
        self.limits = limits or DatasetLimits()
        """Per-job caps on datasets and on shards per epoch."""
        self.rows_per_write = rows_per_write
        """Shard rows the general path writes at a time (the fast path has its own)."""
        self.shuffler = shuffler
        """Where seeded shuffles run (a worker process: see ``sharding.Shuffle``); None: a
        thread."""
        self._orders: dict[tuple[str, tuple[int, int, int]], asyncio.Future[None]] = {}
        """Shuffles being computed off the event loop, so concurrent callers share one."""
        self.outbox = outbox
        self.lease_duration = lease_duration
        self.rate_window = rate_window
        """Time constant of the progress rates, and how long a new worker is not judged."""
        self.batch_timeout = batch_timeout
        """How long a data worker's batch may go unconsumed before it is dispatched again."""
        self.steps_in_flight = steps_in_flight
        """Most steps of a dataset dispatched and not consumed (the consumer's queue)."""
        self.fast = fast
        """The hot calls' single-hop path (see its module); None runs everything through the
        general path (tests of the general path alone)."""

    @_retried_on_contention
    async def create_dataset(
        self, job_id: str, dataset: str, parameters: DatasetParameters
    ) -> bool:
        """Store a dataset; True if created, False if it already exists identically."""
        check_job_id(job_id)
        check_dataset(dataset)
        validate(parameters, limits=self.limits)
        try:
            async with self.database.transaction() as session:
                existing = await repository.find_dataset(session, job_id, dataset)
                if existing is None:
                    count = await repository.count_datasets(session, job_id)
                    check_dataset_count(job_id, count, self.limits)
                    await repository.insert_dataset(
                        session, job_id, dataset, parameters, datetime.now(UTC)
                    )
        except ConflictingWrite:
            # A concurrent create of the same dataset won the insert; compare with it.
            async with self.database.sessions() as session:
                existing = await repository.find_dataset(session, job_id, dataset)
            if existing is None:
                raise
        if existing is None:
            log.info(
                "dataset created",
                job_id=job_id,
                dataset=dataset,
                shards_per_epoch=parameters.shards_per_epoch,
                epochs=parameters.epochs,
            )
            return True
        if existing.parameters != parameters:
            raise AlreadyExists(
                f"dataset {dataset!r} of job {job_id!r} exists with different parameters "
                f"({_describe(existing.parameters)})"
            )
        return False

    @_retried_on_contention
    async def register_worker(self, job_id: str, worker: str) -> int:
        """A new incarnation token for ``worker``; shards its older incarnation held go back
        to TODO, because the process that held them is gone."""
        check_job_id(job_id)
        check_worker(worker)
        try:
            incarnation, requeued = await self._register_once(job_id, worker)
        except ConflictingWrite:
            # Two first registrations raced on the insert; this one now finds the row.
            incarnation, requeued = await self._register_once(job_id, worker)
        if requeued:
            self.outbox.notify()
        log.info(
            "worker registered",
            job_id=job_id,
            worker=worker,
            incarnation=incarnation,
            requeued=requeued,
        )
        return incarnation

    async def _register_once(self, job_id: str, worker: str) -> tuple[int, int]:
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            incarnation = await repository.bump_incarnation(session, job_id, worker, now)
            if incarnation is None:
                await repository.insert_worker(session, job_id, worker, now)
                incarnation = 1
            requeued = await self._release_held(session, job_id, worker, now, "requeued")
        return incarnation, requeued

    @_retried_on_contention
    async def mark_worker_lost(self, job_id: str, worker: str) -> int:
        """Fence the worker's token and return every shard it holds to TODO."""
        check_job_id(job_id)
        check_worker(worker)
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            if not await repository.mark_lost(session, job_id, worker, now):
                raise NotFound(f"worker {worker!r} of job {job_id!r} is not registered")
            requeued = await self._release_held(session, job_id, worker, now, "requeued")
        if requeued:
            self.outbox.notify()
        log.info("worker marked lost", job_id=job_id, worker=worker, requeued=requeued)
        return requeued

    async def _release_held(
        self, session: Session, job_id: str, worker: str, now: datetime, event: str
    ) -> int:
        held = await repository.held_shards(session, job_id, worker)
        for item in held:
            released = queue.release(item.shard)
            await repository.save_shard(session, item.dataset_id, released, now)
            await self._add_event(session, job_id, item.dataset, item.shard, event, now)
        return len(held)

    async def get_shard(
        self,
        ref: WorkerRef,
        done_shard_id: int | None = None,
        done_lease: int | None = None,
        *,
        done: Sequence[DoneReport] = (),
        max_shards: int = 1,
    ) -> ShardGrant:
        """Lease the next shard (up to ``max_shards``, in hand-out order) to the caller,
        first completing ``done_shard_id`` and then ``done``, in order, if given.

        Everything is one transaction: if one report is refused, nothing changes. With no
        shard free the answer is END_OF_DATA only when every shard of the last epoch is
        DONE. While others still hold shards it is RETRY_LATER: a held shard comes back to
        TODO if its worker is lost or its lease lapses, and someone must be left to take it
        (exactly once needs every shard DONE, not merely handed out). A straggler gets one
        shard, cut down first, whatever ``max_shards`` says.
        """
        ref.validate()
        reports = _done_reports(done_shard_id, done_lease, done)
        if not 1 <= max_shards <= MAX_SHARDS_PER_CALL:
            raise InvalidArgument(
                "max_shards", f"must be 0 to {MAX_SHARDS_PER_CALL} (0 means 1), got {max_shards}"
            )
        for _ in range(ORDER_ATTEMPTS):
            try:
                grant = await self._get_shard_once(ref, reports, max_shards)
            except OrderNotReady as missing:
                # Rolled back: the epoch's shuffle is computed off the event loop, then the
                # call runs again (a 1,000,000-shard shuffle is half a second of CPU).
                await self._computed(missing.shuffle)
                continue
            await self._indices_computed(grant)
            return grant
        raise Unavailable("the epoch's shard order is being computed; retry")

    async def _get_shard_once(
        self, ref: WorkerRef, reports: Sequence[tuple[str, DoneReport]], max_shards: int
    ) -> ShardGrant:
        if self.fast is not None:
            fast = await self.fast.get_shard(
                ref.job_id,
                ref.dataset,
                ref.worker,
                ref.incarnation,
                [(field, report.shard_id, report.lease) for field, report in reports],
                max_shards,
            )
            if not isinstance(fast, SlowPath):
                first = fast.shards[0] if fast.shards else None
                return ShardGrant(first, fast.parameters, fast.why_none, more=fast.shards[1:])
        # Shielded: a caller that gives up (a client timeout while a big epoch is cut) must
        # not roll the cut back, or its retry would start it over; its answer is then lost,
        # which the protocol already survives (the lease lapses or the retry gets it).
        task = asyncio.ensure_future(self._get_shard_general(ref, reports, max_shards))
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _computed(self, shuffle: Shuffle) -> None:
        """Run a seeded shuffle (cached by the domain) off the event loop, in the worker
        process if there is one, once for every caller waiting for the same one."""
        key = (shuffle.kind, shuffle.key)
        pending = self._orders.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._shuffled(shuffle))
            self._orders[key] = pending
            pending.add_done_callback(lambda _: self._orders.pop(key, None))
        await asyncio.shield(pending)

    async def _shuffled(self, shuffle: Shuffle) -> None:
        if self.shuffler is None:
            await asyncio.to_thread(shuffle.run)
            return
        data = await asyncio.get_running_loop().run_in_executor(self.shuffler, shuffle.compute)
        shuffle.store(data)

    async def _order_computed(self, parameters: DatasetParameters, epoch: int) -> None:
        """The epoch's hand-out order is cached (computed off the event loop if need be)."""
        if not sharding.order_ready(parameters, epoch):
            await self._computed(sharding.order_shuffle(parameters, epoch))

    async def _indices_computed(self, grant: ShardGrant) -> None:
        """An index-list grant's record orders are cached before the answer slices them on
        the event loop (a 2,000,000-record shuffle is a second of CPU)."""
        parameters = grant.parameters
        if grant.shard is None or parameters.kind is not ShardingKind.INDEX_LIST:
            return
        for epoch in sorted({shard.epoch for shard in (grant.shard, *grant.more)}):
            if not sharding.permutation_ready(parameters, epoch):
                await self._computed(sharding.permutation_shuffle(parameters, epoch))

    @_retried_on_contention
    async def _get_shard_general(
        self, ref: WorkerRef, reports: Sequence[tuple[str, DoneReport]], max_shards: int
    ) -> ShardGrant:
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            dataset = await self._lock_dataset(session, ref.job_id, ref.dataset)
            worker = await self._touch(session, ref, now)
            holder = queue.fence(worker.record, ref.worker, ref.incarnation)
            records = 0
            finished: list[ShardRecord] = []
            for field, report in reports:
                shard = await repository.get_shard(session, dataset.id, report.shard_id)
                if shard is None:
                    raise NotFound(
                        f"{field}: shard {report.shard_id} of dataset {ref.dataset!r} not found"
                    )
                if len(reports) == 1:
                    records += await self._complete(
                        session, ref, dataset, holder, shard, now, report.lease
                    )
                    continue
                done = queue.complete(shard, holder, report.lease)
                if done != shard:
                    await repository.save_shard(session, dataset.id, done, now)
                    records += done.offset - shard.offset
                    finished.append(done)
            if finished:  # a batch's reports: one event for them all
                await self.outbox.add_event(
                    session,
                    topics.SHARDS_DONE.outgoing(
                        ref.job_id,
                        shards_done(ref.job_id, ref.dataset, ref.worker, finished, now),
                        shards_done_id(ref.job_id, ref.dataset, finished[0]),
                    ),
                )
            await self._update_rate(session, ref, worker, records, now)
            straggler = worker.record.straggler
            leased, dataset = await self._lease(session, ref, dataset, holder, straggler, now)
            more: list[ShardRecord] = []
            while leased is not None and not straggler and len(more) + 1 < max_shards:
                following, dataset = await self._lease(session, ref, dataset, holder, False, now)
                if following is None:
                    break
                more.append(following)
            why_none = None
            if leased is None:
                doing = await repository.any_doing(session, dataset.id)
                why_none = Grant.RETRY_LATER if doing else Grant.END_OF_DATA
        return ShardGrant(
            leased,
            dataset.parameters,
            why_none,
            straggler and leased is not None,
            tuple(more),
        )

    async def _lease(
        self,
        session: Session,
        ref: WorkerRef,
        dataset: StoredDataset,
        holder: Holder,
        straggler: bool,
        now: datetime,
    ) -> tuple[ShardRecord | None, StoredDataset]:
        """The shard leased (None if none is left), and the dataset as it is now (with one
        more epoch if this cut one)."""
        expires = now + self.lease_duration
        if not straggler:
            leased = await repository.lease_next(session, dataset.id, holder, expires, now)
            while leased is None:
                written = await self._write_rows(session, ref, dataset, now)
                if written is None:
                    break
                dataset = written
                leased = await repository.lease_next(session, dataset.id, holder, expires, now)
            return leased, dataset
        # A straggler's shard is cut down first (DLRover-RM sec. 5.1): read, split, lease.
        shard = await repository.next_todo(session, dataset.id)
        while shard is None:
            written = await self._write_rows(session, ref, dataset, now)
            if written is None:
                return None, dataset
            dataset = written
            shard = await repository.next_todo(session, dataset.id)
        parts = queue.split(
            shard,
            straggler_shard_records(dataset.parameters),
            SPLIT_ID_BASE + dataset.splits,
        )
        if parts is not None:
            shard, tail = parts
            await repository.insert_shards(session, dataset.id, [tail], now)
            await repository.set_splits(session, dataset.id, dataset.splits + 1)
        leased = queue.lease(shard, holder, now, self.lease_duration)
        await repository.save_shard(session, dataset.id, leased, now)
        return leased, dataset

    async def _write_rows(
        self, session: Session, ref: WorkerRef, dataset: StoredDataset, now: datetime
    ) -> StoredDataset | None:
        """The TODO rows ran out: write the newest epoch's next ones, cutting the next epoch
        when this one is all written (DLRover sec. 5.2); the dataset as it is now, or None
        when every shard has its row. A batch of rows at a time, in this transaction: a big
        epoch is never written in one go, which held the lock other jobs' calls wait for.
        Raises OrderNotReady (this transaction rolls back; :meth:`get_shard` computes it)."""
        parameters = dataset.parameters
        batch = sharding.next_rows(
            parameters, dataset.epochs_created, dataset.written, 1, self.rows_per_write
        )
        if batch is None:
            return None
        planned = sharding.plan_positions(parameters, batch.epoch, batch.first, batch.stop)
        records = [ShardRecord.planned(p) for p in planned]
        await repository.write_rows(session, dataset.id, records, batch.epoch + 1, batch.stop, now)
        if batch.new_epoch:
            log.info(
                "epoch started",
                job_id=ref.job_id,
                dataset=ref.dataset,
                epoch=batch.epoch,
                shards=parameters.shards_per_epoch,
            )
        return replace(dataset, epochs_created=batch.epoch + 1, written=batch.stop)

    @_retried_on_contention
    async def report_progress(
        self,
        ref: WorkerRef,
        shard_id: int,
        offset: int,
        lease: int | None = None,
        renew_held: bool = False,
    ) -> None:
        """A heartbeat: the offset reached in a shard; renews the lease (and, with
        ``renew_held``, every other lease the incarnation holds in the dataset)."""
        ref.validate()
        _check_shard_id(shard_id)
        if self.fast is not None:
            await self.fast.report_progress(
                ref.job_id,
                ref.dataset,
                ref.worker,
                ref.incarnation,
                shard_id,
                offset,
                lease,
                renew_held,
            )
            return
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            worker, dataset, holder, shard = await self._locked_shard(session, ref, shard_id, now)
            updated = queue.record_progress(shard, holder, offset, now, self.lease_duration, lease)
            if renew_held:
                await repository.renew_held(
                    session, dataset.id, holder, shard_id, now + self.lease_duration, now
                )
            if updated != shard:
                await repository.save_shard(session, dataset.id, updated, now)
                await self._update_rate(session, ref, worker, updated.offset - shard.offset, now)

    @_retried_on_contention
    async def report_done(self, ref: WorkerRef, shard_id: int, lease: int | None = None) -> None:
        """The shard was consumed to its end; duplicates are harmless."""
        ref.validate()
        _check_shard_id(shard_id)
        if self.fast is not None:
            await self.fast.report_done(
                ref.job_id, ref.dataset, ref.worker, ref.incarnation, shard_id, lease
            )
            return
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            worker, dataset, holder, shard = await self._locked_shard(session, ref, shard_id, now)
            records = await self._complete(session, ref, dataset, holder, shard, now, lease)
            await self._update_rate(session, ref, worker, records, now)

    # "done" events are not pushed to the relay: its poll (every 0.2 s) picks them up in
    # batches, which keeps the busiest call cheap. Rarer events (failed, requeued, straggler)
    # wake the relay at once.
    async def _complete(
        self,
        session: Session,
        ref: WorkerRef,
        dataset: StoredDataset,
        holder: Holder,
        shard: ShardRecord,
        now: datetime,
        lease: int | None = None,
    ) -> int:
        """Mark the shard done; the records this consumed (for the worker's rate, which the
        caller updates once for all the shards it completes)."""
        done = queue.complete(shard, holder, lease)
        if done == shard:
            return 0
        await repository.save_shard(session, dataset.id, done, now)
        await self._add_event(session, ref.job_id, ref.dataset, done, "done", now)
        return done.offset - shard.offset

    async def _update_rate(
        self, session: Session, ref: WorkerRef, worker: WorkerRate, records: int, now: datetime
    ) -> None:
        if records <= 0:
            return
        window = self.rate_window.total_seconds()
        since = worker.rate_at
        # Registration sets rate_at, so the first report measures from it; a worker row
        # registered before it did has none, and measures one window.
        elapsed = window if since is None else (now - since).total_seconds()
        rate = decayed_rate(worker.rate, records, elapsed, window)
        await repository.set_rate(session, ref.job_id, ref.worker, rate, now)

    @_retried_on_contention
    async def report_failed(
        self, ref: WorkerRef, shard_id: int, reason: str, lease: int | None = None
    ) -> None:
        """The worker gave the shard up; back to TODO at its last reported offset."""
        ref.validate()
        _check_shard_id(shard_id)
        if len(reason) > 1000:
            raise InvalidArgument("reason", "must be at most 1000 characters")
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            _, dataset, holder, shard = await self._locked_shard(session, ref, shard_id, now)
            failed = queue.fail(shard, holder, lease)
            if failed == shard:
                return
            await repository.save_shard(session, dataset.id, failed, now)
            await self._add_event(session, ref.job_id, ref.dataset, shard, "failed", now)
        self.outbox.notify()
        log.info(
            "shard failed",
            job_id=ref.job_id,
            dataset=ref.dataset,
            shard_id=shard_id,
            worker=ref.worker,
            offset=failed.offset,
            reason=reason,
        )

    @_retried_on_contention
    async def list_datasets(self, job_id: str) -> list[StoredDataset]:
        """A job's datasets (empty for a job with none)."""
        check_job_id(job_id)
        async with self.database.sessions() as session:
            return await repository.list_datasets(session, job_id)

    @_retried_on_contention
    async def dataset_state(self, job_id: str, dataset: str) -> DatasetState:
        """Queue sizes, the epoch, and per-worker progress."""
        check_job_id(job_id)
        check_dataset(dataset)
        async with self.database.sessions() as session:
            stored = await repository.find_dataset(session, job_id, dataset)
            if stored is None:
                raise NotFound(f"dataset {dataset!r} of job {job_id!r} not found")
            epoch = queue.current_epoch(stored.epochs_created)
            counts = await repository.state_counts(session, stored.id, epoch)
            workers = await repository.worker_shards(session, job_id, stored.id, epoch)
            cursor = await repository.find_step_cursor(session, stored.id)
        # The newest epoch's shards without a row yet are TODO too.
        rowless = sharding.unwritten(stored.parameters, stored.epochs_created, stored.written)
        finished = queue.is_finished(
            stored.parameters, stored.epochs_created, counts.unfinished + rowless
        )
        window = self.rate_window.total_seconds()
        return DatasetState(
            QueueCounts(epoch, counts.todo + rowless, counts.doing, counts.done_in_epoch, finished),
            # The rates the straggler verdicts were judged by.
            [replace(w, rate=judged_rate(w.rate, w.measured, window)) for w in workers],
            None if cursor is None else cursor.consumed_step,
        )

    async def _lock_dataset(self, session: Session, job_id: str, dataset: str) -> StoredDataset:
        stored = await repository.lock_dataset(session, job_id, dataset)
        if stored is None:
            raise NotFound(f"dataset {dataset!r} of job {job_id!r} not found")
        return stored

    async def _touch(self, session: Session, ref: WorkerRef, now: datetime) -> WorkerRate:
        worker = await repository.touch_worker(session, ref.job_id, ref.worker, now)
        if worker is None:
            queue.fence(None, ref.worker, ref.incarnation)  # raises: not registered
            raise AssertionError("fence raises for an unknown worker")  # pragma: no cover
        return worker

    async def _locked_shard(
        self, session: Session, ref: WorkerRef, shard_id: int, now: datetime
    ) -> tuple[WorkerRate, StoredDataset, Holder, ShardRecord]:
        # Reports lock the worker, not the dataset, so heartbeats of different workers do
        # not queue behind each other; the shard's own row lock orders the rest.
        worker = await self._touch(session, ref, now)
        holder = queue.fence(worker.record, ref.worker, ref.incarnation)
        dataset = await repository.find_dataset(session, ref.job_id, ref.dataset)
        if dataset is None:
            raise NotFound(f"dataset {ref.dataset!r} of job {ref.job_id!r} not found")
        shard = await repository.get_shard(session, dataset.id, shard_id)
        if shard is None:
            raise NotFound(f"shard_id: shard {shard_id} of dataset {ref.dataset!r} not found")
        return worker, dataset, holder, shard

    @_retried_on_contention
    async def expire_leases(self, limit: int = 500) -> int:
        """Return every shard whose lease lapsed to TODO (the lease sweeper); how many."""
        released = 0
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            candidates = await repository.expired_leases(session, now, limit)
            if not candidates:
                return 0
            names = await repository.dataset_names(session, {c.dataset_id for c in candidates})
            for candidate in candidates:
                if not await repository.release_if_expired(
                    session, candidate.dataset_id, candidate.shard, now
                ):
                    continue
                released += 1
                job_id, dataset = names[candidate.dataset_id]
                shard = queue.release(candidate.shard)
                await self._add_event(session, job_id, dataset, shard, "requeued", now)
                log.warning(
                    "lease expired; shard back to TODO",
                    job_id=job_id,
                    dataset=dataset,
                    shard_id=shard.shard_id,
                    worker=None if shard.holder is None else shard.holder.worker,
                    offset=shard.offset,
                )
        if released:
            self.outbox.notify()
        return released

    @_retried_on_contention
    async def judge_stragglers(self) -> list[tuple[str, str]]:
        """Re-judge every job's workers by their rates; returns the newly flagged ones.

        A new verdict is stored with the worker (its next GetShard gets a smaller shard) and,
        when a worker becomes a straggler, a StragglerDetected event for the optimizer leaves
        through the outbox in the same transaction.
        """
        flagged: list[tuple[str, str]] = []
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            rated = await repository.rated_workers(session, now - self.rate_window)
            by_job: dict[str, list[repository.RatedWorker]] = {}
            for worker in rated:
                by_job.setdefault(worker.job_id, []).append(worker)
            window = self.rate_window.total_seconds()
            for job_id, members in by_job.items():
                rates = {w.worker: judged_rate(w.rate, w.measured, window) for w in members}
                stragglers = judge(rates, {w.worker for w in members if w.straggler})
                for worker in members:
                    verdict = worker.worker in stragglers
                    if verdict == worker.straggler:
                        continue
                    if not await repository.set_straggler(
                        session, job_id, worker.worker, worker.incarnation, verdict
                    ):
                        continue
                    rate = rates[worker.worker]
                    median = statistics.median(r for w, r in rates.items() if w != worker.worker)
                    log.warning(
                        "straggler detected" if verdict else "straggler recovered",
                        job_id=job_id,
                        worker=worker.worker,
                        rate=round(rate, 3),
                        peer_median_rate=round(median, 3),
                    )
                    if not verdict:
                        continue
                    flagged.append((job_id, worker.worker))
                    message = straggler_detected(job_id, worker.worker, rate, median, now)
                    await self.outbox.add_event(
                        session,
                        topics.STRAGGLER_DETECTED.outgoing(
                            job_id,
                            message,
                            f"{job_id}.{worker.worker}.straggler.{worker.incarnation}."
                            f"{int(now.timestamp() * 1000)}",
                        ),
                    )
        if flagged:
            self.outbox.notify()
        return flagged

    @_retried_on_contention
    async def pod_gone(self, job_id: str, pod_name: str, occurred_at: datetime) -> int | None:
        """A pod failed or was deleted: mark its worker lost, unless it registered again after.

        Returns the shards requeued, or None when there was nothing to do (not a registered
        worker, or an event older than the current incarnation, e.g. a redelivery).
        """
        check_job_id(job_id)
        check_worker(pod_name, "pod_name")
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            # One conditional UPDATE, so a registration racing with the event is never fenced.
            if not await repository.mark_lost(
                session, job_id, pod_name, now, registered_by=occurred_at
            ):
                return None
            requeued = await self._release_held(session, job_id, pod_name, now, "requeued")
        if requeued:
            self.outbox.notify()
        log.info("worker marked lost", job_id=job_id, worker=pod_name, requeued=requeued)
        return requeued

    async def data_worker_gone(self, job_id: str, pod_name: str, occurred_at: datetime) -> int:
        """A data worker pod failed or was deleted: the steps it fetched before (its lease's
        deadline is a batch time-out after the fetch) go to another reader at once instead
        of after the time-out. A step its relaunch fetched since keeps its lease. How many
        steps were freed."""
        check_job_id(job_id)
        check_worker(pod_name, "pod_name")
        async with self.database.transaction() as session:
            freed = await repository.expire_steps_of(
                session, job_id, pod_name, occurred_at + self.batch_timeout, datetime.now(UTC)
            )
        log.info("data worker gone", job_id=job_id, pod=pod_name, steps_freed=freed)
        return freed

    async def run_sweeper(self, stop: asyncio.Event, interval: float) -> None:
        """Expire lapsed leases and judge stragglers every ``interval`` seconds until ``stop``."""
        while not stop.is_set():
            try:
                await self.expire_leases()
                await self.judge_stragglers()
            except Exception as error:  # a database blip must not end the service
                log.warning("sweep failed; retrying", error=f"{type(error).__name__}: {error}")
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                continue

    @_retried_on_contention
    async def fetch_batches(
        self, job_id: str, dataset: str, data_worker: str, max_batches: int
    ) -> tuple[list[steps.StepBatch], bool, int]:
        """Index batches for a data worker: timed-out steps first, then new ones.

        Returns the batches, whether every step is dispatched and consumed, and the last
        consumed step id (GoldMiner sec. 4; see :mod:`stride.dispatcher.domain.steps`).
        """
        check_job_id(job_id)
        check_dataset(dataset)
        check_worker(data_worker, "data_worker")
        if not 1 <= max_batches <= 1024:
            raise InvalidArgument("max_batches", f"must be between 1 and 1024, got {max_batches}")
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            stored = await self._lock_dataset(session, job_id, dataset)
            steps.check_stepped(stored.parameters, dataset)
            cursor = await repository.step_cursor(session, stored.id)
            deadline = now + self.batch_timeout
            again = await repository.take_timed_out_steps(
                session, stored.id, cursor.consumed_step, now, max_batches, data_worker, deadline
            )
            total = steps.total_steps(stored.parameters)
            fresh = steps.new_steps(
                cursor.next_step,
                cursor.consumed_step,
                total,
                max_batches - len(again),
                self.steps_in_flight,
            )
            await repository.lease_steps(session, stored.id, fresh, data_worker, deadline)
            if fresh:
                cursor = repository.StepCursor(fresh.stop, cursor.consumed_step)
                await repository.save_step_cursor(session, stored.id, cursor)
        if again:
            log.warning(
                "batches timed out; dispatched again",
                job_id=job_id,
                dataset=dataset,
                data_worker=data_worker,
                steps=again,
            )
        parameters, stepped = stored.parameters, [*again, *fresh]
        if parameters.kind is ShardingKind.INDEX_LIST:  # sliced below, on the event loop
            per_epoch = steps.batches_per_epoch(parameters)
            for epoch in sorted({step // per_epoch for step in stepped}):
                if not sharding.permutation_ready(parameters, epoch):
                    await self._computed(sharding.permutation_shuffle(parameters, epoch))
        batches = [steps.batch_of(parameters, step) for step in stepped]
        return batches, cursor.consumed_step == total - 1, cursor.consumed_step

    @_retried_on_contention
    async def report_consumed(self, job_id: str, dataset: str, step_id: int) -> int:
        """The training side consumed every step up to ``step_id``; returns the last consumed."""
        check_job_id(job_id)
        check_dataset(dataset)
        if step_id < 0:
            raise InvalidArgument("step_id", f"must not be negative, got {step_id}")
        async with self.database.transaction() as session:
            stored = await self._lock_dataset(session, job_id, dataset)
            steps.check_stepped(stored.parameters, dataset)
            cursor = await repository.step_cursor(session, stored.id)
            if step_id >= cursor.next_step:
                raise FailedPrecondition(
                    f"step_id: step {step_id} was never dispatched (next is {cursor.next_step})"
                )
            if step_id <= cursor.consumed_step:
                return cursor.consumed_step  # a duplicate or late report
            cursor = repository.StepCursor(cursor.next_step, step_id)
            await repository.save_step_cursor(session, stored.id, cursor)
            await repository.forget_consumed_steps(session, stored.id, step_id)
        return step_id

    @_retried_on_contention
    async def snapshot(self, job_id: str, dataset: str) -> Snapshot:
        """Exactly which data of the dataset is done, and how far each started shard got."""
        check_job_id(job_id)
        check_dataset(dataset)
        async with self.database.transaction() as session:
            # Locking the dataset makes the snapshot consistent with hand-outs.
            stored = await self._lock_dataset(session, job_id, dataset)
            touched = await repository.snapshot_shards(session, stored.id)
            cursor = await repository.find_step_cursor(session, stored.id)
        data = encode_snapshot(
            job_id,
            dataset,
            stored.parameters,
            stored.epochs_created,
            stored.splits,
            touched,
            None if cursor is None else cursor.consumed_step,
        )
        return Snapshot(
            data,
            _snapshot_id(data),
            done=sum(1 for s in touched if s.state is ShardState.DONE),
            doing=sum(1 for s in touched if s.state is ShardState.DOING),
        )

    async def restore(self, job_id: str, dataset: str, data: bytes) -> tuple[str, int]:
        """Put the dataset's shards back to a snapshot; returns its id and the leases revoked.

        Shards in progress at snapshot time come back as TODO at the offset they had then
        (their holders are gone, or at least not the ones the checkpoint knows). Every
        lease held now is revoked, so current holders' reports are refused.
        """
        check_job_id(job_id)
        check_dataset(dataset)
        if not data:
            raise InvalidArgument("snapshot", "is required: bytes from SnapshotShards")
        content = decode_snapshot(data)
        if (content.job_id, content.dataset) != (job_id, dataset):
            raise FailedPrecondition(
                f"snapshot: it is of dataset {content.dataset!r} of job {content.job_id!r}, "
                f"not {dataset!r} of {job_id!r}"
            )
        for _ in range(ORDER_ATTEMPTS):
            # The newest epoch's order (its rows up to the last position leased are
            # written), computed off the event loop before any lock is taken.
            if content.epochs_created > 0:
                await self._order_computed(content.parameters, content.epochs_created - 1)
            try:
                revoked = await self._restore_once(job_id, dataset, content)
                break
            except OrderNotReady:
                continue
        else:
            raise Unavailable("the epoch's shard order is being computed; retry")
        snapshot_id = _snapshot_id(data)
        log.info(
            "shards restored",
            job_id=job_id,
            dataset=dataset,
            snapshot_id=snapshot_id,
            revoked=revoked,
            epochs_created=content.epochs_created,
        )
        return snapshot_id, revoked

    @_retried_on_contention
    async def _restore_once(self, job_id: str, dataset: str, content: SnapshotContent) -> int:
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            stored = await self._lock_dataset(session, job_id, dataset)
            if stored.parameters != content.parameters:
                raise FailedPrecondition(
                    "snapshot: taken with other dataset parameters "
                    f"({_describe(content.parameters)}); the dataset has "
                    f"({_describe(stored.parameters)})"
                )
            leased = await repository.lease_counts(session, stored.id)
            restored = await asyncio.to_thread(
                restored_queue, stored.parameters, content.epochs_created, content.shards, leased
            )
            if content.consumed_step is not None:
                # Data-worker mode: the steps trained after the checkpoint are trained again.
                await repository.rewind_steps(session, stored.id, content.consumed_step)
            return await repository.replace_shards(
                session, stored.id, restored, content.epochs_created, content.splits, now
            )

    async def _add_event(
        self,
        session: Session,
        job_id: str,
        dataset: str,
        shard: ShardRecord,
        event: str,
        now: datetime,
    ) -> None:
        """Queue a shard event; its id names the lease it ends, so re-publishes de-duplicate."""
        message = shard_progress(job_id, dataset, shard, now)
        message_id = f"{job_id}.{dataset}.{shard.shard_id}.{event}.{shard.leases}"
        await self.outbox.add_event(
            session, topics.SHARD_TOPICS[event].outgoing(job_id, message, message_id)
        )


def _describe(parameters: DatasetParameters) -> str:
    kind = parameters.kind.value if parameters.kind else "unspecified"
    return (
        f"kind={kind} record_count={parameters.record_count} batch_size={parameters.batch_size} "
        f"shard_batches={parameters.shard_batches} epochs={parameters.epochs} "
        f"shuffle={parameters.shuffle} seed={parameters.seed} partitions={parameters.partitions}"
    )
