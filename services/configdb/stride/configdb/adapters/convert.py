"""Conversions between configdb's protobuf messages and its domain and storage types."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.configdb.v1 import configdb_service_pb2 as pb
from stride.configdb.adapters.outbound.repository import StoredRecord
from stride.configdb.domain.features import JobFeatures, extract_features
from stride.configdb.domain.profiles import RuntimeProfile, StepWindow, UsageSample
from stride.configdb.domain.similarity import Outcome
from stride.events.v1 import job_pb2, metrics_pb2, plan_pb2, pod_pb2
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import InvalidWord, Role
from stride.vocabulary.jobspec import JobSpec, validate_values

OUTCOME_FROM_PROTO = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: Outcome.SUCCEEDED,
    job_pb2.JOB_OUTCOME_FAILED: Outcome.FAILED,
    job_pb2.JOB_OUTCOME_CANCELLED: Outcome.CANCELLED,
}
OUTCOME_TO_PROTO = {outcome: value for value, outcome in OUTCOME_FROM_PROTO.items()}
ROLE_TO_PROTO = {role: plan_pb2.Role.Value(f"ROLE_{role.name}") for role in Role}
ROLE_FROM_PROTO = {value: role for role, value in ROLE_TO_PROTO.items()}


def window_from_proto(event: metrics_pb2.StepMetrics) -> tuple[StepWindow, datetime]:
    """A step window and when it ended; InvalidArgument when ``reported_at`` is missing."""
    if not event.HasField("reported_at"):
        raise InvalidArgument("reported_at", "is required")
    window = StepWindow(
        job_id=event.job_id,
        pod_name=event.pod_name,
        plan_version=event.plan_version,
        global_step=event.global_step,
        steps=event.steps,
        step_seconds=event.step_seconds,
        samples_per_second=event.samples_per_second,
    )
    return window, moment(event.reported_at)


def usage_from_proto(event: pod_pb2.UsageSample) -> tuple[UsageSample, datetime]:
    """A usage sample and when it was taken; InvalidArgument for a missing time or role."""
    if not event.HasField("sampled_at"):
        raise InvalidArgument("sampled_at", "is required")
    role = ROLE_FROM_PROTO.get(event.role)
    if role is None:
        raise InvalidArgument("role", f"unknown role {event.role}")
    sample = UsageSample(
        job_id=event.job_id,
        pod_name=event.pod_name,
        role=role,
        plan_version=event.plan_version,
        cpu_used=event.cpu_used,
        memory_used_bytes=event.memory_used_bytes,
        cpu_limit=event.cpu_limit,
        memory_limit_bytes=event.memory_limit_bytes,
    )
    return sample, moment(event.sampled_at)


def profile_to_proto(profile: RuntimeProfile) -> pb.RuntimeProfile:
    """The API form of one plan version's profile."""
    return pb.RuntimeProfile(
        plan_version=profile.plan_version,
        windows=profile.windows,
        steps=profile.steps,
        step_seconds=profile.step_seconds,
        samples_per_second=profile.samples_per_second,
        roles=[
            pb.RoleUsage(
                role=ROLE_TO_PROTO[usage.role],
                pods=usage.pods,
                samples=usage.samples,
                cpu_used_mean=usage.cpu_used_mean,
                cpu_used_max=usage.cpu_used_max,
                memory_used_max_bytes=usage.memory_used_max_bytes,
                cpu_limit=usage.cpu_limit,
                memory_limit_bytes=usage.memory_limit_bytes,
            )
            for usage in profile.roles
        ],
    )


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
        profiles=[profile_to_proto(profile) for profile in record.profiles],
    )
    if record.spec is not None:
        message.spec.CopyFrom(record.spec)
    if record.outcome is not None:
        message.outcome = OUTCOME_TO_PROTO[record.outcome]
    if record.finished_at is not None:
        message.finished_at.CopyFrom(timestamp(record.finished_at))
    return message
