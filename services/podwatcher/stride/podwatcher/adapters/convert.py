"""Conversions between the podwatcher's protobuf messages and its domain types."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.events.v1 import cluster_pb2, plan_pb2, pod_pb2
from stride.podwatcher.adapters.outbound.backends.base import PodUsage
from stride.podwatcher.adapters.outbound.repository import StoredPlan, StoredPod
from stride.podwatcher.domain.cluster import PlanState, PodPhase
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.plans import Plan, PodOverride, RoleResources
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role

ROLE_TO_PROTO = {role: plan_pb2.Role.Value(f"ROLE_{role.name}") for role in Role}
"""Every vocabulary role has its ``ROLE_<NAME>`` on the wire (a role without one fails here,
at import, rather than in the middle of a plan)."""
_ROLE_FROM_PROTO = {value: role for role, value in ROLE_TO_PROTO.items()}
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


_FAILURE_TO_PROTO = {
    "OOMKilled": pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
    "Evicted": pod_pb2.POD_FAILURE_REASON_EVICTED,
    "Error": pod_pb2.POD_FAILURE_REASON_ERROR,
}


def pod_to_proto(pod: StoredPod, usage: PodUsage | None, address: str) -> pb.Pod:
    """The API form of a pod, with its last usage sample."""
    record = pod.record
    return pb.Pod(
        name=record.name,
        role=ROLE_TO_PROTO[record.role],
        index=record.index,
        phase=_PHASE_TO_PROTO[record.phase],
        cpu=record.cpu,
        memory_bytes=record.memory_bytes,
        node=record.node,
        plan_version=pod.plan_version,
        restarts=record.restarts,
        last_failure=_FAILURE_TO_PROTO.get(
            pod.last_failure, pod_pb2.POD_FAILURE_REASON_UNSPECIFIED
        ),
        last_message=pod.last_message,
        cpu_used=0.0 if usage is None else usage.cpu_cores,
        memory_used_bytes=0 if usage is None else usage.memory_bytes,
        address=address,
    )


def node_to_proto(
    node: NodeSpec,
    enforcement: str,
    cpu_allocated: float,
    memory_allocated_bytes: int,
    drained: bool = False,
) -> pb.Node:
    """The API form of a node."""
    return pb.Node(
        name=node.name,
        cpu=node.cpu,
        memory_bytes=node.memory_bytes,
        devices=node.gpus,
        enforcement=enforcement,
        cpu_allocated=cpu_allocated,
        memory_allocated_bytes=memory_allocated_bytes,
        drained=drained,
    )


def inventory_to_proto(
    cluster: str, nodes: Sequence[NodeSpec], reason: str, moment: datetime
) -> cluster_pb2.NodeInventory:
    """The bus form of the node inventory."""
    return cluster_pb2.NodeInventory(
        cluster=cluster,
        nodes=[
            cluster_pb2.ClusterNode(
                name=node.name, cpu=node.cpu, memory_bytes=node.memory_bytes, gpus=node.gpus
            )
            for node in nodes
        ],
        reason=reason,
        observed_at=timestamp(moment),
    )
