"""The podwatcher's protobuf edge: wire roles become the vocabulary's, or INVALID_ARGUMENT."""

from __future__ import annotations

import pytest

from stride.events.v1 import plan_pb2
from stride.podwatcher.adapters.convert import plan_from_proto, pod_to_proto
from stride.podwatcher.adapters.outbound.repository import StoredPod
from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.reconcile import PodRecord
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role

GIB = 1024**3


def wire_plan(*roles: int) -> plan_pb2.ResourcePlan:
    return plan_pb2.ResourcePlan(
        job_id="job-1",
        version=1,
        roles=[
            plan_pb2.RoleResources(role=role, count=1, cpu=1.0, memory_bytes=GIB)  # type: ignore[arg-type]
            for role in roles
        ],
    )


def test_every_wire_role_becomes_the_vocabulary_role() -> None:
    plan = plan_from_proto(
        wire_plan(
            plan_pb2.ROLE_PS, plan_pb2.ROLE_WORKER, plan_pb2.ROLE_DATA_WORKER, plan_pb2.ROLE_CHIEF
        )
    )
    assert [resources.role for resources in plan.roles] == [
        Role.PS,
        Role.WORKER,
        Role.DATA_WORKER,
        Role.CHIEF,
    ]


@pytest.mark.parametrize("role", [plan_pb2.ROLE_UNSPECIFIED, 99])
def test_an_unspecified_or_unknown_role_is_an_invalid_argument(role: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        plan_from_proto(wire_plan(plan_pb2.ROLE_PS, role))
    assert raised.value.field == "roles[1].role"
    assert raised.value.problem == "must be one of PS, WORKER, DATA_WORKER, CHIEF"


@pytest.mark.parametrize(
    ("role", "wire"),
    [
        (Role.PS, plan_pb2.ROLE_PS),
        (Role.WORKER, plan_pb2.ROLE_WORKER),
        (Role.DATA_WORKER, plan_pb2.ROLE_DATA_WORKER),
        (Role.CHIEF, plan_pb2.ROLE_CHIEF),
    ],
)
def test_pods_carry_their_role_onto_the_wire(role: Role, wire: int) -> None:
    record = PodRecord("job-1-pod-0", "job-1", role, 0, 0, 1.0, GIB, "here", PodPhase.RUNNING)
    wire_pod = pod_to_proto(StoredPod(record, 4000, 4001, 1), None, "127.0.0.1:4000")
    assert wire_pod.role == wire
    assert wire_pod.address == "127.0.0.1:4000"
