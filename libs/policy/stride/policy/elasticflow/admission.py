"""Admission control by Minimum Satisfactory Share (ElasticFlow sec. 4.1, Algorithm 1).

ElasticFlow admits a job only if it can guarantee its deadline and the deadlines of every
job admitted before it. Time is cut into slots of ``slot_seconds``; slot ``t`` is
``[now + t * slot, now + (t + 1) * slot)``. A job with deadline ``d`` may use the slots that
end by ``d``: ``D = floor((d - now) / slot)`` of them (a partial last slot is not counted,
so a plan that meets the slotted deadline meets the real one). A timeline may also start
mid-slot (``first_slot`` shorter than ``slot_seconds``): slot 0 is then
``[now, now + first_slot)`` and makes ``first_slot / slot`` of a slot's progress, and the
slots after it lie on a fixed grid. A caller that re-plans mid-slot keeps every job's count
of whole slots, so a plan that was feasible stays feasible as time passes (the paper
re-plans only at slot boundaries; a live service re-plans whenever a job arrives).
Progressive filling (Algorithm 1, lines 11-22) raises a cap ``j`` on the job's devices until
``sum_t T(min(j, free(t))) * slot >= M`` (eq. 2), where ``free(t)`` is what the jobs before
it in deadline order left in slot ``t`` (eq. 3). The smallest such ``j`` gives the job its
minimum satisfactory share.

Choices where the paper is silent, each tested in ``test_elasticflow_admission.py``:

- ``j`` is searched by bisection over the curve's allowed sizes, not counted up from 1:
  the progress is monotone in ``j`` (curves are monotone), so the answer is the same.
- A job takes ``usable(min(j, free(t)))`` devices (only allowed sizes, sec. 4.3), and its
  plan is trimmed after the slot in which it completes: Algorithm 1 would hold ``j``
  devices to the deadline, which guarantees nothing more and blocks later jobs.
- Jobs already admitted *hold* their reservations (:class:`HeldReservation`). The decision
  first fits the candidate into what they leave free; only if that fails are the candidate
  and the jobs with later deadlines (more whole slots) re-filled in deadline order (jobs
  with earlier deadlines are first in Algorithm 1's order, so its re-run would give them the same
  plans). :func:`admit_from_scratch` is Algorithm 1 verbatim (re-fill every job), the
  reference of ``bench/admission.py``. The two can differ only when the candidate fits the
  held reservations but not a from-scratch re-plan, or the reverse; both keep every
  admitted deadline, which the property tests check by simulating the plans forward.
- Soft-deadline and best-effort jobs never reserve (sec. 4.4: they get resources in
  Algorithm 2 "after allocating the minimum satisfactory shares to admitted jobs"), so
  they are never dropped and never delay a hard job.
- Quotas (sec. 4.4, :mod:`.quotas`) are checked first and drop a job that is over quota.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt

from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.kernels import fill_slots
from stride.policy.elasticflow.quotas import UserQuota, quota_violation
from stride.policy.errors import PolicyError

ALGORITHM_NAME = "elasticflow-admission"
ALGORITHM_VERSION = 1
MAX_SLOTS = 100_000
"""Most slots a deadline may lie ahead: a bound on memory (a year of 5-minute slots)."""
PROGRESS_TOLERANCE = 1e-9
"""Relative (and, for nearly finished jobs, absolute) slack when comparing summed progress
with the iterations left, so float sums and subtractions do not flip a decision."""


def _needed(remaining: float) -> float:
    return remaining - PROGRESS_TOLERANCE * max(1.0, remaining)


_LOOKAHEAD = 16
"""Slots a fill first looks through for the one its job completes in (:meth:`PlannedJob.
fill`); only a speed-up: the answer is the same."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class InvalidAdmission(PolicyError):
    """An admission request is malformed (bad capacity, deadline before now, ...)."""


