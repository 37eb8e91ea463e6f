"""Greedy allocation of spare devices (ElasticFlow sec. 4.2, Algorithm 2)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.elasticflow import ALGORITHMS
from stride.policy.elasticflow.admission import JobKind
from stride.policy.elasticflow.allocation import (
    AllocationJob,
    AllocationReply,
    AllocationRequest,
    InvalidAllocation,
    allocate,
    marginal_weight,
    run,
    total_value,
)
from stride.policy.elasticflow.curves import NonConcaveCurve, ScalingCurve
from stride.policy.serialization import from_dict, to_dict

FIG4_CURVE = ScalingCurve((1, 2, 4), (1.0, 1.5, 2.0))


def test_spare_devices_go_to_the_highest_marginal_return() -> None:
    fast = ScalingCurve((1, 2, 3), (1.0, 1.9, 2.7))  # scales almost linearly
    slow = ScalingCurve((1, 2, 3), (1.0, 1.2, 1.3))
    request = AllocationRequest(5, (AllocationJob("fast", fast, 1), AllocationJob("slow", slow, 1)))
    assert allocate(request) == [3, 2]
    reply = run(request)
    assert reply.idle_devices == 0
    assert from_dict(AllocationReply, to_dict(reply)) == reply
    assert from_dict(AllocationRequest, to_dict(request)) == request


def test_jobs_stop_when_more_devices_do_not_speed_them_up() -> None:
    request = AllocationRequest(16, (AllocationJob("a", FIG4_CURVE, 1),))
    assert allocate(request) == [4]
    assert run(request).idle_devices == 12


def test_best_effort_jobs_share_the_spare_after_minimum_shares() -> None:
    request = AllocationRequest(
        4,
        (
            AllocationJob("slo", FIG4_CURVE, 2),
            AllocationJob("be", FIG4_CURVE, 0, JobKind.BEST_EFFORT),
        ),
    )
    devices = allocate(request)
    assert devices[0] >= 2 and sum(devices) == 4 and devices[1] >= 1


def test_power_of_two_steps_skip_steps_that_do_not_fit() -> None:
    request = AllocationRequest(
        5, (AllocationJob("big", FIG4_CURVE, 2), AllocationJob("small", FIG4_CURVE, 1))
    )
    assert allocate(request) == [2, 2]  # 2 -> 4 needs two spare devices, there are two
    assert run(request).idle_devices == 1


@pytest.mark.parametrize(
    ("jobs", "capacity", "field"),
    [
        ((AllocationJob("a", FIG4_CURVE, 4), AllocationJob("b", FIG4_CURVE, 1)), 4, "jobs"),
        ((AllocationJob("a", FIG4_CURVE, 3),), 4, "jobs[0].minimum_share"),
        ((AllocationJob("a", FIG4_CURVE, -1),), 4, "jobs[0].minimum_share"),
        ((AllocationJob("a", FIG4_CURVE), AllocationJob("a", FIG4_CURVE)), 4, "jobs[1].job_id"),
        ((AllocationJob("a", FIG4_CURVE),), 0, "capacity"),
    ],
)
def test_rejected_inputs_name_the_field(
    jobs: tuple[AllocationJob, ...], capacity: int, field: str
) -> None:
    with pytest.raises(InvalidAllocation) as caught:
        allocate(AllocationRequest(capacity, jobs))
    assert caught.value.field == field


def test_non_concave_curve_is_rejected() -> None:
    bad = ScalingCurve((1, 2), (1.0, 2.5))
    with pytest.raises(NonConcaveCurve) as caught:
        allocate(AllocationRequest(4, (AllocationJob("a", FIG4_CURVE), AllocationJob("b", bad))))
    assert caught.value.field == "jobs[1].curve.throughputs[1]"


def test_registered() -> None:
    spec = {spec.name: spec for spec in ALGORITHMS}["elasticflow-allocation"]
    request = AllocationRequest(4, (AllocationJob("a", FIG4_CURVE, 1),))
    assert spec.run_dict(to_dict(request))["allocations"] == [{"job_id": "a", "devices": 4}]


@st.composite
def unit_step_curves(draw: st.DrawFn) -> ScalingCurve:
    count = draw(st.integers(1, 5))
    slope = draw(st.floats(0.5, 4))
    values: list[float] = []
    total = 0.0
    for _ in range(count):
        slope *= draw(st.floats(0.2, 1.0))
        total += slope
        values.append(total)
    return ScalingCurve(tuple(range(1, count + 1)), tuple(values))


@st.composite
def instances(draw: st.DrawFn) -> AllocationRequest:
    curves = draw(st.lists(unit_step_curves(), min_size=1, max_size=4))
    shares = [draw(st.integers(0, curve.max_size)) for curve in curves]
    capacity = sum(shares) + draw(st.integers(0, 8))
    if capacity == 0:
        capacity = 1
    jobs = tuple(
        AllocationJob(f"j{index}", curve, share)
        for index, (curve, share) in enumerate(zip(curves, shares, strict=True))
    )
    return AllocationRequest(capacity, jobs)


@settings(max_examples=200, deadline=None)
@given(instances())
def test_greedy_matches_brute_force_and_respects_capacity(request: AllocationRequest) -> None:
    devices = allocate(request)
    assert sum(devices) <= request.capacity
    for job, count in zip(request.jobs, devices, strict=True):
        assert job.minimum_share <= count <= job.curve.max_size
    # Brute force over every allocation that hands out as many devices as can be used.
    ranges = [range(job.minimum_share, job.curve.max_size + 1) for job in request.jobs]
    usable = min(request.capacity, sum(job.curve.max_size for job in request.jobs))
    assert sum(devices) == usable
    best = max(
        total_value(request, list(option))
        for option in itertools.product(*ranges)
        if sum(option) == usable
    )
    assert total_value(request, devices) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_marginal_weight_is_cost_per_iteration_at_the_smallest_size() -> None:
    assert marginal_weight(ScalingCurve((2, 4), (4.0, 6.0))) == 0.5
