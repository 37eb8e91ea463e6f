"""Plan validation and the "newer version wins" rule."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.podwatcher.domain.plans import (
    Arrival,
    Plan,
    PodOverride,
    RoleResources,
    classify_arrival,
    newest_after,
    validate_plan,
)
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import MAX_PODS_PER_ROLE, Role

GIB = 1024**3
PS = RoleResources(Role.PS, count=1, cpu=4.0, memory_bytes=8 * GIB)
WORKERS = RoleResources(Role.WORKER, count=3, cpu=2.0, memory_bytes=4 * GIB)
VALID = Plan(job_id="job-1", version=1, roles=(PS, WORKERS))


def with_workers(**changes: Any) -> Plan:
    return replace(VALID, roles=(PS, replace(WORKERS, **changes)))


def test_a_valid_plan_passes() -> None:
    validate_plan(VALID)
    validate_plan(replace(VALID, roles=()))
    validate_plan(with_workers(count=0, cpu=0.0, memory_bytes=0))
    validate_plan(with_workers(overrides=(PodOverride(2, 8.0, 0),)))


@pytest.mark.parametrize(
    ("plan", "field"),
    [
        (replace(VALID, job_id=""), "job_id"),
        (replace(VALID, job_id="j" * 65), "job_id"),
        (replace(VALID, job_id="job.1"), "job_id"),
        (replace(VALID, job_id="job-1\n"), "job_id"),
        (replace(VALID, version=0), "version"),
        (replace(VALID, version=-3), "version"),
        (replace(VALID, roles=(PS, PS)), "roles[1].role"),
        (with_workers(count=-1), "roles[1].count"),
        (with_workers(count=MAX_PODS_PER_ROLE + 1), "roles[1].count"),
        (with_workers(cpu=0.0), "roles[1].cpu"),
        (with_workers(cpu=-1.0), "roles[1].cpu"),
        (with_workers(cpu=math.nan), "roles[1].cpu"),
        (with_workers(cpu=math.inf), "roles[1].cpu"),
        (with_workers(memory_bytes=0), "roles[1].memory_bytes"),
        (with_workers(overrides=(PodOverride(3, 1.0, GIB),)), "roles[1].overrides[0].index"),
        (
            with_workers(overrides=(PodOverride(0, 1.0, GIB), PodOverride(0, 2.0, GIB))),
            "roles[1].overrides[1].index",
        ),
        (with_workers(overrides=(PodOverride(0, -1.0, GIB),)), "roles[1].overrides[0].cpu"),
        (with_workers(overrides=(PodOverride(0, math.nan, GIB),)), "roles[1].overrides[0].cpu"),
        (with_workers(overrides=(PodOverride(0, 1.0, -1),)), "roles[1].overrides[0].memory_bytes"),
    ],
)
def test_invalid_plans_name_the_field(plan: Plan, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate_plan(plan)
    assert raised.value.field == field


def test_arrivals_are_classified_against_the_newest_version() -> None:
    assert classify_arrival(1, None) is Arrival.NEWER
    assert classify_arrival(3, 2) is Arrival.NEWER
    assert classify_arrival(2, 2) is Arrival.DUPLICATE
    assert classify_arrival(1, 2) is Arrival.STALE


@given(
    st.sets(st.integers(min_value=1, max_value=10**9), min_size=1, max_size=30).flatmap(
        lambda versions: st.permutations(sorted(versions))
    )
)
def test_any_arrival_order_leaves_the_highest_version_recorded(versions: list[int]) -> None:
    assert newest_after(versions) == max(versions)


@given(st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=40))
def test_redelivery_and_duplicates_do_not_change_the_outcome(versions: list[int]) -> None:
    assert newest_after(versions + versions) == newest_after(versions) == max(versions)


def test_nothing_arrived_means_nothing_recorded() -> None:
    assert newest_after([]) is None