class JobKind(Enum):
    """How a job's deadline is treated (ElasticFlow sec. 4.4)."""

    HARD = "hard"
    """Admitted only with a guaranteed deadline, otherwise dropped."""
    SOFT = "soft"
    """Never dropped; gets spare devices after the hard jobs' minimum shares."""
    BEST_EFFORT = "best-effort"
    """No deadline (the paper's infinite deadline); spare devices only."""


@dataclass(frozen=True)
class DeadlineJob:
    """A training job as ElasticFlow sees it (sec. 3.1): curve, work left, deadline."""

    job_id: str
    curve: ScalingCurve
    """Throughput in iterations per second by device count; must be monotone concave."""
    remaining_iterations: float
    """Iterations still to run (the termination condition M_i minus progress)."""
    deadline: float | None = None
    """Seconds on the caller's clock; None only for best-effort jobs."""
    kind: JobKind = JobKind.HARD
    user: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise InvalidAdmission("job_id", "is required")
        if not isinstance(self.curve, ScalingCurve):
            raise InvalidAdmission("curve", f"must be a ScalingCurve, got {self.curve!r}")
        self.curve.require_concave("curve")
        left = self.remaining_iterations
        if isinstance(left, bool) or not isinstance(left, int | float) or not math.isfinite(left):
            raise InvalidAdmission("remaining_iterations", f"must be finite, got {left!r}")
        if left < 0:
            raise InvalidAdmission("remaining_iterations", f"must be >= 0, got {left!r}")
        if not isinstance(self.kind, JobKind):
            raise InvalidAdmission("kind", f"must be a JobKind, got {self.kind!r}")
        if self.kind is JobKind.BEST_EFFORT:
            if self.deadline is not None:
                raise InvalidAdmission("deadline", "a best-effort job has no deadline (None)")
        elif self.deadline is None or not math.isfinite(self.deadline):
            raise InvalidAdmission(
                "deadline",
                f"a {self.kind.value} job needs a finite deadline, got {self.deadline!r}",
            )


@dataclass(frozen=True)
class HeldReservation:
    """Devices an admitted hard job holds in each slot from now (slot 0 first)."""

    job: DeadlineJob
    devices_per_slot: tuple[int, ...]


class AdmissionDecision(Enum):
    """The outcome of one admission request."""

    ADMITTED = "admitted"
    """Hard job admitted with a guaranteed deadline."""
    DROPPED = "dropped"
    """Hard job whose deadline cannot be guaranteed together with the admitted ones."""
    BEST_EFFORT = "best-effort"
    """Soft-deadline or best-effort job: accepted without a reservation."""
    OVER_QUOTA = "over-quota"
    """Dropped before planning: the user is over quota."""


@dataclass(frozen=True)
class AdmissionRequest:
    """Whether to admit ``candidate`` beside the jobs that hold reservations."""

    capacity: int
    """Devices in the cluster (GPUs, or CPU shares for CPU jobs: see ``resource_kind``)."""
    now: float
    slot_seconds: float
    candidate: DeadlineJob
    admitted: tuple[HeldReservation, ...] = ()
    resource_kind: str = "gpu"
    """What a device is; the logic does not depend on it, replies carry it for the reader."""
    quota: UserQuota | None = None
    user_submissions: tuple[float, ...] = ()
    """The candidate's user's earlier submission times, for the quota."""


@dataclass(frozen=True)
class AdmissionReply:
    """The decision, and the reservations every admitted hard job holds after it."""

    decision: AdmissionDecision
    reason: str
    candidate_share: tuple[int, ...]
    """The candidate's minimum satisfactory share per slot (empty unless admitted)."""
    reservations: tuple[HeldReservation, ...]
    """All hard reservations after the decision (the request's if nothing changed)."""
    resource_kind: str = "gpu"


