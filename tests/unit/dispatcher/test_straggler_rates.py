"""The rate a worker is judged by: measured from its registration, so a worker that joins a
running job (a scale-out, a replaced pod) is judged at its real pace, not below it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.dispatcher.domain.stragglers import (
    STRAGGLER_RATIO,
    decayed_rate,
    judge,
    judged_rate,
)

WINDOW = 30.0


def reported(pace: float, every: float, reports: int, window: float = WINDOW) -> float:
    """The stored rate after ``reports`` reports every ``every`` seconds at ``pace`` records
    a second, from zero at registration."""
    rate = 0.0
    for _ in range(reports):
        rate = decayed_rate(rate, round(pace * every), every, window)
    return rate


@pytest.mark.parametrize("every", [5.0, 10.0, 15.0, 30.0])
def test_a_newcomer_is_judged_at_its_pace_from_its_first_report(every: float) -> None:
    for reports in range(1, 12):
        stored = reported(100.0, every, reports)
        assert judged_rate(stored, every * reports, WINDOW) == pytest.approx(100.0)
    # Uncorrected, the rate from zero is far below the pace when first judged (one window
    # after registration), which is what flagged newcomers.
    assert reported(100.0, 10.0, 3) < 0.7 * 100.0


def test_a_newcomer_at_its_peers_pace_is_not_a_straggler_when_first_judged() -> None:
    newcomer = reported(100.0, 10.0, 3)
    peers = {"a": 100.0, "b": 101.0, "c": 99.0}
    assert judge({**peers, "new": judged_rate(newcomer, 30.0, WINDOW)}, set()) == set()
    # A slow newcomer still is one.
    slow = reported(100.0 * STRAGGLER_RATIO / 2, 10.0, 3)
    assert judge({**peers, "new": judged_rate(slow, 30.0, WINDOW)}, set()) == {"new"}


@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(0.01, 120.0)), min_size=1, max_size=20))
def test_the_judged_rate_is_a_weighted_average_of_the_reported_intervals(
    reports: list[tuple[int, float]],
) -> None:
    rate, measured = 0.0, 0.0
    for records, elapsed in reports:
        rate = decayed_rate(rate, records, elapsed, WINDOW)
        measured += elapsed
    paces = [records / elapsed for records, elapsed in reports]
    judged = judged_rate(rate, measured, WINDOW)
    assert min(paces) * (1 - 1e-9) <= judged <= max(paces) * (1 + 1e-9)


def test_an_old_rate_is_left_as_it_is() -> None:
    assert judged_rate(42.0, 0.0, WINDOW) == 42.0
    assert judged_rate(42.0, 100 * WINDOW, WINDOW) == pytest.approx(42.0)
