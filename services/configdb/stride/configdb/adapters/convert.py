"""Conversions between configdb's protobuf messages and its domain and storage types."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.configdb.v1 import configdb_service_pb2 as pb
from stride.configdb.adapters.outbound.repository import StoredRecord
from stride.configdb.domain.features import JobFeatures, extract_features
from stride.configdb.domain.similarity import Outcome
from stride.events.v1 import job_pb2
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import InvalidWord
from stride.vocabulary.jobspec import JobSpec, validate_values

OUTCOME_FROM_PROTO = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: Outcome.SUCCEEDED,
    job_pb2.JOB_OUTCOME_FAILED: Outcome.FAILED,
    job_pb2.JOB_OUTCOME_CANCELLED: Outcome.CANCELLED,
}
OUTCOME_TO_PROTO = {outcome: value for value, outcome in OUTCOME_FROM_PROTO.items()}


def features_from_spec(spec: job_pb2.JobSpec) -> JobFeatures:
    """The warm-start features of a job spec; InvalidArgument names a bad field.

    Every value given is judged by the rules admission applies at submit
    (:func:`stride.vocabulary.jobspec.validate_values`), so a spec admission accepted is
    always recorded. Missing fields are allowed: a similarity query names only some.
    """
    view = JobSpec.from_message(spec)
    try:
        validate_values(view)
    except InvalidWord as error:
        raise InvalidArgument(error.field, error.problem) from None
    dataset_format = view.dataset_format
    return extract_features(
        model_name=view.model.name,
        model_family=view.model.family,
        dataset_name=view.dataset.name,
        dataset_format=dataset_format.value if dataset_format is not None else "",
        record_count=view.dataset.record_count,
        batch_size=view.batch_size,
        embedding_dim=view.model.embedding_dim,
        parameter_count=view.model.parameter_count,
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
