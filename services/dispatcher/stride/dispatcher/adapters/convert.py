"""Conversions between the dispatcher's protobuf messages and its domain types."""

from __future__ import annotations

from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import ShardRecord
from stride.events.v1 import shard_pb2
from stride.runtime.errors import InvalidArgument

_KIND = {
    shard_pb2.SHARDING_KIND_UNSPECIFIED: None,
    shard_pb2.SHARDING_KIND_INDEX_RANGE: ShardingKind.INDEX_RANGE,
    shard_pb2.SHARDING_KIND_INDEX_LIST: ShardingKind.INDEX_LIST,
    shard_pb2.SHARDING_KIND_STREAM: ShardingKind.STREAM,
}

SHARD_EVENTS = frozenset({"progress", "done", "failed", "requeued", "straggler", "epoch"})


def shard_subject(job_id: str, event: str) -> str:
    """``stride.shards.v1.<job_id>.<event>`` (the bus contract in shard.proto)."""
    if event not in SHARD_EVENTS:
        raise ValueError(f"event: {event!r} is not one of {sorted(SHARD_EVENTS)}")
    return f"stride.shards.v1.{job_id}.{event}"


def timestamp(moment: datetime) -> Timestamp:
    """A protobuf Timestamp of an aware datetime."""
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def parameters_from_proto(parameters: pb.DatasetParameters) -> DatasetParameters:
    """The domain view of requested parameters (validation is the domain's job)."""
    if parameters.kind not in _KIND:
        raise InvalidArgument("parameters.kind", f"unknown sharding kind {parameters.kind}")
    return DatasetParameters(
        record_count=parameters.record_count,
        batch_size=parameters.batch_size,
        shard_batches=parameters.shard_batches,
        epochs=parameters.epochs,
        shuffle=parameters.shuffle,
        seed=parameters.seed,
        kind=_KIND[parameters.kind],
        partitions=parameters.partitions,
    )


def shard_to_proto(shard: ShardRecord) -> shard_pb2.Shard:
    """The wire form of a leased shard."""
    return shard_pb2.Shard(
        shard_id=shard.shard_id,
        epoch=shard.epoch,
        start=shard.start,
        end=shard.end,
        offset=shard.offset,
    )


def shard_progress(
    job_id: str, dataset: str, shard: ShardRecord, at: datetime
) -> shard_pb2.ShardProgress:
    """A shard event: where the shard stood, and who held it."""
    return shard_pb2.ShardProgress(
        job_id=job_id,
        dataset=dataset,
        worker="" if shard.holder is None else shard.holder.worker,
        shard_id=shard.shard_id,
        epoch=shard.epoch,
        offset=shard.offset,
        reported_at=timestamp(at),
    )
