"""A job's runtime profile: what it measured while each plan version was in force.

DLRover-RM's config DB keeps, beside each job's configurations, the runtime profile that
its warm start and its throughput model learn from (DLRover-RM sec. 3, Alg. 1). Stride's
profile is built from two measurements already on the bus:

- the trainer's **step windows** (``stride.metrics.v1``): steps, mean step time and
  throughput, tagged with the plan version the job trained under;
- the podwatcher's **usage samples** (``stride.pods.v1 ... usage``): each pod's CPU and
  resident memory against its limits, tagged with the job's plan version.

Per plan version, throughput is total samples over total seconds (a window's seconds are
its steps times its step time), so long windows weigh more than short ones, and usage is
summarised per role: mean and peak CPU per pod, peak memory, and the limits the pods had.

Measurements are validated here (the bus edge): a window or sample that cannot be a
measurement is refused with the field named, and goes to the dead-letter stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role, check_job_id


@dataclass(frozen=True)
class StepWindow:
    """One window of training steps, as the trainer measured it."""

    job_id: str
    pod_name: str
    plan_version: int
    global_step: int
    steps: int
    step_seconds: float
    samples_per_second: float


@dataclass(frozen=True)
class UsageSample:
    """One pod's usage at one moment."""

    job_id: str
    pod_name: str
    role: Role
    plan_version: int
    cpu_used: float
    memory_used_bytes: int
    cpu_limit: float
    memory_limit_bytes: int


@dataclass(frozen=True)
class WindowTotals:
    """The sums a plan version's throughput is computed from."""

    plan_version: int
    windows: int
    steps: int
    seconds: float
    samples: float


@dataclass(frozen=True)
class RoleUsage:
    """How one role's pods used CPU and memory under a plan version."""

    role: Role
    pods: int
    samples: int
    cpu_used_mean: float
    cpu_used_max: float
    memory_used_max_bytes: int
    cpu_limit: float
    memory_limit_bytes: int


@dataclass(frozen=True)
class RuntimeProfile:
    """What the job measured under one plan version."""

    plan_version: int
    windows: int
    steps: int
    step_seconds: float
    """Mean seconds per step, weighted by steps."""
    samples_per_second: float
    """Total samples over total seconds."""
    roles: tuple[RoleUsage, ...]


def _finite(field: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise InvalidArgument(field, f"must be a finite, non-negative number, got {value}")


def _named(field: str, value: str) -> None:
    if not value or len(value) > 253:
        raise InvalidArgument(field, "must be 1 to 253 characters")


def check_window(window: StepWindow) -> None:
    """Raise InvalidArgument naming the first field that cannot be a measurement."""
    check_job_id(window.job_id, raise_as=InvalidArgument)
    _named("pod_name", window.pod_name)
    if window.plan_version < 0:
        raise InvalidArgument("plan_version", f"must not be negative, got {window.plan_version}")
    if window.global_step < 0:
        raise InvalidArgument("global_step", f"must not be negative, got {window.global_step}")
    if window.steps <= 0:
        raise InvalidArgument("steps", f"must be positive, got {window.steps}")
    _finite("step_seconds", window.step_seconds)
    _finite("samples_per_second", window.samples_per_second)


def check_sample(sample: UsageSample) -> None:
    """Raise InvalidArgument naming the first field that cannot be a measurement."""
    check_job_id(sample.job_id, raise_as=InvalidArgument)
    _named("pod_name", sample.pod_name)
    if sample.plan_version < 0:
        raise InvalidArgument("plan_version", f"must not be negative, got {sample.plan_version}")
    _finite("cpu_used", sample.cpu_used)
    _finite("cpu_limit", sample.cpu_limit)
    if sample.memory_used_bytes < 0:
        raise InvalidArgument(
            "memory_used_bytes", f"must not be negative, got {sample.memory_used_bytes}"
        )
    if sample.memory_limit_bytes < 0:
        raise InvalidArgument(
            "memory_limit_bytes", f"must not be negative, got {sample.memory_limit_bytes}"
        )


def window_seconds(window: StepWindow) -> float:
    """The wall time the window covers."""
    return window.steps * window.step_seconds


def window_samples(window: StepWindow) -> float:
    """The samples the window trained on."""
    return window.samples_per_second * window_seconds(window)


def build_profiles(
    windows: list[WindowTotals], usage: list[RoleUsage], usage_versions: list[int]
) -> list[RuntimeProfile]:
    """Profiles per plan version, oldest first, from the window totals and the role usage
    (``usage_versions[i]`` is the plan version of ``usage[i]``). A version with usage but
    no windows (its pods ran, the trainer had not reported yet) has zero throughput."""
    by_version: dict[int, list[RoleUsage]] = {}
    for version, role_usage in zip(usage_versions, usage, strict=True):
        by_version.setdefault(version, []).append(role_usage)
    totals = {total.plan_version: total for total in windows}
    profiles = []
    for version in sorted(set(totals) | set(by_version)):
        total = totals.get(version, WindowTotals(version, 0, 0, 0.0, 0.0))
        profiles.append(
            RuntimeProfile(
                plan_version=version,
                windows=total.windows,
                steps=total.steps,
                step_seconds=total.seconds / total.steps if total.steps else 0.0,
                samples_per_second=total.samples / total.seconds if total.seconds > 0 else 0.0,
                roles=tuple(sorted(by_version.get(version, []), key=lambda u: u.role.value)),
            )
        )
    return profiles
