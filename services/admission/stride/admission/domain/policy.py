"""What admission decides about a job (admit, reject, queue or run it best effort) and why.

The decision is ElasticFlow's admission as ``stride sim --env deadline`` runs it
(:class:`~stride.policy.elasticflow.guarantees.GuaranteePolicy`, through
:class:`~stride.admission.domain.ledger.Pool`). This module holds what is admission's own:
which scaling curve a job is planned with, and the words a user reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from stride.admission.domain.jobs import JobSpec
from stride.policy.cold_start import CHIEF_CPU, CHIEF_MEMORY_BYTES
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.units import (
    CpuUnit,
    InvalidUnits,
    JobCurve,
    gpu_curve,
    profile_curve,
    sized_curve,
)
from stride.policy.warm_start import MeasuredPoint, MeasuredRun, blended_points
from stride.vocabulary.jobspec import ResourceKind

POLICY = "stride-guarantees/1"
"""Name and version of the admission policy, as decisions record it."""

CHIEF = (CHIEF_CPU, CHIEF_MEMORY_BYTES)
"""What the chief holds at every size of a PS/worker job: the optimizer's plans always run
one (:mod:`stride.policy.cold_start`), so a share counts it, and a plan fits its share."""


class Outcome(Enum):
    """What admission decided."""

    ADMITTED = "admitted"
    REJECTED = "rejected"
    QUEUED = "queued"
    SOFT = "soft"


@dataclass(frozen=True)
class Share:
    """An amount of the cluster: workers and the CPU, memory and devices they hold."""

    workers: int
    cpu: float
    memory_bytes: int
    devices: int = 0


@dataclass(frozen=True)
class Decision:
    """An admission decision and why."""

    outcome: Outcome
    reason: str
    policy: str
    minimum_share: Share | None
    earliest_deadline: datetime | None = None
    curve_source: str = "none"
    guaranteed_finish: datetime | None = None


def job_curve(
    spec: JobSpec, unit: CpuUnit, table: Mapping[tuple[str, int], ScalingCurve]
) -> JobCurve | None:
    """The curve a job is planned with: its declared profile, else (GPU jobs) the curves
    table's row for its model and batch size; None when neither knows it.

    Similar finished jobs (the config DB's warm start) come after both, from the use case
    (:func:`history_curve`): they need a call to the config DB.
    """
    profile = spec.profile
    if profile is not None:
        if spec.kind is ResourceKind.GPU:
            return gpu_curve([(p.workers, p.steps_per_second) for p in profile.points])
        return profile_curve(
            [(p.workers, p.ps, p.steps_per_second) for p in profile.points],
            (profile.worker_cpu, profile.worker_memory_bytes),
            (profile.ps_cpu, profile.ps_memory_bytes),
            unit,
            fixed=CHIEF,
        )
    if spec.kind is ResourceKind.GPU:
        curve = table.get((spec.model.name, spec.batch_size))
        if curve is not None:
            return JobCurve(curve, {}, "curves-table")
    return None


def history_curve(runs: Sequence[MeasuredRun], unit: CpuUnit) -> JobCurve | None:
    """A PS/worker job's curve warm-started from what similar finished jobs measured (the
    config DB's runs, blended by :func:`stride.policy.warm_start.blended_points`), or None
    when they measured nothing usable. Its ``basis`` names the jobs."""
    points, used = blended_points(runs)
    if not points:
        return None
    return measured_curve(points, unit, _basis(used))


def measured_curve(points: Sequence[MeasuredPoint], unit: CpuUnit, basis: str) -> JobCurve | None:
    """The curve of measured points (each with what the job held in all), as stored."""
    try:
        curve = sized_curve(
            [(p.workers, p.ps, p.steps_per_second, p.cpu, p.memory_bytes) for p in points],
            unit,
            "history",
        )
    except InvalidUnits:
        return None
    return JobCurve(curve.curve, curve.sizes, "history", basis)


def _basis(job_ids: Sequence[str]) -> str:
    shown = ", ".join(job_ids[:3]) + (f" and {len(job_ids) - 3} more" if len(job_ids) > 3 else "")
    return f"{len(job_ids)} similar finished job{'s' if len(job_ids) != 1 else ''}: {shown}"


def in_words(seconds: float) -> str:
    """A duration as a user writes a relative deadline: ``+7h20m``, ``+2d3h``, ``+45m``."""
    minutes = max(1, math.ceil(seconds / 60 - 1e-9))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days and minutes:  # days are written without minutes: round up, never earlier
        hours, minutes = hours + 1, 0
        if hours == 24:
            days, hours = days + 1, 0
    parts = []
    if days:
        parts.append(f"{days}d")
    if hours:
        parts.append(f"{hours}h")
    if minutes and not days:
        parts.append(f"{minutes}m")
    return "+" + "".join(parts or ["1m"])


def curve_to_json(curve: JobCurve) -> dict[str, Any] | None:
    """A history curve as the books keep it (None for a curve the spec itself gives)."""
    if curve.source != "history":
        return None
    points = []
    for units, rate in zip(curve.curve.sizes, curve.curve.throughputs, strict=True):
        size = curve.sizes[units]
        points.append([size.workers, size.ps, rate, size.cpu, size.memory_bytes])
    return {"basis": curve.basis, "points": points}


def curve_from_json(data: Mapping[str, Any], unit: CpuUnit) -> JobCurve | None:
    """The inverse of :func:`curve_to_json` (None if the stored curve is unreadable)."""
    try:
        points = [
            MeasuredPoint(int(w), int(p), float(rate), float(cpu), int(memory))
            for w, p, rate, cpu, memory in data["points"]
        ]
        return measured_curve(points, unit, str(data.get("basis", "")))
    except (KeyError, TypeError, ValueError):
        return None
