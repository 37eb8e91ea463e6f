"""The hot calls with group commit on one dedicated connection: SQLite (the embedded
default, :class:`SqliteFastPath`) and PostgreSQL (:class:`PostgresFastPath`, whose
differences its docstring gives; the rest of this text is about SQLite).

Through SQLAlchemy's asyncio adapter every statement costs several hand-offs to the driver's
thread (about 30 per GetShard), and on a busy machine each hand-off waits for a thread to
be scheduled: that, not SQLite, dominated a hand-out (about 15 ms). Here GetShard (with its
piggy-backed done and, when the queue runs dry, the next epoch's cut), ReportShardDone and
ReportProgress are plain functions run on one dedicated connection, with a handful of
prepared statements. The transitions are the same domain functions the general path uses;
only the SQL is spelled out, for SQLite.

The calls run on the event loop's own thread. A hand-off to a worker thread and back cost
about 380 us here (two thread wake-ups on a 2-core VM), more than the SQL of a hand-out
(about 220 us, most of it the COMMIT's WAL write): measured with
``bench/dispatcher_vs_dlrover.py``. A batch blocks the loop for its SQL only, a few hundred
microseconds per call; calls that arrive meanwhile wait in gRPC's buffers and form the
next batch.

Group commit: calls queue up while a batch is being applied, and the committer takes all
of them at once into ONE transaction (``BEGIN IMMEDIATE``, each call in its own savepoint,
``COMMIT``), then answers each. So a call is answered only after its change is committed
(a SIGKILL loses nothing answered), while with many callers one commit serves many calls.
A call that is refused (NotFound, FailedPrecondition) is rolled back to its savepoint
alone. If the commit fails, the whole batch is rolled back (the database is the only
state) and every call of it fails with UNAVAILABLE.

Checkpoints: SQLite copies the WAL back into the database file (and, at ``synchronous=
NORMAL``, fsyncs it) inside whichever COMMIT crosses ``wal_autocheckpoint`` pages, which
put a multi-millisecond stall on every thousandth hand-out. The hot connection therefore
never checkpoints by size; :meth:`SqliteFastPath.run_checkpoints` does it in the background
(PASSIVE: it never blocks a writer) on its own connection and thread. A PASSIVE checkpoint
copies pages back but never rewinds the WAL, and under steady writes the log is never all
copied at the moment a writer starts, which is when SQLite rewinds it: the WAL grew without
bound (540 MB in 30 s of batched hand-outs, found by ``bench/dispatcher_vs_dlrover.py``,
and reads slowed with it). So once the log passes :data:`WAL_RESET_FRAMES`, the hot
connection itself, between two batches, runs a TRUNCATE checkpoint: the background has
copied almost everything already, so it copies the little rest, rewinds and truncates.

The outbox relay's reads, deletes and parks (of an event the bus refuses for good) are
calls of the same group commit (:meth:`FastPath.relay_hooks`): through a connection of
their own they would queue for SQLite's write lock behind the hand-outs.

A straggler's GetShard (its shard is split first) answers :data:`SLOW` after rolling back
its savepoint, and the caller runs the general path, which handles every case.
The schema is the one :mod:`stride.dispatcher.db.tables` defines; timestamps are stored
the way SQLAlchemy stores them on SQLite (naive UTC, ``YYYY-MM-DD HH:MM:SS.ffffff``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final, TypeVar

import psycopg
import psycopg.sql
import structlog

from stride.bus import topics
from stride.bus.topics import Outgoing
from stride.db.outbox import PendingEvent, Refusal, RelayHooks
from stride.dispatcher.adapters.convert import shard_progress, shards_done, shards_done_id
from stride.dispatcher.domain import queue
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import (
    Grant,
    Holder,
    ShardRecord,
    ShardState,
    WorkerRecord,
)
from stride.dispatcher.domain.sharding import ROWS_PER_WRITE, next_rows, plan_positions
from stride.dispatcher.domain.stragglers import decayed_rate
from stride.runtime.errors import NotFound, Unavailable

T = TypeVar("T")
Connection = Any
"""A DB-API connection in autocommit mode: ``Connection`` or :class:`_PgConnection`
(``execute(sql, params)`` with ``?`` placeholders, ``executemany``, ``in_transaction``)."""
log = structlog.get_logger(__name__)


class SlowPath:
    """Marker: this call needs the general path."""


SLOW: Final = SlowPath()

BUSY_TIMEOUT: Final = 5.0
"""Seconds a batch waits for another connection's write lock before answering UNAVAILABLE."""

WAL_RESET_FRAMES: Final = 4096
"""WAL frames (pages; 16 MiB at SQLite's 4 KiB) past which the hot connection rewinds the
log between two batches (see the module docstring)."""


class _Busy(Exception):
    """BEGIN found SQLite's write lock taken by another connection."""


SHARD_COLUMNS = (
    "shard_id, epoch, position, start_index, end_index, consumed, state, worker, "
    "incarnation, leases, lease_expires_at, partition"
)

_DATASET_COLUMNS = (
    "id, record_count, batch_size, shard_batches, epochs, shuffle, seed, kind, partitions, "
    "epochs_created, written"
)
_LOCK_DATASET = (
    "UPDATE datasets SET version = version + 1 WHERE job_id = ? AND dataset = ? "
    f"RETURNING {_DATASET_COLUMNS}"
)
"""The row lock the general path's lock_dataset takes, with the dataset's columns."""
_TOUCH = (
    "UPDATE workers SET last_seen_at = ? WHERE job_id = ? AND worker = ? "
    "RETURNING incarnation, lost, straggler, rate, rate_at"
)
"""A worker's last contact, with what fencing and its rate need."""

_LEASE = (
    "UPDATE shards SET state = 'DOING', worker = ?, incarnation = ?, leases = leases + 1, "
    "lease_expires_at = ?, updated_at = ? WHERE dataset_id = ? AND shard_id "
)
_NEXT_TODO = (
    "(SELECT shard_id FROM shards WHERE dataset_id = ? AND state = 'TODO' "
    "AND (epoch, position) >= (?, ?) ORDER BY epoch, position, shard_id LIMIT "
)
_LEASE_ONE = _LEASE + "= " + _NEXT_TODO + f"1) RETURNING {SHARD_COLUMNS}"
_LEASE_MANY = _LEASE + "IN " + _NEXT_TODO + f"?) RETURNING {SHARD_COLUMNS}"
_PG_LEASE_MANY = (
    "UPDATE shards SET state = 'DOING', worker = ?, incarnation = ?, leases = shards.leases + 1, "
    "lease_expires_at = ?, updated_at = ? FROM (SELECT dataset_id, shard_id FROM shards "
    "WHERE dataset_id = ? AND state = 'TODO' AND (epoch, position) >= (?, ?) "
    "ORDER BY epoch, position, shard_id LIMIT ?) AS k "
    "WHERE shards.dataset_id = k.dataset_id AND shards.shard_id = k.shard_id "
    "RETURNING " + ", ".join(f"shards.{column.strip()}" for column in SHARD_COLUMNS.split(","))
)
"""On PostgreSQL each leased row is joined by its whole key. The planner's statistics never
know a dataset created since the table was last analyzed (every new job's): it estimates
such a dataset at one row, and given ``dataset_id = ? AND shard_id IN (...)`` it read the
shards by scanning all of the dataset's primary key and filtering (14,000 rows for 16,
3-30 ms a call; auto_explain under ``bench/dispatcher_vs_dlrover.py``). A join on both key
columns leaves it one sensible plan, a key lookup per shard, whatever it estimates."""


