"""The cache's use cases: flash saves into shared memory, background persistence, restore.

A save lands in the memory tier first (DLRover-RM sec. 5.2): on the trainer's node the
client fills a shared-memory segment and registers it (one memory copy, then a small RPC);
from another node it streams the shard here and the cache writes the segment. The
checksum of a registered segment is computed here, off the trainer's blocking path. A
checkpoint is complete when every shard (one per parameter server) is in and checksummed;
only complete checkpoints are listed, restored or persisted.

A persister task copies complete checkpoints to the durable store in order, so training
never waits for the disk, and the save of step s+1 overlaps the persistence of step s.
When saves come faster than the disk, a checkpoint that a newer one has already superseded
in the queue is skipped unless the retention policy keeps its step (DLRover instead blocks
or drops the new save; skipping the old one keeps the newest state safest).

Restore takes the newest complete checkpoint whose checksums verify: the memory copy
first, then the durable copy of the same checkpoint, then older checkpoints. A torn or
corrupt checkpoint is never returned.

Events: "saved" when a checkpoint is complete in memory (best effort) and "persisted" when
it is durable. The cache has no database and so no transactional outbox; instead the
durable tier remembers which checkpoints still lack a published "persisted" event, and a
root task retries them. The event's id is deterministic, so JetStream drops a repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import structlog

from stride.ckptcache.adapters.outbound.memory_store import MemoryStore
from stride.ckptcache.domain import checksum
from stride.ckptcache.domain.checkpoints import (
    CheckpointHeader,
    CheckpointInfo,
    Tier,
    check_checkpoint_id,
    check_job_id,
    merge_tiers,
    newest_first,
    validate_header,
)
from stride.ckptcache.domain.memory_budget import (
    HeldBytes,
    MemoryLedger,
    MemoryLimits,
    Reservation,
)
from stride.ckptcache.domain.retention import RetentionPolicy
from stride.ckptcache.domain.tiers import DurableStore, ShardSource, StoredCheckpoint
from stride.runtime.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    StrideError,
)

log = structlog.get_logger(__name__)

HeaderCodec = Callable[[bytes, int], bytes]
"""Returns a serialized header with its checksum set (the API's encoding)."""
HeaderParser = Callable[[bytes], CheckpointHeader]
"""Reads a serialized header back into the domain type."""


class CorruptCheckpoint(StrideError):
    """A stored buffer no longer matches its checksum (the API answers DATA_LOSS)."""


class CheckpointEvents(Protocol):
    """Where "a checkpoint reached a tier" is announced."""

    async def stored(self, stored: StoredCheckpoint) -> None:
        """Announce ``stored``; raise if it could not be published."""
        ...


class PersistState(Enum):
    """Where a memory checkpoint is on its way to the durable tier."""

    ASSEMBLING = "assembling"
    QUEUED = "queued"
    PERSISTING = "persisting"
    PERSISTED = "persisted"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass
class MemoryShard:
    """One shard of a checkpoint in shared memory."""

    header: CheckpointHeader
    blob: bytes
    path: Path | None = None
    ready: bool = False
    """Checksummed and its header written: restorable once all shards are."""


@dataclass
class MemoryCheckpoint:
    """A checkpoint held (or being assembled) in shared memory."""

    job_id: str
    checkpoint_id: str
    step: int
    shard_count: int
    shard_snapshot_id: str
    saved_at: datetime
    shards: dict[int, MemoryShard] = field(default_factory=dict)
    state: PersistState = PersistState.ASSEMBLING
    persist_error: str = ""
    persist_finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a persist that started has ended (so a delete can wait for it)."""

    @property
    def complete(self) -> bool:
        """Every shard is in and checksummed."""
        return len(self.shards) == self.shard_count and all(s.ready for s in self.shards.values())

    def ordered_shards(self) -> list[MemoryShard]:
        """The shards in index order."""
        return [self.shards[index] for index in sorted(self.shards)]

    def info(self, tier: Tier = Tier.MEMORY) -> CheckpointInfo:
        """The checkpoint's facts."""
        shards = self.ordered_shards()
        return CheckpointInfo(
            job_id=self.job_id,
            checkpoint_id=self.checkpoint_id,
            step=self.step,
            size_bytes=sum(s.header.size_bytes for s in shards),
            crc32c=checksum.combined(s.header.crc32c for s in shards),
            tier=tier,
            saved_at=self.saved_at,
            shard_count=self.shard_count,
            shard_snapshot_id=self.shard_snapshot_id,
            persist_error=self.persist_error,
        )


@dataclass(frozen=True)
class Located:
    """Where a load finds one shard of a checkpoint."""

    info: CheckpointInfo
    header_blob: bytes
    header: CheckpointHeader
    tier: Tier
    memory_path: Path | None
    """The shared-memory segment, when the shard is read from the memory tier."""


class BandwidthThrottle:
    """Holds a writer to ``bytes_per_second`` (None: unlimited), so background persistence
    can be kept from starving the training's own disk traffic."""

    def __init__(self, bytes_per_second: float | None) -> None:
        self.bytes_per_second = bytes_per_second
        self.started = time.monotonic()
        self.written = 0

    def __call__(self, written_bytes: int) -> None:
        """Sleep until ``written_bytes`` more fit the budget."""
        if not self.bytes_per_second:
            return
        self.written += written_bytes
        ahead = self.written / self.bytes_per_second - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)


