"""Deadline guarantees as Stride runs them: admission and shares (ElasticFlow sec. 4.1-4.2).

Why a module of its own: ``stride sim --env deadline`` and the live admission service must
make the same decisions, so both run this code. The simulator feeds it the trace's arrivals
and completions on a simulated clock; the admission service feeds it submissions, job ends
and capacity changes on the wall clock (or a replay's clock). Neither owns a copy.

- :class:`GuaranteePolicy` admits a job only if Algorithm 1 (progressive filling over time
  slots, :mod:`.admission`) can guarantee its deadline beside the jobs already guaranteed,
  and hands the cluster out as minimum shares first, then spare devices by marginal return
  (Algorithm 2, :mod:`.allocation`).
- :meth:`GuaranteePolicy.earliest_deadline` answers a refusal with the earliest deadline
  that would be admitted now (the paper only drops the job; a user needs to know what to ask
  for instead).
- "Devices" are what the caller counts: GPUs, or CPU units (a core and its memory) for
  PS/worker jobs (:mod:`.units`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

import numpy as np

from stride.policy.elasticflow.admission import (
    MAX_SLOTS,
    AdmissionControl,
    DeadlineJob,
    IntArray,
    JobKind,
    PlannedJob,
    admit_from_scratch,
    deadline_slots,
)
from stride.policy.elasticflow.allocation import AllocationJob, AllocationRequest, allocate
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.priorities import (
    NORMAL,
    Contender,
    class_of,
    mixed,
    prioritized,
    promotion_after,
)

__all__ = [
    "SCALING_PAUSE_SECONDS",
    "SLOT_SECONDS",
    "DeadlineView",
    "GuaranteePlanner",
    "GuaranteePolicy",
    "JobView",
    "admission_test",
    "edf_key",
    "first_slot",
]

SCALING_PAUSE_SECONDS = 20.0
"""Pause per re-allocation: ElasticFlow sec. 6.6 / Fig. 12(b) measures suspend-to-restart
per model and calls it marginal against a ~23 minute scheduling interval without giving
numbers; we take one fixed 20 s pause (our reading of the figure's order of magnitude)."""
SLOT_SECONDS = 300.0
"""Admission slot length: short against ElasticFlow's ~23 min scheduling interval (sec. 6.6)
so slot rounding costs little, long enough that a 40-day Philly deadline stays well under
the admission library's MAX_SLOTS."""


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
    priority: int = NORMAL
    """The spec's priority class (:mod:`.priorities`; LOW 1, NORMAL 2, HIGH 3)."""
    weight: float = 0.5
    """KOD2's weight (eq. 1, :func:`.priorities.unit_weight`), the order within a class."""
    waiting_since: float | None = None
    """Since when the job has held no units (None while it holds some): its age."""
    measured_speed: float | None = None
    """Measured throughput over the curve's at the job's size, once it has run (None: no
    measurement yet, the curve is trusted). Guarantees are re-planned on it: a job found
    slower needs more of its share (or loses its guarantee), one found faster less."""


@dataclass(frozen=True)
class DeadlineView:
    """A frozen snapshot for one decision."""

    now: float
    capacity: int
    jobs: tuple[JobView, ...]
    pause_seconds: float


def edf_key(job: JobView) -> tuple[float, float]:
    """Earliest deadline first; jobs without a deadline last; then arrival. Every sort by it
    is stable, so jobs equal in both keep the order they arrived in (a view lists its jobs
    that way): not their ids, which the live service draws at random and the simulator
    takes from the trace, so the two would break such ties differently."""
    deadline = math.inf if job.deadline is None else job.deadline
    return (deadline, job.submission_time)


def first_slot(now: float) -> float:
    """Seconds from ``now`` to the next boundary of the fixed slot grid (multiples of
    ``SLOT_SECONDS`` on the caller's clock); a whole slot at a boundary.

    Slots lie on one grid however often the policy re-plans. Re-basing them on every
    decision instant (Algorithm 1 as written, whose rounds fall on slot boundaries) loses
    each guaranteed job the part of its window after its last whole slot at every mid-slot
    re-plan, and a job admitted with a tight plan then drops out of the guaranteed set.
    """
    boundary = (_grid_slot(now) + 1) * SLOT_SECONDS
    return min(SLOT_SECONDS, max(boundary - now, 1e-6))


def _grid_slot(now: float) -> int:
    """The index of the grid slot holding ``now`` (as :func:`first_slot` counts)."""
    return math.floor(now / SLOT_SECONDS + 1e-9)


def _slot_end(now: float, slots: int) -> float:
    """Where slot ``slots - 1`` of the timeline starting at ``now`` ends."""
    return now + first_slot(now) + (slots - 1) * SLOT_SECONDS


def _hard_job(job: JobView, now: float, pause: float) -> DeadlineJob | None:
    """The admission library's view of a job, or None if it cannot hold a reservation.

    The deadline is moved earlier by one pause (the job may be re-allocated before it
    runs), a conservative choice that keeps the slotted plan achievable with overhead.
    """
    if not _reservable(job, now, pause):
        return None
    assert job.deadline is not None
    slots, remaining = _budget(job, now, pause)
    return DeadlineJob(job.job_id, job.curve, remaining, _slot_end(now, slots))


def _reservable(job: JobView, now: float, pause: float) -> bool:
    """Whether :func:`_hard_job` gives a job (cheap: builds nothing)."""
    return job.deadline is not None and job.deadline - pause - now > _MIN_WINDOW_SECONDS


_MIN_WINDOW_SECONDS = 1.0
"""A job whose (paused) deadline is closer than this cannot hold a reservation."""


def _budget(job: JobView, now: float, pause: float) -> tuple[int, float]:
    """Whole slots a job may plan in, and the work it must plan in them.

    Algorithm 1 counts only the grid slots that end before the deadline. A guaranteed job
    re-planned in its last partial slot would then have none and lose its reservation (its
    deadline, met on admission, could be missed by the next arrival taking its devices).
    Such a job gets slot 0 instead, with its work scaled by ``slot 0 / window``: a share
    that finishes it at the same rate within the window it really has. A departure from the
    paper, which does not say how a partial last slot is re-planned.
    """
    assert job.deadline is not None
    window = job.deadline - pause - now
    first = first_slot(now)
    work = job.remaining_iterations
    if job.measured_speed is not None and job.measured_speed > 0:
        work /= job.measured_speed  # in the curve's iterations: what the plan can count on
    if window >= first:
        return (
            deadline_slots(job.deadline - pause, now, SLOT_SECONDS, f"job {job.job_id}", first),
            work,
        )
    return 1, work * first / window


def _feasible_plans(
    jobs: Sequence[JobView], capacity: int, now: float, pause: float
) -> dict[str, tuple[int, ...]] | None:
    """Algorithm 1 plans for the given hard jobs, or None if some deadline cannot be met."""
    hard: list[DeadlineJob] = []
    for job in jobs:
        converted = _hard_job(job, now, pause)
        if converted is None:
            return None
        hard.append(converted)
    if not hard:
        return {}
    plans = admit_from_scratch(capacity, now, SLOT_SECONDS, hard, first_slot(now))
    if plans is None:
        return None
    return {job.job_id: plan for job, plan in zip(hard, plans, strict=True)}


def _guaranteed(view: DeadlineView) -> dict[str, tuple[int, ...]]:
    """Plans for the largest EDF prefix-greedy set of active jobs that can all be guaranteed.

    All at once first; if that fails (an admitted job fell behind, e.g. through overhead),
    jobs are added in deadline order and kept only if the set stays feasible. Jobs left out
    get no minimum share and run on spare GPUs.
    """
    candidates = sorted(
        (job for job in view.jobs if _hard_job(job, view.now, view.pause_seconds) is not None),
        key=edf_key,
    )
    plans = _feasible_plans(candidates, view.capacity, view.now, view.pause_seconds)
    if plans is not None:
        return plans
    kept: list[JobView] = []
    plans = {}
    for job in candidates:
        trial = _feasible_plans([*kept, job], view.capacity, view.now, view.pause_seconds)
        if trial is not None:
            kept.append(job)
            plans = trial
    return plans


def admission_test(view: DeadlineView, candidate: JobView) -> bool:
    """ElasticFlow admission (sec. 4.1): the candidate and the guaranteed jobs all fit.

    The from-scratch reference: Algorithm 1 re-run over the guaranteed jobs and the
    candidate (see :class:`GuaranteePlanner` for the default).
    """
    if candidate.deadline is None:
        return True  # best effort: no reservation, never dropped (sec. 4.4)
    if _hard_job(candidate, view.now, view.pause_seconds) is None:
        return False
    kept = _guaranteed(view)
    guaranteed = [job for job in view.jobs if job.job_id in kept]
    return (
        _feasible_plans([*guaranteed, candidate], view.capacity, view.now, view.pause_seconds)
        is not None
    )


_ViewKey = tuple[float, int, float, tuple[str, ...]]

TOTALS_EVERY = 32
"""By default a filled timeline keeps its running reservation totals after every this many
jobs (:class:`_EdfPrefixes`)."""


@dataclass
class _EdfPrefixes:
    """Algorithm 1 re-run in deadline order over a timeline's guaranteed jobs, with what
    their reservations added up to after every ``every`` of them.

    Algorithm 1 re-run in deadline order over these jobs and a candidate fills every job
    before the candidate exactly as this re-fill did (each is filled into what the earlier
    ones leave), so the paper's admission test needs only the candidate and the jobs after
    it, filled on top of the nearest total before the candidate's place; and if the re-fill
    already dropped a job before that place, the test fails without filling anything. Same
    answer as the whole re-fill; a candidate with a late deadline costs a few fills instead
    of one per guaranteed job, and an earliest-deadline search many fewer.

    The re-fill stops at the first job it drops (:attr:`dropped_at`): nothing after it can
    change a test's answer. When the timeline itself was filled in deadline order, it is
    that re-fill (nothing dropped), and so is the first pass of :meth:`GuaranteePlanner.
    _keeping` over the jobs it goes on to keep.
    """

    timeline: AdmissionControl
    """The timeline whose guaranteed jobs these are."""
    size: int
    """How many jobs the timeline held when this was taken (it is void once one joins)."""
    jobs: list[JobView]
    """The timeline's guaranteed jobs as the view saw them, in deadline order."""
    keys: list[tuple[float, float]]
    """Their :func:`edf_key`."""
    totals: list[IntArray]
    """``totals[i]``: the reservations of the first ``i * every`` jobs (up to the drop)."""
    every: int
    filled: list[PlannedJob]
    """The re-fill's jobs before the drop (``jobs``' first ones, prepared), and ..."""
    plans: list[IntArray]
    """... the plans it gave them."""
    dropped_at: int | None = None
    """Where in :attr:`jobs` the re-fill dropped its first job (None: it kept them all)."""

    def valid_for(self, timeline: AdmissionControl) -> bool:
        return self.timeline is timeline and len(timeline.jobs) == self.size


@dataclass
class _Pass:
    """What one :meth:`GuaranteePlanner._fill` pass did, for :class:`_EdfPrefixes`."""

    totals: list[IntArray] = field(default_factory=list)
    """The timeline's reservations after every ``totals_every`` kept jobs (from none)."""
    dropped: list[int] = field(default_factory=list)
    """Positions (in the order offered) of the jobs that did not fit."""


def _view_key(view: DeadlineView, jobs: Sequence[JobView]) -> _ViewKey:
    """Identifies a decision instant: at one ``now`` the same jobs have the same state."""
    return (view.now, view.capacity, view.pause_seconds, tuple(job.job_id for job in jobs))


class GuaranteePlanner:
    """Admission and guaranteed shares through :class:`AdmissionControl` (the default).

    Equivalent to the from-scratch functions above, at O(n) progressive fills per event
    instead of O(n) from-scratch runs (each O(n)) in :func:`_guaranteed`'s fallback:

    - Guaranteed set: jobs are offered to one timeline in EDF order and kept if
      ``decide`` fits them. Every kept job has a deadline (hence slot count) no earlier than
      the kept ones, so ``decide`` only fills the job into what they leave, which is what
      Algorithm 1 re-run over ``[*kept, job]`` does: same set, same plans.
    - Admission: ``decide`` on that timeline, and Algorithm 1 re-run in deadline order
      over the guaranteed jobs and the candidate must keep them all (the paper's test;
      :meth:`_refill_keeps`). The candidate's timeline is kept for the scheduling round at
      the same instant, so that round honours the plans that admitted it. At later
      instants the guaranteed set is re-filled keeping every job that kept up with its
      plan (:meth:`_keeping`). Ties in slots are broken by EDF order here, by admission
      order in the reference.
    - Per-job lookup tables (``curve.table`` and the progress matrix, the bulk of
      ``prepare``) are built once per job and re-used with the current deadline slots and
      remaining iterations.
    """

    def __init__(self, *, prefix_refills: bool = True, totals_every: int = TOTALS_EVERY) -> None:
        """``prefix_refills=False``: every admission test re-fills from the first job (the
        reference :class:`_EdfPrefixes` is tested against); ``totals_every``: how often a
        filled timeline keeps its running totals (fewer: less copying, longer re-fills)."""
        if totals_every < 1:
            raise ValueError(f"totals_every: must be >= 1, got {totals_every}")
        self.prefix_refills = prefix_refills
        self.totals_every = totals_every
        self._templates: dict[str, PlannedJob] = {}
        self._memo: tuple[_ViewKey, AdmissionControl] | None = None
        self._built: tuple[AdmissionControl, set[str]] | None = None
        """The timeline jobs are allocated by and the ids of every job it considered."""
        self._considered: tuple[AdmissionControl, set[str]] | None = None
        """The last timeline built and the jobs it considered (acted on or not)."""
        self.used: AdmissionControl | None = None
        """The timeline the last :meth:`guaranteed` answered from (its slot 0 began at its
        ``now``), for :meth:`GuaranteePolicy.wakeup`."""
        self._prefixes: _EdfPrefixes | None = None
        """The deadline-order re-fill of the last timeline's guaranteed jobs (built with the
        timeline where that costs nothing, else on first use: :meth:`_edf_refill`)."""

    def _planned(self, job: JobView, timeline: AdmissionControl, pause: float) -> PlannedJob:
        template = self._templates.get(job.job_id)
        if template is None:
            hard = _hard_job(job, timeline.now, pause)
            assert hard is not None
            template = timeline.prepare(hard, f"job {job.job_id}")
            self._templates[job.job_id] = template
        slots, remaining = _budget(job, timeline.now, pause)
        return template.rebudget(slots, remaining, timeline.first_slot / SLOT_SECONDS)

    def timeline(self, view: DeadlineView) -> AdmissionControl:
        """The guaranteed jobs' timeline at ``view.now`` (memoised for the same view).

        Re-derived in EDF order (plans re-fitted to each job's real progress), unless that
        would drop a job the last timeline guaranteed: then the guaranteed jobs hold their
        plans (:meth:`_hold`). An EDF re-fill can drop one, as a job admitted into the gaps
        of earlier plans (see the class docstring) may not fit when every job is re-filled
        in deadline order; ElasticFlow's admitted jobs hold their reservations, so a
        guarantee once given is kept as long as the job keeps up with its plan.
        """
        key = _view_key(view, view.jobs)
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        candidates = sorted(
            (job for job in view.jobs if _reservable(job, view.now, view.pause_seconds)),
            key=edf_key,
        )
        previous = self._built[0] if self._built is not None else None
        self._prefixes = None
        if previous is None:
            record = _Pass()
            timeline = self._fill(view, candidates, self._fresh(view), record)
            self._remember_prefixes(view, timeline, record.totals)
        else:
            timeline = self._keeping(view, candidates, previous)
        self._memo = (key, timeline)
        self._considered = (timeline, {job.job_id for job in candidates})
        return timeline

    def _act_on(self, timeline: AdmissionControl, also: str = "") -> None:
        """The jobs are now allocated by ``timeline``'s plans: it is the one the next
        re-fill must keep (:meth:`_keeping`) and the one a later instant may reuse. A
        timeline built only to test a candidate that was then refused is not acted on (no
        round follows), so jobs keep following the plans they were allocated by."""
        considered = set()
        if self._considered is not None and self._considered[0] is timeline:
            considered = set(self._considered[1])
        if self._built is not None and self._built[0] is timeline:
            considered |= self._built[1]
        if also:
            considered.add(also)
        self._built = (timeline, considered)

    def _keeping(
        self, view: DeadlineView, candidates: Sequence[JobView], previous: AdmissionControl
    ) -> AdmissionControl:
        """Re-fill the guaranteed set, keeping every guarantee the last timeline gave to a
        job that kept up with its plan.

        Jobs guaranteed before are filled first (EDF), then the others (EDF): a job that
        fell behind and lost its reservation does not take it back from one on plan. If
        the re-fill still drops a job on plan (Algorithm 1 re-run in deadline order can
        fail where the plans it replaces fit, e.g. after a job was admitted into their
        gaps), that job is filled first and the rest again; if it cannot be kept that
        way, every job on plan holds its plan (:meth:`_held`), which fits by construction.
        Re-filling rather than holding old plans matters: a job that ran ahead of its plan
        on spare devices needs less than it reserved.

        Keeping every guarantee costs admissions on overloaded traces. Re-deriving the set
        in deadline order at every instant and dropping whoever no longer fits (what this
        planner did before) admitted about 1.6x as many jobs on itp cluster04's first
        3,000 (DSR 0.69 against 0.34 here), of which 1.6 % then missed deadlines they had
        been promised (0.2 % here, all through scaling pauses); a guarantee that can be
        taken back to admit someone else is not one (``stride sim`` reports both).
        """
        before = {planned.job.job_id for planned in previous.jobs}
        urgent: list[JobView] = []
        first_pass: _EdfPrefixes | None = None
        while True:
            first = {job.job_id for job in urgent}
            order = [
                *urgent,
                *sorted(
                    (job for job in candidates if job.job_id not in first),
                    key=lambda job: (job.job_id not in before, edf_key(job)),
                ),
            ]
            record = _Pass()
            timeline = self._fresh(view)
            if urgent:
                self._fill(view, order, timeline, record)
            else:
                # The jobs guaranteed before come first, in deadline order: up to its first
                # drop, this pass is the deadline-order re-fill of those jobs.
                held = sum(1 for job in order if job.job_id in before)
                self._fill(view, order[:held], timeline, record)
                first_pass = self._prefixes_of(timeline, order[:held], record)
                self._fill(view, order[held:], timeline, record)
            dropped = self._dropped_but_on_plan(view, candidates, previous, timeline)
            if not dropped:
                self._remember_prefixes(view, timeline, record.totals, first_pass)
                return timeline
            if dropped & first:
                on_plan = dropped | {
                    planned.job.job_id
                    for planned in previous.jobs
                    if planned.job.job_id in {job.job_id for job in candidates}
                }
                return self._held(view, candidates, previous, on_plan)
            urgent.extend(sorted((job for job in candidates if job.job_id in dropped), key=edf_key))

    def _dropped_but_on_plan(
        self,
        view: DeadlineView,
        candidates: Sequence[JobView],
        previous: AdmissionControl,
        fresh: AdmissionControl,
    ) -> set[str]:
        """Whether the EDF re-fill dropped a job the last timeline guaranteed although it
        kept up with its plan (that plan, minus the slots that passed, still finishes it).
        A job that fell behind (a scaling pause, a capacity loss) cannot be saved by
        holding plans, so then the re-fill stands: holding every plan for it would keep
        stale reservations and admit less (measured on itp cluster04's first 3,000 jobs:
        DSR 0.30 holding on any drop, against 0.66 re-filling)."""
        kept = {planned.job.job_id for planned in fresh.jobs}
        by_id = {job.job_id: job for job in candidates}
        passed = _grid_slot(view.now) - _grid_slot(previous.now)
        dropped = set()
        for planned, plan in zip(previous.jobs, previous.plans, strict=True):
            job = by_id.get(planned.job.job_id)
            if job is None or job.job_id in kept:
                continue
            if fresh.holds(self._planned(job, fresh, view.pause_seconds), plan[passed:]):
                dropped.add(job.job_id)
        return dropped

    @staticmethod
    def _fresh(view: DeadlineView) -> AdmissionControl:
        return AdmissionControl(
            view.capacity, view.now, SLOT_SECONDS, first_slot=first_slot(view.now)
        )

    def _fill(
        self,
        view: DeadlineView,
        jobs: Sequence[JobView],
        timeline: AdmissionControl,
        record: _Pass | None = None,
        *,
        stop: bool = False,
    ) -> AdmissionControl:
        """Offer ``jobs`` to ``timeline`` in order; keep each one that fits. ``record``
        notes the reservations' sum after every ``totals_every`` kept jobs (from none: see
        :class:`_EdfPrefixes`) and where jobs were dropped; ``stop``: stop at the first
        job dropped."""
        if record is not None and not timeline.jobs:
            record.totals.append(timeline.used.copy())
        for position, job in enumerate(jobs):
            planned = self._planned(job, timeline, view.pause_seconds)
            plans = timeline.decide(planned)
            if plans is None:
                if record is not None:
                    record.dropped.append(position)
                if stop:
                    break
                continue
            timeline.commit(planned, plans)
            if record is not None and len(timeline.jobs) % self.totals_every == 0:
                record.totals.append(timeline.used.copy())
        return timeline

    def _prefixes_of(
        self, filled: AdmissionControl, jobs: list[JobView], record: _Pass
    ) -> _EdfPrefixes:
        """What a fresh pass that offered ``jobs`` (in deadline order) to ``filled`` knows of
        their deadline-order re-fill: everything up to its first drop (there the number of
        jobs kept stops matching their place, so the totals after it are cut). It answers
        for ``filled`` as it stands; a caller whose guaranteed jobs these are puts its own
        timeline in (``replace``)."""
        dropped = record.dropped[0] if record.dropped else None
        limit = len(jobs) if dropped is None else dropped
        return _EdfPrefixes(
            filled,
            len(filled.jobs),
            jobs,
            [edf_key(job) for job in jobs],
            record.totals[: limit // self.totals_every + 1],
            self.totals_every,
            filled.jobs[:limit],
            filled.plans[:limit],
            dropped,
        )

    def _remember_prefixes(
        self,
        view: DeadlineView,
        timeline: AdmissionControl,
        totals: list[IntArray],
        first_pass: _EdfPrefixes | None = None,
    ) -> None:
        """Keep the deadline-order re-fill of ``timeline``'s jobs when it costs nothing:

        - the jobs it kept are in deadline order: then no fill re-planned an earlier job
          (``decide`` only re-fills jobs with later deadlines, and a job kept that way would
          sit out of order), so the timeline is that re-fill and ``totals`` its totals;
        - else ``first_pass`` (:meth:`_keeping`'s, over the jobs guaranteed before), if it
          offered exactly the jobs the timeline kept.
        """
        by_id = {job.job_id: job for job in view.jobs}
        jobs = [by_id[planned.job.job_id] for planned in timeline.jobs]
        if totals and all(a <= b for a, b in pairwise(edf_key(job) for job in jobs)):
            self._prefixes = self._prefixes_of(timeline, jobs, _Pass(totals))
        elif first_pass is not None and {job.job_id for job in first_pass.jobs} == {
            job.job_id for job in jobs
        }:
            self._prefixes = replace(first_pass, timeline=timeline, size=len(timeline.jobs))

    def _edf_refill(self, view: DeadlineView, timeline: AdmissionControl) -> _EdfPrefixes:
        """Algorithm 1 re-run in deadline order over ``timeline``'s guaranteed jobs, up to
        the first it drops (once per timeline; see :class:`_EdfPrefixes`)."""
        if self._prefixes is not None and self._prefixes.valid_for(timeline):
            return self._prefixes
        guaranteed = {planned.job.job_id for planned in timeline.jobs}
        jobs = sorted((job for job in view.jobs if job.job_id in guaranteed), key=edf_key)
        record = _Pass()
        refill = self._fill(view, jobs, self._fresh(view), record, stop=True)
        self._prefixes = replace(
            self._prefixes_of(refill, jobs, record), timeline=timeline, size=len(timeline.jobs)
        )
        return self._prefixes

    def _refill_from_prefix(
        self, view: DeadlineView, prefixes: _EdfPrefixes, candidate: JobView
    ) -> bool:
        """:meth:`_refill_keeps` from the candidate's place (see :class:`_EdfPrefixes`):
        the candidate and every later job filled on top of the jobs before it."""
        place = bisect.bisect_right(prefixes.keys, edf_key(candidate))
        if prefixes.dropped_at is not None and prefixes.dropped_at < place:
            return False  # a job before the candidate is dropped whatever it asks
        start = (place // prefixes.every) * prefixes.every
        refill = self._fresh(view)
        refill.jobs = list(prefixes.filled[:start])
        refill.plans = list(prefixes.plans[:start])
        refill.used = prefixes.totals[start // prefixes.every].copy()
        rest = prefixes.jobs
        for job in [*rest[start:place], candidate, *rest[place:]]:
            planned = self._planned(job, refill, view.pause_seconds)
            plans = refill.decide(planned)
            if plans is None:
                return False  # one job dropped: the test fails, whatever follows
            refill.commit(planned, plans)
        return True

    def _held(
        self,
        view: DeadlineView,
        candidates: Sequence[JobView],
        previous: AdmissionControl,
        holding: set[str],
    ) -> AdmissionControl:
        """The ``holding`` jobs keep their plans where those still finish them and fit;
        every other candidate is then offered in EDF order."""
        timeline = self._fresh(view)
        passed = _grid_slot(view.now) - _grid_slot(previous.now)
        by_id = {job.job_id: job for job in candidates}
        held: set[str] = set()
        for planned, plan in zip(previous.jobs, previous.plans, strict=True):
            job = by_id.get(planned.job.job_id)
            if job is None or job.job_id not in holding:
                continue
            current = self._planned(job, timeline, view.pause_seconds)
            if timeline.hold(current, plan[passed:]):
                held.add(job.job_id)
        return self._fill(view, [job for job in candidates if job.job_id not in held], timeline)

    def _still_valid(self, view: DeadlineView) -> AdmissionControl | None:
        """The last timeline, if only completions happened since, within its first slot.

        A completion only frees reservations, so every other guaranteed job's plan stays
        feasible; re-deriving the guaranteed set would only re-consider jobs left out earlier
        (they fell behind), which then wait for the next arrival or slot to be re-considered.
        """
        if self._built is None:
            return None
        timeline, considered = self._built
        if not 0.0 <= view.now - timeline.now < timeline.first_slot - 1e-6:  # a new grid slot
            return None
        if timeline.capacity != view.capacity:
            return None
        for job in view.jobs:
            if job.job_id not in considered and _reservable(job, view.now, view.pause_seconds):
                return None
        return timeline

    def guaranteed(self, view: DeadlineView) -> dict[str, int]:
        """Each guaranteed job's minimum share in the current slot.

        Re-uses the last timeline when only completions happened since it was built, in the
        same slot (:meth:`_still_valid`); otherwise re-derives it (:meth:`timeline`).
        """
        key_matches = self._memo is not None and self._memo[0] == _view_key(view, view.jobs)
        reused = None if key_matches else self._still_valid(view)
        if reused is not None:
            self.used = reused
            present = {job.job_id for job in view.jobs}
            return {
                planned.job.job_id: int(plan[0]) if plan.size else 0
                for planned, plan in zip(reused.jobs, reused.plans, strict=True)
                if planned.job.job_id in present
            }
        timeline = self.timeline(view)
        self.used = timeline
        self._act_on(timeline)
        return {
            planned.job.job_id: int(plan[0]) if plan.size else 0
            for planned, plan in zip(timeline.jobs, timeline.plans, strict=True)
        }

    def fits(self, view: DeadlineView, candidate: JobView) -> bool:
        """Whether :meth:`admit` would admit ``candidate`` now, changing nothing."""
        if not self.fits_held(view, candidate):
            return False
        if candidate.deadline is None:
            return True
        return self._refill_keeps(view, self.timeline(view), candidate)

    def fits_held(self, view: DeadlineView, candidate: JobView) -> bool:
        """The first half of :meth:`fits`, and the cheap one: ``candidate`` fits into what
        the held plans leave free (no re-fill). Necessary for :meth:`fits`, so a search
        may use it to find where to start checking the whole test."""
        if candidate.deadline is None:
            return True
        if not _reservable(candidate, view.now, view.pause_seconds):
            return False
        timeline = self.timeline(view)
        return timeline.decide(self._planned(candidate, timeline, view.pause_seconds)) is not None

    def refillable(self, view: DeadlineView) -> bool:
        """Whether Algorithm 1 re-run in deadline order keeps every guaranteed job *without*
        a candidate. When it does not (jobs admitted into the gaps of held plans, on an
        overloaded cluster), the earliest-deadline search reports that no deadline can be
        guaranteed now: filling a job in only takes room from the jobs after it. (Exactly
        so for curves of contiguous sizes; with gaps in a curve a job at a larger size can
        use fewer devices in a slot, so this only shapes a refusal's message, never the
        admission test.) Answered once per timeline, by the re-fill the admission test
        starts from (:meth:`_edf_refill`)."""
        timeline = self.timeline(view)
        return self._edf_refill(view, timeline).dropped_at is None

    def refill_keeps(self, view: DeadlineView, candidate: JobView) -> bool:
        """The paper's half of :meth:`fits` alone: Algorithm 1 re-run in deadline order over
        the guaranteed jobs and a hard ``candidate`` keeps them all."""
        return self._refill_keeps(view, self.timeline(view), candidate)

    def _refill_keeps(
        self, view: DeadlineView, timeline: AdmissionControl, candidate: JobView
    ) -> bool:
        """Whether Algorithm 1 re-run in deadline order over the guaranteed jobs and the
        candidate keeps them all: the paper's admission test (sec. 4.1, "it checks whether
        the deadline of all admitted jobs can still be satisfied after adding the new
        job"), on top of fitting the candidate into what the held plans leave free. A job
        admitted only into the gaps of held plans is the case Algorithm 1's later re-runs
        cannot keep, and :meth:`_keeping` then has to hold stale plans for it."""
        # Not answered from refillable's "blocked": that a candidate only takes room from
        # the jobs after it holds for contiguous sizes, not exactly for curves with gaps, and
        # the simulator never asks; the test re-fills, so both decide alike.
        if self.prefix_refills:
            return self._refill_from_prefix(view, self._edf_refill(view, timeline), candidate)
        guaranteed = {planned.job.job_id for planned in timeline.jobs}
        jobs = sorted(
            [*(job for job in view.jobs if job.job_id in guaranteed), candidate], key=edf_key
        )
        refill = self._fill(view, jobs, self._fresh(view))
        return len(refill.jobs) == len(jobs)

    def reservations(self, view: DeadlineView) -> dict[str, tuple[int, ...]]:
        """Each guaranteed job's reserved devices per slot from ``view.now`` (slot 0 first)."""
        timeline = self.timeline(view)
        return {
            planned.job.job_id: tuple(int(devices) for devices in plan)
            for planned, plan in zip(timeline.jobs, timeline.plans, strict=True)
        }

    def forget(self, job_id: str) -> None:
        """Drop a job's lookup tables once it ended or was refused (a long-running service
        would otherwise keep every job it ever planned)."""
        self._templates.pop(job_id, None)

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Incremental admission test (see the class docstring)."""
        if candidate.deadline is None:
            return True
        if not _reservable(candidate, view.now, view.pause_seconds):
            return False
        timeline = self.timeline(view)
        planned = self._planned(candidate, timeline, view.pause_seconds)
        plans = timeline.decide(planned)
        if plans is None:
            return False
        if not self._refill_keeps(view, timeline, candidate):
            return False
        timeline.commit(planned, plans)
        self._memo = (_view_key(view, [*view.jobs, candidate]), timeline)
        self._act_on(timeline, candidate.job_id)
        return True


@dataclass
class GuaranteePolicy:
    """ElasticFlow as Stride runs it: admission (Alg. 1) + greedy allocation (Alg. 2).

    ``incremental`` (default) plans through :class:`GuaranteePlanner`; False re-runs
    Algorithm 1 from scratch at every decision (the reference, for benchmarks).
    """

    name: str = "stride"
    incremental: bool = True
    placement: str = "buddy"
    """Where the environment puts the GPUs (sec. 4.3): buddy allocation with migration."""
    notes: dict[str, str] = field(default_factory=dict, repr=False)
    """After :meth:`decide`: why jobs lost units to higher priority classes (by job id)."""
    _planner: GuaranteePlanner = field(default_factory=GuaranteePlanner, repr=False)

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """The first slot boundary at which a guaranteed job's reservation exceeds what it
        was just given; else None (rounds run on arrivals and completions, sec. 3.2).

        Without it a guarantee can be lost: a plan of 1 device now and 2 in a later slot
        needs a round at that slot's start, and none comes if nothing arrives or ends (the
        property test in ``tests/unit/policy/test_guarantees.py`` finds such cases). Waking
        at every boundary instead costs a pause per re-sized job for nothing: measured on
        whole itp cluster02 and 03, it met no more deadlines (DSR 0.788 vs 0.804 and 0.448
        vs 0.446), as greedy allocation usually runs admitted jobs ahead of their plans.

        Also the first instant a job left waiting by ``decision`` is promoted a class by
        aging (:mod:`.priorities`): nothing else would wake a quiet cluster for it.
        """
        aging = self._aging(view, decision)
        slot = self._slot_wakeup(view, decision)
        if aging is None or (slot is not None and slot <= aging):
            return slot
        return aging

    def _aging(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """When the next waiting job is promoted a class (None: nobody waits to be)."""
        if view.capacity <= 0:
            return None
        shares = self._shares(view)
        first = math.inf
        for job in view.jobs:
            if decision.get(job.job_id, 0) or job.job_id in shares:
                continue
            since = view.now if job.devices else job.waiting_since
            if since is None:
                since = view.now  # it loses its units in this round
            at = promotion_after(job.priority, since, view.now)
            if at is not None:
                first = min(first, at)
        return None if first == math.inf else first

    def _slot_wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        timeline = self._planner.used if self.incremental else None
        if timeline is None or view.capacity <= 0:
            return None
        first = math.inf
        for planned, plan in zip(timeline.jobs, timeline.plans, strict=True):
            given = decision.get(planned.job.job_id)
            if given is None or plan.size < 2:
                continue
            grows = np.flatnonzero(plan[1:] > given)
            if grows.size:
                first = min(first, int(grows[0]) + 1)
        if first == math.inf:
            return None
        return timeline.now + timeline.first_slot + (first - 1) * SLOT_SECONDS

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Admit only with a guaranteed deadline (minimum satisfactory share exists)."""
        if view.capacity <= 0:  # every node lost or drained: nothing can be guaranteed
            return candidate.deadline is None
        if self.incremental:
            return self._planner.admit(view, candidate)
        return admission_test(view, candidate)

    def fits(self, view: DeadlineView, candidate: JobView) -> bool:
        """Whether :meth:`admit` would admit ``candidate`` now, without admitting it."""
        if view.capacity <= 0:
            return candidate.deadline is None
        if self.incremental:
            return self._planner.fits(view, candidate)
        return admission_test(view, candidate)

    def fits_held(self, view: DeadlineView, candidate: JobView) -> bool:
        """A necessary condition of :meth:`fits`, cheaper: the candidate fits beside the
        guaranteed jobs' held plans (the re-fill not tried)."""
        if view.capacity <= 0:
            return candidate.deadline is None
        if self.incremental:
            return self._planner.fits_held(view, candidate)
        return admission_test(view, candidate)

    def blocked(self, view: DeadlineView) -> bool:
        """Whether no deadline at all can be guaranteed now: Algorithm 1 re-run over the
        guaranteed jobs alone no longer keeps them all (:meth:`GuaranteePlanner.refillable`),
        so the paper's admission test fails for every candidate until some of them end."""
        return view.capacity > 0 and self.incremental and not self._planner.refillable(view)

    def earliest_deadline(self, view: DeadlineView, candidate: JobView) -> float | None:
        """The earliest deadline at which ``candidate`` would be admitted now, or None.

        ElasticFlow only drops a job it cannot guarantee; a user needs to know what to ask
        for instead. Deadlines are tried at grid slot ends after one pause (what admission
        can count, :func:`_hard_job`): from the fewest slots in which the job could finish
        alone on the whole cluster, doubling until one fits, then bisecting. Admission is monotone
        in the deadline in all but rare re-fill orders, and the answer is always one that
        :meth:`fits` accepted. None: it does not fit even alone within ``MAX_SLOTS`` (or
        not at all: its smallest size exceeds the cluster).
        """
        curve = candidate.curve
        if view.capacity <= 0 or self.blocked(view):
            return None
        fastest = curve.throughput(curve.usable(min(curve.max_size, view.capacity)))
        if fastest <= 0:
            return None
        limit = MAX_SLOTS - 1

        def deadline(slots: int) -> float:
            return _slot_end(view.now, slots) + view.pause_seconds

        def fits(slots: int) -> bool:
            return self.fits(view, replace(candidate, deadline=deadline(slots)))

        def fits_held(slots: int) -> bool:
            return self.fits_held(view, replace(candidate, deadline=deadline(slots)))

        first = first_slot(view.now)
        alone = (candidate.remaining_iterations / fastest - first) / SLOT_SECONDS
        low = max(1, 1 + math.ceil(alone - 1e-9))
        if low > limit:
            return None
        # The cheap half of the test first (it fails at least wherever the whole one does),
        # then the whole test from there: the same answer with few re-fills, as a deadline
        # that fits the held plans nearly always keeps the re-fill too.
        start = self._smallest(fits_held, low, limit)
        if start is None:
            return None
        found = start if fits(start) else self._smallest(fits, start + 1, limit)
        return None if found is None else deadline(found)

    @staticmethod
    def _smallest(test: Callable[[int], bool], low: int, limit: int) -> int | None:
        """The fewest slots in ``low .. limit`` that pass ``test`` (monotone in all but
        rare re-fill orders): doubling until one passes, then bisecting."""
        if low > limit:
            return None
        failed, high = low - 1, low
        while not test(high):
            if high >= limit:
                return None
            failed, high = high, min(limit, 2 * high)
        while high - failed > 1:
            middle = (failed + high) // 2
            if test(middle):
                high = middle
            else:
                failed = middle
        return high

    def reservations(self, view: DeadlineView) -> dict[str, tuple[int, ...]]:
        """Each guaranteed job's reserved devices per slot (slot 0 = now), by job id."""
        if view.capacity <= 0:
            return {}
        if self.incremental:
            return self._planner.reservations(view)
        return _guaranteed(view)

    def forget(self, job_id: str) -> None:
        """Free what the planner keeps for a job that ended or was refused."""
        self._planner.forget(job_id)

    def minimum_shares(self, view: DeadlineView) -> dict[str, int]:
        """Each guaranteed job's minimum satisfactory share in the current slot."""
        return self._shares(view)

    def _shares(self, view: DeadlineView) -> dict[str, int]:
        if view.capacity <= 0:
            return {}
        if self.incremental:
            return self._planner.guaranteed(view)
        return {job_id: (plan[:1] or (0,))[0] for job_id, plan in _guaranteed(view).items()}

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """Minimum shares of this slot first, then spare GPUs by marginal return; with jobs
        of more than one priority class (or a starving job), the rest by class
        (:mod:`.priorities`, whose rule :attr:`notes` explains for jobs that lost units)."""
        self.notes = {}
        if view.capacity <= 0:
            return {job.job_id: 0 for job in view.jobs}
        shares = self._shares(view)
        now = view.now
        if mixed(
            class_of(job.priority, shares.get(job.job_id), job.waiting_since, job.devices, now)
            for job in view.jobs
        ):
            contenders = [
                Contender(
                    job.job_id,
                    job.curve,
                    job.priority,
                    job.weight,
                    job.submission_time,
                    job.devices,
                    job.waiting_since,
                    shares.get(job.job_id),
                    job.deadline is not None,
                )
                for job in view.jobs
            ]
            split = prioritized(contenders, view.capacity, view.now)
            self.notes = split.notes
            return split.units
        ordered = sorted(view.jobs, key=edf_key)
        request = AllocationRequest(
            capacity=view.capacity,
            jobs=tuple(
                AllocationJob(
                    job_id=job.job_id,
                    curve=job.curve,
                    minimum_share=shares.get(job.job_id, 0),
                    kind=JobKind.HARD if job.deadline is not None else JobKind.BEST_EFFORT,
                )
                for job in ordered
            ),
        )
        counts = allocate(request)
        return {job.job_id: count for job, count in zip(ordered, counts, strict=True)}