def _stamp(moment: datetime) -> str:
    # As strftime("%Y-%m-%d %H:%M:%S.%f"), in a third of the time.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _moment(value: str | datetime | None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):  # PostgreSQL (timestamptz)
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _headers(value: str | dict[str, str]) -> dict[str, str]:
    # SQLite keeps JSON as text; psycopg hands it back parsed.
    return value if isinstance(value, dict) else dict(json.loads(value))


def _worker(worker: str, row: Sequence[Any] | None) -> _Worker | None:
    """A worker from ``_TOUCH``'s row (None: not registered)."""
    if row is None:
        return None
    record = WorkerRecord(worker, row[0], bool(row[1]), bool(row[2]))
    return _Worker(record, row[3], _moment(row[4]))


def _shard(row: tuple[Any, ...]) -> ShardRecord:
    return ShardRecord(
        shard_id=row[0],
        epoch=row[1],
        position=row[2],
        start=row[3],
        end=row[4],
        offset=row[5],
        state=ShardState(row[6]),
        holder=None if row[7] is None else Holder(row[7], row[8]),
        leases=row[9],
        lease_expires_at=_moment(row[10]),
        partition=row[11],
    )


@dataclass(frozen=True)
class _Dataset:
    id: int
    parameters: DatasetParameters
    epochs_created: int
    written: int
    """Positions of the newest epoch with a shard row (see ``next_rows``)."""


@dataclass(frozen=True)
class _Worker:
    record: WorkerRecord
    rate: float
    rate_at: datetime | None


@dataclass(frozen=True)
class _Outcome:
    result: Any
    error: BaseException | None


@dataclass(frozen=True)
class FastGrant:
    """GetShard's answer from the fast path: the shards leased, in hand-out order (none at
    the end of the data or when every shard left is held: ``why_none``)."""

    shards: tuple[ShardRecord, ...]
    parameters: DatasetParameters
    why_none: Grant | None


