"""Conversions between configdb's protobuf messages and its domain and storage types."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.configdb.v1 import configdb_service_pb2 as pb
from stride.configdb.adapters.repository import StoredRecord
from stride.configdb.domain.features import JobFeatures, extract_features
from stride.configdb.domain.similarity import Outcome
from stride.events.v1 import job_pb2

OUTCOME_FROM_PROTO = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: Outcome.SUCCEEDED,
    job_pb2.JOB_OUTCOME_FAILED: Outcome.FAILED,
    job_pb2.JOB_OUTCOME_CANCELLED: Outcome.CANCELLED,
}
OUTCOME_TO_PROTO = {outcome: value for value, outcome in OUTCOME_FROM_PROTO.items()}

_FORMAT_PREFIX = "DATASET_FORMAT_"


def _dataset_format(value: int) -> str:
    # An unknown or unset format is an unknown feature, not a reason to drop the job.
    if value == job_pb2.DATASET_FORMAT_UNSPECIFIED or value not in job_pb2.DatasetFormat.values():
        return ""
    return job_pb2.DatasetFormat.Name(job_pb2.DatasetFormat.ValueType(value)).removeprefix(
        _FORMAT_PREFIX
    )


def features_from_spec(spec: job_pb2.JobSpec) -> JobFeatures:
    """The warm-start features of a job spec."""
    return extract_features(
        model_name=spec.model.name,
        model_family=spec.model.family,
        dataset_name=spec.dataset.name,
        dataset_format=_dataset_format(spec.dataset.format),
        record_count=spec.dataset.record_count,
        batch_size=spec.batch_size,
        embedding_dim=spec.model.embedding_dim,
        parameter_count=spec.model.parameter_count,
    )


def timestamp(moment: datetime) -> Timestamp:
    """A protobuf Timestamp of an aware datetime."""
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def moment(value: Timestamp) -> datetime:
    """An aware UTC datetime of a protobuf Timestamp."""
    return value.ToDatetime(tzinfo=UTC)


def record_to_proto(record: StoredRecord) -> pb.JobRecord:
    """The API form of a stored record."""
    message = pb.JobRecord(
        job_id=record.job_id,
        plans=record.plans,
        recorded_at=timestamp(record.recorded_at),
    )
    if record.spec is not None:
        message.spec.CopyFrom(record.spec)
    if record.outcome is not None:
        message.outcome = OUTCOME_TO_PROTO[record.outcome]
    if record.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(record.finished_at))
    return message
