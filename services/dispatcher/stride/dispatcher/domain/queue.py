"""The shard queue's state machine: TODO -> DOING -> DONE, and back to TODO on failure.

DLRover sec. 5.2 and DLRover-RM sec. 5.1: a worker's request moves a shard from the TODO
queue to DOING, marked with the worker; heartbeats carry the progress offset; a finished
shard leaves DOING; a failed or lost worker's shards go back to TODO, and a re-issued shard
resumes from its last reported offset. Together this consumes every record of an epoch
exactly once, as far as consumption was reported.

Workers are fenced by an incarnation token: registering again (a restarted pod) or being
marked lost makes every older token stale, so a zombie cannot report on a shard that has
moved on.

The transitions are pure functions over one :class:`ShardRecord`; the service applies them
to database rows inside a transaction. :class:`ShardQueue` applies the same functions to an
in-memory queue. It is the executable specification that the property tests check, and a
simulator can run it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum

from stride.dispatcher.domain.datasets import SPLIT_ID_BASE, DatasetParameters
from stride.dispatcher.domain.sharding import PlannedShard, plan_epoch
from stride.dispatcher.domain.stragglers import straggler_shard_records
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound


class ShardState(Enum):
    """Which queue a shard is in."""

    TODO = "TODO"
    DOING = "DOING"
    DONE = "DONE"


@dataclass(frozen=True)
class Holder:
    """One incarnation of a worker."""

    worker: str
    incarnation: int


@dataclass(frozen=True)
class ShardRecord:
    """A shard and where it stands."""

    shard_id: int
    epoch: int
    position: int
    """Place in the epoch's hand-out order."""
    start: int
    end: int
    offset: int = 0
    """Records of the shard consumed (reported); a re-issued shard resumes here."""
    state: ShardState = ShardState.TODO
    holder: Holder | None = None
    """The worker holding it (DOING), or the last one that did (TODO after a release, DONE)."""
    leases: int = 0
    """How many times it was leased; names each re-issue deterministically."""
    lease_expires_at: datetime | None = None
    """When the lease lapses without a progress report (enforced by the lease sweeper)."""
    partition: int = 0
    """Stream partition (0 for the index kinds)."""

    @property
    def size(self) -> int:
        """Records in the shard."""
        return self.end - self.start

    @classmethod
    def planned(cls, shard: PlannedShard) -> ShardRecord:
        """A fresh TODO record of a planned shard."""
        return cls(
            shard.shard_id,
            shard.epoch,
            shard.position,
            shard.start,
            shard.end,
            partition=shard.partition,
        )


@dataclass(frozen=True)
class WorkerRecord:
    """A registered worker: its current incarnation, and whether it was declared lost."""

    worker: str
    incarnation: int
    lost: bool = False
    straggler: bool = False


def fence(record: WorkerRecord | None, worker: str, incarnation: int) -> Holder:
    """The caller as a :class:`Holder`, or FailedPrecondition if its token is not current."""
    if record is None:
        raise FailedPrecondition(
            f"worker {worker!r} is not registered for this job; call RegisterWorker first"
        )
    if incarnation != record.incarnation:
        raise FailedPrecondition(
            f"worker {worker!r} incarnation {incarnation} is stale; the current one is "
            f"{record.incarnation} (register again)"
        )
    if record.lost:
        raise FailedPrecondition(
            f"worker {worker!r} incarnation {incarnation} was marked lost; register again"
        )
    return Holder(worker, incarnation)


def _not_leased(shard: ShardRecord, holder: Holder) -> FailedPrecondition:
    return FailedPrecondition(
        f"shard {shard.shard_id} is {shard.state.value}, not leased to worker "
        f"{holder.worker!r} incarnation {holder.incarnation}"
    )


def lease(shard: ShardRecord, holder: Holder, now: datetime, duration: timedelta) -> ShardRecord:
    """TODO -> DOING for ``holder``; the offset carries over from an earlier holder."""
    if shard.state is not ShardState.TODO:
        raise ValueError(f"shard {shard.shard_id} is {shard.state.value}, not TODO")
    return replace(
        shard,
        state=ShardState.DOING,
        holder=holder,
        leases=shard.leases + 1,
        lease_expires_at=now + duration,
    )


def check_lease(shard: ShardRecord, lease: int | None) -> None:
    """FailedPrecondition if ``lease`` (a hand-out number, None: unchecked) is not the latest.

    The incarnation fences a restarted worker; the lease number also fences a worker that
    got the same shard twice (its lease lapsed and it leased the shard again), so its
    older view of the shard cannot report for the newer one.
    """
    if lease is not None and lease != shard.leases:
        raise FailedPrecondition(
            f"lease {lease} of shard {shard.shard_id} is stale; it was handed out again "
            f"(lease {shard.leases})"
        )


def check_offset(shard: ShardRecord, offset: int) -> None:
    """Raise InvalidArgument("offset") unless ``0 <= offset <= size``."""
    if offset < 0 or offset > shard.size:
        raise InvalidArgument(
            "offset", f"must be between 0 and the shard's {shard.size} records, got {offset}"
        )


