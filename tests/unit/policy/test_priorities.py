"""Priorities beside deadlines (:mod:`stride.policy.elasticflow.priorities`), each rule with
a hand-computed case, and the one-class case left to ElasticFlow's Algorithm 2."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.elasticflow.allocation import AllocationJob, AllocationRequest, allocate
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import DeadlineView, GuaranteePolicy, JobView
from stride.policy.elasticflow.priorities import (
    HIGH,
    LOW,
    NORMAL,
    STARVE_LIMIT_SECONDS,
    Contender,
    by_class,
    effective_class,
    prioritized,
    promotion_after,
    unit_weight,
)

ELASTIC = ScalingCurve((1, 2, 3, 4), (10.0, 18.0, 24.0, 28.0))
"""Concave: each unit adds 8, 6, 4 steps/s."""
PAIR = ScalingCurve((2,), (10.0,))
"""Runs on exactly 2 units."""
WIDE = ScalingCurve((3, 4), (30.0, 36.0))


def job(
    job_id: str,
    priority: int,
    holding: int = 0,
    *,
    curve: ScalingCurve = ELASTIC,
    submitted: float = 0.0,
    waiting_since: float | None = None,
    guaranteed: int | None = None,
    weight: float = 0.5,
) -> Contender:
    if not holding and waiting_since is None:
        waiting_since = submitted
    return Contender(
        job_id,
        curve,
        priority,
        weight,
        submitted,
        holding,
        None if holding else waiting_since,
        guaranteed,
        guaranteed is not None,
    )


def test_a_waiting_high_job_scales_lower_jobs_in_before_preempting_any() -> None:
    # 4 units: low L1 holds 3, low L2 holds 1; high H arrives. Smallest sizes first, class by
    # class: H 1, L1 1 (holder), L2 1; the last unit goes to the high class's growth: H 2.
    split = prioritized(
        [job("L1", LOW, 3), job("L2", LOW, 1), job("H", HIGH, submitted=10.0)], 4, 100.0
    )
    assert split.units == {"L1": 1, "L2": 1, "H": 2}
    assert split.notes["L1"].startswith("scaled in from 3 to 1 units for higher-priority jobs (H)")
    assert "L2" not in split.notes  # it kept what it had


def test_whole_jobs_are_preempted_only_when_scaling_in_is_not_enough_the_later_first() -> None:
    # 4 units: H needs 3. L1 and L2 (same weight) hold 2 each; scaled in to 1 each they
    # would leave 2 free, one short: L2, which came later, is preempted; L1 keeps 1.
    split = prioritized(
        [
            job("L1", LOW, 2, submitted=0.0),
            job("L2", LOW, 2, submitted=5.0),
            job("H", HIGH, curve=WIDE, submitted=10.0),
        ],
        4,
        100.0,
    )
    assert split.units == {"L1": 1, "L2": 0, "H": 3}
    assert split.notes["L2"].startswith("preempted for higher-priority jobs (H)")
    assert split.notes["L1"].startswith("scaled in from 2 to 1 units")


def test_the_lower_weight_is_preempted_first_within_a_class() -> None:
    split = prioritized(
        [
            job("heavy", LOW, 2, submitted=5.0, weight=0.9),
            job("light", LOW, 2, submitted=0.0, weight=0.6),
            job("H", HIGH, curve=WIDE, submitted=10.0),
        ],
        4,
        100.0,
    )
    assert split.units == {"heavy": 1, "light": 0, "H": 3}


def test_an_equal_never_preempts_a_running_job_whole() -> None:
    # A low job is present, so classes decide. N1 (normal) holds 2 of 2; N2 (normal, heavier)
    # needs exactly 2: it waits, and N1 keeps both units (its smallest first, then the spare).
    split = prioritized(
        [
            job("N1", NORMAL, 2),
            job("N2", NORMAL, curve=PAIR, submitted=5.0, weight=0.99),
            job("L", LOW, submitted=1.0),
        ],
        2,
        100.0,
    )
    assert split.units == {"N1": 2, "N2": 0, "L": 0}
    assert split.notes == {}


def test_an_equal_may_scale_a_running_job_in_to_its_smallest_size() -> None:
    split = prioritized(
        [job("N1", NORMAL, 2), job("N2", NORMAL, submitted=5.0), job("L", LOW, submitted=1.0)],
        2,
        100.0,
    )
    assert split.units == {"N1": 1, "N2": 1, "L": 0}


def test_guaranteed_minimums_come_first_whatever_the_priority() -> None:
    # A low job guaranteed 2 units keeps them; the high job gets the other 2.
    split = prioritized([job("G", LOW, 3, guaranteed=2), job("H", HIGH, submitted=10.0)], 4, 100.0)
    assert split.units == {"G": 2, "H": 2}
    assert split.notes["G"].startswith("scaled in from 3 to 2 units")


def test_starvation_aging_promotes_a_waiting_job_one_class_per_limit() -> None:
    # Both need exactly 2 units of 2. L (low) has waited since 0, N (normal) since 250.
    low = job("L", LOW, curve=PAIR, submitted=0.0)
    normal = job("N", NORMAL, curve=PAIR, submitted=250.0)
    before = prioritized([low, normal], 2, 299.0)
    assert before.units == {"L": 0, "N": 2}
    # At 400 s L has waited past STARVELIMIT (300 s): promoted to normal and first among
    # normal's waiting jobs; N has waited 150 s only.
    after = prioritized([low, normal], 2, 400.0)
    assert after.units == {"L": 2, "N": 0}
    assert effective_class(low, 400.0) == (NORMAL, True)
    assert effective_class(low, 2 * STARVE_LIMIT_SECONDS + 1) == (HIGH, True)
    assert effective_class(low, 10 * STARVE_LIMIT_SECONDS) == (HIGH, True)  # capped
    # Holding units or a guarantee ends the aging.
    assert effective_class(job("L", LOW, 1), 10_000.0) == (LOW, False)
    assert effective_class(job("L", LOW, guaranteed=0), 10_000.0) == (LOW, False)


def test_a_starving_job_takes_no_smallest_size_from_a_holder_of_its_class() -> None:
    split = prioritized(
        [job("N", NORMAL, 2, curve=PAIR), job("L", LOW, curve=PAIR, submitted=0.0)], 2, 400.0
    )
    assert split.units == {"N": 2, "L": 0}


def test_one_class_and_nobody_starving_is_left_to_algorithm_2() -> None:
    jobs = [job("a", NORMAL, 1), job("b", NORMAL, submitted=100.0)]
    assert not by_class(jobs, 200.0)
    assert by_class(jobs, 100.0 + STARVE_LIMIT_SECONDS + 1)  # b starves
    assert by_class([*jobs, job("c", HIGH, 1)], 200.0)


def test_kod2_weight_in_units() -> None:
    # w' = workers / (2 * units / capacity) = 1 / (2 * 2 / 8) = 2; 1 / (1 + e^-2).
    assert unit_weight(1, 2, 8) == pytest.approx(1 / (1 + math.exp(-2)))
    assert unit_weight(4, 2, 8) > unit_weight(1, 2, 8)  # more workers per unit: heavier
    assert unit_weight(1, 0, 8) == 0.0


def view(jobs: list[JobView], capacity: int, now: float = 0.0) -> DeadlineView:
    return DeadlineView(now, capacity, tuple(jobs), 20.0)


def best_effort(job_id: str, devices: int, curve: ScalingCurve, **changes: object) -> JobView:
    values: dict[str, object] = {
        "job_id": job_id,
        "curve": curve,
        "remaining_iterations": 1e6,
        "deadline": None,
        "submission_time": 0.0,
        "num_gpu": 1,
        "devices": devices,
        "paused_until": 0.0,
    }
    return JobView(**{**values, **changes})  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(
    holdings=st.lists(st.integers(0, 4), min_size=1, max_size=6),
    capacity=st.integers(1, 16),
)
def test_the_policy_with_one_class_decides_as_algorithm_2(
    holdings: list[int], capacity: int
) -> None:
    jobs = [best_effort(f"j{i}", held, ELASTIC) for i, held in enumerate(holdings)]
    decided = GuaranteePolicy().decide(view(jobs, capacity))
    expected = allocate(
        AllocationRequest(capacity, tuple(AllocationJob(j.job_id, ELASTIC) for j in jobs))
    )
    assert [decided[j.job_id] for j in jobs] == expected


@settings(max_examples=150, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.sampled_from([LOW, NORMAL, HIGH]),
            st.integers(0, 4),
            st.sampled_from([ELASTIC, PAIR, WIDE]),
            st.floats(0, 2_000),
        ),
        min_size=1,
        max_size=7,
    ),
    capacity=st.integers(1, 16),
)
def test_classes_never_overcommit_and_a_higher_class_never_waits_for_a_lower_one(
    jobs: list[tuple[int, int, ScalingCurve, float]], capacity: int
) -> None:
    contenders = [
        job(f"j{i}", level, min(held, capacity), curve=curve if not held else ELASTIC, submitted=at)
        for i, (level, held, curve, at) in enumerate(jobs)
    ]
    now = 2_000.0
    split = prioritized(contenders, capacity, now)
    assert sum(split.units.values()) <= capacity
    for contender in contenders:
        given_units = split.units[contender.job_id]
        assert given_units == 0 or contender.curve.usable(given_units) == given_units
    # A job left without units means none of a lower class holds units it could have used.
    for waiting in contenders:
        if split.units[waiting.job_id]:
            continue
        level = effective_class(waiting, now)[0]
        lower = sum(
            split.units[other.job_id]
            for other in contenders
            if effective_class(other, now)[0] < level
        )
        free = capacity - sum(split.units.values())
        assert lower + free < waiting.curve.sizes[0]


def test_the_policy_wakes_a_quiet_cluster_when_a_waiting_job_is_promoted() -> None:
    # One normal job holds both units; a low job waiting since 100 s is promoted at 400 s
    # (normal) and 700 s (high): the policy asks for rounds then, though nothing arrives.
    holder = best_effort("n", 2, PAIR, priority=NORMAL)
    waiting = best_effort("l", 0, PAIR, priority=LOW, waiting_since=100.0)
    policy = GuaranteePolicy()
    first = view([holder, waiting], 2, now=150.0)
    assert policy.decide(first) == {"n": 2, "l": 0}
    assert policy.wakeup(first, {"n": 2, "l": 0}) == pytest.approx(400.0)
    second = view([holder, waiting], 2, now=400.0)
    assert policy.decide(second) == {"n": 2, "l": 0}  # promoted to normal: no preemption
    assert policy.wakeup(second, {"n": 2, "l": 0}) == pytest.approx(700.0)
    third = view([holder, waiting], 2, now=700.0)
    assert policy.decide(third) == {"n": 0, "l": 2}  # high now: it preempts the normal job
    assert policy.notes["n"].startswith("preempted for higher-priority jobs (l)")
    assert policy.wakeup(third, {"n": 0, "l": 2}) == pytest.approx(1_000.0)  # n waits now
    assert promotion_after(HIGH, 0.0, 10.0) is None
