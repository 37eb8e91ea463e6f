"""Runtime profiles: hand-computed sums, and measurements that cannot be ones."""

from __future__ import annotations

import math

import pytest

from stride.configdb.domain.profiles import (
    RoleUsage,
    StepWindow,
    UsageSample,
    WindowTotals,
    build_profiles,
    check_sample,
    check_window,
    window_samples,
    window_seconds,
)
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role


def window(**changes: object) -> StepWindow:
    values: dict[str, object] = {
        "job_id": "job-1",
        "pod_name": "job-1-chief-0",
        "plan_version": 2,
        "global_step": 20,
        "steps": 10,
        "step_seconds": 0.05,
        "samples_per_second": 5120.0,
    }
    values.update(changes)
    return StepWindow(**values)  # type: ignore[arg-type]


def sample(**changes: object) -> UsageSample:
    values: dict[str, object] = {
        "job_id": "job-1",
        "pod_name": "job-1-ps-0",
        "role": Role.PS,
        "plan_version": 2,
        "cpu_used": 0.5,
        "memory_used_bytes": 300 << 20,
        "cpu_limit": 1.0,
        "memory_limit_bytes": 1 << 30,
    }
    values.update(changes)
    return UsageSample(**values)  # type: ignore[arg-type]


def usage(role: Role, mean: float) -> RoleUsage:
    return RoleUsage(role, 1, 3, mean, mean * 2, 1 << 20, 1.0, 1 << 30)


def test_a_window_covers_its_steps_times_its_step_time() -> None:
    assert window_seconds(window()) == pytest.approx(0.5)
    assert window_samples(window()) == pytest.approx(2560.0)


def test_throughput_is_samples_over_seconds_so_long_windows_weigh_more() -> None:
    # Two windows of version 1: 10 steps of 0.1 s at 1000/s (1000 samples in 1 s) and
    # 30 steps of 0.1 s at 3000/s (9000 samples in 3 s): 10000 / 4 = 2500/s, not the
    # plain mean of 2000/s; 0.1 s a step either way.
    totals = [WindowTotals(1, 2, 40, 4.0, 10_000.0), WindowTotals(3, 1, 5, 1.0, 600.0)]
    profiles = build_profiles(
        totals,
        [usage(Role.WORKER, 0.7), usage(Role.PS, 0.2), usage(Role.PS, 0.4)],
        [1, 1, 2],
    )
    assert [p.plan_version for p in profiles] == [1, 2, 3]  # oldest first
    first, second, third = profiles
    assert first.samples_per_second == pytest.approx(2500.0)
    assert first.step_seconds == pytest.approx(0.1)
    assert (first.windows, first.steps) == (2, 40)
    assert [u.role for u in first.roles] == [Role.PS, Role.WORKER]
    # Version 2 only ran pods: usage, no throughput yet.
    assert (second.windows, second.samples_per_second, second.step_seconds) == (0, 0.0, 0.0)
    assert [u.cpu_used_mean for u in second.roles] == [0.4]
    assert third.samples_per_second == pytest.approx(600.0) and third.roles == ()


def test_nothing_measured_is_no_profile() -> None:
    assert build_profiles([], [], []) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"job_id": "job 1"}, "job_id"),
        ({"pod_name": ""}, "pod_name"),
        ({"plan_version": -1}, "plan_version"),
        ({"global_step": -5}, "global_step"),
        ({"steps": 0}, "steps"),
        ({"step_seconds": math.nan}, "step_seconds"),
        ({"step_seconds": -0.1}, "step_seconds"),
        ({"samples_per_second": math.inf}, "samples_per_second"),
    ],
)
def test_a_window_that_cannot_be_a_measurement_names_its_field(
    changes: dict[str, object], field: str
) -> None:
    check_window(window())
    with pytest.raises(InvalidArgument) as raised:
        check_window(window(**changes))
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"pod_name": "x" * 254}, "pod_name"),
        ({"plan_version": -2}, "plan_version"),
        ({"cpu_used": -1.0}, "cpu_used"),
        ({"cpu_limit": math.nan}, "cpu_limit"),
        ({"memory_used_bytes": -1}, "memory_used_bytes"),
        ({"memory_limit_bytes": -1}, "memory_limit_bytes"),
    ],
)
def test_a_sample_that_cannot_be_a_measurement_names_its_field(
    changes: dict[str, object], field: str
) -> None:
    check_sample(sample())
    with pytest.raises(InvalidArgument) as raised:
        check_sample(sample(**changes))
    assert raised.value.field == field
