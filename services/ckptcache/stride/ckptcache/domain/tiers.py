"""The tier seam: what the cache needs from a place that stores checkpoints.

DLRover-RM sec. 5.2 saves into shared memory in about the time of a memory copy and
persists to durable storage asynchronously. Each place is a :class:`TierStore`; the cache
holds them fastest first, saves into the first, loads from the first that has the
checkpoint and deletes from all. Today there is one, the durable directory; the
shared-memory tier and the background persister plug in here later.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from stride.ckptcache.domain.checkpoints import CheckpointHeader, CheckpointInfo, Tier


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint in a tier: its facts and the header as the client sent it (opaque)."""

    info: CheckpointInfo
    header_blob: bytes


class Upload(Protocol):
    """A checkpoint being written; invisible until :meth:`commit`."""

    async def write(self, chunk: bytes) -> None:
        """Append the next chunk of the buffer."""
        ...

    async def commit(self, saved_at: datetime) -> CheckpointInfo:
        """Make the checkpoint visible atomically. If an identical one already exists it is
        returned; a different one with the same id raises AlreadyExists."""
        ...

    async def abort(self) -> None:
        """Discard everything written; leaves nothing visible."""
        ...


class TierStore(Protocol):
    """One place checkpoints are kept."""

    tier: Tier

    async def begin(self, header: CheckpointHeader, header_blob: bytes) -> Upload:
        """Start writing a validated checkpoint."""
        ...

    async def find(self, job_id: str, checkpoint_id: str) -> StoredCheckpoint | None:
        """A committed checkpoint, or None."""
        ...

    async def checkpoints_of(self, job_id: str) -> list[CheckpointInfo]:
        """Every committed checkpoint of a job, in no particular order."""
        ...

    def read(self, job_id: str, checkpoint_id: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The buffer in chunks of at most ``chunk_bytes``."""
        ...

    async def delete(self, job_id: str, checkpoint_id: str) -> bool:
        """Remove a checkpoint; False if there was none."""
        ...

    async def unpublished(self) -> list[StoredCheckpoint]:
        """Committed checkpoints whose "stored" event is not yet known to be published."""
        ...

    async def mark_published(self, info: CheckpointInfo) -> None:
        """Remember that the event for ``info`` went out."""
        ...