class FastPath:
    """GetShard, ReportShardDone and ReportProgress on one dedicated connection, with group
    commit: the SQL and the batching. :class:`SqliteFastPath` and :class:`PostgresFastPath`
    give the dialect (the class attributes and the methods that say "dialect")."""

    errors: tuple[type[Exception], ...] = ()
    """What the driver raises for a failed statement (dialect)."""
    begin = "BEGIN"
    """Starts a batch's transaction (dialect)."""
    locks_rows = True
    """Whether rows must be locked one by one, or BEGIN already locked everything (dialect)."""
    combines_statements = False
    """Whether statements without parameters can go to the server together, one round trip
    (dialect): then BEGIN rides with the first call's SAVEPOINT, and the last RELEASE with
    the COMMIT."""

    def __init__(
        self,
        path: str,
        lease_duration: timedelta,
        rate_window: timedelta,
        sync_commits: bool,
        *,
        rows_per_write: int = ROWS_PER_WRITE,
    ) -> None:
        self.path = path
        self.rows_per_write = rows_per_write
        """Shard rows written at a time when the TODO rows run out (``next_rows``)."""
        self.lease_duration = lease_duration
        self.window = rate_window.total_seconds()
        self.sync_commits = sync_commits
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fast-path")
        self._connection: Connection | None = None
        self._pending: list[tuple[Callable[[Connection], Any], asyncio.Future[Any]]] = []
        self._committer: asyncio.Task[None] | None = None
        self._begin_deferred = False
        """Whether the batch's BEGIN is still to be sent, with its next statement."""
        self._closing: list[str] = []
        """Statements of the batch to send with its COMMIT (the last call's RELEASE)."""
        self.commits = 0
        """Transactions committed so far (one per batch of calls)."""
        self._front: dict[int, tuple[int, int]] = {}
        """Per dataset id, the hand-out order key (epoch, position) of the last shard this
        batch leased: its next lease scans from there (see :meth:`_lease_next`)."""

    def _connect(self) -> Connection:
        """The dedicated connection, opened on first use (dialect)."""
        raise NotImplementedError

    def _is_busy(self, error: Exception) -> bool:
        """Whether BEGIN failed only because another connection holds the lock (dialect)."""
        return False

    async def _apply_when_free(self, works: list[Callable[[Connection], Any]]) -> list[_Outcome]:
        """Apply a batch where the connection lives (dialect)."""
        raise NotImplementedError

    async def _on_connection_thread(self, action: Callable[[], T]) -> T:
        """Run ``action`` where the connection is used (dialect: here, the loop's thread)."""
        return action()

    async def close(self) -> None:
        """Let queued calls commit, then close the connection and stop the thread."""
        if self._committer is not None:
            await asyncio.gather(self._committer, return_exceptions=True)

        def close() -> None:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

        await self._on_connection_thread(close)
        self._executor.shutdown(wait=True)

    def _apply_batch(self, works: list[Callable[[Connection], Any]]) -> list[_Outcome]:
        """Run every queued call in ONE transaction (group commit), each in a savepoint.

        A call that raises (NotFound, FailedPrecondition, ...) or answers SLOW is rolled
        back to its savepoint alone, so it leaves nothing behind and the others still
        commit. If BEGIN or COMMIT fails, everything is rolled back and every call of the
        batch fails with Unavailable: no call is answered before its change committed.
        """
        self._begin_deferred, self._closing = False, []
        self._front = {}
        try:
            connection = self._connect()  # (again, if the last one broke: a database restart)
            self._discard(connection, everything=True)
            if connection.in_transaction:  # left open by an earlier batch that died mid-way
                connection.execute("ROLLBACK")
            if self.combines_statements:
                self._begin_deferred = True  # sent with the first call's SAVEPOINT
            else:
                connection.execute(self.begin)
        except self.errors as error:
            if self._is_busy(error):
                raise _Busy from error
            failure = Unavailable(f"database: cannot start a transaction ({error})")
            return [_Outcome(None, failure)] * len(works)
        try:
            outcomes = self._apply_calls(connection, works)
            self._commit(connection)
        except self.errors as error:
            self._discard(connection, everything=True)
            if connection.in_transaction:
                connection.execute("ROLLBACK")
            log.warning("group commit failed; calls answered UNAVAILABLE", error=str(error))
            failure = Unavailable(f"database: the commit failed ({error}); retry")
            return [_Outcome(None, failure)] * len(works)
        self.commits += 1
        return outcomes

    def _apply_calls(
        self, connection: Connection, works: Sequence[Callable[[Connection], Any]]
    ) -> list[_Outcome]:
        """Each call in its own savepoint, in order, inside the batch's transaction."""
        outcomes: list[_Outcome] = []
        # The savepoint statements carry no result: where the dialect can send several
        # statements at once (PostgreSQL), one call's RELEASE goes with the next call's
        # SAVEPOINT, a round trip per call instead of two.
        held = False
        """Whether the last call's savepoint is still to be released."""
        for work in works:
            self._savepoint_statements(
                connection, [*self._take_opening(), *(["RELEASE call"] * held), "SAVEPOINT call"]
            )
            held = True
            front = dict(self._front)  # a call rolled back gives its leases back
            try:
                result = work(connection)
                if not isinstance(result, SlowPath):
                    self._flush(connection)  # its writes' errors are its own
            except Exception as error:
                self._discard(connection)
                connection.execute("ROLLBACK TO call")
                self._front = front
                if isinstance(
                    error, self.errors
                ):  # a deadlock, a lock timeout: not the call's fault
                    error = Unavailable(f"database: {error}; retry")
                outcomes.append(_Outcome(None, error))
                continue
            if isinstance(result, SlowPath):
                self._discard(connection)
                connection.execute("ROLLBACK TO call")
                self._front = front
            outcomes.append(_Outcome(result, None))
        if held:
            self._closing = ["RELEASE call"]  # sent with the COMMIT
        return outcomes

    def _write(self, connection: Connection, sql: str, parameters: Sequence[Any]) -> None:
        """Run a statement whose result nobody reads (dialect: now; PostgreSQL queues it
        to go with the call's next statement, see :class:`_PgConnection`)."""
        connection.execute(sql, parameters)

    def _flush(self, connection: Connection) -> None:
        """Send what :meth:`_write` queued (dialect: nothing is queued)."""

    def _discard(self, connection: Connection, everything: bool = False) -> None:
        """Drop what :meth:`_write` queued for a call being rolled back, and with
        ``everything`` the transaction's statements not sent yet too (dialect)."""

    def _take_opening(self) -> list[str]:
        """The batch's BEGIN if it is still to be sent (once): the statements sent next
        must carry it, or follow :meth:`_send_opening`."""
        opening = [self.begin] if self._begin_deferred else []
        self._begin_deferred = False
        return opening

    def _send_opening(self, connection: Connection) -> None:
        """Send the deferred BEGIN now (before a statement with parameters)."""
        opening = self._take_opening()
        if opening:
            self._savepoint_statements(connection, opening)

    def _savepoint_statements(self, connection: Connection, statements: list[str]) -> None:
        """Run statements without parameters or results (dialect: one at a time)."""
        for statement in statements:
            connection.execute(statement)

    def _commit(self, connection: Connection) -> None:
        """COMMIT, with what the batch left to send with it (and a BEGIN never sent, for a
        batch of no calls); a separate method so a test can make it fail."""
        closing, self._closing = self._closing, []
        self._savepoint_statements(connection, [*self._take_opening(), *closing, "COMMIT"])

    async def _run(self, work: Callable[[Connection], T]) -> T:
        # Calls queue up until the committer runs; it takes all of them at once, so with
        # many concurrent callers one commit serves many.
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((work, future))
        if self._committer is None or self._committer.done():
            self._committer = loop.create_task(self._commit_loop())
        result: T = await future
        return result

    async def _commit_loop(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            try:
                outcomes = await self._apply_when_free([work for work, _ in batch])
            except BaseException as error:  # not an SQLite error: a bug; fail the batch
                for _, future in batch:
                    if not future.done():
                        future.set_exception(Unavailable(f"database: {error}"))
                raise
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():  # the caller went away (deadline); its change stands
                    continue
                if outcome.error is not None:
                    future.set_exception(outcome.error)
                else:
                    future.set_result(outcome.result)
            self._after_batch()

    def _after_batch(self) -> None:
        """Upkeep between two batches, once the last one's calls are answered (dialect:
        none; SQLite's runs on the loop's thread, where its connection lives)."""

    async def get_shard(
        self,
        job_id: str,
        dataset: str,
        worker: str,
        incarnation: int,
        done: Sequence[tuple[str, int, int | None]],
        max_shards: int = 1,
    ) -> FastGrant | SlowPath:
        """Complete the ``done`` shards ((field, shard id, lease) each, in order) and lease
        up to ``max_shards`` next ones, or SLOW."""

        def work(connection: Connection) -> FastGrant | SlowPath:
            now = datetime.now(UTC)
            stored, current = self._lock_and_touch(connection, job_id, dataset, worker, now)
            holder = queue.fence(current.record if current else None, worker, incarnation)
            assert current is not None  # fence raised otherwise
            if current.record.straggler:
                return SLOW
            if len(done) == 1:
                field, shard_id, lease = done[0]
                shard = self._shard(connection, stored.id, shard_id, field)
                records = self._complete(
                    connection, job_id, dataset, stored, holder, shard, lease, now
                )
            else:
                records = self._complete_many(
                    connection, job_id, dataset, stored, holder, done, now
                )
            self._rate(connection, job_id, worker, current, records, now)
            leased = self._lease_next(connection, stored.id, holder, now, max_shards)
            while len(leased) < max_shards:
                # The TODO rows ran out: write the next ones of the newest epoch, cutting the
                # next epoch if this one is all written (DLRover sec. 5.2), in this same
                # transaction. A batch of rows at a time, never a whole big epoch: that held
                # the lock every other job's calls wait for, for seconds (issue 37).
                written = self._write_rows(
                    connection, job_id, dataset, stored, now, max_shards - len(leased)
                )
                if written is None:
                    break
                stored = written
                leased += self._lease_next(
                    connection, stored.id, holder, now, max_shards - len(leased)
                )
            if leased:
                return FastGrant(tuple(leased), stored.parameters, None)
            doing = connection.execute(
                "SELECT 1 FROM shards WHERE dataset_id = ? AND state = 'DOING' LIMIT 1",
                (stored.id,),
            ).fetchone()
            why = Grant.RETRY_LATER if doing else Grant.END_OF_DATA
            return FastGrant((), stored.parameters, why)

        return await self._run(work)

    async def report_done(
        self,
        job_id: str,
        dataset: str,
        worker: str,
        incarnation: int,
        shard_id: int,
        lease: int | None,
    ) -> bool:
        """ReportShardDone; True if it changed anything (an event was queued)."""

        def work(connection: Connection) -> bool:
            now = datetime.now(UTC)
            current, holder, stored = self._fenced(
                connection, job_id, dataset, worker, incarnation, now
            )
            shard = self._shard(connection, stored.id, shard_id, "shard_id")
            records = self._complete(connection, job_id, dataset, stored, holder, shard, lease, now)
            self._rate(connection, job_id, worker, current, records, now)
            return records > 0

        return await self._run(work)

    async def report_progress(
        self,
        job_id: str,
        dataset: str,
        worker: str,
        incarnation: int,
        shard_id: int,
        offset: int,
        lease: int | None,
        renew_held: bool = False,
    ) -> None:
        """ReportProgress: keep the highest offset, renew the lease (and, with
        ``renew_held``, the worker's other leases in the dataset), update the rate."""

        def work(connection: Connection) -> None:
            self._report_progress_stepwise(
                connection,
                job_id,
                dataset,
                worker,
                incarnation,
                shard_id,
                offset,
                lease,
                datetime.now(UTC),
                renew_held,
            )

        await self._run(work)

    def _report_progress_stepwise(
        self,
        connection: Connection,
        job_id: str,
        dataset: str,
        worker: str,
        incarnation: int,
        shard_id: int,
        offset: int,
        lease: int | None,
        now: datetime,
        renew_held: bool = False,
    ) -> None:
        current, holder, stored = self._fenced(
            connection, job_id, dataset, worker, incarnation, now
        )
        shard = self._shard(connection, stored.id, shard_id, "shard_id")
        updated = queue.record_progress(shard, holder, offset, now, self.lease_duration, lease)
        if renew_held:
            connection.execute(
                "UPDATE shards SET lease_expires_at = ?, updated_at = ? WHERE dataset_id = ? "
                "AND worker = ? AND incarnation = ? AND state = 'DOING' AND shard_id <> ?",
                (
                    _stamp(now + self.lease_duration),
                    _stamp(now),
                    stored.id,
                    holder.worker,
                    holder.incarnation,
                    shard_id,
                ),
            )
        if updated == shard:
            return
        self._save(connection, stored.id, updated, now)
        self._rate(connection, job_id, worker, current, updated.offset - shard.offset, now)

    async def delete_outbox(self, last_seq: int) -> None:
        """Delete relayed outbox rows up to ``last_seq`` as part of the next group commit.

        The relay's delete through its own connection would take SQLite's write lock, and
        the hand-outs queued behind it would wait in SQLite's busy handler, which sleeps in
        growing steps (the tail latency); here it is one more statement of a batch.
        """

        def work(connection: Connection) -> None:
            connection.execute("DELETE FROM outbox WHERE seq <= ?", (last_seq,))

        await self._run(work)

    async def park_outbox(self, refused: Sequence[Refusal], last_seq: int) -> None:
        """Move ``refused`` outbox rows into ``outbox_dead_letter`` and delete relayed rows up
        to ``last_seq``, as one call of the next group commit (one savepoint: all or none).

        For the same reason as :meth:`delete_outbox`: through the general path this would
        wait for SQLite's write lock behind the hand-outs.
        """

        def work(connection: Connection) -> None:
            now = _stamp(datetime.now(UTC))
            for refusal in refused:
                row = connection.execute(
                    "SELECT message_id, subject, payload, headers, created_at FROM outbox "
                    "WHERE seq = ?",
                    (refusal.seq,),
                ).fetchone()
                if row is None:  # another relay of the service removed it first
                    continue
                connection.execute(
                    "INSERT INTO outbox_dead_letter (seq, message_id, subject, payload, "
                    "headers, reason, created_at, parked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        refusal.seq,
                        row[0],
                        row[1],
                        row[2],
                        json.dumps(_headers(row[3])),
                        refusal.reason,
                        row[4],  # as stored: text on SQLite, a timestamptz on PostgreSQL
                        now,
                    ),
                )
            connection.execute("DELETE FROM outbox WHERE seq <= ?", (last_seq,))

        await self._run(work)

    def relay_hooks(self) -> RelayHooks:
        """The outbox relay's reads, deletes and parks on this connection (``Outbox(...,
        hooks=fast.relay_hooks())``), so the relay never contends for the write lock."""
        return RelayHooks(self.pending_outbox, self.delete_outbox, self.park_outbox)

    async def pending_outbox(self, limit: int) -> list[PendingEvent]:
        """Up to ``limit`` outbox rows in order, read on this connection's thread."""

        def work(connection: Connection) -> list[PendingEvent]:
            rows = connection.execute(
                "SELECT seq, subject, payload, message_id, headers FROM outbox "
                "ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
            return [
                # SQLite keeps JSON as text; psycopg hands it back parsed.
                PendingEvent(
                    r[0], r[1], r[2], r[3], r[4] if isinstance(r[4], dict) else json.loads(r[4])
                )
                for r in rows
            ]

        return await self._run(work)

    def _fenced(
        self,
        connection: Connection,
        job_id: str,
        dataset: str,
        worker: str,
        incarnation: int,
        now: datetime,
    ) -> tuple[_Worker, Holder, _Dataset]:
        current = self._touch(connection, job_id, worker, now)
        holder = queue.fence(current.record if current else None, worker, incarnation)
        assert current is not None  # fence raised otherwise
        stored = self._find_dataset(connection, job_id, dataset)
        return current, holder, stored

    @staticmethod
    def _dataset(row: tuple[Any, ...] | None, job_id: str, dataset: str) -> _Dataset:
        if row is None:
            raise NotFound(f"dataset {dataset!r} of job {job_id!r} not found")
        return _Dataset(
            id=row[0],
            parameters=DatasetParameters(
                record_count=row[1],
                batch_size=row[2],
                shard_batches=row[3],
                epochs=row[4],
                shuffle=bool(row[5]),
                seed=row[6],
                kind=ShardingKind(row[7]),
                partitions=row[8],
            ),
            epochs_created=row[9],
            written=row[10],
        )

    def _lock_dataset(self, connection: Connection, job_id: str, dataset: str) -> _Dataset:
        if self.locks_rows:  # the row lock the general path's lock_dataset takes
            row = connection.execute(_LOCK_DATASET, (job_id, dataset)).fetchone()
            return self._dataset(row, job_id, dataset)
        # The batch's BEGIN IMMEDIATE already holds SQLite's one write lock, so unlike the
        # general path's lock_dataset no row needs touching (one page fewer per commit).
        return self._find_dataset(connection, job_id, dataset)

    def _lock_and_touch(
        self, connection: Connection, job_id: str, dataset: str, worker: str, now: datetime
    ) -> tuple[_Dataset, _Worker | None]:
        """:meth:`_lock_dataset`, then :meth:`_touch` (dialect: one after the other)."""
        return self._lock_dataset(connection, job_id, dataset), self._touch(
            connection, job_id, worker, now
        )

    def _find_dataset(self, connection: Connection, job_id: str, dataset: str) -> _Dataset:
        row = connection.execute(
            f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE job_id = ? AND dataset = ?",
            (job_id, dataset),
        ).fetchone()
        return self._dataset(row, job_id, dataset)

    @staticmethod
    def _touch(connection: Connection, job_id: str, worker: str, now: datetime) -> _Worker | None:
        row = connection.execute(_TOUCH, (_stamp(now), job_id, worker)).fetchone()
        return _worker(worker, row)

    def _shard(
        self, connection: Connection, dataset_id: int, shard_id: int, field: str
    ) -> ShardRecord:
        row = connection.execute(
            f"SELECT {SHARD_COLUMNS} FROM shards WHERE dataset_id = ? AND shard_id = ?"
            + (" FOR UPDATE" if self.locks_rows else ""),
            (dataset_id, shard_id),
        ).fetchone()
        if row is None:
            raise NotFound(f"{field}: shard {shard_id} not found")
        return _shard(row)

    def _save(
        self, connection: Connection, dataset_id: int, shard: ShardRecord, now: datetime
    ) -> None:
        self._write(connection, _SAVE_SHARD, _save_parameters(dataset_id, shard, now))

    def _new_rate(self, current: _Worker, records: int, now: datetime) -> float | None:
        """The worker's progress rate after ``records`` more (None: unchanged)."""
        if records <= 0:
            return None
        elapsed = (
            self.window if current.rate_at is None else (now - current.rate_at).total_seconds()
        )
        return decayed_rate(current.rate, records, elapsed, self.window)

    def _rate(
        self,
        connection: Connection,
        job_id: str,
        worker: str,
        current: _Worker,
        records: int,
        now: datetime,
    ) -> None:
        rate = self._new_rate(current, records, now)
        if rate is None:
            return
        self._write(
            connection,
            "UPDATE workers SET rate = ?, rate_at = ? WHERE job_id = ? AND worker = ?",
            (rate, _stamp(now), job_id, worker),
        )

    def _complete(
        self,
        connection: Connection,
        job_id: str,
        dataset: str,
        stored: _Dataset,
        holder: Holder,
        shard: ShardRecord,
        lease: int | None,
        now: datetime,
    ) -> int:
        """Mark the shard done and queue its event; the records this consumed (the caller
        updates the worker's rate once for every shard it completes)."""
        done = queue.complete(shard, holder, lease)
        if done == shard:
            return 0
        self._save(connection, stored.id, done, now)
        event = topics.SHARD_DONE.outgoing(
            job_id,
            shard_progress(job_id, dataset, done, now),
            f"{job_id}.{dataset}.{done.shard_id}.done.{done.leases}",
        )
        self._write(connection, _INSERT_OUTBOX, _outbox_row(event, now))
        return done.offset - shard.offset

    def _complete_many(
        self,
        connection: Connection,
        job_id: str,
        dataset: str,
        stored: _Dataset,
        holder: Holder,
        done: Sequence[tuple[str, int, int | None]],
        now: datetime,
    ) -> int:
        """:meth:`_complete` for several shards at once (a batched GetShard's reports): one
        read, one batch of writes for the shards and one ``ShardsDone`` event for them all
        (on PostgreSQL three round trips instead of three per shard). The same domain
        function decides each; a refused one raises before anything is written."""
        found = {
            shard.shard_id: shard
            for shard in self._shards(connection, stored.id, [item[1] for item in done])
        }
        changed: list[tuple[ShardRecord, ShardRecord]] = []
        for field, shard_id, lease in done:
            shard = found.get(shard_id)
            if shard is None:
                raise NotFound(f"{field}: shard {shard_id} not found")
            finished = queue.complete(shard, holder, lease)
            if finished != shard:
                changed.append((shard, finished))
        if not changed:
            return 0
        self._save_many(connection, [_save_parameters(stored.id, f, now) for _, f in changed])
        # One event for the call's shards (a "done" event each would be published, signed
        # and stored one by one: most of a batched pair's cost, measured).
        first = changed[0][1]
        event = topics.SHARDS_DONE.outgoing(
            job_id,
            shards_done(job_id, dataset, holder.worker, [f for _, f in changed], now),
            shards_done_id(job_id, dataset, first),
        )
        self._write(connection, _INSERT_OUTBOX, _outbox_row(event, now))
        return sum(finished.offset - shard.offset for shard, finished in changed)

    def _save_many(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Write several shards (``_save_parameters`` rows) (dialect: SQLite, in-process,
        where a statement per row costs next to nothing)."""
        connection.executemany(_SAVE_SHARD, rows)

    def _shards(
        self, connection: Connection, dataset_id: int, shard_ids: Sequence[int]
    ) -> list[ShardRecord]:
        """The shards of ``shard_ids`` that exist (dialect: SQLite)."""
        marks = ", ".join("?" * len(shard_ids))
        rows = connection.execute(
            f"SELECT {SHARD_COLUMNS} FROM shards WHERE dataset_id = ? AND shard_id IN ({marks})",
            (dataset_id, *shard_ids),
        ).fetchall()
        return [_shard(row) for row in rows]

    def _write_rows(
        self,
        connection: Connection,
        job_id: str,
        dataset: str,
        stored: _Dataset,
        now: datetime,
        wanted: int,
    ) -> _Dataset | None:
        """Write the next TODO rows (:func:`next_rows`); the dataset as it is now, or None
        when every shard of the last epoch has its row. Raises ``OrderNotReady`` for a big
        shuffled epoch whose order is not computed: the caller computes it off the event
        loop and calls again (this call's savepoint is rolled back)."""
        batch = next_rows(
            stored.parameters, stored.epochs_created, stored.written, wanted, self.rows_per_write
        )
        if batch is None:
            return None
        planned = plan_positions(stored.parameters, batch.epoch, batch.first, batch.stop)
        stamp = _stamp(now)
        self._insert_shards(
            connection,
            [
                (stored.id, p.shard_id, p.epoch, p.position, p.start, p.end, stamp, p.partition)
                for p in planned
            ],
        )
        self._write(
            connection,
            "UPDATE datasets SET epochs_created = ?, written = ? WHERE id = ?",
            (batch.epoch + 1, batch.stop, stored.id),
        )
        if batch.new_epoch:
            shards = stored.parameters.shards_per_epoch
            log.info(
                "epoch started", job_id=job_id, dataset=dataset, epoch=batch.epoch, shards=shards
            )
        return _Dataset(stored.id, stored.parameters, batch.epoch + 1, batch.stop)

    def _lease_many(
        self,
        connection: Connection,
        lease: tuple[Any, ...],
        scan: tuple[int, int, int],
        count: int,
    ) -> list[tuple[Any, ...]]:
        """The rows of the next ``count`` TODO shards, leased: ``lease`` is (worker,
        incarnation, expiry, now), ``scan`` (dataset id, epoch and position to scan from)
        (dialect: SQLite)."""
        rows: list[tuple[Any, ...]] = connection.execute(
            _LEASE_MANY, (*lease, scan[0], *scan, count)
        ).fetchall()
        return rows

    def _insert_shards(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert an epoch's new TODO shards: (dataset id, shard id, epoch, position, start,
        end, updated at, partition) each (dialect: SQLite, a statement per row)."""
        connection.executemany(_INSERT_SHARD, rows)

    def _lease_next(
        self, connection: Connection, dataset_id: int, holder: Holder, now: datetime, count: int
    ) -> list[ShardRecord]:
        """Lease the next ``count`` TODO shards (fewer if fewer are left), in hand-out order.

        The scan for TODO shards starts where this batch's last lease in the dataset left
        off (:attr:`_front`), not at the head of the queue: every shard an earlier call of
        the same transaction leased still has its TODO index entry there, which PostgreSQL
        cannot skip until the transaction commits, and each one cost a visit to its row (on
        PostgreSQL the lease statement cost 2.5 ms for 16 shards with 8 callers, found with
        pg_stat_statements under ``bench/dispatcher_vs_dlrover.py``). Nothing before the
        front is TODO except a shard another transaction returned meanwhile; the next batch,
        which scans from the head again, hands that out.
        """
        epoch, position = self._front.get(dataset_id, (-1, -1))
        lease = (holder.worker, holder.incarnation, _stamp(now + self.lease_duration), _stamp(now))
        scan = (dataset_id, epoch, position)
        if count == 1:  # the common call: "=" lets both databases take the one row directly
            row = connection.execute(_LEASE_ONE, (*lease, dataset_id, *scan)).fetchone()
            leased = [] if row is None else [_shard(row)]
        else:
            rows = self._lease_many(connection, lease, scan, count)
            # RETURNING gives no order: hand-out order is (epoch, position, shard id).
            leased = sorted(
                (_shard(row) for row in rows), key=lambda s: (s.epoch, s.position, s.shard_id)
            )
        if leased:
            self._front[dataset_id] = (leased[-1].epoch, leased[-1].position)
        return leased


class SqliteFastPath(FastPath):
    """The fast path on SQLite: on the loop's thread, checkpoints in the background (see the
    module docstring)."""

    errors = (sqlite3.Error,)
    begin = "BEGIN IMMEDIATE"  # takes SQLite's one write lock: no row locks needed
    locks_rows = False
    wal_reset_frames = WAL_RESET_FRAMES
    _rewind = False
    """Set by the background checkpoints when the WAL passed ``wal_reset_frames``."""
    rewinds = 0
    """TRUNCATE checkpoints the hot connection ran (the WAL rewound and truncated)."""

    def _after_batch(self) -> None:
        """Between two batches (no transaction open): rewind the WAL if it grew too long.
        Busy (a reader still uses the log) changes nothing; the next round asks again."""
        if not self._rewind or self._connection is None:
            return
        self._rewind = False
        try:
            busy, _, _ = self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as error:
            log.warning("WAL rewind failed; retrying later", error=str(error))
            return
        if not busy:
            self.rewinds += 1

    def _connect(self) -> Connection:
        """The dedicated connection, opened on first use (dialect)."""
        if self._connection is None:
            connection = sqlite3.connect(self.path, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            # Never wait inside SQLite: on the loop's thread that would stall the very
            # coroutines (the general path's connections) that hold the lock. BUSY is
            # retried by _commit_loop, yielding to the loop in between.
            connection.execute("PRAGMA busy_timeout=0")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute(f"PRAGMA synchronous={'FULL' if self.sync_commits else 'NORMAL'}")
            connection.execute("PRAGMA wal_autocheckpoint=0")  # see run_checkpoints
            self._connection = connection
        return self._connection

    def _is_busy(self, error: Exception) -> bool:
        return (
            isinstance(error, sqlite3.OperationalError)
            and error.sqlite_errorcode == sqlite3.SQLITE_BUSY
        )

    async def _apply_when_free(self, works: list[Callable[[Connection], Any]]) -> list[_Outcome]:
        """Apply a batch; while another connection holds the write lock, yield and retry."""
        delay, waited = 0.0005, 0.0
        while True:
            try:
                return self._apply_batch(works)
            except _Busy:
                if waited >= BUSY_TIMEOUT:
                    failure = Unavailable(
                        f"database: still locked by another writer after {BUSY_TIMEOUT:g} s"
                    )
                    return [_Outcome(None, failure)] * len(works)
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 0.01)

    async def run_checkpoints(self, stop: asyncio.Event, interval: float = 1.0) -> None:
        """Copy the WAL into the database every ``interval`` seconds until ``stop``.

        PASSIVE checkpoints on a connection of their own, in a thread: they never wait for
        or block a writer, and a hand-out never pays for one (see the module docstring).
        """
        loop = asyncio.get_running_loop()
        holder: list[Connection] = []

        def checkpoint() -> None:
            if not holder:
                holder.append(sqlite3.connect(self.path, isolation_level=None))
            _, frames, _ = holder[0].execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if frames > self.wal_reset_frames:
                self._rewind = True

        try:
            while not stop.is_set():
                try:
                    await loop.run_in_executor(self._executor, checkpoint)
                except sqlite3.Error as error:  # busy or a disk blip: try again next round
                    log.warning("WAL checkpoint failed; retrying", error=str(error))
                try:
                    await asyncio.wait_for(stop.wait(), interval)
                except TimeoutError:
                    continue
        finally:
            if holder:
                await loop.run_in_executor(self._executor, holder[0].close)


def _outbox_row(event: Outgoing, now: datetime) -> tuple[Any, ...]:
    """An event's outbox row (``_INSERT_OUTBOX``'s parameters), queued in the batch's
    transaction."""
    return (
        event.message_id,
        event.subject,
        event.payload,
        json.dumps(dict(event.headers)),
        _stamp(now),
    )


_INSERT_OUTBOX = (
    "INSERT INTO outbox (message_id, subject, payload, headers, created_at) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (message_id) DO NOTHING"
)
_INSERT_SHARD = (
    "INSERT INTO shards (dataset_id, shard_id, epoch, position, start_index, end_index, "
    "consumed, state, worker, incarnation, leases, lease_expires_at, updated_at, "
    "partition) VALUES (?, ?, ?, ?, ?, ?, 0, 'TODO', NULL, NULL, 0, NULL, ?, ?)"
)
_PG_INSERT_SHARDS = (
    "INSERT INTO shards (dataset_id, shard_id, epoch, position, start_index, end_index, "
    "consumed, state, worker, incarnation, leases, lease_expires_at, updated_at, "
    "partition) SELECT v.dataset_id, v.shard_id, v.epoch, v.position, v.start_index, "
    "v.end_index, 0, 'TODO', NULL, NULL, 0, NULL, v.updated_at, v.partition "
    "FROM unnest(?::int[], ?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[], ?::bigint[], "
    "?::timestamptz[], ?::int[]) AS v(dataset_id, shard_id, epoch, position, start_index, "
    "end_index, updated_at, partition)"
)
"""An epoch's shards on PostgreSQL in one statement (the rows of
:meth:`FastPath._insert_shards`, as columns)."""
_PG_SHARDS_LOCKED = (
    "SELECT "
    + ", ".join(f"s.{column.strip()}" for column in SHARD_COLUMNS.split(","))
    + " FROM unnest(?::int[], ?::bigint[]) AS k(dataset_id, shard_id) JOIN shards s "
    "ON s.dataset_id = k.dataset_id AND s.shard_id = k.shard_id ORDER BY s.shard_id "
    "FOR UPDATE OF s"
)
"""A dataset's shards by id, locked in key order, on PostgreSQL: the dataset id comes with
each key (an array) so that the planner sees no ``dataset_id = ?`` to scan by (see
``_PG_LEASE_MANY``)."""
_SAVE_SHARD = (
    "UPDATE shards SET end_index = ?, consumed = ?, state = ?, worker = ?, "
    "incarnation = ?, leases = ?, lease_expires_at = ?, updated_at = ? "
    "WHERE dataset_id = ? AND shard_id = ?"
)


def _save_parameters(dataset_id: int, shard: ShardRecord, now: datetime) -> tuple[Any, ...]:
    return (
        shard.end,
        shard.offset,
        shard.state.value,
        None if shard.holder is None else shard.holder.worker,
        None if shard.holder is None else shard.holder.incarnation,
        shard.leases,
        None if shard.lease_expires_at is None else _stamp(shard.lease_expires_at),
        _stamp(now),
        dataset_id,
        shard.shard_id,
    )


_PG_SAVE_MANY = (
    "UPDATE shards SET end_index = v.end_index, consumed = v.consumed, state = v.state, "
    "worker = v.worker, incarnation = v.incarnation, leases = v.leases, "
    "lease_expires_at = v.lease_expires_at, updated_at = v.updated_at "
    "FROM unnest(?::bigint[], ?::bigint[], ?::text[], ?::text[], ?::bigint[], ?::int[], "
    "?::timestamptz[], ?::timestamptz[], ?::int[], ?::bigint[]) AS v(end_index, consumed, "
    "state, worker, incarnation, leases, lease_expires_at, updated_at, dataset_id, shard_id) "
    "WHERE shards.dataset_id = v.dataset_id AND shards.shard_id = v.shard_id"
)
"""Several shards' writes on PostgreSQL in one statement (the columns of
:func:`_save_parameters`, in its order)."""
_PG_HEARTBEATS_READ = (
    "SELECT v.i, w.incarnation, w.lost, w.straggler, w.rate, w.rate_at, d.id, "
    + ", ".join(f"s.{column.strip()}" for column in SHARD_COLUMNS.split(","))
    + " FROM unnest(?::int[], ?::text[], ?::text[], ?::text[], ?::bigint[]) "
    "AS v(i, job_id, worker, dataset, shard_id) "
    "JOIN workers w ON w.job_id = v.job_id AND w.worker = v.worker "
    "JOIN datasets d ON d.job_id = v.job_id AND d.dataset = v.dataset "
    "JOIN shards s ON s.dataset_id = d.id AND s.shard_id = v.shard_id "
    "ORDER BY w.job_id, w.worker FOR UPDATE OF w, s"
)
"""A batch's heartbeats' reads on PostgreSQL in one statement: each one's worker and shard
rows, locked (worker rows in key order, as the general path locks one), and its dataset."""
_PG_HEARTBEATS_WRITE = (
    "WITH v AS (SELECT * FROM unnest(?::text[], ?::text[], ?::timestamptz[], ?::float8[], "
    "?::timestamptz[], ?::int[], ?::bigint[], ?::bigint[], ?::bigint[], ?::text[], ?::text[], "
    "?::bigint[], ?::int[], ?::timestamptz[]) AS v(job_id, worker, touched, rate, rate_at, "
    "dataset_id, shard_id, end_index, consumed, state, holder, incarnation, leases, "
    "lease_expires_at)), "
    "saved AS (UPDATE shards SET end_index = v.end_index, consumed = v.consumed, "
    "state = v.state, worker = v.holder, incarnation = v.incarnation, leases = v.leases, "
    "lease_expires_at = v.lease_expires_at, updated_at = v.touched FROM v "
    "WHERE v.shard_id IS NOT NULL AND shards.dataset_id = v.dataset_id "
    "AND shards.shard_id = v.shard_id RETURNING shards.shard_id) "
    "UPDATE workers SET last_seen_at = v.touched, rate = coalesce(v.rate, workers.rate), "
    "rate_at = coalesce(v.rate_at, workers.rate_at) FROM v "
    "WHERE workers.job_id = v.job_id AND workers.worker = v.worker"
)
"""A batch's heartbeats' writes on PostgreSQL in one statement: each one's shard (unless
unchanged), then its worker's touch and rate (unless unchanged)."""


