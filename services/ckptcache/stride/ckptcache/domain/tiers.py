"""The tier seam: what the cache needs from the places that keep checkpoints.

DLRover-RM sec. 5.2 saves into shared memory in about the time of a memory copy and
persists to durable storage asynchronously. The memory tier is the node's shared memory
(``adapters.memory_store``). The durable tier is anything that satisfies
:class:`DurableStore`: today a directory (local disk or a mounted volume); an object store
fits the same contract by uploading the shard objects and their checksums first and the
manifest object last, since a single PUT is atomic and readers look only for manifests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from stride.ckptcache.domain.checkpoints import CheckpointInfo


@dataclass(frozen=True)
class StoredCheckpoint:
    """A checkpoint in a tier: its facts and shard 0's header as the client sent it."""

    info: CheckpointInfo
    header_blob: bytes


@dataclass(frozen=True)
class ShardSource:
    """One shard to persist: where its bytes are and what they must check out as."""

    index: int
    header_blob: bytes
    size_bytes: int
    crc32c: int
    path: Path


@dataclass(frozen=True)
class DurableCheckpoint:
    """A complete checkpoint in the durable tier, with every shard's header."""

    info: CheckpointInfo
    shard_headers: tuple[bytes, ...]
    shard_checksums: tuple[int, ...]
    shard_sizes: tuple[int, ...]


PersistThrottle = Callable[[int], None]
"""Called with each chunk's size after it is written; blocks as long as a bandwidth cap
needs, so persistence can be kept from starving other disk traffic."""


class DurableStore(Protocol):
    """The durable tier. Blocking methods: the cache calls them from worker threads."""

    def prepare(self) -> None:
        """Create what is missing and clear what a previous process left unfinished."""
        ...

    def writable(self) -> bool:
        """True if a checkpoint could be written right now."""
        ...

    def persist(
        self, info: CheckpointInfo, shards: Sequence[ShardSource], throttle: PersistThrottle
    ) -> CheckpointInfo:
        """Write every shard and its checksum, then the manifest, atomically: afterwards
        the checkpoint is either complete or absent. Raises OSError (disk full...) or
        ValueError if a source no longer matches its checksum."""
        ...

    def find(self, job_id: str, checkpoint_id: str) -> DurableCheckpoint | None:
        """A complete checkpoint, or None."""
        ...

    def checkpoints_of(self, job_id: str) -> list[CheckpointInfo]:
        """Every complete checkpoint of a job, in no particular order."""
        ...

    def open_shard(self, job_id: str, checkpoint_id: str, shard_index: int) -> BinaryIO:
        """The shard's bytes (FileNotFoundError if it went away)."""
        ...

    def delete(self, job_id: str, checkpoint_id: str) -> bool:
        """Remove a checkpoint; False if there was none."""
        ...

    def unpublished(self) -> list[StoredCheckpoint]:
        """Complete checkpoints whose "persisted" event is not yet known to be published."""
        ...

    def mark_published(self, info: CheckpointInfo) -> None:
        """Remember that the event for ``info`` went out."""
        ...
