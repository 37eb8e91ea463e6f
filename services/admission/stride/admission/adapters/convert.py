"""Conversions between the job API's protobuf messages and admission's domain types."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.unknown_fields import UnknownFieldSet

from stride.admission.domain.jobs import JobSpec, Priority
from stride.admission.domain.policy import Decision, Outcome
from stride.events.v1 import job_pb2
from stride.runtime.errors import InvalidArgument

_PRIORITY = {
    job_pb2.PRIORITY_UNSPECIFIED: Priority.NORMAL,
    job_pb2.PRIORITY_LOW: Priority.LOW,
    job_pb2.PRIORITY_NORMAL: Priority.NORMAL,
    job_pb2.PRIORITY_HIGH: Priority.HIGH,
}

OUTCOME_TO_PROTO = {
    Outcome.ADMITTED: job_pb2.ADMISSION_OUTCOME_ADMITTED,
    Outcome.REJECTED: job_pb2.ADMISSION_OUTCOME_REJECTED,
    Outcome.QUEUED: job_pb2.ADMISSION_OUTCOME_QUEUED,
}


def _reject_unknown_fields(message: Message, path: str) -> None:
    """Unknown fields mean a client built against another schema; refuse, don't drop them."""
    unknown = UnknownFieldSet(message)
    if len(unknown):
        numbers = sorted({unknown[i].field_number for i in range(len(unknown))})
        raise InvalidArgument(
            path, f"unknown field number(s) {numbers}; is the client's proto newer?"
        )
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None or descriptor.message_type.GetOptions().map_entry:
            continue
        if descriptor.is_repeated:
            for index, item in enumerate(value):
                _reject_unknown_fields(item, f"{path}.{descriptor.name}[{index}]")
        else:
            _reject_unknown_fields(value, f"{path}.{descriptor.name}")


def spec_from_proto(spec: job_pb2.JobSpec) -> JobSpec:
    """The domain view of a submitted spec (validation is the domain's job)."""
    _reject_unknown_fields(spec, "spec")
    if spec.priority not in _PRIORITY:
        raise InvalidArgument("spec.priority", f"unknown priority {spec.priority}")
    deadline = spec.deadline.ToDatetime(tzinfo=UTC) if spec.HasField("deadline") else None
    return JobSpec(
        name=spec.name,
        user=spec.user,
        model_name=spec.model.name,
        image=spec.model.image,
        entrypoint=spec.model.entrypoint,
        dataset_name=spec.dataset.name,
        record_count=spec.dataset.record_count,
        batch_size=spec.batch_size,
        max_steps=spec.termination.max_steps,
        max_epochs=spec.termination.max_epochs,
        deadline=deadline,
        priority=_PRIORITY[spec.priority],
        hyperparameters=dict(spec.hyperparameters),
    )


def timestamp(moment: datetime) -> Timestamp:
    """A protobuf Timestamp of an aware datetime."""
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def decision_to_proto(
    job_id: str, decision: Decision, spec: job_pb2.JobSpec, decided_at: datetime
) -> job_pb2.AdmissionDecision:
    """The bus and API form of a decision."""
    message = job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=OUTCOME_TO_PROTO[decision.outcome],
        reason=decision.reason,
        policy=decision.policy,
        decided_at=timestamp(decided_at),
        spec=spec,
    )
    if decision.minimum_share is not None:
        message.minimum_share.CopyFrom(
            job_pb2.ResourceShare(
                workers=decision.minimum_share.workers,
                cpu=decision.minimum_share.cpu,
                memory_bytes=decision.minimum_share.memory_bytes,
            )
        )
    return message