@dataclass(frozen=True)
class _Heartbeat:
    """A queued ReportProgress on PostgreSQL. Alone (in a savepoint) it runs the stepwise
    path; in a batch with others, :meth:`PostgresFastPath._apply_calls` reads for all and
    :meth:`decide` decides each."""

    fast: FastPath
    job_id: str
    dataset: str
    worker: str
    incarnation: int
    shard_id: int
    offset: int
    lease: int | None
    renew_held: bool = False
    """Also renew the worker's other leases: such a heartbeat runs alone (stepwise)."""

    def __call__(self, connection: Connection) -> None:
        self.fast._report_progress_stepwise(
            connection,
            self.job_id,
            self.dataset,
            self.worker,
            self.incarnation,
            self.shard_id,
            self.offset,
            self.lease,
            datetime.now(UTC),
            self.renew_held,
        )

    def decide(self, row: Sequence[Any], now: datetime) -> tuple[Any, ...]:
        """From the read's row (worker, dataset id, shard): the write's values, or the
        refusal ``queue.fence`` or ``queue.record_progress`` raises."""
        record = WorkerRecord(self.worker, row[0], bool(row[1]), bool(row[2]))
        current = _Worker(record, row[3], _moment(row[4]))
        holder = queue.fence(record, self.worker, self.incarnation)
        dataset_id, shard = row[5], _shard(tuple(row[6:]))
        fast = self.fast
        updated = queue.record_progress(
            shard, holder, self.offset, now, fast.lease_duration, self.lease
        )
        rate = None
        shard_values: tuple[Any, ...] = (None,) * 9
        if updated != shard:
            rate = fast._new_rate(current, updated.offset - shard.offset, now)
            expires = updated.lease_expires_at
            shard_values = (
                dataset_id,
                updated.shard_id,
                updated.end,
                updated.offset,
                updated.state.value,
                None if updated.holder is None else updated.holder.worker,
                None if updated.holder is None else updated.holder.incarnation,
                updated.leases,
                None if expires is None else _stamp(expires),
            )
        return (
            self.job_id,
            self.worker,
            _stamp(now),
            rate,
            None if rate is None else _stamp(now),
            *shard_values,
        )


