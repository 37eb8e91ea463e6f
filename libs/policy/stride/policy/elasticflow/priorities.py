"""Priorities beside deadlines: who gets what is left after the guarantees.

ElasticFlow (sec. 4) knows deadlines and no priorities; KOD2 (sec. 3) knows priorities
(weights), preemption by scale-in and starvation aging, and no deadlines. No paper combines
them, so this is Stride's rule, run by the live admission service and by ``stride sim``
alike (through :meth:`GuaranteePolicy.decide`):

1. **A guarantee is a promise.** Every guaranteed job first gets its minimum satisfactory
   share (Algorithm 1), whatever its priority, and whether a deadline is guaranteed
   depends only on the jobs already guaranteed, never on priorities: a high-priority job
   is not admitted by breaking another job's guarantee, and a low-priority guaranteed job
   is never preempted below its reservation.
2. **The rest goes by class.** Classes are the spec's priorities, LOW < NORMAL < HIGH,
   taken from the highest. In its turn a class first starts its jobs at their *smallest
   size* (the curve's first allowed size), then grows them by marginal return (ElasticFlow's
   Algorithm 2 within the class). A job holding units keeps its smallest size until its
   class's turn unless a higher class needs it, so a higher-class job takes, in this
   order, idle units, lower classes' extra units (scale-in, KOD2 Algorithm 2: never below
   a job's smallest size), and only then whole lower-class jobs (preemption: the lowest
   class, then the lowest weight, then the latest arrival first; nobody is preempted for
   a job that would not fit even then). The whole-job preemption is the issue's, not
   KOD2's (which only scales in).
3. **Within a class** no job preempts another whole: the jobs holding units keep their
   smallest size first (KOD2 Alg. 2 line 5: an equal job that came first keeps its
   workers), then the waiting ones start, by KOD2 weight (eq. 1) and then arrival.
4. **Aging** (KOD2 lines 27-29, STARVELIMIT): a job that has waited without units for
   :data:`STARVE_LIMIT_SECONDS` is promoted one class per limit waited (up to HIGH)
   and goes first among the waiting jobs of its new class (KOD2's weight ``1 + w``); like
   any waiting job it takes no smallest size from a holder of its own class. Once it runs
   it competes in its own class again (KOD2: "with its own weight"), so jobs that cannot
   run together take turns (a low one runs 300 s for a normal one's 600 s: each holds the
   units until the other has waited up to a class above it). Departure:
   KOD2 ages weights
   within one queue; with classes, a weight alone would let a low job wait for ever behind
   a stream of normal ones. Guaranteed jobs are never aged: their promise covers them.

With one class among the jobs and nobody starving (every trace ``stride sim`` replays; a
cluster where nobody sets a priority) the spare goes by ElasticFlow's Algorithm 2 exactly,
with no smallest-size pass, so priorities change nothing there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from stride.policy.elasticflow.admission import JobKind
from stride.policy.elasticflow.allocation import AllocationJob, AllocationRequest, allocate
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.kod2 import STARVE_LIMIT_SECONDS

__all__ = [
    "HIGH",
    "LOW",
    "NORMAL",
    "STARVE_LIMIT_SECONDS",
    "Contender",
    "Split",
    "by_class",
    "class_of",
    "effective_class",
    "mixed",
    "prioritized",
    "promotion_after",
    "unit_weight",
]

LOW, NORMAL, HIGH = 1, 2, 3
"""Priority classes, as ``stride.events.v1.Priority`` numbers them (0, unset, is NORMAL)."""
CLASS_NAMES = {LOW: "low", NORMAL: "normal", HIGH: "high"}


def unit_weight(min_workers: int, min_units: int, capacity: int) -> float:
    """KOD2 eq. 1 for a job counted in units (GPUs, or CPU units of a core and its memory):
    ``1 / (1 + exp(-w'))`` with ``w' = min_workers / (cpu share + memory share)``; a unit's
    cores and memory are the same share of the cluster, so the sum is
    ``2 * min_units / capacity``."""
    if min_units <= 0 or capacity <= 0:
        return 0.0
    raw = max(min_workers, 1) / (2.0 * min_units / capacity)
    return 1.0 / (1.0 + math.exp(-min(raw, 700.0)))


@dataclass(frozen=True)
class Contender:
    """One job as priorities see it."""

    job_id: str
    curve: ScalingCurve
    priority: int
    weight: float
    submitted: float
    holding: int
    """Units held now (before this decision)."""
    waiting_since: float | None
    """Since when the job has held no units (None while it holds some)."""
    guaranteed: int | None
    """Its guaranteed minimum share this slot (None: not guaranteed)."""
    hard: bool


def effective_class(
    job: Contender, now: float, limit: float = STARVE_LIMIT_SECONDS
) -> tuple[int, bool]:
    """The class a job competes in now and whether it is starving (rule 4)."""
    return class_of(job.priority, job.guaranteed, job.waiting_since, job.holding, now, limit)


def class_of(
    priority: int,
    guaranteed: int | None,
    waiting_since: float | None,
    holding: int,
    now: float,
    limit: float = STARVE_LIMIT_SECONDS,
) -> tuple[int, bool]:
    """:func:`effective_class` from the fields it reads (a caller with many jobs need not
    build a :class:`Contender` for each to learn that classes decide nothing)."""
    base = priority if priority in CLASS_NAMES else NORMAL
    if guaranteed is not None or waiting_since is None or holding:
        return base, False
    steps = _limits_waited(now - waiting_since, limit)
    if steps < 1:
        return base, False
    return min(HIGH, base + steps), True


def _limits_waited(waited: float, limit: float) -> int:
    """Whole STARVELIMITs in ``waited`` (a microsecond of slack, so a round woken at the
    promotion instant promotes whatever the float rounding of the subtraction)."""
    return max(0, math.floor((waited + 1e-6) / limit))


def promotion_after(
    priority: int, waiting_since: float, now: float, limit: float = STARVE_LIMIT_SECONDS
) -> float | None:
    """The first instant after ``now`` at which a job waiting since ``waiting_since`` is
    promoted a class (None: it is at the top already, or will be by then)."""
    base = priority if priority in CLASS_NAMES else NORMAL
    steps = _limits_waited(now - waiting_since, limit)
    if base + steps >= HIGH:
        return None
    return waiting_since + (steps + 1) * limit


@dataclass(frozen=True)
class Split:
    """Units per job, and why jobs that held units got fewer (empty when nothing was
    taken for a higher class)."""

    units: dict[str, int]
    notes: dict[str, str]


def by_class(jobs: Sequence[Contender], now: float) -> bool:
    """Whether priorities decide anything here: jobs of more than one effective class, or a
    starving job (else :func:`prioritized` is ElasticFlow's Algorithm 2 and is not run)."""
    return mixed(effective_class(job, now) for job in jobs)


def mixed(ranked: Iterable[tuple[int, bool]]) -> bool:
    """Whether jobs ranked by :func:`effective_class` are of more than one class, or one
    of them starves: then :func:`prioritized` decides."""
    levels = set()
    for level, starving in ranked:
        if starving:
            return True
        levels.add(level)
    return len(levels) > 1


def prioritized(jobs: Sequence[Contender], capacity: int, now: float) -> Split:
    """Rules 1-4 over ``jobs`` on ``capacity`` units (guaranteed minimums fit by the
    admission test)."""
    ranked = {job.job_id: effective_class(job, now) for job in jobs}
    units = {job.job_id: job.guaranteed or 0 for job in jobs}

    def smallest(job: Contender) -> int:
        return job.curve.sizes[0]

    # Jobs holding units keep their smallest size unless a higher class needs it (rule 2):
    # until their class's turn, those sizes are reserved. The totals are kept as units
    # change, so each question costs O(1) whatever the number of jobs.
    by_id = {job.job_id: job for job in jobs}
    kept = {job.job_id for job in jobs if job.holding and units[job.job_id] < smallest(job)}
    reserved: dict[int, int] = {}
    for job_id in kept:
        level = ranked[job_id][0]
        reserved[level] = reserved.get(level, 0) + smallest(by_id[job_id]) - units[job_id]
    total = sum(units.values())

    def free(level: int) -> int:
        below = sum(held for kept_level, held in reserved.items() if kept_level < level)
        return capacity - total - below

    def release(job_id: str) -> None:
        """A kept job's reserved size is no longer held for it."""
        if job_id in kept:
            kept.discard(job_id)
            level = ranked[job_id][0]
            reserved[level] -= smallest(by_id[job_id]) - units[job_id]

    def assign(job_id: str, value: int) -> None:
        nonlocal total
        total += value - units[job_id]
        units[job_id] = value

    # Both orders are used by stable sorts: jobs equal in every key keep their arrival
    # order (not their ids, random in the live service; see edf_key).
    def order(job: Contender) -> tuple[int, int, float, float]:
        return (
            0 if job.holding else 1,  # rule 3: holders of the class keep their smallest size
            0 if ranked[job.job_id][1] else 1,  # rule 4: then the starving, first in line
            -job.weight,
            job.submitted,
        )

    def victim_order(job: Contender) -> tuple[int, float, float]:
        """Who is preempted first: the lowest class, the lowest weight, the latest."""
        return (ranked[job.job_id][0], job.weight, -job.submitted)

    for level in sorted({level for level, _ in ranked.values()}, reverse=True):
        members = sorted((job for job in jobs if ranked[job.job_id][0] == level), key=order)
        for job in members:  # starts: smallest sizes, by preemption of lower classes if need be
            release(job.job_id)
            need = smallest(job) - units[job.job_id]
            if need <= 0:
                continue
            room = free(level)
            if need > room:
                victims = sorted(
                    (o for o in jobs if o.job_id in kept and ranked[o.job_id][0] < level),
                    key=victim_order,
                )
                chosen: list[str] = []
                for victim in victims:
                    if need <= room:
                        break
                    chosen.append(victim.job_id)
                    room += smallest(victim) - units[victim.job_id]
                if need > room:
                    continue  # not even all lower classes make room: it waits, nobody moves
                for victim_id in chosen:
                    release(victim_id)
            assign(job.job_id, smallest(job))
        spare = free(level)
        if spare <= 0:
            continue
        held = sum(units[job.job_id] for job in members)
        counts = allocate(  # growth within the class: ElasticFlow's Algorithm 2
            AllocationRequest(
                capacity=held + spare,
                jobs=tuple(
                    AllocationJob(
                        job.job_id,
                        job.curve,
                        minimum_share=units[job.job_id],
                        kind=JobKind.HARD if job.hard else JobKind.BEST_EFFORT,
                    )
                    for job in members
                ),
            )
        )
        for job, count in zip(members, counts, strict=True):
            assign(job.job_id, count)
    return Split(units, _notes(jobs, units, ranked))


def _notes(
    jobs: Sequence[Contender], units: Mapping[str, int], ranked: Mapping[str, tuple[int, bool]]
) -> dict[str, str]:
    """Why each job that held units holds fewer now, when a higher class took them."""
    notes: dict[str, str] = {}
    for job in jobs:
        given = units[job.job_id]
        if given >= job.holding:
            continue
        level = ranked[job.job_id][0]
        above = sorted(
            other.job_id
            for other in jobs
            if ranked[other.job_id][0] > level and units[other.job_id] > other.holding
        )
        if not above:
            continue
        named = ", ".join(above[:3]) + (f" and {len(above) - 3} more" if len(above) > 3 else "")
        what = "preempted" if given == 0 else f"scaled in from {job.holding} to {given} units"
        notes[job.job_id] = (
            f"{what} for higher-priority jobs ({named}); class {CLASS_NAMES.get(level, str(level))}"
        )
    return notes