def deadline_slots(
    deadline: float, now: float, slot_seconds: float, field: str, first_slot: float | None = None
) -> int:
    """Slots between ``now`` and ``deadline`` that end by it (slot 0 lasts ``first_slot``,
    a whole slot by default); a deadline before now is an error."""
    if not math.isfinite(deadline):
        raise InvalidAdmission(field, f"must be finite, got {deadline!r}")
    if deadline < now:
        raise InvalidAdmission(field, f"{deadline!r} is before now ({now!r})")
    lead = slot_seconds - (slot_seconds if first_slot is None else first_slot)
    # The tiny slack keeps a deadline that is an exact multiple of slots from losing one.
    slots = math.floor((deadline - now + lead) / slot_seconds * (1 + 1e-12) + 1e-9)
    if slots > MAX_SLOTS:
        raise InvalidAdmission(field, f"is {slots} slots ahead; at most {MAX_SLOTS} are planned")
    return slots


class PlannedJob:
    """A hard job prepared for progressive filling: lookup tables and its slot budget."""

    __slots__ = (
        "first",
        "job",
        "progress",
        "progress_by_cap",
        "remaining",
        "size_steps",
        "slots",
        "steps",
        "usable",
    )

    def __init__(
        self,
        job: DeadlineJob,
        capacity: int,
        now: float,
        slot_seconds: float,
        field: str,
        first_slot: float | None = None,
    ):
        assert job.deadline is not None
        self.job = job
        self.slots = deadline_slots(
            job.deadline, now, slot_seconds, f"{field}.deadline", first_slot
        )
        self.first = 1.0 if first_slot is None else first_slot / slot_seconds
        """Slot 0's share of a whole slot's progress (1.0 unless the timeline starts mid-slot)."""
        usable, values = job.curve.table(capacity)
        self.usable: IntArray = np.asarray(usable, dtype=np.int64)
        self.progress: FloatArray = np.asarray(values, dtype=np.float64) * slot_seconds
        self.size_steps = [size for size in job.curve.sizes if size <= capacity]
        self.steps: IntArray = np.asarray(self.size_steps, dtype=np.int64)
        self.remaining = job.remaining_iterations
        largest = self.size_steps[-1] if self.size_steps else 0
        caps = np.asarray(self.size_steps, dtype=np.int64)[:, None]
        offered = np.arange(largest + 1, dtype=np.int64)[None, :]
        self.progress_by_cap: FloatArray = self.progress[np.minimum(caps, offered)]

    def rebudget(self, slots: int, remaining: float, first: float = 1.0) -> PlannedJob:
        """The same job's tables with a new slot budget, remaining work and slot 0's fraction
        of a whole slot (no rebuild).

        For callers that re-plan one job many times (the simulator does at every event):
        the lookup tables depend only on the curve, capacity and slot length, and are shared.
        """
        clone = PlannedJob.__new__(PlannedJob)
        clone.first = first
        clone.job = self.job
        clone.progress = self.progress
        clone.progress_by_cap = self.progress_by_cap
        clone.size_steps = self.size_steps
        clone.steps = self.steps
        clone.usable = self.usable
        clone.slots = slots
        clone.remaining = remaining
        return clone

    def fill(self, used: IntArray, capacity: int) -> IntArray | None:
        """Algorithm 1's ProgressiveFilling into what the reservations ``used`` (devices per
        slot; later slots are free) leave of ``capacity``: the minimum satisfactory share,
        or None. Compiled (:mod:`.kernels`); :meth:`fill_reference` is the same in numpy."""
        needed = _needed(self.remaining)
        if needed <= 0:
            return np.zeros(0, dtype=np.int64)
        plan = fill_slots()(
            used,
            capacity,
            self.slots,
            self.first,
            needed,
            self.steps,
            self.progress,
            self.progress_by_cap,
            self.usable,
        )
        return plan if plan.size else None

    def fill_reference(self, free: IntArray) -> IntArray | None:
        """:meth:`fill` written in numpy, given the free devices of each of the job's
        slots: the reference the compiled fill is tested against."""
        needed = _needed(self.remaining)
        if needed <= 0:
            return np.zeros(0, dtype=np.int64)
        window = free[: self.slots]
        if not self.size_steps or window.size == 0:
            return None
        # Progress under every cap j at once: slots by free devices (clipped at the largest
        # size, beyond which nothing changes), times the progress each cap makes there.
        clipped = np.minimum(window, self.size_steps[-1])
        by_free = np.bincount(clipped, minlength=self.size_steps[-1] + 1).astype(np.float64)
        by_free[clipped[0]] -= 1.0 - self.first  # slot 0 may be a partial slot
        reachable = self.progress_by_cap @ by_free
        meets = reachable >= needed
        low = int(meets.argmax())  # the smallest cap j that meets the deadline (monotone in j)
        if not meets[low]:
            return None
        # The slot it completes in: first within the slots it needs at full speed (twice
        # over, and at least a few), else anywhere in the window. A prefix's cumulative sum
        # is the whole one's prefix (summed in order), so both find the same slot.
        cap = self.size_steps[low]
        rate = float(self.progress[cap])
        full_speed = int(needed / rate) + 1 if rate > 0 else window.size
        ahead = window[: max(_LOOKAHEAD, 2 * full_speed)]
        for part in (ahead, window) if ahead.size < window.size else (window,):
            offered = np.minimum(cap, part)
            gained = self.progress[offered]  # a copy (fancy indexing)
            gained[0] *= self.first
            done = np.cumsum(gained)
            if done[-1] >= needed or part is window:
                break
        last = int(np.searchsorted(done, needed))  # slot in which the job completes
        return self.usable[offered[: last + 1]]


