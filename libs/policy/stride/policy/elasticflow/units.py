"""What admission counts: GPUs, or CPU units for PS/worker jobs, on one code path.

ElasticFlow plans GPUs (one per data-parallel worker). DLRover-RM's jobs hold CPU cores and
memory per role (parameter servers and workers), and a cluster of such jobs has two
dimensions. Algorithm 1 and Algorithm 2 need one integer count per job, so a PS/worker job
is counted in *CPU units*: one unit is ``CpuUnit.cpu`` cores together with
``CpuUnit.memory_bytes`` of memory (default 1 core and 4 GiB). A configuration takes the
units of its dominant resource (``max(cores / unit cores, memory / unit memory)``, rounded
up), and the cluster has the units of its scarcer resource (rounded down), so every set of
shares that fits in units fits in cores and in memory. This is our departure from both
papers (ElasticFlow has no CPU dimension, DLRover-RM no deadline admission), in the spirit
of dominant-resource accounting; a job whose memory per core differs from the unit's
wastes part of the other resource, which is the price of a single count.

A job's curve over units comes from its declared profile (:func:`profile_curve`: workers
and parameter servers at each point, with each role's size) or, for a GPU job, from the
curves table. Either is made concave (:func:`~.curves.concave_envelope`), as Algorithm 2
needs, and every kept point is one the job declared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from stride.policy.elasticflow.curves import InvalidCurve, ScalingCurve, concave_envelope
from stride.policy.errors import PolicyError

__all__ = [
    "GIB",
    "CpuUnit",
    "JobCurve",
    "ProfileSize",
    "cpu_capacity",
    "cpu_units",
    "gpu_curve",
    "profile_curve",
    "sized_curve",
]

GIB = 1024**3


class InvalidUnits(PolicyError):
    """A unit, a capacity or a profile that cannot be counted."""


@dataclass(frozen=True)
class CpuUnit:
    """One CPU unit: cores with their memory."""

    cpu: float = 1.0
    memory_bytes: int = 4 * GIB

    def __post_init__(self) -> None:
        if not (math.isfinite(self.cpu) and self.cpu > 0):
            raise InvalidUnits("unit.cpu", f"must be a positive number of cores, got {self.cpu!r}")
        if self.memory_bytes <= 0:
            raise InvalidUnits(
                "unit.memory_bytes", f"must be a positive number of bytes, got {self.memory_bytes}"
            )


def cpu_units(cpu: float, memory_bytes: int, unit: CpuUnit) -> int:
    """Units a configuration of ``cpu`` cores and ``memory_bytes`` takes (dominant resource,
    rounded up; a hair of float error does not cost a whole unit)."""
    ratio = max(cpu / unit.cpu, memory_bytes / unit.memory_bytes)
    return max(1, math.ceil(ratio - 1e-9))


def cpu_capacity(cpu: float, memory_bytes: int, unit: CpuUnit) -> int:
    """Units a cluster of ``cpu`` cores and ``memory_bytes`` holds (scarcer resource, down)."""
    if cpu < 0 or memory_bytes < 0:
        raise InvalidUnits("capacity", f"must not be negative, got {cpu} cores, {memory_bytes} B")
    return max(0, math.floor(min(cpu / unit.cpu, memory_bytes / unit.memory_bytes) + 1e-9))


@dataclass(frozen=True)
class ProfileSize:
    """What a job runs with at one size of its curve."""

    workers: int
    ps: int
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class JobCurve:
    """A job's scaling curve in units, with what each size of it means."""

    curve: ScalingCurve
    sizes: Mapping[int, ProfileSize] = field(default_factory=dict)
    """Units -> the workers, PS, cores and memory at that size (CPU jobs; empty for GPU)."""
    source: str = "profile"
    """Where it came from: ``profile``, ``curves-table`` or ``history``."""
    basis: str = ""
    """What the source was, in words (for ``history``: the similar jobs it blends)."""

    def size_at(self, units: int) -> ProfileSize | None:
        """What the job runs with when it holds ``units`` (the largest size it can use)."""
        return self.sizes.get(self.curve.usable(units))


def gpu_curve(
    points: Sequence[tuple[int, float]], source: str = "profile", *, powers_of_two: bool = False
) -> JobCurve:
    """A GPU job's curve from ``(gpus, steps per second)`` points."""
    if not points:
        raise InvalidUnits("profile.points", "needs at least one point")
    try:
        raw = ScalingCurve(tuple(g for g, _ in points), tuple(float(v) for _, v in points))
        curve = concave_envelope(raw, powers_of_two_only=powers_of_two)
    except InvalidCurve as error:
        raise InvalidUnits(f"profile.{error.field}", error.problem) from None
    return JobCurve(curve, {}, source)


def profile_curve(
    points: Sequence[tuple[int, int, float]],
    worker: tuple[float, int],
    ps: tuple[float, int],
    unit: CpuUnit,
    source: str = "profile",
    fixed: tuple[float, int] = (0.0, 0),
) -> JobCurve:
    """A CPU job's curve in units from ``(workers, ps, steps per second)`` points and each
    role's ``(cores, memory bytes)``; ``fixed`` is held at every size (the chief, which a
    ParameterServerStrategy job always runs beside its PS and workers). Points that take
    the same units keep the fastest."""
    return sized_curve(
        [
            (
                workers,
                servers,
                rate,
                workers * worker[0] + servers * ps[0] + fixed[0],
                workers * worker[1] + servers * ps[1] + fixed[1],
            )
            for workers, servers, rate in points
        ],
        unit,
        source,
    )


def sized_curve(
    points: Sequence[tuple[int, int, float, float, int]], unit: CpuUnit, source: str
) -> JobCurve:
    """A CPU job's curve in units from ``(workers, ps, steps per second, cores, memory
    bytes)`` points, each with what it holds in all (a measured history's plans differ in
    their pods' sizes). Points that take the same units keep the fastest."""
    if not points:
        raise InvalidUnits("profile.points", "needs at least one point")
    best: dict[int, tuple[float, ProfileSize]] = {}
    for workers, servers, rate, cpu, memory in points:
        units = cpu_units(cpu, memory, unit)
        if units not in best or rate > best[units][0]:
            best[units] = (rate, ProfileSize(workers, servers, cpu, memory))
    ordered = sorted(best)
    try:
        raw = ScalingCurve(tuple(ordered), tuple(best[u][0] for u in ordered))
        curve = concave_envelope(raw, powers_of_two_only=False)
    except InvalidCurve as error:
        raise InvalidUnits(f"profile.{error.field}", error.problem) from None
    return JobCurve(curve, {u: best[u][1] for u in curve.sizes}, source)
