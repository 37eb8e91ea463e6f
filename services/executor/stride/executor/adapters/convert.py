"""Conversions between the executor's protobufs and the policy library's plain values."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from stride.decisions import dict_to_struct, struct_to_dict
from stride.events.v1 import plan_pb2
from stride.policy.plans import Plan, Role

__all__ = [
    "ROLE_TO_PROTO",
    "dict_to_struct",
    "plan_to_proto",
    "proposed_plans",
    "struct_to_dict",
]

ROLE_TO_PROTO = {
    Role.PS: plan_pb2.ROLE_PS,
    Role.WORKER: plan_pb2.ROLE_WORKER,
    Role.DATA_WORKER: plan_pb2.ROLE_DATA_WORKER,
    Role.CHIEF: plan_pb2.ROLE_CHIEF,
}


def proposed_plans(reply: object) -> Iterator[Plan]:
    """The plans in an algorithm's reply: its top-level Plan fields and sequences of plans."""
    if not dataclasses.is_dataclass(reply) or isinstance(reply, type):
        return
    for field in dataclasses.fields(reply):
        value = getattr(reply, field.name)
        if isinstance(value, Plan):
            yield value
        elif isinstance(value, list | tuple):
            yield from (item for item in value if isinstance(item, Plan))


def plan_to_proto(plan: Plan, job_id: str) -> plan_pb2.ResourcePlan:
    """A proposed plan in wire form. Version 0: only the optimizer numbers the plans it
    publishes, so a proposal carries none."""
    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=0,
        reason=plan.reason,
        algorithm=plan.algorithm,
        roles=[
            plan_pb2.RoleResources(
                role=ROLE_TO_PROTO[resources.role],
                count=resources.count,
                cpu=resources.cpu,
                memory_bytes=resources.memory_bytes,
                overrides=[
                    plan_pb2.PodOverride(index=o.index, cpu=o.cpu, memory_bytes=o.memory_bytes)
                    for o in resources.overrides
                ],
            )
            for resources in plan.roles
        ],
    )
