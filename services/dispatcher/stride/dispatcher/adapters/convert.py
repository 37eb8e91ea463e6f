"""Conversions between the dispatcher's protobuf messages and its domain types."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import ShardRecord, ShardState
from stride.dispatcher.domain.sharding import shard_indices
from stride.dispatcher.domain.steps import total_steps
from stride.events.v1 import shard_pb2
from stride.runtime.errors import InvalidArgument

_KIND = {
    shard_pb2.SHARDING_KIND_UNSPECIFIED: None,
    shard_pb2.SHARDING_KIND_INDEX_RANGE: ShardingKind.INDEX_RANGE,
    shard_pb2.SHARDING_KIND_INDEX_LIST: ShardingKind.INDEX_LIST,
    shard_pb2.SHARDING_KIND_STREAM: ShardingKind.STREAM,
}


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


_KIND_TO_PROTO = {kind: number for number, kind in _KIND.items() if kind is not None}
SNAPSHOT_VERSION = 1


def parameters_to_proto(parameters: DatasetParameters) -> pb.DatasetParameters:
    """The wire form of dataset parameters."""
    return pb.DatasetParameters(
        record_count=parameters.record_count,
        batch_size=parameters.batch_size,
        shard_batches=parameters.shard_batches,
        epochs=parameters.epochs,
        shuffle=parameters.shuffle,
        seed=parameters.seed,
        kind=_KIND_TO_PROTO[parameters.kind] if parameters.kind else 0,  # type: ignore[arg-type]
        partitions=parameters.partitions,
    )


def shard_to_proto(shard: ShardRecord, parameters: DatasetParameters) -> shard_pb2.Shard:
    """The wire form of a leased shard; an index-list shard carries its indices."""
    message = shard_pb2.Shard(
        shard_id=shard.shard_id,
        epoch=shard.epoch,
        start=shard.start,
        end=shard.end,
        offset=shard.offset,
        partition=shard.partition,
    )
    if parameters.kind is ShardingKind.INDEX_LIST:
        message.indices.extend(shard_indices(parameters, shard.epoch, shard.start, shard.end))
    return message


@dataclass(frozen=True)
class SnapshotContent:
    """A decoded snapshot."""

    job_id: str
    dataset: str
    parameters: DatasetParameters
    epochs_created: int
    splits: int
    shards: list[ShardRecord]
    consumed_step: int | None = None
    """Data-worker mode: the last step consumed then (None: never read by steps)."""


def encode_snapshot(
    job_id: str,
    dataset: str,
    parameters: DatasetParameters,
    epochs_created: int,
    splits: int,
    touched: list[ShardRecord],
    consumed_step: int | None = None,
) -> bytes:
    """Serialize a snapshot: a DOING shard is recorded as not done at its reported offset,
    and, for a dataset read by steps, the last step consumed."""
    message = pb.ShardSnapshot(
        version=SNAPSHOT_VERSION,
        job_id=job_id,
        dataset=dataset,
        parameters=parameters_to_proto(parameters),
        epochs_created=epochs_created,
        splits=splits,
        shards=[
            pb.SnapshotShard(
                shard_id=s.shard_id,
                epoch=s.epoch,
                position=s.position,
                start=s.start,
                end=s.end,
                offset=s.offset,
                done=s.state is ShardState.DONE,
                partition=s.partition,
            )
            for s in touched
        ],
        consumed_step=consumed_step,
    )
    return message.SerializeToString(deterministic=True)


def decode_snapshot(data: bytes) -> SnapshotContent:
    """Parse and check a snapshot; InvalidArgument("snapshot") if it is not one."""
    try:
        message = pb.ShardSnapshot.FromString(data)
    except DecodeError as error:
        raise InvalidArgument("snapshot", f"is not a shard snapshot: {error}") from None
    if message.version != SNAPSHOT_VERSION:
        raise InvalidArgument(
            "snapshot", f"version {message.version} is not supported (only {SNAPSHOT_VERSION})"
        )
    parameters = parameters_from_proto(message.parameters)
    if parameters.kind is None or message.epochs_created < 0 or message.splits < 0:
        raise InvalidArgument("snapshot", "is malformed (no kind, or negative counters)")
    stream = parameters.kind is ShardingKind.STREAM
    shards = []
    for entry in message.shards:
        size = entry.end - entry.start
        if entry.epoch >= message.epochs_created or size <= 0 or not 0 <= entry.offset <= size:
            raise InvalidArgument(
                "snapshot", f"shard {entry.shard_id} is malformed (epoch, range or offset)"
            )
        done = entry.done
        shards.append(
            ShardRecord(
                shard_id=entry.shard_id,
                epoch=entry.epoch,
                position=entry.position,
                start=entry.start,
                end=entry.end,
                offset=size if done else entry.offset,
                state=ShardState.DONE if done else ShardState.TODO,
                partition=entry.partition if stream else 0,
            )
        )
    consumed_step = message.consumed_step if message.HasField("consumed_step") else None
    if consumed_step is not None and not -1 <= consumed_step < total_steps(parameters):
        raise InvalidArgument(
            "snapshot", f"consumed_step {consumed_step} is not a step of the dataset"
        )
    return SnapshotContent(
        message.job_id,
        message.dataset,
        parameters,
        message.epochs_created,
        message.splits,
        shards,
        consumed_step,
    )


def straggler_detected(
    job_id: str, worker: str, rate: float, peer_median_rate: float, at: datetime
) -> shard_pb2.StragglerDetected:
    """The straggler signal for the optimizer."""
    return shard_pb2.StragglerDetected(
        job_id=job_id,
        worker=worker,
        rate=rate,
        peer_median_rate=peer_median_rate,
        detected_at=timestamp(at),
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


def shards_done(
    job_id: str, dataset: str, worker: str, shards: Sequence[ShardRecord], at: datetime
) -> shard_pb2.ShardsDone:
    """One event for the shards a batched call reported done, in the order reported."""
    return shard_pb2.ShardsDone(
        job_id=job_id,
        dataset=dataset,
        worker=worker,
        shards=[
            shard_pb2.FinishedShard(
                shard_id=shard.shard_id, epoch=shard.epoch, offset=shard.offset, lease=shard.leases
            )
            for shard in shards
        ],
        reported_at=timestamp(at),
    )


def shards_done_id(job_id: str, dataset: str, first: ShardRecord) -> str:
    """A batch's event id: its first shard's lease ends in this one call only, so the id is
    unique and a re-published copy de-duplicates."""
    return f"{job_id}.{dataset}.{first.shard_id}.done-batch.{first.leases}"
