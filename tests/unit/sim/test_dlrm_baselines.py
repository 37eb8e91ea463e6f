"""Optimus and ES, the DLRM environment's elastic baselines, on hand-computed cases.

Every expected value below is worked out in a comment from the rules of
:mod:`stride.sim.dlrm_baselines`, so a reader can re-check it with pencil and paper.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from stride.sim.dlrm_baselines import (
    ES_PASSES_TO_STAY,
    ES_THRESHOLD,
    OptimusJob,
    es_target,
    fit_optimus_model,
    optimus_allocate,
    optimus_speed,
    step_toward,
)

# --- The Optimus speed model ---------------------------------------------------------

# f(p, w) = w / (t0 + t1 w/p + t2 w + t3 p) with theta = (2, 3, 0.5, 1):
#   (1, 1): 2 + 3*1   + 0.5*1 + 1*1 =  6.5  -> f = 1 / 6.5
#   (1, 2): 2 + 3*2   + 0.5*2 + 1*1 = 10    -> f = 2 / 10 = 0.2
#   (2, 1): 2 + 3*0.5 + 0.5*1 + 1*2 =  6    -> f = 1 / 6
#   (2, 2): 2 + 3*1   + 0.5*2 + 1*2 =  8    -> f = 2 / 8  = 0.25
#   (2, 4): 2 + 3*2   + 0.5*4 + 1*2 = 12    -> f = 4 / 12 = 1 / 3
# Rows [1, w/p, w, p] of the first four: [1,1,1,1], [1,2,2,1], [1,.5,1,2], [1,1,2,2];
# their determinant is -0.5, so the four coefficients are identifiable.
EXACT_THETA = (2.0, 3.0, 0.5, 1.0)
EXACT_POINTS = [
    (1, 1, 1 / 6.5),
    (1, 2, 0.2),
    (2, 1, 1 / 6),
    (2, 2, 0.25),
    (2, 4, 1 / 3),
]


def test_fit_recovers_the_theta_the_points_were_made_from() -> None:
    assert fit_optimus_model(EXACT_POINTS) == pytest.approx(EXACT_THETA, abs=1e-9)
    # Four distinct (p, w) are enough.
    assert fit_optimus_model(EXACT_POINTS[:4]) == pytest.approx(EXACT_THETA, abs=1e-9)


def test_fit_needs_four_distinct_configurations() -> None:
    # Four points but only three distinct (p, w): (1, 1) is measured twice.
    three = [EXACT_POINTS[0], EXACT_POINTS[0], EXACT_POINTS[1], EXACT_POINTS[2]]
    with pytest.raises(ValueError, match="points"):
        fit_optimus_model(three)
    with pytest.raises(ValueError, match="points"):
        fit_optimus_model([])


@pytest.mark.parametrize("bad_speed", [0.0, -1.0])
def test_fit_rejects_a_non_positive_speed(bad_speed: float) -> None:
    points = [*EXACT_POINTS[:3], (2, 2, bad_speed)]
    with pytest.raises(ValueError, match="points"):
        fit_optimus_model(points)


def test_optimus_speed_by_hand() -> None:
    theta = np.array(EXACT_THETA)
    # p = 3, w = 6: 2 + 3*(6/3) + 0.5*6 + 1*3 = 2 + 6 + 3 + 3 = 14 -> f = 6 / 14 = 3 / 7.
    assert optimus_speed(theta, 3, 6) == pytest.approx(3 / 7)
    # A model that predicts no time per step predicts an infinite speed.
    assert math.isinf(optimus_speed(np.zeros(4), 1, 1))


# --- Optimus's allocation ------------------------------------------------------------


def _job(
    job_id: int,
    remaining: float,
    theta: tuple[float, float, float, float] | None,
    *,
    worker_cpu: int = 1,
    worker_mem_gib: int = 1,
    ps_cpu: int = 1,
    cpu_limit: int = 200,
) -> OptimusJob:
    """A job whose PS take 1 GiB each (the first one too)."""
    return OptimusJob(
        job_id=job_id,
        remaining=remaining,
        theta=None if theta is None else np.array(theta),
        worker_cpu=worker_cpu,
        worker_mem_gib=worker_mem_gib,
        ps_cpu=ps_cpu,
        first_ps_mem_gib=1,
        ps_mem_gib=1,
        cpu_limit=cpu_limit,
    )


def test_allocate_greedy_order_by_gain_over_dominant_share() -> None:
    # Cluster: 10 cores, 60 GiB. Remaining time is R / f = R (t0 + t1 w/p + t2 w + t3 p) / w.
    #
    # Job 1: theta (1, 4, 0, 0), R = 12 -> 12/w + 48/p. Every task 1 core, 1 GiB: its
    #   dominant share is max(1/10, 1/60) = 1/10, so gain = 10 x reduction:
    #   a PS at p:     48/p - 48/(p+1) = 48/(p(p+1)) -> gain 480/(p(p+1))
    #   a worker at w: 12/(w(w+1))                   -> gain 120/(w(w+1))
    # Job 2: theta (1, 0, 0, 0), R = 100 -> 100/w; a PS reduces nothing (gain 0). A worker
    #   is 1 core and 20 GiB: share max(1/10, 20/60) = 1/3, gain 3 x 100/(w(w+1)).
    #   (By cores alone, share 1/10, its first worker would gain 500 and come first.)
    #
    # First 1 PS + 1 worker each, in arrival order: job 1 2 cores 2 GiB, job 2 2 cores
    # 21 GiB -> free 6 cores, 37 GiB. Then:
    #   1. job 1 best: PS 480/2 = 240 (worker 60); job 2: 300/2 = 150 -> job 1 PS, (2, 1);
    #      free 5 cores, 36 GiB.
    #   2. job 1: PS 480/6 = 80 (worker 60); job 2: 150 -> job 2 worker, (1, 2);
    #      free 4 cores, 16 GiB.
    #   3. job 1: PS 80; job 2: 300/6 = 50 -> job 1 PS, (3, 1); free 3 cores, 15 GiB.
    #   4. job 1: worker 60 (PS 480/12 = 40); job 2: 50 -> job 1 worker, (3, 2);
    #      free 2 cores, 14 GiB.
    #   5. job 1: PS 40 (worker 120/6 = 20); job 2: 50 -> job 2's worker is the best task
    #      but needs 20 GiB of the 14 free: the greedy stops here, although job 1's PS
    #      (1 core, 1 GiB, gain 40) would fit.
    jobs = [
        _job(1, 12.0, (1.0, 4.0, 0.0, 0.0)),
        _job(2, 100.0, (1.0, 0.0, 0.0, 0.0), worker_mem_gib=20),
    ]
    assert optimus_allocate(jobs, 10, 60) == {1: (3, 2), 2: (1, 2)}


def test_allocate_keeps_a_job_without_a_model_at_one_ps_and_one_worker() -> None:
    # Job 1 cannot be estimated: it gets its 1 + 1 and nothing more. Job 2 (theta
    # (1, 0, 0, 0), a worker always helps) takes the other 10 - 2 - 2 = 6 cores as workers.
    jobs = [_job(1, 1e6, None), _job(2, 10.0, (1.0, 0.0, 0.0, 0.0))]
    assert optimus_allocate(jobs, 10, 100) == {1: (1, 1), 2: (1, 7)}


def test_allocate_leaves_out_a_job_that_does_not_fit_one_ps_and_one_worker() -> None:
    # Job 1 takes 1 + 59 = 60 GiB of 100; job 2 needs 1 + 50 = 51 GiB > 40 free.
    jobs = [
        _job(1, 1e6, None, worker_mem_gib=59),
        _job(2, 1e6, (1.0, 0.0, 0.0, 0.0), worker_mem_gib=50),
    ]
    assert optimus_allocate(jobs, 10, 100) == {1: (1, 1)}


def test_allocate_stops_a_job_at_its_cpu_limit_and_grows_the_others() -> None:
    # Both theta (1, 0, 0, 0): remaining time R/w, so a PS gains 0 and a worker at w gains
    # R/(w(w+1)) / (1/10) on 10 cores. Job 1 R = 100: 500, 166.7, 83.3, 50, 33.3, 23.8 for
    # w = 1, 2, ...; job 2 R = 12: 60, 20, 10, 6, 4. After 1 + 1 each, 6 cores are free.
    capped = [
        _job(1, 100.0, (1.0, 0.0, 0.0, 0.0), cpu_limit=4),
        _job(2, 12.0, (1.0, 0.0, 0.0, 0.0)),
    ]
    # Job 1 takes workers 2 (500) and 3 (166.7); it then holds 1 + 3 = 4 cores, its limit,
    # and leaves the greedy. Job 2 takes the last 4 cores: workers 2 to 5 (60, 20, 10, 6).
    assert optimus_allocate(capped, 10, 100) == {1: (1, 3), 2: (1, 5)}
    # Without the limit: job 1 500, 166.7, 83.3; job 2 60 (> 50); job 1 50 (> 20) and 33.3
    # (> 20); the 6 cores are gone.
    uncapped = [replace(capped[0], cpu_limit=200), capped[1]]
    assert optimus_allocate(uncapped, 10, 100) == {1: (1, 6), 2: (1, 2)}


def test_allocate_stops_on_a_negative_gain() -> None:
    # With theta >= 0 a worker never hurts (f = w / (a + b w) rises with w), so the negative
    # gain comes from a PS: theta (1, 0, 0, 5), R = 100 -> remaining time 100 (1 + 5p) / w.
    # At (1, 1) a PS changes it from 600 to 1100: gain (600 - 1100) / (1/10) = -5000 < 0.
    # A worker is 2 cores and the job's limit is 3 (1 PS + 1 worker), so the PS is its only
    # task: the greedy stops although 10 - 3 = 7 cores are free.
    slowed_by_ps = _job(1, 100.0, (1.0, 0.0, 0.0, 5.0), worker_cpu=2, cpu_limit=3)
    assert optimus_allocate([slowed_by_ps], 10, 100) == {1: (1, 1)}
    # With room for workers it takes them (each gain > 0) and never the PS: 7 free cores
    # hold 3 more 2-core workers.
    roomy = replace(slowed_by_ps, cpu_limit=200)
    assert optimus_allocate([roomy], 10, 100) == {1: (1, 4)}


# --- Fixed steps ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "target", "step", "expected"),
    [
        (3, 10, 4, 7),  # up: 3 + 4
        (10, 3, 4, 6),  # down: 10 - 4
        (5, 7, 4, 7),  # up within a step: the target
        (7, 5, 4, 5),  # down within a step: the target
        (5, 5, 4, 5),  # there already
    ],
)
def test_step_toward(current: int, target: int, step: int, expected: int) -> None:
    assert step_toward(current, target, step) == expected


# --- ES ------------------------------------------------------------------------------
# Efficiency of k_old -> k_new: ((R_new - R_old) / (k_new - k_old)) / (R_old / k_old), and a
# pair passes when it is strictly above 0.3. Step 4 throughout.


def test_es_constants_the_hand_computations_assume() -> None:
    assert ES_THRESHOLD == 0.3
    assert ES_PASSES_TO_STAY == 3


def test_es_one_measured_count_tries_one_step_more() -> None:
    # k = 8 -> 8 + 4 = 12, within 32.
    assert es_target({8: 100.0}, 8, 4, 32) == 12
    # 8 + 4 = 12 > 10 workers allowed: stay.
    assert es_target({8: 100.0}, 8, 4, 10) == 8


def test_es_nothing_measured_stays() -> None:
    assert es_target({}, 8, 4, 32) == 8


def test_es_all_pairs_pass_tries_the_top_plus_a_step() -> None:
    # 4 -> 8:  (90 / 4) / (100 / 4)  = 22.5 / 25    = 0.9   pass
    # 8 -> 12: (80 / 4) / (190 / 8)  = 20 / 23.75   = 0.842 pass
    measured = {4: 100.0, 8: 190.0, 12: 270.0}
    assert es_target(measured, 12, 4, 32) == 16
    # 12 + 4 = 16 > 14 allowed: stay at the top.
    assert es_target(measured, 12, 4, 14) == 12


def test_es_first_pair_failing_scales_in() -> None:
    # 12 -> 16: (20 / 4) / (300 / 12) = 5 / 25 = 0.2 fail; no pair passes before it and
    # 12 > 1, so ES tries 12 - 4 = 8.
    assert es_target({12: 300.0, 16: 320.0}, 16, 4, 32) == 8


def test_es_two_passes_then_a_failure_still_scales_in() -> None:
    # 8 -> 12: (40 / 4) / (80 / 8) = 1 pass; 12 -> 16: (5 / 4) / (120 / 12) = 0.125 fail.
    # One pass from the bottom is fewer than 3: scale in to 8 - 4 = 4.
    assert es_target({8: 80.0, 12: 120.0, 16: 125.0}, 16, 4, 32) == 4


def test_es_three_passes_from_the_bottom_stay_at_the_first_failing_pair() -> None:
    # 1 -> 4:   (30 / 3) / (10 / 1)   = 1     pass
    # 4 -> 8:   (40 / 4) / (40 / 4)   = 1     pass
    # 8 -> 12:  (40 / 4) / (80 / 8)   = 1     pass
    # 12 -> 16: (5 / 4)  / (120 / 12) = 0.125 fail -> the lower end of that pair, 12.
    measured = {1: 10.0, 4: 40.0, 8: 80.0, 12: 120.0, 16: 125.0}
    assert es_target(measured, 16, 4, 32) == 12
    # The same with the smallest count above 1, so the three passes (not k_min = 1) are what
    # stop the scale-in: 4 -> 8, 8 -> 12, 12 -> 16 pass (1 each), 16 -> 20 fails
    # ((5 / 4) / (160 / 16) = 0.125) -> 16.
    measured = {4: 40.0, 8: 80.0, 12: 120.0, 16: 160.0, 20: 165.0}
    assert es_target(measured, 20, 4, 32) == 16


def test_es_scale_in_stops_at_one_worker() -> None:
    # 2 -> 6: (10 / 4) / (100 / 2) = 2.5 / 50 = 0.05 fail -> max(1, 2 - 4) = 1.
    assert es_target({2: 100.0, 6: 110.0}, 6, 4, 32) == 1


def test_es_efficiency_exactly_at_the_threshold_fails() -> None:
    # 8 -> 12: (12 / 4) / (80 / 8) = 3 / 10 = 0.3, not above 0.3: fail -> 8 - 4 = 4.
    assert es_target({8: 80.0, 12: 92.0}, 12, 4, 32) == 4
    # 92.4: (12.4 / 4) / 10 = 0.31 > 0.3 passes -> 12 + 4 = 16.
    assert es_target({8: 80.0, 12: 92.4}, 12, 4, 32) == 16
