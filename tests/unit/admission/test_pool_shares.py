"""What a pool's round leaves in each share beside the policy's units, worked out by hand:
headroom (units no curve can use, lent to running jobs) and the rewind of a second round at
one instant. The policy's own decisions are the simulator's (``test_pool_parity``)."""

from __future__ import annotations

from stride.admission.domain.ledger import Entry, Pool
from stride.admission.domain.policy import CHIEF
from stride.policy.elasticflow.units import GIB, CpuUnit, profile_curve

UNIT = CpuUnit()


def job(job_id: str, submitted: float = 0.0, steps: float = 1e7) -> Entry:
    """A best-effort PS/worker job that uses at most 4 units: 1 worker + 1 PS (3 units with
    the chief) at 12 steps/s, 2 workers + 1 PS (4 units) at 14."""
    curve = profile_curve(
        [(1, 1, 12.0), (2, 1, 14.0)], (1.0, 2 * GIB), (1.0, 2 * GIB), UNIT, fixed=CHIEF
    )
    return Entry(job_id, curve, None, submitted, steps, steps)


def test_the_chief_is_counted_in_every_size() -> None:
    curve = job("a").curve
    assert curve.curve.sizes == (3, 4)
    size = curve.size_at(4)
    assert size is not None and (size.workers, size.ps, size.cpu) == (2, 1, 4.0)
    assert size.memory_bytes == 8 * GIB


def test_units_no_curve_can_use_are_lent_as_headroom_and_taken_back() -> None:
    pool = Pool(10, headroom=True)
    assert pool.join(0.0, job("a"))
    assert pool.round(0.0) == {"a": 4}
    # Alone: 4 units by its curve, the other 6 lent.
    assert pool.headroom == {"a": 6} and pool.published["a"] == (4, (), 6)
    assert pool.join(10.0, job("b", 10.0))
    changed = pool.round(10.0)
    # Two jobs at 4 units each leave 2: one each, and both shares changed.
    assert changed == {"a": 4, "b": 4}
    assert pool.headroom == {"a": 1, "b": 1}
    assert pool.join(20.0, job("c", 20.0))
    pool.round(20.0)
    # 10 units, three jobs: the curve gives the third what is left (2 units are below its
    # smallest size of 3, so it waits), and nothing is lent to a job that does not run.
    units = {job_id: entry.units for job_id, entry in pool.entries.items()}
    assert sum(units.values()) + sum(pool.headroom.values()) == 10
    assert all(pool.headroom.get(job_id, 0) == 0 for job_id, held in units.items() if not held)


def test_the_remainder_goes_to_the_earliest_admitted() -> None:
    pool = Pool(13, headroom=True)
    for number, job_id in enumerate("ab"):
        assert pool.join(float(number), job(job_id, float(number)))
        pool.round(float(number))
    assert pool.headroom == {"a": 3, "b": 2}  # 13 - 8 = 5 spare


def test_gpu_pools_lend_nothing() -> None:
    pool = Pool(10)
    assert pool.join(0.0, job("a"))
    pool.round(0.0)
    assert pool.headroom == {} and pool.published["a"] == (4, (), 0)


def test_a_second_round_at_one_instant_counts_from_before_the_first() -> None:
    pool = Pool(8, headroom=True)
    assert pool.join(0.0, job("a"))
    pool.round(0.0)
    paused = pool.entries["a"].paused_until
    assert paused == 20.0
    # b arrives at 100 s: the round halves the cluster (a keeps 4, b gets 4) ...
    assert pool.join(100.0, job("b", 100.0))
    pool.round(100.0)
    assert pool.entries["a"].units == 4 and pool.entries["a"].paused_until == paused
    # ... and b ends at the same instant: a's next round at 100 s starts from the books
    # before 100 s, so a, which never changed size, pays no pause.
    pool.leave(100.0, "b")
    changed = pool.round(100.0)
    assert pool.entries["a"].units == 4 and pool.entries["a"].paused_until == paused
    assert changed == {"a": 4} and pool.headroom == {"a": 4}


def test_a_history_curve_survives_the_books() -> None:
    from stride.admission.domain.policy import curve_from_json, curve_to_json, history_curve
    from stride.policy.warm_start import MeasuredPoint, MeasuredRun

    runs = [
        MeasuredRun(
            "job-past",
            1.0,
            (MeasuredPoint(2, 1, 5.0, 8.0, 16 * GIB), MeasuredPoint(4, 1, 7.0, 12.0, 24 * GIB)),
        )
    ]
    curve = history_curve(runs, UNIT)
    assert curve is not None and curve.source == "history"
    assert curve.basis == "1 similar finished job: job-past"
    assert curve.curve.sizes == (8, 12) and curve.curve.throughputs == (5.0, 7.0)
    stored = curve_to_json(curve)
    assert stored is not None
    again = curve_from_json(stored, UNIT)
    assert again is not None and again.curve == curve.curve and again.sizes == curve.sizes
    assert curve_to_json(job("a").curve) is None  # a profile's curve is in the spec
    assert curve_from_json({"points": "nonsense"}, UNIT) is None
