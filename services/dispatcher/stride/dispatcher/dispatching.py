"""The dispatcher's use cases: create datasets, register workers, hand out and take back shards.

Every call is one database transaction that applies the domain's transitions
(:mod:`stride.dispatcher.domain.queue`) to the rows it locked, and queues the events the
change causes in the outbox in that same transaction. Nothing lives only in memory, so a
dispatcher killed at any point restarts into a consistent queue: a shard handed out in a
committed call stays DOING for its worker, and one whose call did not commit is still TODO.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from stride.bus.client import message_headers
from stride.db.engine import Database
from stride.db.outbox import Outbox
from stride.dispatcher.adapters import repository
from stride.dispatcher.adapters.convert import shard_progress, shard_subject
from stride.dispatcher.adapters.repository import StoredDataset, WorkerShards
from stride.dispatcher.domain import queue
from stride.dispatcher.domain.datasets import (
    DatasetParameters,
    check_dataset,
    check_job_id,
    check_worker,
    validate,
)
from stride.dispatcher.domain.queue import Holder, QueueCounts, ShardRecord
from stride.dispatcher.domain.sharding import plan_epoch
from stride.runtime.errors import AlreadyExists, InvalidArgument, NotFound

log = structlog.get_logger(__name__)


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


@dataclass(frozen=True)
class DatasetState:
    """Queue sizes and per-worker progress of one dataset."""

    counts: QueueCounts
    workers: list[WorkerShards]


def _check_shard_id(shard_id: int) -> None:
    if shard_id < 0:
        raise InvalidArgument("shard_id", f"must not be negative, got {shard_id}")


class ShardDispatcher:
    """Dataset and shard-queue operations against the database and outbox."""

    def __init__(self, database: Database, outbox: Outbox, lease_duration: timedelta) -> None:
        self.database = database
        self.outbox = outbox
        self.lease_duration = lease_duration

    async def create_dataset(
        self, job_id: str, dataset: str, parameters: DatasetParameters
    ) -> bool:
        """Store a dataset; True if created, False if it already exists identically."""
        check_job_id(job_id)
        check_dataset(dataset)
        validate(parameters)
        try:
            async with self.database.transaction() as session:
                existing = await repository.find_dataset(session, job_id, dataset)
                if existing is None:
                    await repository.insert_dataset(
                        session, job_id, dataset, parameters, datetime.now(UTC)
                    )
        except IntegrityError:
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

    async def register_worker(self, job_id: str, worker: str) -> int:
        """A new incarnation token for ``worker``; shards its older incarnation held go back
        to TODO, because the process that held them is gone."""
        check_job_id(job_id)
        check_worker(worker)
        try:
            incarnation, requeued = await self._register_once(job_id, worker)
        except IntegrityError:
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
        self, session: AsyncSession, job_id: str, worker: str, now: datetime, event: str
    ) -> int:
        held = await repository.held_shards(session, job_id, worker)
        for item in held:
            released = queue.release(item.shard)
            await repository.save_shard(session, item.dataset_id, released, now)
            await self._add_event(session, job_id, item.dataset, item.shard, event, now)
        return len(held)

    async def get_shard(self, ref: WorkerRef) -> ShardRecord | None:
        """Lease the next shard to the caller; None at the end of data."""
        ref.validate()
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            dataset = await self._lock_dataset(session, ref.job_id, ref.dataset)
            holder = await self._fence(session, ref, now)
            shard = await repository.next_todo(session, dataset.id)
            epoch = dataset.epochs_created
            if shard is None and epoch < dataset.parameters.epochs:
                # Cut the next epoch lazily, when the TODO queue runs dry (DLRover sec. 5.2).
                planned = [ShardRecord.planned(p) for p in plan_epoch(dataset.parameters, epoch)]
                await repository.add_epoch(session, dataset.id, epoch, planned, now)
                shard = await repository.next_todo(session, dataset.id)
                log.info(
                    "epoch started",
                    job_id=ref.job_id,
                    dataset=ref.dataset,
                    epoch=epoch,
                    shards=len(planned),
                )
            if shard is None:
                return None
            leased = queue.lease(shard, holder, now, self.lease_duration)
            await repository.save_shard(session, dataset.id, leased, now)
        return leased

    async def report_progress(self, ref: WorkerRef, shard_id: int, offset: int) -> None:
        """A heartbeat: the offset reached in a shard; renews the lease."""
        ref.validate()
        _check_shard_id(shard_id)
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            dataset, holder, shard = await self._locked_shard(session, ref, shard_id, now)
            updated = queue.record_progress(shard, holder, offset, now, self.lease_duration)
            if updated != shard:
                await repository.save_shard(session, dataset.id, updated, now)

    async def report_done(self, ref: WorkerRef, shard_id: int) -> None:
        """The shard was consumed to its end; duplicates are harmless."""
        ref.validate()
        _check_shard_id(shard_id)
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            dataset, holder, shard = await self._locked_shard(session, ref, shard_id, now)
            done = queue.complete(shard, holder)
            if done == shard:
                return
            await repository.save_shard(session, dataset.id, done, now)
            await self._add_event(session, ref.job_id, ref.dataset, done, "done", now)
        self.outbox.notify()

    async def report_failed(self, ref: WorkerRef, shard_id: int, reason: str) -> None:
        """The worker gave the shard up; back to TODO at its last reported offset."""
        ref.validate()
        _check_shard_id(shard_id)
        if len(reason) > 1000:
            raise InvalidArgument("reason", "must be at most 1000 characters")
        async with self.database.transaction() as session:
            now = datetime.now(UTC)
            dataset, holder, shard = await self._locked_shard(session, ref, shard_id, now)
            failed = queue.fail(shard, holder)
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
        finished = queue.is_finished(stored.parameters, stored.epochs_created, counts.unfinished)
        return DatasetState(
            QueueCounts(epoch, counts.todo, counts.doing, counts.done_in_epoch, finished), workers
        )

    async def _lock_dataset(
        self, session: AsyncSession, job_id: str, dataset: str
    ) -> StoredDataset:
        stored = await repository.lock_dataset(session, job_id, dataset)
        if stored is None:
            raise NotFound(f"dataset {dataset!r} of job {job_id!r} not found")
        return stored

    async def _fence(self, session: AsyncSession, ref: WorkerRef, now: datetime) -> Holder:
        record = await repository.touch_worker(session, ref.job_id, ref.worker, now)
        return queue.fence(record, ref.worker, ref.incarnation)

    async def _locked_shard(
        self, session: AsyncSession, ref: WorkerRef, shard_id: int, now: datetime
    ) -> tuple[StoredDataset, Holder, ShardRecord]:
        # Reports lock the worker, not the dataset, so heartbeats of different workers do
        # not queue behind each other; the shard's own row lock orders the rest.
        holder = await self._fence(session, ref, now)
        dataset = await repository.find_dataset(session, ref.job_id, ref.dataset)
        if dataset is None:
            raise NotFound(f"dataset {ref.dataset!r} of job {ref.job_id!r} not found")
        shard = await repository.get_shard(session, dataset.id, shard_id)
        if shard is None:
            raise NotFound(f"shard {shard_id} of dataset {ref.dataset!r} not found")
        return dataset, holder, shard

    async def _add_event(
        self,
        session: AsyncSession,
        job_id: str,
        dataset: str,
        shard: ShardRecord,
        event: str,
        now: datetime,
    ) -> None:
        """Queue a shard event; its id names the lease it ends, so re-publishes de-duplicate."""
        message = shard_progress(job_id, dataset, shard, now)
        message_id = f"{job_id}.{dataset}.{shard.shard_id}.{event}.{shard.leases}"
        await self.outbox.add(
            session,
            shard_subject(job_id, event),
            message.SerializeToString(),
            message_id,
            message_headers(message),
        )


def _describe(parameters: DatasetParameters) -> str:
    kind = parameters.kind.value if parameters.kind else "unspecified"
    return (
        f"kind={kind} record_count={parameters.record_count} batch_size={parameters.batch_size} "
        f"shard_batches={parameters.shard_batches} epochs={parameters.epochs} "
        f"shuffle={parameters.shuffle} seed={parameters.seed}"
    )