def _pg_array(values: Iterable[Any]) -> str:
    """A PostgreSQL array literal of ``values`` (ints, floats, strings, None), for a
    parameter the statement casts (``?::bigint[]``). psycopg's list dumper looks up a dumper
    for every element: it was 7 % of the dispatcher's CPU under batched hand-outs (py-spy,
    ``bench/dispatcher_vs_dlrover.py``); this is a join."""
    values = list(values)
    if all(type(value) is int for value in values):
        return "{" + ",".join(map(str, values)) + "}"
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
        elif isinstance(value, str):
            parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:
            parts.append(str(value))
    return "{" + ",".join(parts) + "}"


def _pg_columns(rows: Sequence[Sequence[Any]]) -> list[str]:
    """Rows as one array literal per column (the parameters of an ``unnest`` statement)."""
    return [_pg_array(column) for column in zip(*rows, strict=True)]


class _PgConnection:
    """A psycopg connection (autocommit) with the ``sqlite3`` calls the fast path makes:
    ``?`` placeholders become ``%s`` (once per statement text).

    Statements whose result nobody reads wait to go with the next one that is read, in one
    pipeline (one round trip to the server): the transaction's and savepoints' statements
    (:meth:`prefix`) and a call's writes (:meth:`defer`). A round trip cost about 60 us of
    the dispatcher's CPU (a one-row prepared UPDATE through psycopg, measured), and a batched
    GetShard made nine of them; it makes three now (dataset lock and worker touch; the done
    shards' read; their writes, the event, the rate and the lease).
    """

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self.connection = connection
        self._texts: dict[str, str] = {}
        self._prefix: list[str] = []
        self._deferred: list[tuple[str, Sequence[Any]]] = []

    def prefix(self, statements: Sequence[str]) -> None:
        """Queue statements without parameters (BEGIN, SAVEPOINT, RELEASE): they are always
        sent, first, with the next statement."""
        self._prefix.extend(statements)

    def defer(self, sql: str, parameters: Sequence[Any]) -> None:
        """Queue a write to go with the next statement (or :meth:`flush`)."""
        self._deferred.append((sql, parameters))

    def discard(self) -> None:
        """Drop the queued writes (their call is being rolled back); the prefix stays."""
        self._deferred.clear()

    def reset(self) -> None:
        """Drop everything queued (a batch that failed)."""
        self._prefix.clear()
        self._deferred.clear()

    def flush(self) -> None:
        """Send what is queued, if anything."""
        if self._prefix or self._deferred:
            self.execute_all([])

    REPLANNED: Final = frozenset(
        {
            _PG_LEASE_MANY,
            _PG_SHARDS_LOCKED,
            _PG_SAVE_MANY,
            _PG_HEARTBEATS_READ,
            _PG_HEARTBEATS_WRITE,
        }
    )
    """Statements planned at every execution, for the table as it is then (the rest are
    prepared once and planned the way PostgreSQL's plan cache chooses): the joins. The plan
    cache settled on a generic plan made while the shards table was small and kept it after
    the table grew, a hash join over a scan of the whole table to fetch 16 shards, 4-13 ms a
    call (auto_explain under bench/dispatcher_vs_dlrover.py). Planning every statement
    instead cost a single-shard call about 200 us of PostgreSQL's CPU (pg_stat_statements)."""

    def _run(self, sql: str, parameters: Sequence[Any]) -> psycopg.Cursor[Any]:
        prepare = bool(parameters) and sql not in self.REPLANNED
        return self.connection.execute(self._text(sql), parameters, prepare=prepare)

    def execute_all(
        self, statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[psycopg.Cursor[Any]]:
        """Send what is queued and ``statements`` in one pipeline; their cursors, in order.
        An error raises here, for the first statement that failed."""
        everything = [*((sql, ()) for sql in self._prefix), *self._deferred, *statements]
        self.reset()
        if len(everything) == 1:
            return [self._run(*everything[0])]
        with self.connection.pipeline():
            cursors = [self._run(sql, parameters) for sql, parameters in everything]
        return cursors[len(everything) - len(statements) :]

    def _text(self, sql: str) -> str:
        text = self._texts.get(sql)
        if text is None:
            text = self._texts[sql] = sql.replace("?", "%s")
        return text

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        """Run one statement (after what is queued); the cursor has ``fetchone``/``fetchall``."""
        return self.execute_all([(sql, parameters)])[0]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement for every row."""
        self.flush()
        with self.connection.cursor() as cursor:
            cursor.executemany(self._text(sql), rows)

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (or failed and not yet rolled back)."""
        return self.connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()


class PostgresFastPath(FastPath):
    """The same calls on PostgreSQL, through psycopg directly, with group commit.

    Through SQLAlchemy's asyncio adapter a PostgreSQL hand-out cost 5-6 ms of CPU (statement
    handling and the greenlet bridge, about ten statements); here it is the same SQL as on
    SQLite, prepared once per connection. Differences from SQLite: the network round trips
    block, so batches run on one dedicated thread (the loop never waits on PostgreSQL);
    ``BEGIN`` takes no lock, so rows are locked as the general path locks them (the dataset
    row for a hand-out, the worker row, the shard row ``FOR UPDATE``), in the same order.
    A batch holds its row locks until its COMMIT; if a general-path transaction (a
    straggler's split, the lease sweeper) and a batch ever deadlock, PostgreSQL aborts one:
    if it is the batch, its calls answer UNAVAILABLE and the clients retry them.
    """

    errors = (psycopg.Error,)
    combines_statements = True

    def __init__(
        self,
        url: str,
        schema: str,
        lease_duration: timedelta,
        rate_window: timedelta,
        sync_commits: bool,
        *,
        rows_per_write: int = ROWS_PER_WRITE,
    ) -> None:
        super().__init__(
            url, lease_duration, rate_window, sync_commits, rows_per_write=rows_per_write
        )
        self.schema = schema

    def _connect(self) -> Connection:
        if self._connection is not None and (
            self._connection.connection.closed or self._connection.connection.broken
        ):
            # The server restarted or dropped us: a new connection, or the dispatcher would
            # answer UNAVAILABLE for good (found by bench/chaos.py's PostgreSQL restart).
            log.warning("fast-path connection lost; reconnecting")
            with contextlib.suppress(psycopg.Error):
                self._connection.close()
            self._connection = None
        if self._connection is None:
            raw = psycopg.connect(self.path, autocommit=True)
            raw.execute(
                psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(self.schema))
            )
            raw.execute("SET TIME ZONE 'UTC'")  # timestamps are written as UTC text
            # Key lookups never scan the table, whatever size the statistics (or a plan cached
            # while the table was small) say it has: a generic plan for "the row with this key"
            # made on a 200-row table is a scan, and stays cached after the table grew. The
            # statements that join are planned at every execution (_PgConnection.REPLANNED).
            raw.execute("SET enable_seqscan = off")
            # Commits stay synchronous whatever sync_commits says: with synchronous_commit
            # off, a crash of the database server loses the last acknowledged reports, and
            # their shards are read again (DispatcherSettings.sync_commits).
            self._connection = _PgConnection(raw)
        return self._connection

    def _save_many(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        # One statement over arrays: a statement per row costs a pipelined round of the
        # driver's work each.
        self._write(connection, _PG_SAVE_MANY, _pg_columns(rows))

    def _write(self, connection: Connection, sql: str, parameters: Sequence[Any]) -> None:
        connection.defer(sql, parameters)

    def _flush(self, connection: Connection) -> None:
        connection.flush()

    def _discard(self, connection: Connection, everything: bool = False) -> None:
        if everything:
            connection.reset()
        else:
            connection.discard()

    def _lock_and_touch(
        self, connection: Connection, job_id: str, dataset: str, worker: str, now: datetime
    ) -> tuple[_Dataset, _Worker | None]:
        # One round trip for both (in the general path's lock order: dataset, then worker).
        locked, touched = connection.execute_all(
            [(_LOCK_DATASET, (job_id, dataset)), (_TOUCH, (_stamp(now), job_id, worker))]
        )
        stored = self._dataset(locked.fetchone(), job_id, dataset)
        return stored, _worker(worker, touched.fetchone())

    def _lease_many(
        self,
        connection: Connection,
        lease: tuple[Any, ...],
        scan: tuple[int, int, int],
        count: int,
    ) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = connection.execute(
            _PG_LEASE_MANY, (*lease, *scan, count)
        ).fetchall()
        return rows

    def _insert_shards(self, connection: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        # One statement over arrays: a statement per row cost about 25 us of the two
        # processes' CPU per shard, a seventh of a batched pair's (bench/dispatcher_vs_dlrover.py).
        connection.execute(_PG_INSERT_SHARDS, _pg_columns(rows))

    def _shards(
        self, connection: Connection, dataset_id: int, shard_ids: Sequence[int]
    ) -> list[ShardRecord]:
        # Locked in key order, as a batch of heartbeats locks them.
        # Joined by the whole key, as _PG_LEASE_MANY says why.
        rows = connection.execute(
            _PG_SHARDS_LOCKED, (_pg_array([dataset_id] * len(shard_ids)), _pg_array(shard_ids))
        ).fetchall()
        return [_shard(row) for row in rows]

    def _savepoint_statements(self, connection: Connection, statements: list[str]) -> None:
        # They go with the next statement (the COMMIT: now, with the writes still queued).
        if "COMMIT" in statements:
            connection.execute_all([(statement, ()) for statement in statements])
        else:
            connection.prefix(statements)

    async def report_progress(
        self,
        job_id: str,
        dataset: str,
        worker: str,
        incarnation: int,
        shard_id: int,
        offset: int,
        lease: int | None,
        renew_held: bool = False,
    ) -> None:
        """ReportProgress, the heartbeat and the busiest call: queued as a
        :class:`_Heartbeat`, which a batch applies together with the batch's other
        heartbeats (:meth:`_apply_calls`)."""
        await self._run(
            _Heartbeat(
                self, job_id, dataset, worker, incarnation, shard_id, offset, lease, renew_held
            )
        )

    def _apply_calls(
        self, connection: Connection, works: Sequence[Callable[[Connection], Any]]
    ) -> list[_Outcome]:
        """The batch's heartbeats first, all of them in two statements (one reads and locks
        their workers' and shards' rows, one writes the shards and the workers' touch and
        rate), then every other call in its savepoint, in order. Through one connection the
        round trips are the limit (five per heartbeat, each waiting for the server): under
        1,000 agents at 1 Hz, heartbeats queued for seconds (``bench/agents_load.py``).

        Each heartbeat gets what it would have got alone: the same domain functions decide
        it (``queue.fence``, ``queue.record_progress``), and one that is refused writes
        nothing. A heartbeat whose worker, dataset or shard the read did not find runs
        alone in its savepoint, which raises the error that names what is missing. The
        reorder is harmless: a worker's heartbeat and another call about the same shard in
        one batch end the same either way (a late heartbeat on a shard its holder finished
        changes nothing)."""
        beats = [
            (index, work)
            for index, work in enumerate(works)
            if isinstance(work, _Heartbeat) and not work.renew_held
        ]
        if len(beats) < 2:
            return super()._apply_calls(connection, works)
        outcomes: dict[int, _Outcome] = {}
        alone: list[int] = []
        now = datetime.now(UTC)
        self._send_opening(connection)  # the batch's BEGIN, before statements with parameters
        found = connection.execute(
            _PG_HEARTBEATS_READ,
            (
                _pg_array([index for index, _ in beats]),
                _pg_array([beat.job_id for _, beat in beats]),
                _pg_array([beat.worker for _, beat in beats]),
                _pg_array([beat.dataset for _, beat in beats]),
                _pg_array([beat.shard_id for _, beat in beats]),
            ),
        ).fetchall()
        rows = {row[0]: row[1:] for row in found}
        writes: list[tuple[Any, ...]] = []
        for index, beat in beats:
            row = rows.get(index)
            if row is None:
                alone.append(index)
                continue
            try:
                writes.append(beat.decide(row, now))
            except Exception as error:
                outcomes[index] = _Outcome(None, error)
                continue
            outcomes[index] = _Outcome(None, None)
        if writes:
            columns = _pg_columns(writes)
            connection.execute(_PG_HEARTBEATS_WRITE, columns)
        batched = {index for index, _ in beats}
        rest = [index for index in range(len(works)) if index not in batched]
        order = sorted(alone + rest)
        others = super()._apply_calls(connection, [works[index] for index in order])
        for index, outcome in zip(order, others, strict=True):
            outcomes[index] = outcome
        return [outcomes[index] for index in range(len(works))]

    async def _apply_when_free(self, works: list[Callable[[Connection], Any]]) -> list[_Outcome]:
        # Round trips to the server block: one hop to the dedicated thread per batch.
        return await self._on_connection_thread(partial(self._apply_batch, works))

    async def _on_connection_thread(self, action: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, action)
