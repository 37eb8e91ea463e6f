"""Conversions between the job API's protobuf messages and admission's domain types."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from google.protobuf.unknown_fields import UnknownFieldSet

from stride.admission.domain.jobs import JobSpec
from stride.admission.domain.policy import Decision, Outcome, Share
from stride.events.v1 import cluster_pb2, job_pb2
from stride.runtime.errors import InvalidArgument

OUTCOME_TO_PROTO = {
    Outcome.ADMITTED: job_pb2.ADMISSION_OUTCOME_ADMITTED,
    Outcome.REJECTED: job_pb2.ADMISSION_OUTCOME_REJECTED,
    Outcome.QUEUED: job_pb2.ADMISSION_OUTCOME_QUEUED,
    Outcome.SOFT: job_pb2.ADMISSION_OUTCOME_SOFT,
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
    """The domain view of a submitted spec; validation is the domain's job.

    Only what the view cannot see is refused here: fields of a newer schema. Everything
    else, out-of-range numbers, enums and timestamps included, is copied as sent, so the
    shared rules judge it and name the field (never a conversion error here).
    """
    _reject_unknown_fields(spec, "spec")
    return JobSpec.from_message(spec)


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
        curve_source=decision.curve_source,
    )
    if decision.minimum_share is not None:
        message.minimum_share.CopyFrom(share_to_proto(decision.minimum_share))
    if decision.earliest_deadline is not None:
        message.earliest_deadline.CopyFrom(timestamp(decision.earliest_deadline))
    if decision.guaranteed_finish is not None:
        message.guaranteed_finish.CopyFrom(timestamp(decision.guaranteed_finish))
    return message


def share_to_proto(share: Share) -> job_pb2.ResourceShare:
    """The bus form of a share."""
    return job_pb2.ResourceShare(
        workers=share.workers,
        cpu=share.cpu,
        memory_bytes=share.memory_bytes,
        devices=share.devices,
    )


@dataclass(frozen=True)
class Inventory:
    """What admission takes from a node inventory: units per resource kind, and when."""

    gpus: int
    cpu: float
    memory_bytes: int
    nodes: int
    observed_at: float
    reason: str
    gpu_nodes: tuple[tuple[str, int], ...] = ()
    """Each node's name and GPUs (the GPU tree's leaves)."""


def inventory_from_proto(event: cluster_pb2.NodeInventory) -> Inventory:
    """Check a node inventory and total it; InvalidArgument names the bad field."""
    if not event.HasField("observed_at"):
        raise InvalidArgument("observed_at", "is required (when the podwatcher saw the nodes)")
    names: set[str] = set()
    cpu, memory, gpus = 0.0, 0, 0
    for index, node in enumerate(event.nodes):
        where = f"nodes[{index}]"
        if not node.name:
            raise InvalidArgument(f"{where}.name", "is required")
        if node.name in names:
            raise InvalidArgument(f"{where}.name", f"{node.name[:60]!r} is listed twice")
        names.add(node.name)
        if not math.isfinite(node.cpu) or node.cpu < 0:
            raise InvalidArgument(f"{where}.cpu", f"must be a finite number >= 0, got {node.cpu}")
        if node.memory_bytes < 0:
            raise InvalidArgument(f"{where}.memory_bytes", f"must be >= 0, got {node.memory_bytes}")
        if node.gpus < 0:
            raise InvalidArgument(f"{where}.gpus", f"must be >= 0, got {node.gpus}")
        cpu += node.cpu
        memory += node.memory_bytes
        gpus += node.gpus
    return Inventory(
        gpus=gpus,
        cpu=cpu,
        memory_bytes=memory,
        nodes=len(event.nodes),
        gpu_nodes=tuple((node.name, int(node.gpus)) for node in event.nodes),
        observed_at=event.observed_at.ToDatetime(UTC).timestamp(),
        reason=event.reason[:120] or "node inventory changed",
    )
