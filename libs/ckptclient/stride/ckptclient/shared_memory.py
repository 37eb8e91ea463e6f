"""The client's side of the same-node fast path: segments in the cache's shared memory.

The cache's directory layout is a contract (see ckptcache_service.proto, RegisterSegment):
the client fills ``<dir>/<job>/.incoming/<name>.seg`` and registers it; the cache moves
segments it no longer needs to ``<dir>/<job>/.free/``. Taking a free segment of the right
size (an atomic rename back into ``.incoming``) reuses pages that are already allocated,
and this process keeps its mappings of segments it has used, so a save is one memcpy into
mapped memory. A fresh tmpfs file costs a page fault per 4 KiB, about ten times the copy.

A restore maps the located segment read-only instead of copying it: the restored arrays
are views of the cache's memory, and cost the mapping's page-table entries, not a copy.
The segment is pinned first with a hard link in ``<dir>/<job>/.pinned/``: the cache never
hands a pinned segment to a writer (it unlinks it when the checkpoint leaves memory), so
the arrays never change under the caller. The pin is removed when the arrays are collected
(and by the cache's sweep once the segment has no other name, if this process was killed).

Every new segment's pages are reserved with posix_fallocate before anything is written:
writing to a tmpfs page the filesystem cannot back kills the process with SIGBUS (Docker's
64 MB /dev/shm, DLRover issue #1046); reserving first turns that into a clear error.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INCOMING = ".incoming"
FREE = ".free"
PINNED = ".pinned"
NODE_ID = "node-id"
MIB = 1024 * 1024
HOW_TO_FIX = (
    "give the container a bigger /dev/shm (`docker run --shm-size=2g`, `shm_size: 2gb` in "
    "compose, or in Kubernetes an emptyDir with `medium: Memory` and a sizeLimit mounted at "
    "/dev/shm)"
)


class SharedMemoryFull(Exception):
    """Shared memory has no room for the segment; the message says how to fix it."""


@dataclass
class Segment:
    """A writable segment in ``.incoming``, mapped into this process."""

    name: str
    path: Path
    buffer: np.ndarray
    """The mapped bytes as a flat uint8 array."""


def same_node(directory: Path, node_id: str) -> bool:
    """True if ``directory`` here is the cache's shared memory (its node marker matches)."""
    try:
        return bool(node_id) and (directory / NODE_ID).read_text().strip() == node_id
    except OSError:
        return False


class SegmentPool:
    """One job's segments in shared memory, as seen from a trainer process."""

    def __init__(self, root: Path, job_id: str, max_mappings: int = 4) -> None:
        self.root = root
        self.incoming = root / job_id / INCOMING
        self.free = root / job_id / FREE
        self.max_mappings = max_mappings
        self._mappings: OrderedDict[tuple[int, int], mmap.mmap] = OrderedDict()

    def acquire(self, size_bytes: int) -> Segment:
        """A segment of exactly ``size_bytes``: a free one if there is one, else a new one."""
        self.incoming.mkdir(parents=True, exist_ok=True)
        name = f"{uuid.uuid4().hex}.seg"
        path = self.incoming / name
        if self.free.is_dir():
            for candidate in sorted(self.free.glob("*.seg")):
                try:
                    if candidate.stat().st_size != size_bytes:
                        continue
                    os.rename(candidate, path)  # atomic: only one taker wins
                except FileNotFoundError:
                    continue
                return Segment(name, path, self._map(path, size_bytes))
        self._create(path, size_bytes)
        return Segment(name, path, self._map(path, size_bytes))

    def _create(self, path: Path, size_bytes: int) -> None:
        stats = os.statvfs(self.root)
        free = stats.f_bavail * stats.f_frsize
        if free < size_bytes:
            raise SharedMemoryFull(
                f"shared memory at {self.root} has {free // MIB} MiB free, not enough for a "
                f"{size_bytes / MIB:.1f} MiB checkpoint; {HOW_TO_FIX}"
            )
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(descriptor, 0, size_bytes)
        except OSError as error:
            os.close(descriptor)
            path.unlink(missing_ok=True)
            raise SharedMemoryFull(
                f"cannot reserve {size_bytes / MIB:.1f} MiB in shared memory at {self.root}: "
                f"{error.strerror}; {HOW_TO_FIX}"
            ) from None
        os.close(descriptor)

    def _map(self, path: Path, size_bytes: int) -> np.ndarray:
        stats = path.stat()
        key = (stats.st_dev, stats.st_ino)
        mapping = self._mappings.get(key)
        if mapping is None or len(mapping) != size_bytes:
            descriptor = os.open(path, os.O_RDWR)
            try:
                mapping = mmap.mmap(
                    descriptor,
                    size_bytes,
                    flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                )
            finally:
                os.close(descriptor)
            self._mappings[key] = mapping
            while len(self._mappings) > self.max_mappings:
                _, oldest = self._mappings.popitem(last=False)
                _close(oldest)
        self._mappings.move_to_end(key)
        return np.frombuffer(mapping, dtype=np.uint8)

    def discard(self, segment: Segment) -> None:
        """Give back a segment that was never registered (a failed save)."""
        segment.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Unmap everything this process mapped."""
        while self._mappings:
            _, mapping = self._mappings.popitem()
            _close(mapping)


def _close(mapping: mmap.mmap) -> None:
    # An array still viewing it keeps it alive; the mapping goes when that array does.
    with contextlib.suppress(BufferError):
        mapping.close()


def map_segment(root: Path, job_id: str, path: Path, size_bytes: int) -> np.ndarray | None:
    """The segment's first ``size_bytes`` as a read-only uint8 array over shared memory (no
    copy), or None if the cache released the segment before it could be pinned.

    The hard link made first is the pin: made while the segment was still at ``path`` (in
    its checkpoint's directory), so the segment had not been released when it was located
    and verified, and from now on the cache will not reuse it. The array keeps the mapping
    (and the memory) alive on its own; the pin goes when the mapping is collected.
    """
    if size_bytes == 0:
        return np.empty(0, dtype=np.uint8) if path.exists() else None
    pins = root / job_id / PINNED
    pins.mkdir(parents=True, exist_ok=True)
    pin = pins / f"{uuid.uuid4().hex}.pin"
    try:
        os.link(path, pin)
    except OSError:
        # Released meanwhile (ENOENT), or not linkable from here (EPERM: the kernel's
        # protected_hardlinks when this user does not own the segment): the caller streams
        # the checkpoint instead.
        return None
    try:
        descriptor = os.open(pin, os.O_RDONLY)
        try:
            if os.fstat(descriptor).st_size < size_bytes:
                pin.unlink(missing_ok=True)
                return None
            # PROT_READ alone makes the mmap (and so every array over it) read-only. No
            # MAP_POPULATE: it maps page by page (about 0.14 s per GiB here), while faults
            # on first access map 16 tmpfs pages at a time (fault-around, about 0.06 s per
            # GiB); bench/ckptcache.py times the restore with a first touch of every page.
            mapping = mmap.mmap(descriptor, size_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(descriptor)
    except BaseException:
        pin.unlink(missing_ok=True)
        raise
    weakref.finalize(mapping, _unpin, str(pin))
    return np.frombuffer(mapping, dtype=np.uint8)


def _unpin(pin: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(pin)