def record_progress(
    shard: ShardRecord,
    holder: Holder,
    offset: int,
    now: datetime,
    duration: timedelta,
    lease: int | None = None,
) -> ShardRecord:
    """Record a heartbeat: keep the highest offset and renew the lease.

    An offset lower than one already reported arrived out of order and changes nothing
    but the lease. A late heartbeat for a shard this holder already finished is ignored.
    """
    check_offset(shard, offset)
    check_lease(shard, lease)
    if shard.holder == holder and shard.state is ShardState.DONE:
        return shard
    if shard.holder != holder or shard.state is not ShardState.DOING:
        raise _not_leased(shard, holder)
    return replace(shard, offset=max(shard.offset, offset), lease_expires_at=now + duration)


def complete(shard: ShardRecord, holder: Holder, lease: int | None = None) -> ShardRecord:
    """DOING -> DONE. A shard already DONE by this holder stays so: a duplicate report is
    harmless. A late report from an earlier holder is refused even when someone else has
    finished the shard since, so that holder never counts the records as its own."""
    check_lease(shard, lease)
    if shard.state is ShardState.DONE and shard.holder == holder:
        return shard
    if shard.holder != holder or shard.state is not ShardState.DOING:
        raise _not_leased(shard, holder)
    return replace(shard, state=ShardState.DONE, offset=shard.size, lease_expires_at=None)


def fail(shard: ShardRecord, holder: Holder, lease: int | None = None) -> ShardRecord:
    """DOING -> TODO, keeping the offset. Repeating the report changes nothing."""
    check_lease(shard, lease)
    if shard.state is ShardState.TODO and shard.holder == holder:
        return shard
    if shard.holder != holder or shard.state is not ShardState.DOING:
        raise _not_leased(shard, holder)
    return replace(shard, state=ShardState.TODO, lease_expires_at=None)


def release(shard: ShardRecord) -> ShardRecord:
    """DOING -> TODO because the holder is gone (lost, or restarted and registered again)."""
    if shard.state is not ShardState.DOING:
        return shard
    return replace(shard, state=ShardState.TODO, lease_expires_at=None)


def lease_expired(shard: ShardRecord, now: datetime) -> bool:
    """True if ``shard`` is DOING and its lease lapsed at or before ``now``."""
    return (
        shard.state is ShardState.DOING
        and shard.lease_expires_at is not None
        and shard.lease_expires_at <= now
    )


def split(shard: ShardRecord, records: int, new_id: int) -> tuple[ShardRecord, ShardRecord] | None:
    """Cut a TODO shard so its unconsumed part is at most ``records``; None if it already is.

    The first part keeps the shard's id, offset and place; the rest becomes a new TODO shard
    ``new_id`` right behind it in hand-out order. The two cover exactly what the shard did,
    so nothing is lost or repeated (DLRover-RM sec. 5.1: a straggler gets a smaller shard).
    """
    if shard.state is not ShardState.TODO:
        raise ValueError(f"shard {shard.shard_id} is {shard.state.value}, not TODO")
    if records <= 0:
        raise ValueError("records must be positive")
    cut = shard.start + shard.offset + records
    if cut >= shard.end:
        return None
    head = replace(shard, end=cut)
    tail = ShardRecord(
        shard_id=new_id,
        epoch=shard.epoch,
        position=shard.position,
        start=cut,
        end=shard.end,
        partition=shard.partition,
    )
    return head, tail


@dataclass(frozen=True)
class QueueCounts:
    """How many shards are in each queue (``done`` counts the current epoch only)."""

    epoch: int
    todo: int
    doing: int
    done: int
    finished: bool


class Grant(Enum):
    """Why GetShard returned no shard."""

    END_OF_DATA = "END_OF_DATA"
    """Every shard of the last epoch is DONE."""
    RETRY_LATER = "RETRY_LATER"
    """Nothing is TODO, but shards are DOING: one may come back if its holder is lost."""


def is_finished(parameters: DatasetParameters, epochs_created: int, unfinished: int) -> bool:
    """True when the last epoch exists and every shard is DONE."""
    return epochs_created >= parameters.epochs and unfinished == 0


def current_epoch(epochs_created: int) -> int:
    """The epoch being handed out: the newest one created (0 before any)."""
    return max(epochs_created - 1, 0)


