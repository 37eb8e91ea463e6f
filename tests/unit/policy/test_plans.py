"""Plan validation: every rule names the field it guards."""

from __future__ import annotations

import math

import pytest

from stride.policy.errors import InvalidPlan
from stride.policy.plans import MAX_MEMORY_BYTES, Plan, PodOverride, Role, RoleResources

GIB = 1024**3


def worker(**changes: object) -> RoleResources:
    values: dict[str, object] = {"role": Role.WORKER, "count": 2, "cpu": 2.0, "memory_bytes": GIB}
    values.update(changes)
    return RoleResources(**values)  # type: ignore[arg-type]


def test_a_valid_plan_reports_its_totals() -> None:
    plan = Plan(
        roles=(
            RoleResources(Role.PS, 2, 4.0, 2 * GIB, (PodOverride(1, 8.0, 4 * GIB),)),
            worker(count=3),
        ),
        reason="hot PS ps-1",
        algorithm="hot-ps/1",
    )
    assert plan.pod_count() == 5
    assert plan.pod_count(Role.PS) == 2
    assert plan.total_cpu() == pytest.approx(4.0 + 8.0 + 3 * 2.0)
    assert plan.total_memory_bytes() == 2 * GIB + 4 * GIB + 3 * GIB
    assert plan.role(Role.WORKER) == worker(count=3)
    assert plan.role(Role.CHIEF) is None


def test_zero_count_is_allowed_and_lists_become_tuples() -> None:
    resources = RoleResources(Role.DATA_WORKER, 0, 1.0, GIB, [])  # type: ignore[arg-type]
    plan = Plan(roles=[resources], reason="r", algorithm="a/1")  # type: ignore[arg-type]
    assert plan.roles == (resources,) and resources.overrides == ()
    assert hash(plan) == hash(Plan(roles=(resources,), reason="r", algorithm="a/1"))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"count": -1}, "count"),
        ({"count": 1.5}, "count"),
        ({"count": True}, "count"),
        ({"cpu": 0.0}, "cpu"),
        ({"cpu": -2.0}, "cpu"),
        ({"cpu": math.inf}, "cpu"),
        ({"cpu": math.nan}, "cpu"),
        ({"cpu": "2"}, "cpu"),
        ({"memory_bytes": 0}, "memory_bytes"),
        ({"memory_bytes": 1.0}, "memory_bytes"),
        ({"memory_bytes": MAX_MEMORY_BYTES + 1}, "memory_bytes"),
        ({"role": "worker"}, "role"),
        ({"overrides": (PodOverride(2, 1.0, GIB),)}, "overrides[0].index"),
        ({"overrides": (PodOverride(0, 1.0, GIB), PodOverride(0, 2.0, GIB))}, "overrides[1].index"),
        ({"overrides": (PodOverride(1, 0.0, GIB),)}, "overrides[0].cpu"),
        ({"overrides": (PodOverride(1, 1.0, -5),)}, "overrides[0].memory_bytes"),
    ],
)
def test_bad_role_resources_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidPlan) as raised:
        worker(**changes)
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_a_role_listed_twice_is_refused() -> None:
    with pytest.raises(InvalidPlan) as raised:
        Plan(roles=(worker(), worker(count=1)), reason="r", algorithm="a/1")
    assert raised.value.field == "roles[1].role"


@pytest.mark.parametrize(
    ("reason", "algorithm", "field"),
    [("", "a/1", "reason"), (" ", "a/1", "reason"), ("r", "", "algorithm")],
)
def test_reason_and_algorithm_are_required(reason: str, algorithm: str, field: str) -> None:
    with pytest.raises(InvalidPlan) as raised:
        Plan(roles=(), reason=reason, algorithm=algorithm)
    assert raised.value.field == field
