"""Environment A's non-elastic baselines: Tiresias 2D-LAS, Themis and Chronus (sec. 6.1).

Why it exists: ElasticFlow (seed 001, sec. 6.1) compares against these schedulers; their
papers' mechanisms are summarised there in one line each, so each class below states the
rules we simulate, our parameters and where we simplify. All three run a job on exactly the
GPU count its trace recorded (``num_gpu``) or not at all: none is elastic. They see the
same trace, curves and scaling-overhead model as every other policy (traces README): a job
that starts or resumes pauses for the environment's overhead.

- Tiresias (Gu et al., NSDI'19), discretized two-dimensional least-attained-service
  (2D-LAS): a job's priority is its attained service, GPUs x time. Jobs sit in
  :data:`TIRESIAS_QUEUE_THRESHOLDS`-separated queues; a higher queue (less service) always
  preempts a lower one, FIFO by arrival within a queue. Our thresholds are one and ten
  GPU-hours (Tiresias tunes K and thresholds per cluster; the paper's simulations use two
  to three queues). Not modelled: its starvation guard (promote a job that waited
  longer than a multiple of its run time) and consolidation-aware placement (GPUs are
  counted, not placed). Not deadline-aware, no admission control.
- Themis (Mahajan et al., NSDI'20), finish-time fairness: ``rho = T_shared / T_ideal``,
  where ``T_shared`` is the job's elapsed time plus its remaining time on its GPUs and
  ``T_ideal`` its run time alone on a ``1/N`` share of the cluster (N active jobs). Every
  :data:`THEMIS_LEASE_SECONDS` the GPUs are re-leased to jobs in decreasing ``rho``
  (fairness knob f = 0: every job bids); between leases, jobs keep their GPUs and freed
  GPUs go to waiting jobs by ``rho``. Simplified: the auction is a greedy order, not the
  paper's partial-allocation mechanism. Not deadline-aware.
- Chronus (Gao et al., SoCC'21), deadline-aware, not elastic: an arriving job is admitted as
  an SLO job if an earliest-deadline-first list schedule of the admitted SLO jobs (each on
  its trace GPU count, running ones where they are) still meets every deadline; otherwise
  it is demoted to best effort (it still runs on what SLO jobs leave, shortest remaining
  time first, and counts as met if it happens to finish in time). SLO jobs run EDF and are
  not preempted once started; best-effort jobs are preempted for SLO jobs. Simplified: the
  paper plans leases with an integer program; the list schedule is our stand-in.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field

from stride.sim.deadline_views import DeadlineView, JobView, edf_key

__all__ = [
    "THEMIS_LEASE_SECONDS",
    "TIRESIAS_QUEUE_THRESHOLDS",
    "ChronusPolicy",
    "GandivaPolicy",
    "ThemisPolicy",
    "TiresiasPolicy",
]

TIRESIAS_QUEUE_THRESHOLDS: tuple[float, ...] = (3600.0, 36000.0)
"""Attained GPU-seconds at which a job drops to the next queue (1 and 10 GPU-hours)."""
THEMIS_LEASE_SECONDS = 1200.0
"""GPU lease length: Themis re-auctions leases of tens of minutes; we take 20 minutes."""


def _fixed_rate(job: JobView) -> float:
    """Iterations per second on the trace's GPU count (0 if the curve cannot run there)."""
    return job.curve.throughput(job.num_gpu)


def _fixed_size(job: JobView) -> int:
    """The GPUs a non-elastic scheduler gives the job: its trace count (curve-usable)."""
    return job.curve.usable(job.num_gpu) or job.curve.sizes[0]


def _without_deadline(job: JobView) -> JobView:
    return dataclasses.replace(job, deadline=None)


def _greedy(ordered: list[JobView], free: int, result: dict[str, int]) -> int:
    """Give each job its fixed size, in order, while it fits (others are skipped)."""
    for job in ordered:
        if free <= 0:
            break
        size = _fixed_size(job)
        if size <= free:
            result[job.job_id] = size
            free -= size
    return free


@dataclass
class TiresiasPolicy:
    """Discretized 2D-LAS with preemption (see the module docstring)."""

    name: str = "tiresias"
    thresholds: tuple[float, ...] = TIRESIAS_QUEUE_THRESHOLDS

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """No admission control."""
        return True

    def _queue(self, job: JobView) -> int:
        return bisect.bisect_right(self.thresholds, job.attained_gpu_seconds)

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """Highest queue (least attained service) first, FIFO by arrival within a queue."""
        ordered = sorted(
            view.jobs,
            key=lambda job: (self._queue(job), job.submission_time, job.job_id),
        )
        result: dict[str, int] = {}
        _greedy(ordered, view.capacity, result)
        return result

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """When the next running job crosses a threshold, if someone waits to preempt it.

        A job that just (re)started is checked from the end of its restart pause, up to one
        pause after its attained service (which counts the pause) crossed the threshold.
        """
        if all(job.job_id in decision for job in view.jobs):
            return None
        soonest: float | None = None
        for job in view.jobs:
            devices = decision.get(job.job_id, 0)
            queue = self._queue(job)
            if not devices or queue >= len(self.thresholds):
                continue
            start = max(view.now, job.paused_until) if job.devices == devices else view.now
            at = start + (self.thresholds[queue] - job.attained_gpu_seconds) / devices
            at = max(at, view.now + 1.0)
            soonest = at if soonest is None else min(soonest, at)
        return soonest