def describe_os_error(error: OSError) -> str:
    """A one-line reason with the errno's name, e.g. 'No space left on device (ENOSPC)'."""
    name = errno.errorcode.get(error.errno or 0, "")
    where = f" writing {error.filename}" if error.filename else ""
    return f"{error.strerror or error} ({name}){where}"


@dataclass(frozen=True)
class CacheLimits:
    """The numbers that shape the cache's behaviour (from the settings)."""

    max_size_bytes: int
    chunk_bytes: int
    retention: RetentionPolicy
    memory: MemoryLimits
    """The shared-memory budget, the per-job quota and uploads in progress per job."""
    memory_keep: int = 1
    persist_bytes_per_second: float | None = None
    settle_seconds: float = 30.0
    memory_ttl_seconds: float = 3600.0


class Checkpoints:
    """Checkpoint operations over the memory and durable tiers."""

    def __init__(
        self,
        memory: MemoryStore,
        durable: DurableStore,
        events: CheckpointEvents,
        limits: CacheLimits,
        with_checksum: HeaderCodec,
        parse_header: HeaderParser,
    ) -> None:
        self.memory = memory
        self.durable = durable
        self.events = events
        self.limits = limits
        self.with_checksum = with_checksum
        self.parse_header = parse_header
        self.in_memory: dict[tuple[str, str], MemoryCheckpoint] = {}
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._checksumming: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self._publish_wanted = asyncio.Event()
        self._background: set[asyncio.Future[None]] = set()
        self.ledger = MemoryLedger(limits.memory)
        """Shared memory reserved for shards on their way in."""

    # ---- startup -------------------------------------------------------------------------

    async def recover(self) -> None:
        """Rebuild the memory index from shared memory (the cache restarted, the node did
        not) and queue the complete checkpoints that are not yet durable."""
        found = await asyncio.to_thread(self.memory.scan)
        for (job_id, checkpoint_id), shards in found.items():
            entry: MemoryCheckpoint | None = None
            for shard in shards:
                header = self.parse_header(shard.header_blob)
                if entry is None:
                    entry = MemoryCheckpoint(
                        job_id,
                        checkpoint_id,
                        header.step,
                        header.shard_count,
                        header.shard_snapshot_id,
                        datetime.fromtimestamp(shard.path.stat().st_mtime, UTC),
                    )
                entry.shards[header.shard_index] = MemoryShard(
                    header, shard.header_blob, shard.path, ready=True
                )
            if entry is None:
                continue
            self.in_memory[(job_id, checkpoint_id)] = entry
            if entry.complete:
                durable = await asyncio.to_thread(self.durable.find, job_id, checkpoint_id)
                if durable is not None:
                    entry.state = PersistState.PERSISTED
                else:
                    entry.state = PersistState.QUEUED
                    self._queue.put_nowait((job_id, checkpoint_id))
        for job_id in {job for job, _ in found}:
            await self._trim_memory(job_id)
        if found:
            log.info(
                "checkpoints found in shared memory after a restart",
                complete=sum(1 for e in self.in_memory.values() if e.complete),
                incomplete=sum(1 for e in self.in_memory.values() if not e.complete),
            )

    # ---- saving --------------------------------------------------------------------------

    async def _reserve(
        self, header: CheckpointHeader, retried_checksum: int | None
    ) -> MemoryCheckpoint | Tier:
        """Claim the shard's slot (the checkpoint it joins), or say the save already
        happened (the tier it is in).

        ``retried_checksum`` is the checksum of a streamed save, for which an identical
        retry succeeds; a registered segment's content is not known yet, so any clash is
        AlreadyExists.
        """
        key = (header.job_id, header.checkpoint_id)
        if key not in self.in_memory:
            durable = await asyncio.to_thread(
                self.durable.find, header.job_id, header.checkpoint_id
            )
            if durable is not None:
                same = retried_checksum is not None and durable.info.same_content(
                    replace(header, crc32c=retried_checksum)
                )
                if same:
                    return Tier.DURABLE
                raise AlreadyExists(
                    f"checkpoint {header.checkpoint_id!r} of job {header.job_id!r} exists "
                    f"(step {durable.info.step}, {durable.info.size_bytes} bytes); "
                    "save under a new checkpoint_id"
                )
        entry = self.in_memory.get(key)
        if entry is None:
            entry = MemoryCheckpoint(
                header.job_id,
                header.checkpoint_id,
                header.step,
                header.shard_count,
                header.shard_snapshot_id,
                datetime.now(UTC),
            )
            self.in_memory[key] = entry
        elif not header.same_checkpoint_as(
            CheckpointHeader(
                entry.job_id,
                entry.checkpoint_id,
                entry.step,
                0,
                0,
                shard_count=entry.shard_count,
                shard_snapshot_id=entry.shard_snapshot_id,
            )
        ):
            raise AlreadyExists(
                f"checkpoint {header.checkpoint_id!r} of job {header.job_id!r} exists with step "
                f"{entry.step}, {entry.shard_count} shard(s) and snapshot "
                f"{entry.shard_snapshot_id!r}; every shard must agree"
            )
        existing = entry.shards.get(header.shard_index)
        if existing is not None:
            if (
                retried_checksum is not None
                and existing.ready
                and (existing.header.size_bytes, existing.header.crc32c)
                == (header.size_bytes, retried_checksum)
            ):
                return Tier.DURABLE if entry.state is PersistState.PERSISTED else Tier.MEMORY
            raise AlreadyExists(
                f"shard {header.shard_index} of checkpoint {header.checkpoint_id!r} of job "
                f"{header.job_id!r} is already in"
            )
        entry.shards[header.shard_index] = MemoryShard(header, b"")
        return entry

    def _unreserve(self, entry: MemoryCheckpoint, index: int) -> None:
        entry.shards.pop(index, None)
        key = (entry.job_id, entry.checkpoint_id)
        if not entry.shards and self.in_memory.get(key) is entry:
            del self.in_memory[key]

    async def register(self, header: CheckpointHeader, blob: bytes, segment_name: str) -> Tier:
        """Index a segment the client filled; its checksum is computed in the background."""
        validate_header(header, self.limits.max_size_bytes)
        # The client wrote the segment already: it counts against the limits, not the
        # filesystem's free space (written_bytes). Refused, the client unlinks it.
        reservation = await self._reserve_memory(header.job_id, header.size_bytes, False)
        try:
            entry = await self._reserve(header, None)
            assert isinstance(entry, MemoryCheckpoint)  # only a streamed retry can be a no-op
            try:
                path = await asyncio.to_thread(
                    self.memory.adopt,
                    header.job_id,
                    header.checkpoint_id,
                    header.shard_index,
                    segment_name,
                    header.size_bytes,
                )
            except BaseException:
                self._unreserve(entry, header.shard_index)
                raise
        finally:
            self.ledger.release(reservation)  # counted as the shard it became, from here on
        shard = entry.shards[header.shard_index]
        shard.path = path
        shard.blob = blob
        self._checksumming[header.job_id] = self._checksumming.get(header.job_id, 0) + 1
        self._spawn(self._finish_shard(entry, shard, None))
        return Tier.MEMORY

    async def save_stream(
        self, header: CheckpointHeader, blob: bytes, chunks: AsyncIterator[tuple[bytes, int | None]]
    ) -> Tier:
        """Receive a shard streamed from another node into shared memory; it is indexed
        only if its size and checksum (and each chunk's, when sent) check out."""
        validate_header(header, self.limits.max_size_bytes)
        entry = await self._reserve(header, header.crc32c)
        if isinstance(entry, Tier):
            return entry  # an identical retry of a save that already happened
        descriptor = -1
        path: Path | None = None
        reservation: Reservation | None = None
        try:
            reservation = await self._reserve_memory(header.job_id, header.size_bytes, True)
            path, descriptor = await asyncio.to_thread(self.memory.create_incoming, header.job_id)
            received = 0
            crc = 0
            index = 0
            async for chunk, chunk_crc in chunks:
                index += 1
                if chunk_crc is not None and checksum.checksum(chunk) != chunk_crc:
                    raise InvalidArgument(
                        "data_crc32c",
                        f"chunk {index} does not match its checksum; the save is discarded",
                    )
                if received + len(chunk) > header.size_bytes:
                    raise InvalidArgument(
                        "header.size_bytes",
                        f"declared {header.size_bytes} bytes, but more data arrived",
                    )
                crc = checksum.extend(crc, chunk)
                await asyncio.to_thread(
                    _reserve_and_write, self.memory.reserve, descriptor, chunk, received
                )
                received += len(chunk)
                reservation.written_bytes = received
            if received != header.size_bytes:
                raise InvalidArgument(
                    "header.size_bytes",
                    f"declared {header.size_bytes} bytes, received {received}; "
                    "the upload was incomplete and is discarded",
                )
            if crc != header.crc32c:
                raise InvalidArgument(
                    "header.crc32c",
                    f"{header.crc32c:#010x} does not match the data ({checksum.ALGORITHM} "
                    f"{crc:#010x}); the upload is discarded",
                )
            os.close(descriptor)
            descriptor = -1
            final = await asyncio.to_thread(
                self.memory.adopt,
                header.job_id,
                header.checkpoint_id,
                header.shard_index,
                path.name if path is not None else "",
                header.size_bytes,
            )
        except BaseException:
            # A client that goes away (or idles past its time) ends this task; the cleanup
            # must still finish, and the reservation is released at once.
            if reservation is not None:
                self.ledger.release(reservation)
            self._unreserve(entry, header.shard_index)
            cleanup = asyncio.ensure_future(asyncio.to_thread(_discard, descriptor, path))
            self._background.add(cleanup)
            cleanup.add_done_callback(self._background.discard)
            await asyncio.shield(cleanup)
            raise
        self.ledger.release(reservation)  # now counted as the shard it became
        shard = entry.shards[header.shard_index]
        shard.path = final
        shard.blob = blob
        self._checksumming[header.job_id] = self._checksumming.get(header.job_id, 0) + 1
        await self._finish_shard(entry, shard, crc)
        return Tier.MEMORY

    def _held(self, job_id: str) -> HeldBytes:
        """Shared memory the indexed shards (being checksummed, ready, kept) hold: the
        job's and every job's."""
        job = total = 0
        for entry in self.in_memory.values():
            size = sum(s.header.size_bytes for s in entry.shards.values() if s.path is not None)
            total += size
            job += size if entry.job_id == job_id else 0
        return HeldBytes(job, total)

    async def _reserve_memory(self, job_id: str, size: int, streamed: bool) -> Reservation:
        """Reserve shared memory for a shard coming in (streamed: its data is still to be
        written), or raise ResourceExhausted naming the limit it would break. The free
        segments are given back first when that makes it fit."""
        wanted = Reservation(job_id, size, streamed, written_bytes=0 if streamed else size)
        state = await asyncio.to_thread(self.memory.observe)
        refused = self.ledger.refusal(wanted, self._held(job_id), state)
        if refused is not None and refused.pool_would_help:
            await asyncio.to_thread(self.memory.drop_free_pool)
            state = await asyncio.to_thread(self.memory.observe)
        self.ledger.reserve(wanted, self._held(job_id), state)  # checked again: no await
        return wanted

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Future[None] = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _finish_shard(
        self, entry: MemoryCheckpoint, shard: MemoryShard, known_checksum: int | None
    ) -> None:
        header = shard.header
        try:
            assert shard.path is not None
            crc = known_checksum
            if crc is None:
                crc = await asyncio.to_thread(
                    self.memory.compute_checksum, shard.path, header.size_bytes
                )
            shard.blob = self.with_checksum(shard.blob, crc)
            shard.header = replace(header, crc32c=crc)
            await asyncio.to_thread(
                self.memory.write_header,
                header.job_id,
                header.checkpoint_id,
                header.shard_index,
                shard.blob,
            )
            shard.ready = True
        except Exception as error:
            log.error(
                "could not index a checkpoint shard; dropped",
                job_id=header.job_id,
                checkpoint_id=header.checkpoint_id,
                shard_index=header.shard_index,
                error=f"{type(error).__name__}: {error}",
            )
            self._unreserve(entry, header.shard_index)
        finally:
            self._checksumming[header.job_id] -= 1
            async with self._changed:
                self._changed.notify_all()
        key = (entry.job_id, entry.checkpoint_id)
        if self.in_memory.get(key) is not entry or not entry.complete:
            return
        if entry.state is PersistState.ASSEMBLING:
            entry.state = PersistState.QUEUED
            self._queue.put_nowait(key)
            log.info(
                "checkpoint in memory",
                job_id=entry.job_id,
                checkpoint_id=entry.checkpoint_id,
                step=entry.step,
                shard_count=entry.shard_count,
                size_bytes=entry.info().size_bytes,
            )
            with contextlib.suppress(Exception):
                await self.events.stored(StoredCheckpoint(entry.info(), entry.shards[0].blob))
            await self._trim_memory(entry.job_id)

    # ---- persistence ---------------------------------------------------------------------

    async def run_persister(self, stop: asyncio.Event) -> None:
        """Persist complete memory checkpoints in order until ``stop``, then those still
        queued for as long as the host lets it (it cancels this task once its server has
        stopped), so a clean stop leaves as little as it can only in memory."""
        while (key := await self._next_queued(stop)) is not None:
            try:
                await self.persist_one(key)
            except Exception:
                # One bad checkpoint must not stop persistence for every job.
                log.exception("persisting failed", job_id=key[0], checkpoint_id=key[1])
                entry = self.in_memory.get(key)
                if entry is not None and entry.state is PersistState.PERSISTING:
                    entry.state = PersistState.FAILED
                    entry.persist_error = "internal error; see the cache's log"

    async def _next_queued(self, stop: asyncio.Event) -> tuple[str, str] | None:
        """The next checkpoint to persist; None once ``stop`` is set and none is queued."""
        if not stop.is_set():
            getter = asyncio.ensure_future(self._queue.get())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if getter in done:
                return getter.result()
            getter.cancel()
        return None if self._queue.empty() else self._queue.get_nowait()

    async def persist_one(self, key: tuple[str, str]) -> None:
        """Persist one queued checkpoint (or skip it if a newer one supersedes it)."""
        entry = self.in_memory.get(key)
        if entry is None or entry.state is not PersistState.QUEUED:
            return
        newer_queued = any(
            other.job_id == entry.job_id
            and other.state is PersistState.QUEUED
            and other.step > entry.step
            for other in self.in_memory.values()
        )
        if newer_queued and not self.limits.retention.keeps_step(entry.step):
            entry.state = PersistState.SKIPPED
            log.info(
                "checkpoint superseded before it was persisted; skipped",
                job_id=entry.job_id,
                checkpoint_id=entry.checkpoint_id,
                step=entry.step,
            )
            await self._trim_memory(entry.job_id)
            return
        entry.state = PersistState.PERSISTING
        info = entry.info(Tier.DURABLE)
        sources = []
        for index, shard in sorted(entry.shards.items()):
            assert shard.path is not None
            sources.append(
                ShardSource(
                    index, shard.blob, shard.header.size_bytes, shard.header.crc32c, shard.path
                )
            )
        started = time.monotonic()
        try:
            stored = await asyncio.to_thread(
                self.durable.persist,
                info,
                sources,
                BandwidthThrottle(self.limits.persist_bytes_per_second),
            )
        except (OSError, ValueError, AlreadyExists) as error:
            entry.persist_finished.set()
            entry.state = PersistState.FAILED
            entry.persist_error = (
                describe_os_error(error) if isinstance(error, OSError) else str(error)
            )
            log.error(
                "checkpoint not persisted; it stays in memory only",
                job_id=entry.job_id,
                checkpoint_id=entry.checkpoint_id,
                step=entry.step,
                error=entry.persist_error,
            )
            await self._trim_memory(entry.job_id)
            return
        except BaseException:
            entry.persist_finished.set()
            raise
        entry.state = PersistState.PERSISTED
        entry.persist_finished.set()
        seconds = time.monotonic() - started
        log.info(
            "checkpoint persisted",
            job_id=entry.job_id,
            checkpoint_id=entry.checkpoint_id,
            step=entry.step,
            size_bytes=info.size_bytes,
            seconds=round(seconds, 3),
        )
        if self.in_memory.get(key) is not entry:  # deleted while it was being written
            await asyncio.to_thread(self.durable.delete, entry.job_id, entry.checkpoint_id)
            return
        await self._publish(StoredCheckpoint(stored, entry.shards[0].blob))
        await self._apply_retention(entry.job_id)
        await self._trim_memory(entry.job_id)

    async def _apply_retention(self, job_id: str) -> None:
        durable = await asyncio.to_thread(self.durable.checkpoints_of, job_id)
        for info in self.limits.retention.expired(durable):
            await asyncio.to_thread(self.durable.delete, job_id, info.checkpoint_id)
            entry = self.in_memory.get((job_id, info.checkpoint_id))
            if entry is not None and entry.state is PersistState.PERSISTED:
                await self._release(entry)
            log.info(
                "checkpoint expired by retention",
                job_id=job_id,
                checkpoint_id=info.checkpoint_id,
                step=info.step,
            )

    async def _trim_memory(self, job_id: str) -> None:
        """Keep the newest ``memory_keep`` complete checkpoints in memory; older ones go once
        they no longer wait for the disk. Incomplete ones older than the newest complete
        one are abandoned."""
        mine = [e for e in self.in_memory.values() if e.job_id == job_id]
        complete = newest_first(e.info() for e in mine if e.complete)
        keep = {info.checkpoint_id for info in complete[: self.limits.memory_keep]}
        newest_step = complete[0].step if complete else -1
        done = (PersistState.PERSISTED, PersistState.FAILED, PersistState.SKIPPED)
        for entry in mine:
            if entry.complete and entry.checkpoint_id not in keep and entry.state in done:
                await self._release(entry)
            elif (
                not entry.complete
                and entry.step < newest_step
                and all(s.ready for s in entry.shards.values())
            ):
                log.warning(
                    "incomplete checkpoint abandoned: a newer one is complete",
                    job_id=job_id,
                    checkpoint_id=entry.checkpoint_id,
                    shards_in=len(entry.shards),
                    shard_count=entry.shard_count,
                )
                await self._release(entry)

    async def _release(self, entry: MemoryCheckpoint) -> None:
        key = (entry.job_id, entry.checkpoint_id)
        if self.in_memory.get(key) is entry:
            del self.in_memory[key]
        await asyncio.to_thread(self.memory.release, entry.job_id, entry.checkpoint_id)

    async def sweep_memory(self) -> int:
        """Release persisted memory checkpoints older than the memory TTL (a finished or
        idle job's state should not hold RAM forever; its durable copy remains) and expire
        old free segments. Returns how many checkpoints were released."""
        cutoff = datetime.now(UTC).timestamp() - self.limits.memory_ttl_seconds
        stale = [
            entry
            for entry in self.in_memory.values()
            if entry.state is PersistState.PERSISTED and entry.saved_at.timestamp() < cutoff
        ]
        for entry in stale:
            await self._release(entry)
        await asyncio.to_thread(self.memory.expire_free, cutoff)
        if stale:
            log.info("idle checkpoints released from memory", count=len(stale))
        return len(stale)

    async def run_sweeper(self, stop: asyncio.Event, interval_seconds: float) -> None:
        """Sweep memory every ``interval_seconds`` until ``stop``."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_seconds)
            if not stop.is_set():
                try:
                    await self.sweep_memory()
                except Exception as error:
                    log.warning("memory sweep failed", error=f"{type(error).__name__}: {error}")

    # ---- events --------------------------------------------------------------------------

    async def _publish(self, stored: StoredCheckpoint) -> None:
        try:
            await self.events.stored(stored)
        except Exception as error:
            # The checkpoint is safe; the publisher task retries the event.
            log.warning(
                "checkpoint event not published; will retry",
                checkpoint_id=stored.info.checkpoint_id,
                error=f"{type(error).__name__}: {error}",
            )
            self._publish_wanted.set()
            return
        await asyncio.to_thread(self.durable.mark_published, stored.info)

    async def publish_pending(self) -> int:
        """Publish every event a crash or an outage left unpublished; returns how many."""
        sent = 0
        for stored in await asyncio.to_thread(self.durable.unpublished):
            await self.events.stored(stored)
            await asyncio.to_thread(self.durable.mark_published, stored.info)
            sent += 1
        return sent

    async def run_publisher(self, stop: asyncio.Event, retry_seconds: float) -> None:
        """Retry unpublished events at startup, after a failed publish, and periodically."""
        while not stop.is_set():
            self._publish_wanted.clear()
            try:
                sent = await self.publish_pending()
                if sent:
                    log.info("published pending checkpoint events", count=sent)
            except Exception as error:
                log.warning(
                    "pending checkpoint events not published; will retry",
                    error=f"{type(error).__name__}: {error}",
                )
            waiters = [
                asyncio.ensure_future(self._publish_wanted.wait()),
                asyncio.ensure_future(stop.wait()),
            ]
            _, pending = await asyncio.wait(
                waiters, timeout=retry_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            for waiter in pending:
                waiter.cancel()

    # ---- restoring -----------------------------------------------------------------------

    async def _settled(self, job_id: str) -> None:
        """Wait (bounded) until no shard of the job is still being checksummed, so a
        restore right after a save sees that save."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self._checksumming.get(job_id, 0) == 0),
                    self.limits.settle_seconds,
                )

    async def locate(self, job_id: str, checkpoint_id: str, shard_index: int) -> Located:
        """Where to read a shard: the newest complete, verified checkpoint when
        ``checkpoint_id`` is empty (memory first, then durable, then older ones)."""
        check_job_id(job_id)
        if shard_index < 0:
            raise InvalidArgument("shard_index", f"must not be negative, got {shard_index}")
        if checkpoint_id:
            check_checkpoint_id(checkpoint_id)
            return await self._copy_of(job_id, checkpoint_id, shard_index, verify=False)
        candidates = await self.list(job_id)
        if not candidates:
            raise NotFound(f"job {job_id!r} has no checkpoints")
        for info in candidates:
            try:
                return await self._copy_of(job_id, info.checkpoint_id, shard_index, verify=True)
            except (CorruptCheckpoint, NotFound) as error:
                log.error(
                    "checkpoint refused; trying the previous one",
                    job_id=job_id,
                    checkpoint_id=info.checkpoint_id,
                    error=error.message,
                )
        raise NotFound(f"job {job_id!r} has no intact checkpoint")

    async def _copy_of(
        self, job_id: str, checkpoint_id: str, shard_index: int, verify: bool
    ) -> Located:
        entry = self.in_memory.get((job_id, checkpoint_id))
        problems = []
        if entry is not None and entry.complete:
            self._check_shard_index(shard_index, entry.shard_count)
            # The memory copy is checked on every locate, also when asked for by id: a
            # same-node client maps the segment and reads it without a checksum of its own
            # (a trainer or anything else with the job's file permissions could have
            # written to it since it was saved). The check is one CRC pass over the
            # cache's mapping, about half a memcpy; the durable copy of a checkpoint asked
            # for by id is checked by the stream that reads it.
            if await self._memory_intact(entry, shard_index):
                shard = entry.shards[shard_index]
                tier = Tier.DURABLE if entry.state is PersistState.PERSISTED else Tier.MEMORY
                return Located(entry.info(tier), shard.blob, shard.header, Tier.MEMORY, shard.path)
            problems.append("its memory copy fails its checksum")
            if entry.state is not PersistState.PERSISTING:
                await self._release(entry)  # garbage: later loads go to the durable copy
        durable = await asyncio.to_thread(self.durable.find, job_id, checkpoint_id)
        if durable is not None:
            self._check_shard_index(shard_index, durable.info.shard_count)
            if not verify or await self._durable_intact(
                job_id, checkpoint_id, durable.shard_checksums
            ):
                blob = durable.shard_headers[shard_index]
                return Located(durable.info, blob, self.parse_header(blob), Tier.DURABLE, None)
            problems.append("its durable copy fails its checksum")
        if problems:
            raise CorruptCheckpoint(
                f"checkpoint {checkpoint_id!r} of job {job_id!r} is corrupt: {'; '.join(problems)}"
            )
        raise NotFound(f"checkpoint {checkpoint_id!r} of job {job_id!r} not found")

    @staticmethod
    def _check_shard_index(shard_index: int, shard_count: int) -> None:
        if shard_index >= shard_count:
            raise InvalidArgument(
                "shard_index", f"the checkpoint has {shard_count} shard(s), got {shard_index}"
            )

    async def _memory_intact(self, entry: MemoryCheckpoint, shard_index: int) -> bool:
        """Whether the memory copy of the shard that will be read matches its checksum."""
        for shard in [entry.shards[shard_index]]:
            assert shard.path is not None
            try:
                crc = await asyncio.to_thread(
                    self.memory.compute_checksum, shard.path, shard.header.size_bytes
                )
            except FileNotFoundError:
                return False
            if crc != shard.header.crc32c:
                log.error(
                    "memory copy of a checkpoint is corrupt",
                    job_id=entry.job_id,
                    checkpoint_id=entry.checkpoint_id,
                    shard_index=shard.header.shard_index,
                )
                return False
        return True

    async def _durable_intact(
        self, job_id: str, checkpoint_id: str, checksums: tuple[int, ...]
    ) -> bool:
        for index, expected in enumerate(checksums):
            try:
                crc = await asyncio.to_thread(
                    _file_checksum, self.durable.open_shard(job_id, checkpoint_id, index)
                )
            except FileNotFoundError:
                return False
            if crc != expected:
                log.error(
                    "durable copy of a checkpoint is corrupt",
                    job_id=job_id,
                    checkpoint_id=checkpoint_id,
                    shard_index=index,
                )
                return False
        return True

    async def load(
        self, job_id: str, checkpoint_id: str, shard_index: int
    ) -> tuple[Located, AsyncIterator[bytes]]:
        """A shard (of the newest intact checkpoint when ``checkpoint_id`` is empty) and its
        buffer's chunks, checked against the checksum as they stream; a mismatch at the end
        raises :class:`CorruptCheckpoint`."""
        located = await self.locate(job_id, checkpoint_id, shard_index)
        return located, self._verified(located, shard_index)

    async def _verified(self, located: Located, shard_index: int) -> AsyncIterator[bytes]:
        info = located.info
        try:
            if located.memory_path is not None:
                handle: BinaryIO = await asyncio.to_thread(located.memory_path.open, "rb")
            else:
                handle = await asyncio.to_thread(
                    self.durable.open_shard, info.job_id, info.checkpoint_id, shard_index
                )
        except FileNotFoundError:
            raise NotFound(f"checkpoint {info.checkpoint_id!r} was deleted while loading") from None
        crc = 0
        size = 0
        expected = located.header.size_bytes
        try:
            while size < expected:
                chunk = await asyncio.to_thread(
                    handle.read, min(self.limits.chunk_bytes, expected - size)
                )
                if not chunk:
                    break
                crc = checksum.extend(crc, chunk)
                size += len(chunk)
                yield chunk
        finally:
            handle.close()
        if (size, crc) != (expected, located.header.crc32c):
            log.error(
                "stored checkpoint is corrupt",
                job_id=info.job_id,
                checkpoint_id=info.checkpoint_id,
                size=size,
                expected_size=expected,
            )
            raise CorruptCheckpoint(
                f"checkpoint {info.checkpoint_id!r} of job {info.job_id!r} is corrupt in the "
                f"{located.tier.name.lower()} tier: {size} bytes with {checksum.ALGORITHM} "
                f"{crc:#010x}, expected {expected} bytes with {located.header.crc32c:#010x}"
            )

    async def list(self, job_id: str) -> list[CheckpointInfo]:
        """A job's complete checkpoints, newest first, each at the highest tier it reached
        (after any save that already returned has been checksummed)."""
        check_job_id(job_id)
        await self._settled(job_id)
        found = [e.info() for e in self.in_memory.values() if e.job_id == job_id and e.complete]
        found.extend(await asyncio.to_thread(self.durable.checkpoints_of, job_id))
        return merge_tiers(found)

    async def delete(self, job_id: str, checkpoint_id: str) -> None:
        """Remove a checkpoint from every tier; NotFound if no tier had it."""
        check_job_id(job_id)
        check_checkpoint_id(checkpoint_id)
        entry = self.in_memory.get((job_id, checkpoint_id))
        if entry is not None:
            persisting = entry.state is PersistState.PERSISTING
            await self._release(entry)
            if persisting:
                # Its persist cannot be stopped half way; let it land, then remove it, so
                # the deleted checkpoint never reappears from the durable tier.
                await entry.persist_finished.wait()
        on_disk = await asyncio.to_thread(self.durable.delete, job_id, checkpoint_id)
        if entry is None and not on_disk:
            raise NotFound(f"checkpoint {checkpoint_id!r} of job {job_id!r} not found")
        log.info("checkpoint deleted", job_id=job_id, checkpoint_id=checkpoint_id)

    async def close(self) -> None:
        """Let background checksum work finish (it is short) before the host stops."""
        if self._background:
            await asyncio.wait(self._background, timeout=10)

    async def leave_shared_memory(self) -> None:
        """On a clean stop (the server and the root tasks have stopped): remove the
        shared-memory directory, so a stopped cache holds no RAM, unless a checkpoint's only
        copy is there (not yet persisted, or its persist failed): then it stays for the
        next start, which persists it. Incomplete checkpoints are discarded with it (their
        trainers saved again, or will)."""
        await self.close()
        only_here = [
            f"{entry.job_id}/{entry.checkpoint_id}"
            for entry in self.in_memory.values()
            if entry.complete and entry.state not in (PersistState.PERSISTED, PersistState.SKIPPED)
        ]
        if only_here:
            log.warning(
                "shared memory kept: it holds the only copy of checkpoints not yet persisted; "
                "the next start persists them",
                directory=str(self.memory.root),
                checkpoints=only_here,
            )
            return
        incomplete = sum(1 for entry in self.in_memory.values() if not entry.complete)
        self.in_memory.clear()
        await asyncio.to_thread(self.memory.remove)
        log.info(
            "shared memory released: every checkpoint in it is durable",
            directory=str(self.memory.root),
            incomplete_discarded=incomplete,
        )


def _reserve_and_write(
    reserve: Callable[[int, int, int], None], descriptor: int, chunk: bytes, offset: int
) -> None:
    reserve(descriptor, offset, len(chunk))
    _write_at(descriptor, chunk, offset)


def _write_at(descriptor: int, chunk: bytes, offset: int) -> None:
    view = memoryview(chunk)
    while view:
        written = os.pwrite(descriptor, view, offset)
        view = view[written:]
        offset += written


def _discard(descriptor: int, path: Path | None) -> None:
    if descriptor >= 0:
        os.close(descriptor)
    if path is not None:
        path.unlink(missing_ok=True)


def _file_checksum(handle: BinaryIO) -> int:
    crc = 0
    with handle:
        while chunk := handle.read(8 * 1024 * 1024):
            crc = checksum.extend(crc, chunk)
    return crc