class AdmissionControl:
    """The cluster's slot timeline with the reservations of the admitted hard jobs.

    Built once from the held reservations (validated: within capacity, within each job's
    deadline, enough to finish it), then asked :meth:`decide` about candidates.
    """

    def __init__(
        self,
        capacity: int,
        now: float,
        slot_seconds: float,
        admitted: Sequence[HeldReservation] = (),
        first_slot: float | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise InvalidAdmission("capacity", f"must be a whole number > 0, got {capacity!r}")
        if not isinstance(now, int | float) or not math.isfinite(now):
            raise InvalidAdmission("now", f"must be finite, got {now!r}")
        if not isinstance(slot_seconds, int | float) or not (
            math.isfinite(slot_seconds) and slot_seconds > 0
        ):
            raise InvalidAdmission("slot_seconds", f"must be finite and > 0, got {slot_seconds!r}")
        if first_slot is not None and not (
            isinstance(first_slot, int | float) and 0 < first_slot <= slot_seconds
        ):
            raise InvalidAdmission(
                "first_slot", f"must be in (0, slot_seconds], got {first_slot!r}"
            )
        self.capacity = capacity
        self.now = float(now)
        self.slot_seconds = float(slot_seconds)
        self.first_slot = float(slot_seconds if first_slot is None else first_slot)
        """Slot 0's length: slot 0 ends at ``now + first_slot``, the next one a slot later."""
        self.jobs: list[PlannedJob] = []
        self.plans: list[IntArray] = []
        self.used: IntArray = np.zeros(0, dtype=np.int64)
        seen: set[str] = set()
        for index, held in enumerate(admitted):
            field = f"admitted[{index}]"
            job = held.job
            if job.kind is not JobKind.HARD:
                raise InvalidAdmission(f"{field}.job.kind", "only hard jobs hold reservations")
            if job.job_id in seen:
                raise InvalidAdmission(f"{field}.job.job_id", f"{job.job_id!r} repeats")
            seen.add(job.job_id)
            planned = self._plan(job, f"{field}.job")
            plan = np.asarray(held.devices_per_slot, dtype=np.int64)
            self._check_held(planned, plan, f"{field}.devices_per_slot")
            self.jobs.append(planned)
            self.plans.append(plan)
            self._add(plan)
        over = np.flatnonzero(self.used > capacity)
        if over.size:
            slot = int(over[0])
            raise InvalidAdmission(
                "admitted",
                f"reservations use {int(self.used[slot])} devices in slot {slot}, "
                f"capacity is {capacity}",
            )

    def _check_held(self, planned: PlannedJob, plan: IntArray, field: str) -> None:
        problem = self._held_problem(planned, plan)
        if problem is not None:
            where, message = problem
            raise InvalidAdmission(field + where, message)

    def _held_problem(self, planned: PlannedJob, plan: IntArray) -> tuple[str, str] | None:
        """Why ``plan`` cannot be held for ``planned`` (a field suffix and the reason)."""
        if plan.size > planned.slots:
            return "", f"reserves {plan.size} slots, the deadline allows {planned.slots}"
        bad = np.flatnonzero((plan < 0) | (plan > self.capacity))
        if bad.size == 0:
            bad = np.flatnonzero(planned.usable[plan] != plan)
        if bad.size:
            slot = int(bad[0])
            return f"[{slot}]", f"{int(plan[slot])} is not an allowed size of the job's curve"
        gained = planned.progress[plan]
        if gained.size:
            gained[0] *= planned.first
        progress = float(gained.sum())
        if progress < _needed(planned.remaining):
            return "", (
                f"makes {progress:.6g} iterations by the deadline, the job has "
                f"{planned.remaining:.6g} left"
            )
        return None

    def holds(self, planned: PlannedJob, plan: IntArray) -> bool:
        """Whether ``plan`` alone still finishes ``planned`` by its deadline (capacity not
        considered)."""
        return self._held_problem(planned, plan) is None

    def hold(self, planned: PlannedJob, plan: IntArray) -> bool:
        """Add a job with a plan it held before, if that plan still finishes it by its
        deadline and fits what the jobs held so far leave free; else change nothing."""
        if self._held_problem(planned, plan) is not None:
            return False
        shared = min(plan.size, self.used.size)
        if np.any(plan[:shared] + self.used[:shared] > self.capacity):
            return False
        self.commit(planned, {len(self.jobs): plan})
        return True

    def _add(self, plan: IntArray, sign: int = 1) -> None:
        if not plan.size:
            return
        if plan.size > self.used.size:
            self.used = np.concatenate([self.used, np.zeros(plan.size - self.used.size, np.int64)])
        part = self.used[: plan.size]
        if sign > 0:
            np.add(part, plan, out=part)
        else:
            np.subtract(part, plan, out=part)

    def _free(self, used: IntArray, slots: int) -> IntArray:
        free = np.full(slots, self.capacity, dtype=np.int64)
        shared = min(slots, used.size)
        free[:shared] -= used[:shared]
        return free

    def prepare(self, candidate: DeadlineJob, field: str = "candidate") -> PlannedJob:
        """Validate a hard candidate against this timeline (deadline not before now, ...)."""
        if candidate.kind is not JobKind.HARD:
            raise InvalidAdmission(f"{field}.kind", "only hard jobs are planned")
        if any(planned.job.job_id == candidate.job_id for planned in self.jobs):
            raise InvalidAdmission(f"{field}.job_id", f"{candidate.job_id!r} is already admitted")
        return self._plan(candidate, field)

    def _plan(self, job: DeadlineJob, field: str) -> PlannedJob:
        return PlannedJob(job, self.capacity, self.now, self.slot_seconds, field, self.first_slot)

    def decide(self, candidate: PlannedJob) -> dict[int, IntArray] | None:
        """New plans by job index (the candidate is index ``len(jobs)``), or None to drop.

        First the candidate alone in what the held reservations leave free; then the
        candidate and every later-deadline job re-filled in deadline order.
        """
        share = candidate.fill(self.used, self.capacity)
        new_index = len(self.jobs)
        if share is not None:
            return {new_index: share}
        later = [
            index for index, planned in enumerate(self.jobs) if planned.slots > candidate.slots
        ]
        if not later:
            return None
        used = self.used.copy()
        for index in later:
            held = self.plans[index]
            used[: held.size] -= held
        order = sorted(later, key=lambda index: (self.jobs[index].slots, index))
        replanned: dict[int, IntArray] = {}
        for index, planned in [(new_index, candidate)] + [(i, self.jobs[i]) for i in order]:
            plan = planned.fill(used, self.capacity)
            if plan is None:
                return None
            if plan.size > used.size:
                used = np.concatenate([used, np.zeros(plan.size - used.size, np.int64)])
            used[: plan.size] += plan
            replanned[index] = plan
        return replanned

    def commit(self, candidate: PlannedJob, plans: dict[int, IntArray]) -> None:
        """Apply a :meth:`decide` result: the candidate joins, re-filled jobs change plans."""
        self.jobs.append(candidate)
        self.plans.append(np.zeros(0, dtype=np.int64))
        for index, plan in plans.items():
            self._add(self.plans[index], -1)
            self.plans[index] = plan
            self._add(plan)

    def reservations(self) -> tuple[HeldReservation, ...]:
        """The held reservations as request/reply values."""
        return tuple(
            HeldReservation(planned.job, tuple(int(devices) for devices in plan))
            for planned, plan in zip(self.jobs, self.plans, strict=True)
        )


def admit_from_scratch(
    capacity: int,
    now: float,
    slot_seconds: float,
    jobs: Sequence[DeadlineJob],
    first_slot: float | None = None,
) -> list[tuple[int, ...]] | None:
    """Algorithm 1 verbatim: re-fill every hard job in deadline order from an empty cluster.

    Returns each job's plan (in the order given) or None if some deadline cannot be met.
    This is the naive reference for the incremental :meth:`AdmissionControl.decide`.
    """
    timeline = AdmissionControl(capacity, now, slot_seconds, first_slot=first_slot)
    prepared = [timeline.prepare(job, f"jobs[{index}]") for index, job in enumerate(jobs)]
    order = sorted(range(len(jobs)), key=lambda index: (prepared[index].slots, index))
    plans: dict[int, IntArray] = {}
    used = np.zeros(0, dtype=np.int64)
    for index in order:
        plan = prepared[index].fill(used, capacity)
        if plan is None:
            return None
        if plan.size > used.size:
            used = np.concatenate([used, np.zeros(plan.size - used.size, np.int64)])
        used[: plan.size] += plan
        plans[index] = plan
    return [tuple(int(devices) for devices in plans[index]) for index in range(len(jobs))]


def run(request: AdmissionRequest) -> AdmissionReply:
    """The registry entry point: admit, drop, or accept without reservation."""
    timeline = AdmissionControl(
        request.capacity, request.now, request.slot_seconds, request.admitted
    )
    candidate = request.candidate
    if candidate.deadline is not None:
        deadline_slots(
            candidate.deadline, timeline.now, timeline.slot_seconds, "candidate.deadline"
        )
    held = timeline.reservations()
    kind = request.resource_kind
    if request.quota is not None:
        admitted_of_user = sum(1 for item in request.admitted if item.job.user == candidate.user)
        problem = quota_violation(
            request.quota, timeline.now, request.user_submissions, admitted_of_user
        )
        if problem is not None:
            return AdmissionReply(AdmissionDecision.OVER_QUOTA, problem, (), held, kind)
    if candidate.kind is not JobKind.HARD:
        return AdmissionReply(
            AdmissionDecision.BEST_EFFORT,
            f"{candidate.kind.value} job: no reservation, spare devices only (sec. 4.4)",
            (),
            held,
            kind,
        )
    planned = timeline.prepare(candidate)
    plans = timeline.decide(planned)
    if plans is None:
        return AdmissionReply(
            AdmissionDecision.DROPPED,
            "the deadline cannot be met without breaking an admitted job's deadline",
            (),
            held,
            kind,
        )
    timeline.commit(planned, plans)
    share = tuple(int(devices) for devices in timeline.plans[-1])
    return AdmissionReply(
        AdmissionDecision.ADMITTED,
        f"minimum satisfactory share over {len(share)} slots",
        share,
        timeline.reservations(),
        kind,
    )
