"""The memory tier: checkpoint shards as files in the node's shared memory (tmpfs).

Layout under ``shm_dir`` (a contract with the client library, which writes segments)::

    node-id                                  random id of this node's cache
    <job_id>/.incoming/<name>.seg            a client fills a segment here...
    <job_id>/<checkpoint_id>/shard-00000.seg ...and RegisterSegment moves it here
    <job_id>/<checkpoint_id>/shard-00000.header.pb   written once its checksum is known
    <job_id>/.free/<name>.seg                released segments a client may reuse

A segment is one contiguous buffer; its tensors' names, dtypes, shapes and offsets are in
the header (protobuf, never pickle). Moving a segment with ``rename`` hands it over
atomically. A shard counts only once its header file exists, which the cache writes
(temp file, then rename) after computing the checksum, so a restart finds only whole
shards. tmpfs outlives the cache process but not the node: after a crash of the cache the
shards are found again by :meth:`MemoryStore.scan`. A clean stop takes everything away
(:meth:`MemoryStore.remove`) once all of it is durable, so a stopped cache holds no RAM.

Segments that are no longer needed go to ``.free`` (a few per job) instead of being
unlinked: their pages are already allocated, and a client that reuses one saves at memory
speed, while a fresh tmpfs file costs a page fault per 4 KiB (about 10x a memcpy here).

A same-node restore maps the segment instead of copying it (the client library's
``map_segment``), and first pins it with a hard link in ``<job_id>/.pinned/``. A released
segment that is pinned (its link count above 1) is unlinked instead of going to ``.free``,
so no writer ever reuses memory that a restored array still shows; its pages go back when
the last mapping does. A pin whose segment has no other name left is only a leftover (the
client unlinks its pins when its arrays are collected; a killed client cannot), and the
memory sweep removes it: with no other name, nobody can reach the segment to reuse it.

Checksums are computed over a read-only mapping of the segment (no copy), and the cache
keeps that mapping while the shard is indexed, so checking a shard again at restore costs
only the CRC pass itself (about 0.07 s per GiB here), not the page faults of a new mapping.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import structlog

from stride.ckptcache.domain import checksum
from stride.ckptcache.domain.checkpoints import (
    CHECKPOINT_ID_PATTERN,
    checkpoint_directory,
)
from stride.ckptcache.domain.memory_budget import SharedMemoryState
from stride.ckptcache.domain.shared_memory import no_room, too_small
from stride.runtime.errors import AlreadyExists, InvalidArgument, ResourceExhausted
from stride.vocabulary import JOB_ID_PATTERN

log = structlog.get_logger(__name__)

NODE_ID = "node-id"
INCOMING = ".incoming"
FREE = ".free"
PINNED = ".pinned"
SEGMENT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}\.seg$")


class SharedMemoryTooSmall(Exception):
    """The shared-memory filesystem cannot hold what the cache needs; says how to fix it."""


@dataclass(frozen=True)
class MemoryShard:
    """A whole shard found in shared memory."""

    header_blob: bytes
    path: Path


def shard_segment_name(index: int) -> str:
    """The file of a shard's buffer."""
    return f"shard-{index:05d}.seg"


def shard_header_name(index: int) -> str:
    """The file of a shard's header (present once the shard is whole)."""
    return f"shard-{index:05d}.header.pb"


