"""What admission decides about a job (admit, reject, queue or run it best effort) and why.

The decision is ElasticFlow's admission as ``stride sim --env deadline`` runs it
(:class:`~stride.policy.elasticflow.guarantees.GuaranteePolicy`, through
:class:`~stride.admission.domain.ledger.Pool`). This module holds what is admission's own:
which scaling curve a job is planned with, and the words a user reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from stride.admission.domain.jobs import JobSpec
from stride.policy.cold_start import CHIEF_CPU, CHIEF_MEMORY_BYTES
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.units import CpuUnit, JobCurve, gpu_curve, profile_curve
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

    Similar finished jobs (the config DB's warm start) are not consulted yet.
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
