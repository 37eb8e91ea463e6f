"""The trainer's checkpoint client: flash saves into the node's shared memory, streaming
saves and loads from anywhere else.

On the cache's node, :meth:`CheckpointClient.save` copies the tensors once into a
shared-memory segment and registers it with the cache; that copy is all training waits
for. The cache checksums and persists the segment in the background. Elsewhere (or with
``transport="stream"``) the tensors stream over gRPC in checksummed chunks. Either way the
checkpoint is a flat buffer plus a header of names, dtypes, shapes and offsets: no pickle.

The client talks to the cache directly rather than through the agent, because the fast
path needs the cache's shared memory, which only the cache's node has; it sends the job's
identity in the ``stride-job-id`` metadata as the agent does.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

import google_crc32c
import grpc
import numpy as np

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc
from stride.ckptclient.layout import TensorRecord, as_bytes, plan, views
from stride.ckptclient.shared_memory import SegmentPool, map_segment, same_node
from stride.events.v1 import checkpoint_pb2
from stride.runtime import tls
from stride.runtime.tokens import TokenSource

JOB_METADATA_KEY = "stride-job-id"
DEFAULT_ADDRESS = "127.0.0.1:50056"
CHUNK_BYTES = 1024 * 1024
Transport = Literal["auto", "shared-memory", "stream"]
TIER_NAMES: dict[int, str] = {
    checkpoint_pb2.CHECKPOINT_TIER_MEMORY: "memory",
    checkpoint_pb2.CHECKPOINT_TIER_DURABLE: "durable",
}


class CheckpointCacheError(Exception):
    """The cache refused or failed a call; ``code`` is the gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CorruptCheckpointError(Exception):
    """A checkpoint read back did not match its checksum."""


@dataclass(frozen=True)
class SavedCheckpoint:
    """What a save did."""

    checkpoint_id: str
    step: int
    size_bytes: int
    tier: str
    transport: str
    blocking_seconds: float
    """How long the save held the caller: the copy and the registration (or the stream)."""


@dataclass(frozen=True)
class RestoredCheckpoint:
    """A restored shard: its tensors (read-only arrays over one buffer: the cache's shared
    memory on the same node, no copy; copy one with ``np.array`` to change it) and its
    facts."""

    checkpoint_id: str
    step: int
    tensors: dict[str, np.ndarray]
    shard_index: int
    shard_count: int
    shard_snapshot_id: str
    shard_snapshot: bytes
    tier: str
    transport: str


def _crc(data: bytes) -> int:
    return int(google_crc32c.value(data))


def _records(header: pb.CheckpointHeader) -> list[TensorRecord]:
    return [
        TensorRecord(t.name, t.dtype, tuple(t.shape), t.offset, t.length) for t in header.tensors
    ]