class MemoryStore:
    """Checkpoint shards in shared memory."""

    def __init__(self, root: Path, free_segments_per_job: int = 2) -> None:
        self.root = root
        self.free_segments_per_job = free_segments_per_job
        self.node_id = ""
        self.filesystem_bytes = 0
        """The shared-memory filesystem's size, read by :meth:`prepare`."""
        self._mappings: dict[Path, tuple[tuple[int, int], mmap.mmap]] = {}
        self._mappings_lock = threading.Lock()

    def prepare(self, min_bytes: int) -> None:
        """Create the directory, check the filesystem's size, and read or create the node id.

        Raises SharedMemoryTooSmall with the fix when the filesystem is smaller than
        ``min_bytes``.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        stats = os.statvfs(self.root)
        self.filesystem_bytes = stats.f_blocks * stats.f_frsize
        problem = too_small(str(self.root), self.filesystem_bytes, min_bytes)
        if problem is not None:
            raise SharedMemoryTooSmall(problem)
        marker = self.root / NODE_ID
        try:
            self.node_id = marker.read_text().strip()
        except FileNotFoundError:
            self.node_id = ""
        if not self.node_id:
            self.node_id = uuid.uuid4().hex
            temporary = marker.with_name(f".{NODE_ID}.{uuid.uuid4().hex}")
            temporary.write_text(self.node_id)
            os.rename(temporary, marker)

    def job_dir(self, job_id: str) -> Path:
        """The directory of one job's shards."""
        return checkpoint_directory(self.root, job_id)

    def checkpoint_dir(self, job_id: str, checkpoint_id: str) -> Path:
        """The directory of one checkpoint's shards."""
        return checkpoint_directory(self.root, job_id, checkpoint_id)

    def segment_path(self, job_id: str, checkpoint_id: str, index: int) -> Path:
        """Where a registered shard's buffer is."""
        return self.checkpoint_dir(job_id, checkpoint_id) / shard_segment_name(index)

    def relative(self, path: Path) -> str:
        """``path`` relative to the shared-memory directory (what clients are told)."""
        return str(path.relative_to(self.root))

    def adopt(
        self, job_id: str, checkpoint_id: str, index: int, segment_name: str, size_bytes: int
    ) -> Path:
        """Move a client's filled segment from ``.incoming`` into the index."""
        if not SEGMENT_NAME_PATTERN.match(segment_name):
            raise InvalidArgument(
                "segment_name",
                f"{segment_name!r} is not a segment file name (letters, digits, '_' or '-', "
                "ending in .seg; no directories)",
            )
        source = self.job_dir(job_id) / INCOMING / segment_name
        try:
            actual = source.stat().st_size
        except FileNotFoundError:
            raise InvalidArgument(
                "segment_name",
                f"no segment {segment_name!r} in {source.parent}: write it there first",
            ) from None
        if actual != size_bytes:
            raise InvalidArgument(
                "header.size_bytes",
                f"declares {size_bytes} bytes, but segment {segment_name!r} holds {actual}",
            )
        target = self.segment_path(job_id, checkpoint_id, index)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            raise AlreadyExists(f"shard {index} of checkpoint {checkpoint_id!r} is already in")
        os.rename(source, target)
        return target

    def observe(self) -> SharedMemoryState:
        """What the filesystem has free now, and what the free segments hold."""
        stats = os.statvfs(self.root)
        pool = sum(_allocated(path) for path in self.root.glob(f"*/{FREE}/*.seg"))
        return SharedMemoryState(str(self.root), stats.f_bavail * stats.f_frsize, pool)

    def drop_free_pool(self) -> None:
        """Unlink every free segment (a save needs their memory more than reuse does)."""
        for segment in self.root.glob(f"*/{FREE}/*.seg"):
            segment.unlink(missing_ok=True)

    def create_incoming(self, job_id: str) -> tuple[Path, int]:
        """A new, empty segment for a shard streamed in, and an open descriptor. Its pages
        are allocated as data arrives (:meth:`reserve`), not for the declared size up
        front: a stream that declares 64 GiB and sends nothing holds no memory (whether
        the declared size fits is the cache's budget's call, before this)."""
        incoming = self.job_dir(job_id) / INCOMING
        incoming.mkdir(parents=True, exist_ok=True)
        path = incoming / f"{uuid.uuid4().hex}.seg"
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        return path, descriptor

    def reserve(self, descriptor: int, offset: int, length: int) -> None:
        """Reserve the pages of ``[offset, offset + length)`` before writing them: a memory
        filesystem that filled up since the save was admitted (another process took the
        memory) is then a clear ResourceExhausted, not SIGBUS on a later write."""
        if length <= 0:
            return
        try:
            os.posix_fallocate(descriptor, offset, length)
        except OSError as error:
            raise ResourceExhausted(no_room(str(self.root), 0, length) or str(error)) from None

    def compute_checksum(self, path: Path, size_bytes: int) -> int:
        """CRC-32C of the first ``size_bytes`` of a segment (of all of it if it is shorter,
        which then cannot match), over a read-only mapping: no copy of the data."""
        mapping = self._mapping(path)
        if mapping is None:
            return 0
        if len(mapping) <= size_bytes:
            return checksum.checksum(mapping)
        with memoryview(mapping) as view, view[:size_bytes] as head:
            return checksum.checksum(head)

    def _mapping(self, path: Path) -> mmap.mmap | None:
        """A read-only, populated mapping of the segment at ``path`` (None if it is empty),
        kept for the next check of the same file; a file replaced since is mapped anew."""
        with path.open("rb") as handle:
            stats = os.fstat(handle.fileno())
            key = (stats.st_dev, stats.st_ino)
            with self._mappings_lock:
                known = self._mappings.get(path)
            if known is not None and known[0] == key and len(known[1]) == stats.st_size:
                return known[1]
            if stats.st_size == 0:
                return None
            mapping = mmap.mmap(
                handle.fileno(),
                stats.st_size,
                flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                prot=mmap.PROT_READ,
            )
        with self._mappings_lock:
            replaced = self._mappings.get(path)
            self._mappings[path] = (key, mapping)
        if replaced is not None:
            _unmap(replaced[1])
        return mapping

    def forget_mappings(self, directory: Path) -> None:
        """Unmap the segments under ``directory`` (a checkpoint leaving memory)."""
        with self._mappings_lock:
            gone = [path for path in self._mappings if path.parent == directory]
            mappings = [self._mappings.pop(path)[1] for path in gone]
        for mapping in mappings:
            _unmap(mapping)

    def write_header(self, job_id: str, checkpoint_id: str, index: int, blob: bytes) -> None:
        """Mark a shard whole by writing its header (temp file, then rename)."""
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        temporary = directory / f".{uuid.uuid4().hex}.tmp"
        temporary.write_bytes(blob)
        os.rename(temporary, directory / shard_header_name(index))

    def scan(self) -> dict[tuple[str, str], list[MemoryShard]]:
        """Every whole shard in shared memory, by (job, checkpoint); removes the parts of
        shards a previous process did not finish (a segment without its header)."""
        found: dict[tuple[str, str], list[MemoryShard]] = {}
        for job_dir in sorted(self.root.iterdir()):
            if not job_dir.is_dir() or not JOB_ID_PATTERN.match(job_dir.name):
                continue
            for directory in sorted(job_dir.iterdir()):
                if not directory.is_dir() or not CHECKPOINT_ID_PATTERN.match(directory.name):
                    continue
                shards = []
                for segment in sorted(directory.glob("shard-*.seg")):
                    header = segment.with_name(segment.name.removesuffix(".seg") + ".header.pb")
                    if header.exists():
                        shards.append(MemoryShard(header.read_bytes(), segment))
                    else:
                        segment.unlink(missing_ok=True)
                for temporary in directory.glob(".*.tmp"):
                    temporary.unlink(missing_ok=True)
                if shards:
                    found[(job_dir.name, directory.name)] = shards
                else:
                    shutil.rmtree(directory, ignore_errors=True)
        return found

    def release(self, job_id: str, checkpoint_id: str) -> None:
        """Drop a checkpoint from memory. Its segments go to the job's free pool, which keeps
        the most recently released ones (the likeliest to fit the next save: a model's state
        keeps its size) and unlinks the rest."""
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        if not directory.exists():
            return
        self.forget_mappings(directory)
        free = self.job_dir(job_id) / FREE
        free.mkdir(exist_ok=True)
        for segment in sorted(directory.glob("shard-*.seg")):
            # Out of the checkpoint first (a client can no longer pin it), under a name no
            # writer takes, then into the pool only if no restore pinned it.
            staged = free / f"{uuid.uuid4().hex}.releasing"
            os.rename(segment, staged)
            if staged.stat().st_nlink > 1:
                staged.unlink()  # a restored array maps it: never reuse it
                continue
            target = staged.with_suffix(".seg")
            os.rename(staged, target)
            os.utime(target)  # released now: the newest in the pool
        shutil.rmtree(directory, ignore_errors=True)
        pooled = sorted(free.glob("*.seg"), key=_modified, reverse=True)
        for extra in pooled[self.free_segments_per_job :]:
            extra.unlink(missing_ok=True)

    def expire_free(self, older_than: float) -> None:
        """Unlink free segments released before ``older_than`` (a UNIX time), leftovers of
        an interrupted release, and pins whose segment has no other name left."""
        for segment in self.root.glob(f"*/{FREE}/*.seg"):
            if _modified(segment) < older_than:
                segment.unlink(missing_ok=True)
        for staged in self.root.glob(f"*/{FREE}/*.releasing"):
            if _modified(staged) < older_than:
                staged.unlink(missing_ok=True)
        self.remove_stale_pins()

    def remove_stale_pins(self) -> int:
        """Unlink the pins (``<job>/.pinned/*.pin``) whose segment has left every
        checkpoint: removing them cannot expose memory to a writer, and frees it once no
        process maps it. Returns how many were removed."""
        removed = 0
        for pin in self.root.glob(f"*/{PINNED}/*.pin"):
            try:
                if pin.stat().st_nlink == 1:
                    pin.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def remove(self) -> None:
        """Remove what the cache keeps here (the job directories, the node id), then the
        directory itself if nothing else is in it: a stopped cache leaves nothing in RAM,
        and an operator's directory (``STRIDE_CKPTCACHE_SHM_DIR=/dev/shm``) keeps what
        is not the cache's."""
        with self._mappings_lock:
            mappings = list(self._mappings.values())
            self._mappings.clear()
        for _, mapping in mappings:
            _unmap(mapping)
        if not self.root.exists():
            return
        for path in self.root.iterdir():
            if path.is_dir() and JOB_ID_PATTERN.match(path.name):
                shutil.rmtree(path, ignore_errors=True)
            elif path.name == NODE_ID or path.name.startswith(f".{NODE_ID}."):
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()


def _unmap(mapping: mmap.mmap) -> None:
    # A checksum still running over it keeps it mapped until that finishes.
    with contextlib.suppress(BufferError):
        mapping.close()


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except FileNotFoundError:
        return 0


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
