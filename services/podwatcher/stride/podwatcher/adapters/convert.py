"""Conversions between the podwatcher's protobuf messages and its domain types."""

from __future__ import annotations

from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.events.v1 import plan_pb2, pod_pb2
from stride.podwatcher.adapters.outbound.repository import StoredPlan
from stride.podwatcher.domain.cluster import Node, PlanState, Pod, PodPhase
from stride.podwatcher.domain.plans import Plan, PodOverride, RoleResources
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role

_ROLE_TO_PROTO = {role: plan_pb2.Role.Value(f"ROLE_{role.name}") for role in Role}
"""Every vocabulary role has its ``ROLE_<NAME>`` on the wire (a role without one fails here,
at import, rather than in the middle of a plan)."""
_ROLE_FROM_PROTO = {value: role for role, value in _ROLE_TO_PROTO.items()}
_ROLE_NAMES = ", ".join(role.name for role in Role)
_PHASE_TO_PROTO = {
    PodPhase.PENDING: pod_pb2.POD_PHASE_PENDING,
    PodPhase.RUNNING: pod_pb2.POD_PHASE_RUNNING,
    PodPhase.SUCCEEDED: pod_pb2.POD_PHASE_SUCCEEDED,
    PodPhase.FAILED: pod_pb2.POD_PHASE_FAILED,
    PodPhase.DELETED: pod_pb2.POD_PHASE_DELETED,
}
_STATE_TO_PROTO = {
    PlanState.RECORDED: pb.PLAN_STATE_RECORDED,
    PlanState.APPLYING: pb.PLAN_STATE_APPLYING,
    PlanState.APPLIED: pb.PLAN_STATE_APPLIED,
    PlanState.FAILED: pb.PLAN_STATE_FAILED,
}


def role_from_proto(value: plan_pb2.Role.ValueType, field: str) -> Role:
    """The vocabulary's role for a wire role; ROLE_UNSPECIFIED (a sender that forgot to set
    it) or a number this build does not know is an :class:`InvalidArgument` naming ``field``."""
    role = _ROLE_FROM_PROTO.get(value)
    if role is None:
        raise InvalidArgument(field, f"must be one of {_ROLE_NAMES}")
    return role


def plan_from_proto(plan: plan_pb2.ResourcePlan) -> Plan:
    """The domain view of a plan; raises :class:`InvalidArgument` for a role that is not
    one (the rest is checked by :func:`~stride.podwatcher.domain.plans.validate_plan`)."""
    return Plan(
        job_id=plan.job_id,
        version=plan.version,
        reason=plan.reason,
        algorithm=plan.algorithm,
        roles=tuple(
            RoleResources(
                role=role_from_proto(resources.role, f"roles[{position}].role"),
                count=resources.count,
                cpu=resources.cpu,
                memory_bytes=resources.memory_bytes,
                overrides=tuple(
                    PodOverride(o.index, o.cpu, o.memory_bytes) for o in resources.overrides
                ),
            )
            for position, resources in enumerate(plan.roles)
        ),
    )


def timestamp(moment: datetime) -> Timestamp:
    """A protobuf Timestamp of an aware datetime."""
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def recorded_plan_to_proto(stored: StoredPlan) -> pb.RecordedPlan:
    """The API form of an accepted plan."""
    return pb.RecordedPlan(
        plan=stored.plan,
        state=_STATE_TO_PROTO[stored.state],
        message=stored.message,
        recorded_at=timestamp(stored.recorded_at),
    )


def pod_to_proto(pod: Pod) -> pb.Pod:
    """The API form of a pod."""
    return pb.Pod(
        name=pod.name,
        role=_ROLE_TO_PROTO[pod.role],
        index=pod.index,
        phase=_PHASE_TO_PROTO[pod.phase],
        cpu=pod.cpu,
        memory_bytes=pod.memory_bytes,
        node=pod.node,
        plan_version=pod.plan_version,
    )


def node_to_proto(node: Node) -> pb.Node:
    """The API form of a node."""
    return pb.Node(
        name=node.name, cpu=node.cpu, memory_bytes=node.memory_bytes, devices=node.devices
    )
