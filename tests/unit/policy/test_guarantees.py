"""Deadline guarantees: earliest deadlines by hand, units, and the model's promise kept."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import (
    SLOT_SECONDS,
    DeadlineView,
    GuaranteePolicy,
    JobView,
)
from stride.policy.elasticflow.units import (
    GIB,
    CpuUnit,
    InvalidUnits,
    cpu_capacity,
    cpu_units,
    gpu_curve,
    profile_curve,
)

LINEAR = ScalingCurve((1, 2, 4), (1.0, 2.0, 4.0))
PAUSE = 20.0


def job(job_id: str, work: float, deadline: float | None, now: float = 0.0) -> JobView:
    return JobView(job_id, LINEAR, work, deadline, now, 0, 0, 0.0, work)


def view(jobs: tuple[JobView, ...] = (), capacity: int = 4, now: float = 0.0) -> DeadlineView:
    return DeadlineView(now, capacity, jobs, PAUSE)


def test_the_earliest_deadline_of_a_job_alone_is_its_fastest_run_in_whole_slots() -> None:
    # 4 GPUs at 4 it/s: 3,000 iterations take 750 s, i.e. 3 slots of 300 s after the pause.
    policy = GuaranteePolicy()
    earliest = policy.earliest_deadline(view(), job("a", 3000.0, 100.0))
    assert earliest == PAUSE + 3 * SLOT_SECONDS
    assert policy.fits(view(), job("a", 3000.0, earliest))
    assert not policy.fits(view(), job("a", 3000.0, earliest - 1.0))


def test_the_earliest_deadline_waits_for_the_guaranteed_jobs_reservations() -> None:
    # "g" holds all 4 GPUs for its first 4 slots (4,800 it at 4 it/s, due in 4 slots).
    policy = GuaranteePolicy()
    guaranteed = job("g", 4800.0, PAUSE + 4 * SLOT_SECONDS)
    assert policy.admit(view(), guaranteed)
    # A candidate of 1,200 iterations needs one slot of all 4 GPUs: the fifth.
    earliest = policy.earliest_deadline(view((guaranteed,)), job("c", 1200.0, 10.0))
    assert earliest == PAUSE + 5 * SLOT_SECONDS


def test_a_job_larger_than_the_cluster_has_no_earliest_deadline() -> None:
    wide = JobView("w", ScalingCurve((8,), (8.0,)), 100.0, 400.0, 0.0, 0, 0, 0.0, 100.0)
    assert GuaranteePolicy().earliest_deadline(view(), wide) is None


def test_cpu_units_count_the_dominant_resource_and_the_cluster_its_scarcer_one() -> None:
    unit = CpuUnit(1.0, 4 * GIB)
    assert cpu_units(2.0, 4 * GIB, unit) == 2  # cores dominate
    assert cpu_units(1.0, 10 * GIB, unit) == 3  # memory dominates, rounded up
    assert cpu_capacity(16.0, 32 * GIB, unit) == 8  # memory is scarcer
    with pytest.raises(InvalidUnits, match=r"unit\.cpu"):
        CpuUnit(0.0)


def test_a_profile_becomes_a_concave_curve_over_units_with_its_sizes() -> None:
    curve = profile_curve(
        [(1, 1, 10.0), (2, 1, 14.0), (3, 1, 15.0), (4, 1, 20.0)],
        (1.0, 2 * GIB),
        (1.0, 2 * GIB),
        CpuUnit(),
    )
    # Units 2, 3, 4, 5; (4 units, 15/s) lies under the chord from 3 to 5 and is dropped.
    assert curve.curve.sizes == (2, 3, 5)
    size = curve.size_at(4)
    assert size is not None and size.workers == 2  # 4 units run the 3-unit size
    assert gpu_curve([(1, 1.0), (2, 1.5)]).curve.sizes == (1, 2)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "known gap (issue #14 stays open for it): a re-plan in the middle of a slot re-bases "
        "the slots on the present, so a guaranteed job loses the part of its window after its "
        "last whole slot and can drop out of the guaranteed set (e.g. 8,349 iterations due at "
        "2,746 s re-planned at 346 s see 7 slots, 2,100 s, where 2,354 s remain). Fixing it "
        "needs slots on a fixed grid with a partial first slot in Algorithm 1's filling."
    ),
)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 3000.0),  # arrival
            st.floats(100.0, 20_000.0),  # iterations
            st.floats(0.3, 3.0),  # deadline tightness: multiple of the fastest run
            st.booleans(),  # has a deadline
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(2, 8),
)
@example(  # the gap named in the xfail reason, tried on every run
    [
        (0.0, 346.0, 1.0, False),
        (0.0, 100.0, 1.0, False),
        (0.0, 519.0, 1.0, False),
        (0.0, 8349.0, 0.9375, True),
    ],
    5,
)
def test_no_admitted_job_misses_its_deadline_under_the_model(
    arrivals: list[tuple[float, float, float, bool]], capacity: int
) -> None:
    """Arrivals and completions in any order: every admitted deadline is met when each job
    runs as the policy decides.

    The model is ElasticFlow's (sec. 4.1): the curve, with no scaling overhead. With the
    simulator's 20 s pause after every change the promise can fail (a job re-sized by many
    arrivals pauses many times while admission reserved one pause); ``stride sim`` measures
    that gap (about 95 % of admitted jobs meet their deadline on the ITP traces).
    """
    pause = 0.0
    policy = GuaranteePolicy()
    curve = ScalingCurve((1, 2, 4, 8), (1.0, 1.8, 3.2, 5.6))
    events = sorted((at, index) for index, (at, *_rest) in enumerate(arrivals))
    remaining: dict[str, float] = {}
    deadlines: dict[str, float | None] = {}
    units: dict[str, int] = {}
    paused: dict[str, float] = {}
    finished: dict[str, float] = {}
    clock = 0.0

    def views(now: float) -> DeadlineView:
        return DeadlineView(
            now,
            capacity,
            tuple(
                JobView(j, curve, remaining[j], deadlines[j], 0.0, 0, units[j], paused[j], 1.0)
                for j in remaining
            ),
            pause,
        )

    timer = math.inf

    def advance(to: float) -> None:
        nonlocal clock, timer
        # Step through completions and the policy's wakeups until ``to``.
        while True:
            next_end, who = math.inf, ""
            for j, left in remaining.items():
                if units[j]:
                    end = max(clock, paused[j]) + left / curve.throughput(units[j])
                    if end < next_end:
                        next_end, who = end, j
            stop = min(to, next_end, timer)
            for j, left in list(remaining.items()):
                start = max(clock, paused[j])
                if units[j] and stop > start:
                    remaining[j] = max(0.0, left - curve.throughput(units[j]) * (stop - start))
            clock = stop
            if stop == timer and timer <= to and timer < next_end:
                timer = math.inf
                decide(stop)
                continue
            if not who or next_end > to:
                return
            # Every job done at this instant ends before the round (simultaneous ends).
            done = [j for j, left in remaining.items() if units[j] and left <= 1e-9]
            for j in done or [who]:
                finished[j] = next_end
                for table in (remaining, deadlines, units, paused):
                    table.pop(j)
            decide(next_end)

    def decide(now: float) -> None:
        nonlocal timer
        current = views(now)
        decision = policy.decide(current)
        for j, count in decision.items():
            if count != units[j]:
                units[j] = count
                if count:
                    paused[j] = now + pause
        wakeup = policy.wakeup(current, decision)
        if wakeup is not None and wakeup > now:
            timer = min(timer, wakeup)

    admitted: dict[str, float] = {}
    for at, index in events:
        advance(at)
        _, work, tightness, has_deadline = arrivals[index]
        name = f"j{index}"
        fastest = work / curve.throughput(min(8, capacity))
        deadline = at + tightness * fastest + SLOT_SECONDS if has_deadline else None
        candidate = JobView(name, curve, work, deadline, at, 0, 0, 0.0, work)
        if policy.admit(views(at), candidate):
            remaining[name], deadlines[name], units[name], paused[name] = work, deadline, 0, 0.0
            if deadline is not None:
                admitted[name] = deadline
            decide(at)
    advance(math.inf)
    for name, deadline in admitted.items():
        assert finished[name] <= deadline + 1e-6, (name, finished[name], deadline)
