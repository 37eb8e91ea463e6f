"""What Environment A's policies see and answer: job and cluster snapshots, one interface.

Why a module of its own: Stride's policy (``stride.sim.deadline``) and the baselines
(``stride.sim.deadline_baselines``) both implement :class:`DeadlinePolicy` over these views,
and the environment drives them all the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from stride.policy.elasticflow.curves import ScalingCurve

__all__ = ["DeadlinePolicy", "DeadlineView", "JobView", "edf_key"]


@dataclass(frozen=True)
class JobView:
    """What a policy may see of one active (arrived, admitted, unfinished) job."""

    job_id: str
    curve: ScalingCurve
    remaining_iterations: float
    deadline: float | None
    submission_time: float
    num_gpu: int
    """The GPU count the trace recorded (what a non-elastic scheduler gives the job)."""
    devices: int
    """GPUs held now (0 while waiting or preempted)."""
    paused_until: float
    total_iterations: float = 0.0
    """The job's whole work, as submitted."""
    attained_gpu_seconds: float = 0.0
    """GPU-seconds of service received so far (held GPUs x time, pauses included)."""


@dataclass(frozen=True)
class DeadlineView:
    """A frozen snapshot for one decision."""

    now: float
    capacity: int
    jobs: tuple[JobView, ...]
    pause_seconds: float


class DeadlinePolicy(Protocol):
    """Environment A's specialisation of :class:`stride.sim.engine.Policy`.

    ``admit`` is asked once per arrival (``candidate`` is not yet in ``view.jobs``);
    ``decide`` returns GPUs per active job (missing means 0), within capacity; ``wakeup``
    names the next instant the policy wants a round although nothing arrives or completes
    (a lease expiring, a job crossing a priority threshold), or None.
    """

    name: str

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Whether to accept the candidate (False drops it for good)."""
        ...

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """GPUs for each active job."""
        ...

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """The next time-driven round after ``decision`` takes effect, or None."""
        ...


def edf_key(job: JobView) -> tuple[float, float, str]:
    """Earliest deadline first; jobs without a deadline last; then arrival, then id."""
    deadline = math.inf if job.deadline is None else job.deadline
    return (deadline, job.submission_time, job.job_id)