@dataclass
class ThemisPolicy:
    """Finish-time fairness with leases (see the module docstring)."""

    name: str = "themis"
    lease_seconds: float = THEMIS_LEASE_SECONDS
    _next_lease: float = field(default=0.0, repr=False)

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """No admission control."""
        return True

    def _rho(self, job: JobView, view: DeadlineView) -> float:
        rate = _fixed_rate(job)
        if rate <= 0:
            return 0.0
        shared = (view.now - job.submission_time) + job.remaining_iterations / rate
        share = view.capacity / max(1, len(view.jobs))
        slowdown = max(1.0, _fixed_size(job) / share)
        ideal = job.total_iterations / rate * slowdown
        return shared / ideal if ideal > 0 else math.inf

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """At a lease boundary re-lease everything by rho; otherwise fill freed GPUs by rho."""
        by_rho = sorted(
            view.jobs, key=lambda job: (-self._rho(job, view), job.submission_time, job.job_id)
        )
        result: dict[str, int] = {}
        if view.now >= self._next_lease:
            self._next_lease = view.now + self.lease_seconds
            _greedy(by_rho, view.capacity, result)
            return result
        free = view.capacity
        for job in view.jobs:
            if job.devices:
                result[job.job_id] = job.devices
                free -= job.devices
        _greedy([job for job in by_rho if not job.devices], free, result)
        return result

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """The next lease boundary, while some job waits for GPUs."""
        if all(job.job_id in decision for job in view.jobs):
            return None
        return max(self._next_lease, view.now + 1.0)


@dataclass
class ChronusPolicy:
    """Deadline-aware, non-elastic admission and EDF (see the module docstring)."""

    name: str = "chronus"
    _slo: set[str] = field(default_factory=set, repr=False)

    def _duration(self, job: JobView, view: DeadlineView) -> float:
        rate = _fixed_rate(job)
        if rate <= 0:
            return math.inf
        pause = max(0.0, job.paused_until - view.now) if job.devices else view.pause_seconds
        return pause + job.remaining_iterations / rate

    def _plan(self, view: DeadlineView, jobs: list[JobView]) -> dict[str, float] | None:
        """Start times of an EDF list schedule on fixed sizes, or None if a deadline fails.

        Running jobs stay where they are; waiting ones, in deadline order, take the earliest
        time their GPUs are free for their whole run (conservative backfilling: a later job
        starts early only where it delays no earlier one).
        """
        # The free-GPU profile as breakpoints: free[k] GPUs from times[k] to times[k+1].
        times = [view.now, math.inf]
        free = [view.capacity, view.capacity]

        def reserve(start: float, end: float, size: int) -> None:
            for at in (start, end):
                index = bisect.bisect_right(times, at) - 1
                if times[index] != at:
                    times.insert(index + 1, at)
                    free.insert(index + 1, free[index])
            for index in range(bisect.bisect_left(times, start), bisect.bisect_left(times, end)):
                free[index] -= size

        def earliest(size: int, duration: float) -> float:
            for index, start in enumerate(times[:-1]):
                probe = index
                while probe < len(times) - 1 and times[probe] < start + duration:
                    if free[probe] < size:
                        break
                    probe += 1
                else:
                    return start
            return math.inf

        starts: dict[str, float] = {}
        for job in jobs:
            if job.devices:  # running: where it is, whether or not it will be late
                reserve(view.now, view.now + self._duration(job, view), job.devices)
                starts[job.job_id] = view.now
        for job in sorted((job for job in jobs if not job.devices), key=edf_key):
            duration = self._duration(job, view)
            size = _fixed_size(job)
            if size > view.capacity or not math.isfinite(duration):
                return None
            start = earliest(size, duration)
            if job.deadline is not None and start + duration > job.deadline:
                return None
            reserve(start, start + duration, size)
            starts[job.job_id] = start
        return starts

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Always accepted: as an SLO job if schedulable, else demoted to best effort."""
        if candidate.deadline is not None:
            slo = [job for job in view.jobs if job.job_id in self._slo]
            if self._plan(view, [*slo, candidate]) is not None:
                self._slo.add(candidate.job_id)
        return True

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """SLO jobs run as planned (never preempted); best effort gets the rest, SRTF."""
        present = {job.job_id for job in view.jobs}
        self._slo &= present
        slo = [job for job in view.jobs if job.job_id in self._slo]
        starts = self._plan(view, slo)
        if starts is None:
            # An SLO job fell behind its plan (overhead): plan without deadlines, keep order.
            starts = self._plan(view, [_without_deadline(job) for job in slo]) or {}
        result: dict[str, int] = {}
        free = view.capacity
        for job in slo:
            if job.devices or starts.get(job.job_id, math.inf) <= view.now:
                size = job.devices or _fixed_size(job)
                if size <= free:
                    result[job.job_id] = size
                    free -= size
        # Running best-effort jobs first, then shortest remaining time (thousands may wait).
        keyed = [
            (not job.devices, job.remaining_iterations / max(_fixed_rate(job), 1e-12), index)
            for index, job in enumerate(view.jobs)
            if job.job_id not in self._slo
        ]
        keyed.sort()
        _greedy([view.jobs[index] for _, _, index in keyed], free, result)
        return result

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Event-driven only."""
        return None


@dataclass
class GandivaPolicy:
    """Gandiva-like: the trace's GPU count, strict FIFO (no backfill), no admission.

    Gandiva's time slicing and packing are not modelled; a job holds exactly ``num_gpu``
    GPUs from start to finish.
    """

    name: str = "gandiva"

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Always admits."""
        return True

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Event-driven only."""
        return None

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """Running jobs keep their GPUs; waiting jobs start in arrival order while they fit."""
        free = view.capacity - sum(job.devices for job in view.jobs)
        result = {job.job_id: job.devices for job in view.jobs if job.devices}
        for job in sorted(view.jobs, key=lambda j: (j.submission_time, j.job_id)):
            if job.devices:
                continue
            if job.num_gpu > free:
                break
            result[job.job_id] = job.num_gpu
            free -= job.num_gpu
        return result
