"""The durable tier: checkpoints as directories under ``store_dir``.

Layout::

    <store_dir>/<job_id>/<checkpoint_id>/data          the buffer
                                        /header.pb     the header as the client sent it
                                        /manifest.json step, size, checksum, saved_at
                                        /published     marker: the stored event went out
    <store_dir>/.staging/<random>/                     uploads in flight
    <store_dir>/.trash/<random>/                       deletions in progress

An upload writes the data, then the header and the manifest into its own staging
directory and fsyncs them. A single ``rename`` then moves the directory into place. That
rename is the commit: a torn or abandoned upload leaves only a staging directory, which no
reader looks at and the next start removes. A checkpoint is either complete or absent. Two
saves of one id race on the rename, and the loser compares itself with the winner.

The ``published`` marker is a small outbox on the filesystem. An event that could not be
published (NATS down, or a crash just after the commit) is retried until the marker exists.
All blocking file work runs in worker threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import structlog

from stride.ckptcache.domain.checkpoints import (
    CHECKPOINT_ID_PATTERN,
    JOB_ID_PATTERN,
    CheckpointHeader,
    CheckpointInfo,
    Tier,
)
from stride.ckptcache.domain.tiers import StoredCheckpoint
from stride.runtime.errors import AlreadyExists

log = structlog.get_logger(__name__)

DATA = "data"
HEADER = "header.pb"
MANIFEST = "manifest.json"
PUBLISHED = "published"
STAGING = ".staging"
TRASH = ".trash"
MANIFEST_FORMAT = 1


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_file(path: Path, content: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def _manifest(info: CheckpointInfo) -> bytes:
    return json.dumps(
        {
            "format": MANIFEST_FORMAT,
            "job_id": info.job_id,
            "checkpoint_id": info.checkpoint_id,
            "step": info.step,
            "size_bytes": info.size_bytes,
            "crc32c": info.crc32c,
            "saved_at": info.saved_at.isoformat(),
        },
        indent=1,
    ).encode()


def _read_info(directory: Path) -> CheckpointInfo | None:
    """The manifest of a committed checkpoint directory, or None if it is not one."""
    try:
        raw: dict[str, Any] = json.loads((directory / MANIFEST).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        log.warning(
            "unreadable checkpoint manifest; ignored", path=str(directory), error=str(error)
        )
        return None
    return CheckpointInfo(
        job_id=raw["job_id"],
        checkpoint_id=raw["checkpoint_id"],
        step=raw["step"],
        size_bytes=raw["size_bytes"],
        crc32c=raw["crc32c"],
        tier=Tier.DURABLE,
        saved_at=datetime.fromisoformat(raw["saved_at"]),
    )


class DirectoryUpload:
    """One upload into a staging directory."""

    def __init__(self, store: DirectoryStore, header: CheckpointHeader, header_blob: bytes) -> None:
        self.store = store
        self.header = header
        self.header_blob = header_blob
        self.staging = store.root / STAGING / uuid.uuid4().hex
        self._file: IO[bytes] | None = None

    def _open(self) -> None:
        self.staging.mkdir(parents=True)
        self._file = (self.staging / DATA).open("wb")

    async def write(self, chunk: bytes) -> None:
        """Append the next chunk of the buffer."""
        if self._file is None:
            raise RuntimeError("upload not started or already finished")
        await asyncio.to_thread(self._file.write, chunk)

    def _commit(self, saved_at: datetime) -> CheckpointInfo:
        if self._file is None:
            raise RuntimeError("upload not started or already finished")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        info = CheckpointInfo(
            job_id=self.header.job_id,
            checkpoint_id=self.header.checkpoint_id,
            step=self.header.step,
            size_bytes=self.header.size_bytes,
            crc32c=self.header.crc32c,
            tier=Tier.DURABLE,
            saved_at=saved_at,
        )
        _write_file(self.staging / HEADER, self.header_blob)
        _write_file(self.staging / MANIFEST, _manifest(info))
        _fsync_directory(self.staging)
        job_dir = self.store.job_dir(info.job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        final = job_dir / info.checkpoint_id
        try:
            os.rename(self.staging, final)
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            shutil.rmtree(self.staging, ignore_errors=True)
            existing = _read_info(final)
            if existing is None or not existing.same_content(self.header):
                raise AlreadyExists(
                    f"checkpoint {info.checkpoint_id!r} of job {info.job_id!r} exists with "
                    "different contents"
                ) from None
            return existing
        _fsync_directory(job_dir)
        return info

    async def commit(self, saved_at: datetime) -> CheckpointInfo:
        """Make the checkpoint visible with one directory rename."""
        return await asyncio.to_thread(self._commit, saved_at)

    def _abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        shutil.rmtree(self.staging, ignore_errors=True)

    async def abort(self) -> None:
        """Discard the staging directory."""
        await asyncio.to_thread(self._abort)


class DirectoryStore:
    """Checkpoints in a directory tree (the durable tier)."""

    tier = Tier.DURABLE

    def __init__(self, root: Path) -> None:
        self.root = root

    def prepare(self) -> None:
        """Create the root and clear uploads and deletions a previous process left behind.

        Runs once at startup, before the API serves, when no upload can be in flight.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in (STAGING, TRASH):
            path = self.root / leftover
            if path.exists():
                count = sum(1 for _ in path.iterdir())
                shutil.rmtree(path)
                if count:
                    log.info(
                        "removed unfinished work of a previous run", kind=leftover, count=count
                    )

    def writable(self) -> bool:
        """True if a file can be created, written and removed in the store right now."""
        probe = self.root / f".probe-{uuid.uuid4().hex}"
        try:
            with probe.open("wb") as handle:
                handle.write(b"ok")
            probe.unlink()
        except OSError:
            return False
        return True

    def job_dir(self, job_id: str) -> Path:
        """The directory of one job's checkpoints."""
        # Validated upstream; checked again because these names become paths.
        if not JOB_ID_PATTERN.match(job_id):
            raise ValueError(f"job_id {job_id!r} is not a safe directory name")
        return self.root / job_id

    def checkpoint_dir(self, job_id: str, checkpoint_id: str) -> Path:
        """The directory of one checkpoint."""
        if not CHECKPOINT_ID_PATTERN.match(checkpoint_id):
            raise ValueError(f"checkpoint_id {checkpoint_id!r} is not a safe directory name")
        return self.job_dir(job_id) / checkpoint_id

    async def begin(self, header: CheckpointHeader, header_blob: bytes) -> DirectoryUpload:
        """Start an upload in a fresh staging directory."""
        upload = DirectoryUpload(self, header, header_blob)
        await asyncio.to_thread(upload._open)
        return upload

    def _find(self, job_id: str, checkpoint_id: str) -> StoredCheckpoint | None:
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        info = _read_info(directory)
        if info is None:
            return None
        try:
            blob = (directory / HEADER).read_bytes()
        except FileNotFoundError:
            return None  # deleted between the two reads
        return StoredCheckpoint(info, blob)

    async def find(self, job_id: str, checkpoint_id: str) -> StoredCheckpoint | None:
        """A committed checkpoint, or None."""
        return await asyncio.to_thread(self._find, job_id, checkpoint_id)

    def _list(self, job_id: str) -> list[CheckpointInfo]:
        job_dir = self.job_dir(job_id)
        if not job_dir.is_dir():
            return []
        found = (_read_info(entry) for entry in job_dir.iterdir() if entry.is_dir())
        return [info for info in found if info is not None]

    async def checkpoints_of(self, job_id: str) -> list[CheckpointInfo]:
        """Every committed checkpoint of a job."""
        return await asyncio.to_thread(self._list, job_id)

    async def read(self, job_id: str, checkpoint_id: str, chunk_bytes: int) -> AsyncIterator[bytes]:
        """The buffer in chunks; the open file stays readable even if deleted meanwhile."""
        path = self.checkpoint_dir(job_id, checkpoint_id) / DATA
        handle = await asyncio.to_thread(path.open, "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, chunk_bytes):
                yield chunk
        finally:
            handle.close()

    def _delete(self, job_id: str, checkpoint_id: str) -> bool:
        directory = self.checkpoint_dir(job_id, checkpoint_id)
        if _read_info(directory) is None:
            return False
        trash = self.root / TRASH
        trash.mkdir(exist_ok=True)
        target = trash / uuid.uuid4().hex
        try:
            # The rename makes it disappear at once; removing the files can take a while.
            os.rename(directory, target)
        except FileNotFoundError:
            return False
        shutil.rmtree(target, ignore_errors=True)
        return True

    async def delete(self, job_id: str, checkpoint_id: str) -> bool:
        """Remove a checkpoint; False if there was none."""
        return await asyncio.to_thread(self._delete, job_id, checkpoint_id)

    def _unpublished(self) -> list[StoredCheckpoint]:
        pending = []
        for job_dir in self.root.iterdir():
            if not JOB_ID_PATTERN.match(job_dir.name) or not job_dir.is_dir():
                continue
            for directory in job_dir.iterdir():
                if not CHECKPOINT_ID_PATTERN.match(directory.name):
                    continue
                if (directory / PUBLISHED).exists():
                    continue
                stored = self._find(job_dir.name, directory.name)
                if stored is not None:
                    pending.append(stored)
        return pending

    async def unpublished(self) -> list[StoredCheckpoint]:
        """Committed checkpoints without the ``published`` marker."""
        return await asyncio.to_thread(self._unpublished)

    def _mark_published(self, info: CheckpointInfo) -> None:
        directory = self.checkpoint_dir(info.job_id, info.checkpoint_id)
        # A checkpoint deleted since has nothing left to remember.
        with contextlib.suppress(FileNotFoundError):
            (directory / PUBLISHED).touch()

    async def mark_published(self, info: CheckpointInfo) -> None:
        """Write the ``published`` marker."""
        await asyncio.to_thread(self._mark_published, info)
