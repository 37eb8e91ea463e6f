"""Admission's warm-start curve from similar jobs' measurements (``blended_points``), worked
out by hand: eq. 10's smoothing per configuration, the top-k, and what is skipped."""

from __future__ import annotations

import math

import pytest

from stride.policy.warm_start import (
    InvalidWarmStartRequest,
    MeasuredPoint,
    MeasuredRun,
    blended_points,
)

GIB = 1024**3


def point(workers: int, ps: int, rate: float, cpu: float = 8.0) -> MeasuredPoint:
    return MeasuredPoint(workers, ps, rate, cpu, 16 * GIB)


def test_a_configuration_measured_by_several_runs_is_smoothed_most_similar_last() -> None:
    runs = [
        MeasuredRun("a", 0.9, (point(2, 1, 10.0, cpu=8.0), point(4, 1, 14.0))),
        MeasuredRun("b", 0.5, (point(2, 1, 6.0, cpu=6.0),)),
        MeasuredRun("c", 0.7, (point(2, 1, 8.0, cpu=7.0), point(8, 2, 20.0))),
    ]
    points, used = blended_points(runs, top_k=5, smoothing=0.5)
    assert used == ("a", "c", "b")  # most similar first
    by_config = {(p.workers, p.ps): p for p in points}
    # (2, 1): b 6 -> c: 6 + 0.5 (8 - 6) = 7 -> a: 7 + 0.5 (10 - 7) = 8.5; a's sizes.
    assert by_config[(2, 1)].steps_per_second == pytest.approx(8.5)
    assert by_config[(2, 1)].cpu == 8.0
    # Measured by one run only: that run's speed.
    assert by_config[(4, 1)].steps_per_second == 14.0
    assert by_config[(8, 2)].steps_per_second == 20.0
    assert [(p.workers, p.ps) for p in points] == [(2, 1), (4, 1), (8, 2)]


def test_only_the_top_k_count_and_ties_go_by_job_id() -> None:
    runs = [MeasuredRun(f"job-{n}", 0.5, (point(1, 1, float(n + 1)),)) for n in range(4)]
    points, used = blended_points(runs, top_k=2, smoothing=0.5)
    # Equal similarity: the smaller id counts as more similar, so job-0 and job-1 are kept,
    # job-1 first (less similar), then job-0: 2 + 0.5 (1 - 2) = 1.5.
    assert used == ("job-0", "job-1")
    assert points[0].steps_per_second == pytest.approx(1.5)


def test_runs_and_points_that_cannot_be_measurements_are_skipped() -> None:
    runs = [
        MeasuredRun("nothing", 1.0, ()),
        MeasuredRun("bad", 0.9, (point(2, 1, math.nan), point(0, 1, 5.0), point(2, 1, -1.0))),
        MeasuredRun("good", 0.1, (point(2, 1, 3.0),)),
    ]
    points, used = blended_points(runs)
    assert used == ("good",) and [p.steps_per_second for p in points] == [3.0]
    assert blended_points([]) == ((), ())


@pytest.mark.parametrize(
    ("top_k", "smoothing", "named"),
    [(0, 0.5, "top_k"), (5, 0.0, "smoothing"), (5, 1.0, "smoothing")],
)
def test_bad_parameters_are_named(top_k: int, smoothing: float, named: str) -> None:
    with pytest.raises(InvalidWarmStartRequest, match=named):
        blended_points([], top_k=top_k, smoothing=smoothing)