class ShardQueue:
    """One dataset's shard queue in memory, built from the transitions above.

    The database-backed dispatcher follows exactly these steps in one transaction per
    call. Errors are the same domain errors the gRPC edge maps to status codes.
    """

    def __init__(self, parameters: DatasetParameters, lease_duration: timedelta) -> None:
        self.parameters = parameters
        self.lease_duration = lease_duration
        self.epochs_created = 0
        self.splits = 0
        self.shards: dict[int, ShardRecord] = {}
        self.workers: dict[str, WorkerRecord] = {}

    def register(self, worker: str) -> int:
        """A new incarnation for ``worker``; shards its older incarnation held go back to TODO."""
        previous = self.workers.get(worker)
        incarnation = 1 if previous is None else previous.incarnation + 1
        self.workers[worker] = WorkerRecord(worker, incarnation)
        self._release_held_by(worker)
        return incarnation

    def mark_lost(self, worker: str) -> int:
        """Fence ``worker``'s token and return its shards to TODO; returns how many."""
        record = self.workers.get(worker)
        if record is None:
            raise NotFound(f"worker {worker!r} is not registered")
        self.workers[worker] = replace(record, lost=True)
        return self._release_held_by(worker)

    def _release_held_by(self, worker: str) -> int:
        held = [
            s
            for s in self.shards.values()
            if s.state is ShardState.DOING and s.holder and s.holder.worker == worker
        ]
        for shard in held:
            self.shards[shard.shard_id] = release(shard)
        return len(held)

    def _shard(self, shard_id: int) -> ShardRecord:
        shard = self.shards.get(shard_id)
        if shard is None:
            raise NotFound(f"shard {shard_id} not found")
        return shard

    def next_todo(self) -> ShardRecord | None:
        """The TODO shard handed out next: oldest epoch first, then hand-out order."""
        todo = [s for s in self.shards.values() if s.state is ShardState.TODO]
        return min(todo, key=lambda s: (s.epoch, s.position, s.shard_id), default=None)

    def set_straggler(self, worker: str, straggler: bool) -> None:
        """Record the straggler verdict for ``worker`` (the service derives it from rates)."""
        record = self.workers.get(worker)
        if record is None:
            raise NotFound(f"worker {worker!r} is not registered")
        self.workers[worker] = replace(record, straggler=straggler)

    def expire_leases(self, now: datetime) -> list[ShardRecord]:
        """Return every shard whose lease lapsed to TODO; the released shards."""
        expired = [s for s in self.shards.values() if lease_expired(s, now)]
        for shard in expired:
            self.shards[shard.shard_id] = release(shard)
        return expired

    def why_none(self) -> Grant:
        """After get_shard returned None: the end of the data, or wait for a DOING shard."""
        if any(s.state is ShardState.DOING for s in self.shards.values()):
            return Grant.RETRY_LATER
        return Grant.END_OF_DATA

    def get_shard(self, worker: str, incarnation: int, now: datetime) -> ShardRecord | None:
        """Lease the next shard to the caller; None means end of data.

        Epochs are created lazily: the next one is cut when no TODO shard is left, so
        workers never wait for another's last shard of an epoch.
        """
        record = self.workers.get(worker)
        holder = fence(record, worker, incarnation)
        shard = self.next_todo()
        if shard is None and self.epochs_created < self.parameters.epochs:
            for planned in plan_epoch(self.parameters, self.epochs_created):
                self.shards[planned.shard_id] = ShardRecord.planned(planned)
            self.epochs_created += 1
            shard = self.next_todo()
        if shard is None:
            return None
        if record is not None and record.straggler:
            parts = split(shard, straggler_shard_records(self.parameters), self.next_split_id())
            if parts is not None:
                shard, tail = parts
                self.splits += 1
                self.shards[tail.shard_id] = tail
        leased = lease(shard, holder, now, self.lease_duration)
        self.shards[shard.shard_id] = leased
        return leased

    def next_split_id(self) -> int:
        """The id the next shard split off for a straggler gets."""
        return SPLIT_ID_BASE + self.splits

    def report_progress(
        self, worker: str, incarnation: int, shard_id: int, offset: int, now: datetime
    ) -> ShardRecord:
        """A heartbeat with the offset reached."""
        holder = fence(self.workers.get(worker), worker, incarnation)
        shard = record_progress(self._shard(shard_id), holder, offset, now, self.lease_duration)
        self.shards[shard_id] = shard
        return shard

    def report_done(self, worker: str, incarnation: int, shard_id: int) -> ShardRecord:
        """The shard was consumed to its end."""
        holder = fence(self.workers.get(worker), worker, incarnation)
        shard = complete(self._shard(shard_id), holder)
        self.shards[shard_id] = shard
        return shard

    def report_failed(self, worker: str, incarnation: int, shard_id: int) -> ShardRecord:
        """The worker gave the shard up; it goes back to TODO at its offset."""
        holder = fence(self.workers.get(worker), worker, incarnation)
        shard = fail(self._shard(shard_id), holder)
        self.shards[shard_id] = shard
        return shard

    def counts(self) -> QueueCounts:
        """Queue sizes and whether the dataset is finished."""
        epoch = current_epoch(self.epochs_created)
        shards = list(self.shards.values())
        unfinished = sum(1 for s in shards if s.state is not ShardState.DONE)
        return QueueCounts(
            epoch=epoch,
            todo=sum(1 for s in shards if s.state is ShardState.TODO),
            doing=sum(1 for s in shards if s.state is ShardState.DOING),
            done=sum(1 for s in shards if s.state is ShardState.DONE and s.epoch == epoch),
            finished=is_finished(self.parameters, self.epochs_created, unfinished),
        )
