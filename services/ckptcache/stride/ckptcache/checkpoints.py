"""The cache's use cases: save, load, list and delete checkpoints across its tiers.

A save is checked while it streams. The byte count and the running checksum must match the
header, or the upload is discarded and nothing becomes visible. The "stored" event is
published after the commit. The cache has no database and so no transactional outbox;
instead the tier remembers which checkpoints still lack a published event, and a root task
retries them. The event's id is deterministic, so JetStream drops a repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Protocol

import structlog

from stride.ckptcache.domain import checksum
from stride.ckptcache.domain.checkpoints import (
    CheckpointHeader,
    CheckpointInfo,
    check_checkpoint_id,
    check_job_id,
    merge_tiers,
    validate_header,
)
from stride.ckptcache.domain.tiers import StoredCheckpoint, TierStore
from stride.runtime.errors import AlreadyExists, InvalidArgument, NotFound, StrideError

log = structlog.get_logger(__name__)


class CorruptCheckpoint(StrideError):
    """A stored buffer no longer matches its checksum (the API answers DATA_LOSS)."""


class CheckpointEvents(Protocol):
    """Where "a checkpoint reached a tier" is announced."""

    async def stored(self, stored: StoredCheckpoint) -> None:
        """Announce ``stored``; raise if it could not be published."""
        ...


class Checkpoints:
    """Checkpoint operations over the tiers, fastest first."""

    def __init__(
        self,
        tiers: Sequence[TierStore],
        events: CheckpointEvents,
        max_size_bytes: int,
        chunk_bytes: int,
    ) -> None:
        if not tiers:
            raise ValueError("at least one tier is required")
        self.tiers = list(tiers)
        self.events = events
        self.max_size_bytes = max_size_bytes
        self.chunk_bytes = chunk_bytes
        self._publish_wanted = asyncio.Event()
        self._cleanups: set[asyncio.Future[None]] = set()

    async def _find(self, job_id: str, checkpoint_id: str) -> tuple[TierStore, StoredCheckpoint]:
        for tier in self.tiers:
            stored = await tier.find(job_id, checkpoint_id)
            if stored is not None:
                return tier, stored
        raise NotFound(f"checkpoint {checkpoint_id!r} of job {job_id!r} not found")

    async def save(
        self, header: CheckpointHeader, header_blob: bytes, chunks: AsyncIterator[bytes]
    ) -> CheckpointInfo:
        """Store a checkpoint streamed as ``chunks``; visible only if it all checks out.

        Saving an identical checkpoint again (a retried call) succeeds. Saving different
        contents under an existing id is AlreadyExists.
        """
        validate_header(header, self.max_size_bytes)
        with contextlib.suppress(NotFound):
            _, existing = await self._find(header.job_id, header.checkpoint_id)
            if not existing.info.same_content(header):
                # Refuse before the data crosses the network.
                raise AlreadyExists(
                    f"checkpoint {header.checkpoint_id!r} of job {header.job_id!r} exists "
                    f"with different contents (step {existing.info.step}, "
                    f"{existing.info.size_bytes} bytes)"
                )
        tier = self.tiers[0]
        upload = await tier.begin(header, header_blob)
        try:
            received = 0
            crc = 0
            async for chunk in chunks:
                received += len(chunk)
                if received > header.size_bytes:
                    raise InvalidArgument(
                        "header.size_bytes",
                        f"declared {header.size_bytes} bytes, but more data arrived",
                    )
                crc = checksum.extend(crc, chunk)
                await upload.write(chunk)
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
            info = await upload.commit(datetime.now(UTC))
        except BaseException:
            # A client that goes away cancels this task; the cleanup must still finish, or
            # the staging file stays open and on disk until the next start.
            cleanup = asyncio.ensure_future(upload.abort())
            self._cleanups.add(cleanup)
            cleanup.add_done_callback(self._cleanups.discard)
            await asyncio.shield(cleanup)
            raise
        log.info(
            "checkpoint saved",
            job_id=info.job_id,
            checkpoint_id=info.checkpoint_id,
            step=info.step,
            size_bytes=info.size_bytes,
            tier=info.tier.name,
        )
        await self._publish(tier, StoredCheckpoint(info, header_blob))
        return info

    async def _publish(self, tier: TierStore, stored: StoredCheckpoint) -> None:
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
        await tier.mark_published(stored.info)

    async def publish_pending(self) -> int:
        """Publish every event a crash or an outage left unpublished; returns how many."""
        sent = 0
        for tier in self.tiers:
            for stored in await tier.unpublished():
                await self.events.stored(stored)
                await tier.mark_published(stored.info)
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

    async def load(
        self, job_id: str, checkpoint_id: str
    ) -> tuple[StoredCheckpoint, AsyncIterator[bytes]]:
        """A checkpoint (the newest when ``checkpoint_id`` is empty) and its buffer's chunks.

        The chunks are checked against the stored checksum as they stream; a mismatch at
        the end raises :class:`CorruptCheckpoint`.
        """
        check_job_id(job_id)
        if not checkpoint_id:
            newest = await self.list(job_id)
            if not newest:
                raise NotFound(f"job {job_id!r} has no checkpoints")
            checkpoint_id = newest[0].checkpoint_id
        check_checkpoint_id(checkpoint_id)
        tier, stored = await self._find(job_id, checkpoint_id)
        return stored, self._verified(tier, stored)

    async def _verified(self, tier: TierStore, stored: StoredCheckpoint) -> AsyncIterator[bytes]:
        info = stored.info
        crc = 0
        size = 0
        try:
            async for chunk in tier.read(info.job_id, info.checkpoint_id, self.chunk_bytes):
                crc = checksum.extend(crc, chunk)
                size += len(chunk)
                yield chunk
        except FileNotFoundError:
            raise NotFound(f"checkpoint {info.checkpoint_id!r} was deleted while loading") from None
        if (size, crc) != (info.size_bytes, info.crc32c):
            log.error(
                "stored checkpoint is corrupt",
                job_id=info.job_id,
                checkpoint_id=info.checkpoint_id,
                size=size,
                expected_size=info.size_bytes,
            )
            raise CorruptCheckpoint(
                f"checkpoint {info.checkpoint_id!r} of job {info.job_id!r} is corrupt in the "
                f"{info.tier.name.lower()} tier: {size} bytes with {checksum.ALGORITHM} "
                f"{crc:#010x}, expected {info.size_bytes} bytes with {info.crc32c:#010x}"
            )

    async def list(self, job_id: str) -> list[CheckpointInfo]:
        """A job's checkpoints, newest first, each at the highest tier it reached."""
        check_job_id(job_id)
        found: list[CheckpointInfo] = []
        for tier in self.tiers:
            found.extend(await tier.checkpoints_of(job_id))
        return merge_tiers(found)

    async def delete(self, job_id: str, checkpoint_id: str) -> None:
        """Remove a checkpoint from every tier; NotFound if no tier had it."""
        check_job_id(job_id)
        check_checkpoint_id(checkpoint_id)
        deleted = [await tier.delete(job_id, checkpoint_id) for tier in self.tiers]
        if not any(deleted):
            raise NotFound(f"checkpoint {checkpoint_id!r} of job {job_id!r} not found")
        log.info("checkpoint deleted", job_id=job_id, checkpoint_id=checkpoint_id)
