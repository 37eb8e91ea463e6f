"""The deadline-aware baselines as ElasticFlow's own simulator runs them.

Why it exists: ``stride sim --model elasticflow`` (:mod:`stride.sim.deadline_rounds`) is
calibrated against ElasticFlow's published simulator (pkusys/ElasticFlow), whose EDF with
admission control and whose ElasticFlow differ from the paper's prose in ways that move
the deadline satisfactory ratio. Each class below states the rule it follows; all were
written from the ElasticFlow paper (seed 001, sec. 4.1-4.2, 6.1) and from what that
simulator observably does, with none of its code.

- :class:`EdfPlanAdmissionPolicy` (``edf-ac`` under that model): EDF's allocation (each job
  in deadline order takes its largest raw column that fits, past the throughput peak too),
  and an arrival is admitted only if an EDF *plan* of every active job plus the arrival,
  made slot by slot on the free-GPU profile, ends every job by its deadline. One job at a
  time, in arrival order. A job already admitted that has fallen behind makes every arrival
  fail until it ends (the simulator does the same).
- :class:`ElasticFlowPolicy` (``elasticflow``) and its ``elasticflow-noac`` variant:
  minimum satisfactory shares by progressive filling (sec. 4.1, Algorithm 1) on the raw
  rows, admission all-or-nothing per round (the jobs seen in one round are planned together
  and declined together), spare GPUs by marginal return (Algorithm 2).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from stride.policy.elasticflow.curves import ScalingCurve
from stride.sim.deadline_baselines import ThemisPolicy, TiresiasPolicy
from stride.sim.deadline_views import DeadlinePolicy, DeadlineView, JobView, edf_key

__all__ = [
    "EF_MODEL_POLICIES",
    "DeadlineOrder",
    "EdfNowPolicy",
    "EdfPlanAdmissionPolicy",
    "EfTiresiasPolicy",
    "ElasticFlowNoAdmissionPolicy",
    "ElasticFlowPolicy",
    "FreeProfile",
    "GridThemisPolicy",
    "edf_now",
    "ef_model_policy",
]


def edf_now(view: DeadlineView) -> dict[str, int]:
    """EDF's sizes for the coming interval: in deadline order, each job its largest column
    that fits in what is left (its whole row's largest when it fits), else nothing."""
    free = view.capacity
    result: dict[str, int] = {}
    for job in sorted(view.jobs, key=edf_key):
        take = job.curve.usable(min(job.curve.max_size, free))
        result[job.job_id] = take
        free -= take
    return result


class FreeProfile:
    """Free GPUs over time as a step function: ``free[k]`` from ``times[k]`` to the next."""

    def __init__(self, start: float, capacity: int) -> None:
        self.times = [start]
        self.free = [capacity]

    def split(self, at: float) -> int:
        """The index of the step that starts exactly at ``at`` (made if needed)."""
        index = bisect.bisect_right(self.times, at) - 1
        if self.times[index] != at:
            self.times.insert(index + 1, at)
            self.free.insert(index + 1, self.free[index])
            index += 1
        return index

    def take(self, start: float, end: float, gpus: int) -> None:
        """Reserve ``gpus`` from ``start`` to ``end``."""
        if end <= start or gpus <= 0:
            return
        first = self.split(start)
        last = self.split(end)
        for index in range(first, last):
            self.free[index] -= gpus


def _align(start: float, at: float, slot: float) -> float:
    """The first slot boundary (counted from ``start``) at or after ``at``."""
    return start + slot * math.ceil((at - start) / slot - 1e-9)


def plan_edf(view: DeadlineView, jobs: Sequence[JobView], slot: float) -> bool:
    """Whether an EDF plan of ``jobs`` from now ends every job with a deadline on time.

    Jobs in deadline order walk the free profile: on each step a job runs on its largest
    column that fits what is free there, until its work is done; it holds its GPUs until
    the slot boundary after its end (the simulator reserves whole slots). A clean version
    of the simulator's profile: it also overwrites a boundary's free count and assumes a
    free cluster after the last one, which moves its DSR by at most 0.005 (checked).
    """
    profile = FreeProfile(view.now, view.capacity)
    met = True
    for job in sorted(jobs, key=edf_key):
        left = job.remaining_iterations
        at = view.now
        index = 0
        finish = math.inf
        while True:
            step_end = profile.times[index + 1] if index + 1 < len(profile.times) else math.inf
            free = profile.free[index]
            size = job.curve.usable(min(job.curve.max_size, free)) if free > 0 else 0
            rate = job.curve.throughput(size)
            if size and rate > 0:
                done_at = math.ceil(at + left / rate - 1e-9)
                if done_at <= step_end:
                    finish = done_at
                    profile.take(at, _align(view.now, done_at, slot), size)
                    break
                left -= (step_end - at) * rate
                profile.take(at, step_end, size)
            if not math.isfinite(step_end):
                break
            at = step_end
            index = bisect.bisect_right(profile.times, at) - 1
        if job.deadline is not None and finish > job.deadline:
            met = False
    return met


@dataclass
class EdfPlanAdmissionPolicy:
    """EDF behind the EDF-plan admission test (module docstring)."""

    name: str = "edf-ac"
    slot: float = 60.0

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Admitted if the EDF plan of everyone plus the candidate is on time."""
        return plan_edf(view, [*view.jobs, candidate], self.slot)

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """See :func:`edf_now`."""
        return edf_now(view)

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Round-driven only."""
        return None


class DeadlineOrder:
    """A view's jobs in deadline order (ties in the order they arrived), kept sorted across
    rounds: a job's key never changes, and in overload thousands wait, so re-sorting every
    round would dominate a run."""

    def __init__(self) -> None:
        self._order: list[tuple[float, float, int, str]] = []
        self._ids: set[str] = set()
        self._arrivals = 0

    def of(self, view: DeadlineView) -> list[JobView]:
        """``view.jobs`` sorted by :func:`edf_key`, stable over the view's order."""
        by_id = {job.job_id: job for job in view.jobs}
        if self._ids != by_id.keys():
            gone = self._ids - by_id.keys()
            if gone:
                self._order = [entry for entry in self._order if entry[3] not in gone]
            for job in view.jobs:
                if job.job_id not in self._ids:
                    self._arrivals += 1
                    bisect.insort(self._order, (*edf_key(job), self._arrivals, job.job_id))
            self._ids = set(by_id)
        return [by_id[entry[3]] for entry in self._order]


@dataclass
class EdfNowPolicy:
    """EDF as ElasticFlow's simulator runs it: :func:`edf_now` on the raw rows, every round,
    no admission; that simulator charges it no overhead."""

    name: str = "edf"
    _order: DeadlineOrder = field(default_factory=DeadlineOrder, repr=False)

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Always admits."""
        return True

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """See :func:`edf_now` (the jobs left without GPUs are not listed)."""
        free = view.capacity
        result: dict[str, int] = {}
        for job in self._order.of(view):
            if free <= 0:
                break
            take = job.curve.usable(min(job.curve.max_size, free))
            if take:
                result[job.job_id] = take
                free -= take
        return result

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Round-driven only."""
        return None


EF_MODEL_POLICIES: tuple[str, ...] = (
    "stride",
    "elasticflow",
    "elasticflow-noac",
    "edf",
    "edf-ac",
    "tiresias",
    "themis",
    "gandiva",
    "chronus",
)
"""Policy names under ``--model elasticflow``."""


def ef_model_policy(name: str, slot: float) -> tuple[DeadlinePolicy, bool, str]:
    """The policy ``name`` under ElasticFlow's model: (policy, whether it pays the per-round
    overhead, which curve it is shown: ``raw`` rows or the concave ``envelope``)."""
    from stride.policy.elasticflow.guarantees import GuaranteePolicy
    from stride.sim.deadline_baselines import ChronusPolicy

    if name == "stride":
        return GuaranteePolicy(), True, "envelope"
    if name == "elasticflow":
        return ElasticFlowPolicy(slot=slot), True, "raw"
    if name == "elasticflow-noac":
        return ElasticFlowNoAdmissionPolicy(slot=slot), True, "raw"
    if name == "edf":
        return EdfNowPolicy(), False, "raw"
    if name == "edf-ac":
        return EdfPlanAdmissionPolicy(slot=slot), True, "raw"
    if name == "tiresias":
        return EfTiresiasPolicy(), True, "raw"
    if name == "themis":
        # The simulator leases for one slot and charges Themis no overhead.
        return GridThemisPolicy(lease_seconds=slot), False, "raw"
    if name == "gandiva":
        from stride.sim.deadline_ef_gandiva import GandivaNodeSetPolicy

        return GandivaNodeSetPolicy(slot=slot), True, "raw"
    if name == "chronus":
        return ChronusPolicy(), True, "raw"
    raise KeyError(name)


def _slot_ceil(origin: float, at: float, slot: float) -> float:
    return origin + math.ceil((at - origin) / slot - 1e-9) * slot


@functools.lru_cache(maxsize=4096)
def _levels_of(curve: ScalingCurve) -> list[tuple[int, float]]:
    """A row's columns up to its throughput peak (ElasticFlow's levels for the job)."""
    peak = max(range(len(curve.sizes)), key=lambda index: (curve.throughputs[index], -index))
    return list(zip(curve.sizes[: peak + 1], curve.throughputs[: peak + 1], strict=True))


@dataclass
class _Plan:
    now_gpus: int
    real_end: float
    """When the job's work is planned to be done (a whole second)."""
    end: float
    """``real_end`` rounded up to the round's slot grid: when its GPUs come back."""
    change: float | None
    """The first planned change of its allocation after now, if any."""


@dataclass
class ElasticFlowPolicy:
    """ElasticFlow as its published simulator runs it (see the module docstring).

    Every round re-plans every active job from an empty cluster, in deadline order, on a
    grid of ``slot`` seconds from now (sec. 4.1's slots; the deadline rounded up onto the
    grid, its last step cut at the real deadline). A job's plan is the smallest GPU level
    that finishes it by its deadline when it starts as late as possible at that level,
    running one level lower before (Algorithm 1's progressive filling, as that simulator
    implements it); a job no level can save gets as many GPUs as fit, ahead of later
    deadlines (the cascade that sinks ``elasticflow-noac`` in overload). Levels are the
    raw row's columns up to its throughput peak. Spare GPUs go one level at a time, first
    to jobs holding none, then to the job whose extra GPU costs the most GPU-seconds (the
    simulator's order; sec. 4.2 describes marginal return).

    With ``admission``, the jobs seen in one round are admitted together only if the plan
    of every active job plus all of them meets every deadline; otherwise all are declined
    (best-effort ones are always kept). A job counts as met when its planned end, from its
    last plan, is by its deadline; without admission, when its completion (the slot-aligned
    end plus overhead) is.
    """

    name: str = "elasticflow"
    admission: bool = True
    slot: float = 60.0
    _plans: dict[str, _Plan] = field(default_factory=dict, repr=False)
    _markers: set[float] = field(default_factory=set, repr=False)
    _deadline_order: DeadlineOrder = field(default_factory=DeadlineOrder, repr=False)

    @property
    def placement_order(self) -> str:
        """Without admission the simulator places jobs in the order they started (with
        admission, largest first); through the GPU-range cache this sets the overhead."""
        return "size" if self.admission else "started"

    @staticmethod
    def _fit(levels: list[tuple[int, float]], cap: int) -> tuple[int, float]:
        found = (0, 0.0)
        for size, rate in levels:
            if size > cap:
                break
            found = (size, rate)
        return found

    def _plan(self, job: JobView, profile: FreeProfile, now: float) -> _Plan:
        levels = _levels_of(job.curve)
        slot = self.slot
        left = job.remaining_iterations
        deadline = math.inf if job.deadline is None else job.deadline
        edge = _slot_ceil(now, deadline, slot) if math.isfinite(deadline) else now
        if edge > now:
            profile.split(edge)
        steps = []
        for index, start in enumerate(profile.times):
            if start >= edge:
                break
            end = profile.times[index + 1] if index + 1 < len(profile.times) else math.inf
            steps.append((start, min(end, edge), profile.free[index]))
        chosen: tuple[float, int, int] | None = None
        lower = 0
        for size, _ in levels:
            done = 0.0
            for start, end, free in reversed(steps):
                gpus, rate = self._fit(levels, min(size, free))
                if not gpus:
                    continue
                done += ((deadline if end == edge else end) - start) * rate
                if done >= left - 1e-9:
                    chosen = (start, size, lower)
                    break
            if chosen is not None:
                break
            lower = size
        allocations: list[tuple[float, int]] = []
        highest = levels[-1][0]
        for start, end, free in steps:
            if chosen is not None:
                begin, high, low = chosen
                cap = high if start >= begin else low
            else:
                begin, cap = math.inf, highest
            gpus, rate = self._fit(levels, min(cap, free))
            allocations.append((start, gpus))
            if not gpus:
                continue
            span = (deadline if end == edge else end) - start
            if start >= begin and span * rate >= left - 1e-9:
                return self._finish(profile, now, start, gpus, rate, left, allocations)
            left -= span * rate
            profile.take(start, end, gpus)
        # No level meets the deadline (or none is set): greedy from the deadline on.
        at = max(edge, now)
        while True:
            index = bisect.bisect_right(profile.times, at) - 1
            free = profile.free[index]
            following = profile.times[index + 1] if index + 1 < len(profile.times) else math.inf
            gpus, rate = self._fit(levels, min(highest, free))
            allocations.append((at, gpus))
            if gpus and (following - at) * rate >= left - 1e-9:
                return self._finish(profile, now, at, gpus, rate, left, allocations)
            if gpus:
                left -= (following - at) * rate
                profile.take(at, following, gpus)
            at = following

    def _finish(
        self,
        profile: FreeProfile,
        now: float,
        start: float,
        gpus: int,
        rate: float,
        left: float,
        allocations: list[tuple[float, int]],
    ) -> _Plan:
        took = max(1, math.ceil(max(left, 0.0) / rate - 1e-9))  # a whole second at least
        real_end = start + took
        end = start + math.ceil(took / self.slot - 1e-9) * self.slot
        profile.take(start, end, gpus)
        first = allocations[0][1] if allocations and allocations[0][0] == now else 0
        change = next((at for at, count in allocations if at > now and count != first), None)
        return _Plan(first, float(real_end), float(end), change)

    def _plan_all(
        self, view: DeadlineView, jobs: Sequence[JobView], *, until_full: bool = False
    ) -> dict[str, _Plan]:
        """Plans in deadline order (``jobs`` already in it). ``until_full``: once no GPU is
        free now the later jobs get none now and are not planned (their plans would only
        move markers): in overload, without admission, thousands wait."""
        profile = FreeProfile(view.now, view.capacity)
        plans: dict[str, _Plan] = {}
        for job in jobs:
            if until_full and profile.free[0] <= 0:
                break
            plans[job.job_id] = self._plan(job, profile, view.now)
        return plans

    def admit_group(self, view: DeadlineView, group: Sequence[JobView]) -> list[bool]:
        """All-or-nothing for the jobs seen in one round (best effort always kept)."""
        if not self.admission:
            return [True] * len(group)
        everyone = sorted([*view.jobs, *group], key=edf_key)
        plans = self._plan_all(view, everyone)
        ok = all(
            job.deadline is None or plans[job.job_id].real_end <= job.deadline for job in everyone
        )
        return [ok or job.deadline is None for job in group]

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """A group of one (see :meth:`admit_group`)."""
        return self.admit_group(view, [candidate])[0]

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """Each job's planned GPUs now, then spare GPUs one level at a time."""
        order = self._deadline_order.of(view)
        plans = self._plan_all(view, order, until_full=True)
        counts = {job_id: plan.now_gpus for job_id, plan in plans.items()}
        spare = view.capacity - sum(counts.values())
        while spare > 0:
            best: tuple[float, int, JobView, int, float] | None = None
            for position, job in enumerate(order):
                current = counts.get(job.job_id, 0)
                step = next(
                    ((size, rate) for size, rate in _levels_of(job.curve) if size > current), None
                )
                if step is None or step[0] - current > spare:
                    continue
                left = job.remaining_iterations
                if current == 0:
                    key = math.inf
                else:
                    before = current * left / job.curve.throughput(current)
                    after = step[0] * left / step[1]
                    key = (after - before) / (step[0] - current)
                if best is None or key > best[0]:
                    best = (key, position, job, step[0], step[1])
            if best is None:
                break
            _, _, job, size, rate = best
            spare -= size - counts.get(job.job_id, 0)
            counts[job.job_id] = size
            took = math.ceil(job.remaining_iterations / rate - 1e-9)
            plans[job.job_id] = _Plan(
                size,
                view.now + took,
                view.now + math.ceil(took / self.slot - 1e-9) * self.slot,
                None,
            )
        self._plans = plans
        return counts

    def planned_ends(self) -> dict[str, tuple[float | None, float, float]]:
        """Per job of the last :meth:`decide`: (the finish to record, or None for its
        completion time; its completion before overhead; until when it progresses)."""
        return {
            job_id: (plan.real_end if self.admission else None, plan.end, plan.real_end)
            for job_id, plan in self._plans.items()
        }

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """The first planned change of any job's allocation (the simulator's scale event).

        Without admission every job's next change stays an event until its time passes
        (the simulator keeps one per job), so rounds come more often."""
        changes = {plan.change for plan in self._plans.values() if plan.change is not None}
        if self.admission:
            return min(changes) if changes else None
        self._markers = {at for at in self._markers | changes if at > view.now + self.slot}
        self._markers |= {at for at in changes if at > view.now}
        return min(self._markers) if self._markers else None


@dataclass
class GridThemisPolicy(ThemisPolicy):
    """Themis as ElasticFlow's simulator runs it: leases of one slot on a fixed grid from the
    first arrival, every round on that grid, and a job's end recorded at the end of the lease
    in which it finishes (:class:`ThemisPolicy` otherwise)."""

    _origin: float | None = field(default=None, repr=False)
    _ends: dict[str, tuple[float | None, float, float]] = field(default_factory=dict, repr=False)

    def _grid(self, at: float) -> float:
        assert self._origin is not None
        return self._origin + math.ceil((at - self._origin) / self.lease_seconds - 1e-9) * (
            self.lease_seconds
        )

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """:meth:`ThemisPolicy.decide`, re-leasing at every round (each is a lease end)."""
        if self._origin is None:
            self._origin = view.now
        self._next_lease = view.now
        decision = super().decide(view)
        self._ends = {}
        for job in view.jobs:
            gpus = decision.get(job.job_id, 0)
            rate = job.curve.throughput(gpus)
            if gpus and rate > 0:
                end = self._grid(view.now + job.remaining_iterations / rate)
                self._ends[job.job_id] = (end, end, end)
        return decision

    def planned_ends(self) -> dict[str, tuple[float | None, float, float]]:
        """Each running job's end, rounded up to its lease's end."""
        return self._ends

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """The next lease boundary while any job is active."""
        return self._grid(view.now + 1e-6) if view.jobs else None


@dataclass
class ElasticFlowNoAdmissionPolicy(ElasticFlowPolicy):
    """:class:`ElasticFlowPolicy` without admission control (``elasticflow-noac``)."""

    name: str = "elasticflow-noac"
    admission: bool = False


@dataclass
class EfTiresiasPolicy(TiresiasPolicy):
    """Tiresias as ElasticFlow's simulator runs it: queues at 3,250 and 7,200 GPU-seconds,
    overhead charged once per (re)start rather than every round (:class:`TiresiasPolicy`
    otherwise)."""

    thresholds: tuple[float, ...] = (3250.0, 7200.0)
    overhead_on_start_only: bool = True