class CheckpointClient:
    """Saves and restores one job's checkpoints through the checkpoint cache.

    ``address`` defaults to ``$STRIDE_CKPTCACHE_ADDRESS`` (else 127.0.0.1:50056) and
    ``job_id`` to ``$STRIDE_JOB_ID`` (else ``$STRIDE_AGENT_JOB_ID``, which pods have).
    """

    def __init__(
        self,
        address: str | None = None,
        job_id: str | None = None,
        *,
        transport: Transport = "auto",
        timeout: float = 300.0,
        identity: str = "trainer",
        token: tls.Token | None = None,
    ) -> None:
        """``token``: the pod's job token (default: the file ``STRIDE_JOB_TOKEN_FILE`` names);
        the cache takes the job from it and refuses any other job's checkpoints."""
        self.address = address or os.environ.get("STRIDE_CKPTCACHE_ADDRESS", DEFAULT_ADDRESS)
        found_job = (
            job_id or os.environ.get("STRIDE_JOB_ID") or os.environ.get("STRIDE_AGENT_JOB_ID")
        )
        if not found_job:
            raise ValueError("job_id is required (or set STRIDE_JOB_ID)")
        self.job_id = found_job
        self.transport = transport
        self.timeout = timeout
        self.metadata = ((JOB_METADATA_KEY, self.job_id),)
        self.channel = tls.sync_channel(
            self.address,
            server="ckptcache",
            identity=identity,
            options=[
                ("grpc.max_receive_message_length", 8 * CHUNK_BYTES),
                ("grpc.max_send_message_length", 8 * CHUNK_BYTES),
            ],
            token=token or TokenSource.for_pod(),
        )
        self.stub = pb_grpc.CheckpointCacheServiceStub(self.channel)
        self._pool: SegmentPool | None = None
        self._pool_checked = False
        self.chunk_bytes = CHUNK_BYTES

    def __enter__(self) -> CheckpointClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Unmap segments and close the channel."""
        if self._pool is not None:
            self._pool.close()
        self.channel.close()

    def _call(self, method: str, request: object, **extra: object) -> object:
        try:
            return getattr(self.stub, method)(
                request, metadata=self.metadata, timeout=self.timeout, **extra
            )
        except grpc.RpcError as error:
            raise _wrap(error) from None

    def shared_memory(self) -> SegmentPool | None:
        """The job's segment pool if the cache's shared memory is reachable from here."""
        if self.transport == "stream":
            return None
        if not self._pool_checked:
            info = self._call("GetCacheInfo", pb.GetCacheInfoRequest())
            assert isinstance(info, pb.GetCacheInfoResponse)
            directory = Path(info.shared_memory_dir)
            if same_node(directory, info.node_id):
                self._pool = SegmentPool(directory, self.job_id)
            self.chunk_bytes = int(info.chunk_bytes) or CHUNK_BYTES
            self._pool_checked = True
        if self._pool is None and self.transport == "shared-memory":
            raise RuntimeError(
                f"the checkpoint cache at {self.address} is on another node (its shared "
                "memory is not visible here); use transport='auto' or 'stream'"
            )
        return self._pool

    # ---- saving --------------------------------------------------------------------------

    def save(
        self,
        step: int,
        tensors: Mapping[str, np.ndarray],
        *,
        checkpoint_id: str | None = None,
        shard_index: int = 0,
        shard_count: int = 1,
        shard_snapshot_id: str = "",
        shard_snapshot: bytes = b"",
    ) -> SavedCheckpoint:
        """Save ``tensors`` as (one shard of) checkpoint ``checkpoint_id`` (default
        ``step-<step>``). Returns once the state is safe in the cache's memory."""
        started = time.perf_counter()
        # asarray keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        arrays = {name: np.asarray(value, order="C") for name, value in tensors.items()}
        records, size = plan(arrays)
        header = pb.CheckpointHeader(
            checkpoint_id=checkpoint_id or f"step-{step}",
            step=step,
            size_bytes=size,
            shard_index=shard_index,
            shard_count=shard_count,
            shard_snapshot_id=shard_snapshot_id,
            shard_snapshot=shard_snapshot,
            tensors=[
                pb.TensorEntry(
                    name=r.name, dtype=r.dtype, shape=r.shape, offset=r.offset, length=r.length
                )
                for r in records
            ],
        )
        pool = self.shared_memory() if size > 0 else None
        if pool is not None:
            segment = pool.acquire(size)
            try:
                for record, array in zip(records, arrays.values(), strict=True):
                    segment.buffer[record.offset : record.offset + record.length] = as_bytes(array)
                reply = self._call(
                    "RegisterSegment",
                    pb.RegisterSegmentRequest(header=header, segment_name=segment.name),
                )
            except BaseException:
                pool.discard(segment)
                raise
            finally:
                del segment
            transport = "shared-memory"
        else:
            reply = self._stream_save(header, records, list(arrays.values()))
            transport = "stream"
        tier = TIER_NAMES.get(int(getattr(reply, "tier", 0)), "unknown")
        return SavedCheckpoint(
            header.checkpoint_id, step, size, tier, transport, time.perf_counter() - started
        )

    def _pieces(
        self, records: list[TensorRecord], arrays: list[np.ndarray], size: int
    ) -> Iterator[bytes]:
        """The buffer's bytes in order (zero padding between tensors), in chunks."""
        position = 0
        for record, array in zip(records, arrays, strict=True):
            if record.offset > position:
                yield bytes(record.offset - position)
            flat = as_bytes(array)
            for start in range(0, record.length, self.chunk_bytes):
                yield flat[start : start + self.chunk_bytes].tobytes()
            position = record.offset + record.length
        if size > position:
            yield bytes(size - position)

    def _stream_save(
        self, header: pb.CheckpointHeader, records: list[TensorRecord], arrays: list[np.ndarray]
    ) -> object:
        crc = 0
        for piece in self._pieces(records, arrays, header.size_bytes):
            crc = int(google_crc32c.extend(crc, piece))
        header.crc32c = crc

        def requests() -> Iterator[pb.SaveCheckpointRequest]:
            yield pb.SaveCheckpointRequest(header=header)
            for piece in self._pieces(records, arrays, header.size_bytes):
                yield pb.SaveCheckpointRequest(data=piece, data_crc32c=_crc(piece))

        return self._call("SaveCheckpoint", requests())

    # ---- restoring -----------------------------------------------------------------------

    def restore(self, checkpoint_id: str = "", *, shard_index: int = 0) -> RestoredCheckpoint:
        """The newest complete, intact checkpoint (or ``checkpoint_id``): read straight from
        shared memory when it is held there and reachable, else streamed."""
        pool = self.shared_memory()
        if pool is not None:
            located = self._call(
                "LocateCheckpoint",
                pb.LocateCheckpointRequest(checkpoint_id=checkpoint_id, shard_index=shard_index),
            )
            assert isinstance(located, pb.LocateCheckpointResponse)
            if located.segment_path:
                # The cache verified this segment's checksum when it located it (one CRC
                # pass over its own mapping). The client neither copies nor checks it again:
                # map_segment pins the segment (the pin proves it is the same, unreleased
                # segment, and keeps the cache from reusing it) and returns read-only
                # arrays over it, so a restore costs about half a memcpy, not two copies.
                header = located.header
                data = map_segment(
                    pool.root, self.job_id, pool.root / located.segment_path, header.size_bytes
                )
                if data is not None:
                    return self._restored(header, data, located.tier, "shared-memory")
            # Pin the id so the stream returns the checkpoint just located.
            checkpoint_id = located.header.checkpoint_id
        header, streamed = self._stream_load(checkpoint_id, shard_index)
        return self._restored(header, streamed, 0, "stream")

    def _stream_load(
        self, checkpoint_id: str, shard_index: int
    ) -> tuple[pb.CheckpointHeader, bytes]:
        call = self._call(
            "LoadCheckpoint",
            pb.LoadCheckpointRequest(checkpoint_id=checkpoint_id, shard_index=shard_index),
        )
        header: pb.CheckpointHeader | None = None
        pieces: list[bytes] = []
        try:
            for reply in call:  # type: ignore[attr-defined]
                if reply.WhichOneof("chunk") == "header":
                    header = reply.header
                    continue
                if reply.HasField("data_crc32c") and _crc(reply.data) != reply.data_crc32c:
                    raise CorruptCheckpointError(
                        f"chunk {len(pieces) + 1} of checkpoint {checkpoint_id!r} arrived damaged"
                    )
                pieces.append(reply.data)
        except grpc.RpcError as error:
            raise _wrap(error) from None
        if header is None:
            raise CorruptCheckpointError("the load stream carried no header")
        data = b"".join(pieces)
        if len(data) != header.size_bytes or _crc(data) != header.crc32c:
            raise CorruptCheckpointError(
                f"checkpoint {header.checkpoint_id!r} does not match its checksum"
            )
        return header, data

    def _restored(
        self, header: pb.CheckpointHeader, data: bytes | np.ndarray, tier: int, transport: str
    ) -> RestoredCheckpoint:
        return RestoredCheckpoint(
            checkpoint_id=header.checkpoint_id,
            step=header.step,
            tensors=views(data, _records(header)),
            shard_index=header.shard_index,
            shard_count=header.shard_count or 1,
            shard_snapshot_id=header.shard_snapshot_id,
            shard_snapshot=header.shard_snapshot,
            tier=TIER_NAMES.get(int(tier), "unknown"),
            transport=transport,
        )

    # ---- the rest ------------------------------------------------------------------------

    def list(self) -> list[pb.CheckpointInfo]:
        """The job's complete checkpoints, newest first."""
        reply = self._call("ListCheckpoints", pb.ListCheckpointsRequest())
        assert isinstance(reply, pb.ListCheckpointsResponse)
        return list(reply.checkpoints)

    def delete(self, checkpoint_id: str) -> None:
        """Remove a checkpoint from every tier."""
        self._call("DeleteCheckpoint", pb.DeleteCheckpointRequest(checkpoint_id=checkpoint_id))

    def wait_until_durable(self, checkpoint_id: str, timeout: float = 60.0) -> pb.CheckpointInfo:
        """Block until ``checkpoint_id`` is persisted (TimeoutError, or RuntimeError with the
        cache's reason if persisting it failed)."""
        deadline = time.monotonic() + timeout
        while True:
            for info in self.list():
                if info.checkpoint_id != checkpoint_id:
                    continue
                if info.tier == checkpoint_pb2.CHECKPOINT_TIER_DURABLE:
                    return info
                if info.persist_error:
                    raise RuntimeError(f"{checkpoint_id} was not persisted: {info.persist_error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{checkpoint_id} not durable after {timeout} s")
            time.sleep(0.01)


def new_checkpoint_id(step: int) -> str:
    """A unique id for a checkpoint at ``step`` (when ids must not collide across runs)."""
    return f"step-{step}-{uuid.uuid4().hex[:8]}"


def _wrap(error: grpc.RpcError) -> CheckpointCacheError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    return CheckpointCacheError(code, details or "")
