"""Conversions between the cache's protobuf messages and its domain types."""

from __future__ import annotations

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.ckptcache.domain.checkpoints import CheckpointHeader, CheckpointInfo, TensorSpan, Tier
from stride.ckptcache.domain.tiers import StoredCheckpoint
from stride.events.v1 import checkpoint_pb2

TIER_TO_PROTO = {
    Tier.MEMORY: checkpoint_pb2.CHECKPOINT_TIER_MEMORY,
    Tier.DURABLE: checkpoint_pb2.CHECKPOINT_TIER_DURABLE,
}


def header_from_proto(header: pb.CheckpointHeader) -> CheckpointHeader:
    """The domain view of a shard's header (validation is the domain's job)."""
    return CheckpointHeader(
        job_id=header.job_id,
        checkpoint_id=header.checkpoint_id,
        step=header.step,
        size_bytes=header.size_bytes,
        crc32c=header.crc32c,
        tensors=tuple(
            TensorSpan(
                name=t.name, dtype=t.dtype, offset=t.offset, length=t.length, shape=tuple(t.shape)
            )
            for t in header.tensors
        ),
        shard_index=header.shard_index,
        shard_count=header.shard_count or 1,
        shard_snapshot_id=header.shard_snapshot_id,
    )


def parse_header(blob: bytes) -> CheckpointHeader:
    """A stored header blob back in domain form (an unreadable one reads as empty)."""
    header = pb.CheckpointHeader()
    try:
        header.ParseFromString(blob)
    except DecodeError:
        header.Clear()
    return header_from_proto(header)


def with_checksum(blob: bytes, crc32c: int) -> bytes:
    """The serialized header with its checksum (and a normalized shard count) set."""
    header = pb.CheckpointHeader.FromString(blob)
    header.crc32c = crc32c
    header.shard_count = header.shard_count or 1
    return header.SerializeToString()


def header_to_proto(blob: bytes, info: CheckpointInfo) -> pb.CheckpointHeader:
    """The header to send first in a load stream: as saved, with the stored facts."""
    header = pb.CheckpointHeader()
    try:
        header.ParseFromString(blob)
    except DecodeError:
        header.Clear()  # the facts below still describe the checkpoint
    header.job_id = info.job_id
    header.checkpoint_id = info.checkpoint_id
    header.step = info.step
    header.shard_count = info.shard_count
    header.shard_snapshot_id = info.shard_snapshot_id
    return header


def timestamp(info: CheckpointInfo) -> Timestamp:
    """When the checkpoint was saved, as a protobuf Timestamp."""
    value = Timestamp()
    value.FromDatetime(info.saved_at)
    return value


def info_to_proto(info: CheckpointInfo) -> pb.CheckpointInfo:
    """The API form of a stored checkpoint."""
    return pb.CheckpointInfo(
        job_id=info.job_id,
        checkpoint_id=info.checkpoint_id,
        step=info.step,
        size_bytes=info.size_bytes,
        tier=TIER_TO_PROTO[info.tier],
        saved_at=timestamp(info),
        shard_count=info.shard_count,
        shard_snapshot_id=info.shard_snapshot_id,
        persist_error=info.persist_error,
    )


def stored_event(stored: StoredCheckpoint) -> checkpoint_pb2.CheckpointStored:
    """The bus event for a checkpoint that reached its tier."""
    return checkpoint_pb2.CheckpointStored(
        job_id=stored.info.job_id,
        checkpoint_id=stored.info.checkpoint_id,
        step=stored.info.step,
        size_bytes=stored.info.size_bytes,
        tier=TIER_TO_PROTO[stored.info.tier],
        shard_snapshot=header_to_proto(stored.header_blob, stored.info).shard_snapshot,
        stored_at=timestamp(stored.info),
        shard_snapshot_id=stored.info.shard_snapshot_id,
    )
