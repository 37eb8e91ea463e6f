"""Granted units in a pool's books (stride.admission.domain.ledger, issue 39): a share
request admission granted holds its job to the units its wanted plan needs (``Pool.hold``):
a best-effort job is pinned at them, a guaranteed one holds them beyond its own; they leave
what the ElasticFlow round divides (:attr:`Pool.divided`), and no grant takes other grants
or a guaranteed job's reservation for the current slot (:meth:`Pool.room`). Worked out by
hand on small pools, as in ``test_pool_shares``."""

from __future__ import annotations

from stride.admission.domain.ledger import Entry, Pool
from stride.admission.domain.policy import CHIEF
from stride.policy.elasticflow.units import GIB, CpuUnit, profile_curve

UNIT = CpuUnit()
"""1 core and 4 GiB."""


def job(
    job_id: str,
    submitted: float = 0.0,
    steps: float = 1e7,
    deadline: float | None = None,
    largest_workers: int = 2,
) -> Entry:
    """A PS/worker job with a chief: 1 worker + 1 PS is 3 units (12 steps/s), each further
    worker 1 more unit (14, 15, 15.5 steps/s), up to ``largest_workers`` workers."""
    points = [(1, 1, 12.0), (2, 1, 14.0), (3, 1, 15.0), (4, 1, 15.5)][:largest_workers]
    curve = profile_curve(points, (1.0, 2 * GIB), (1.0, 2 * GIB), UNIT, fixed=CHIEF)
    return Entry(job_id, curve, deadline, submitted, steps, steps)


def units(pool: Pool) -> dict[str, int]:
    return {job_id: entry.units for job_id, entry in pool.entries.items()}


def guaranteed_pool() -> Pool:
    """12 units: ``g`` has a deadline it needs 3 units for now; ``a`` and ``b`` are best
    effort. The round gives each 4 (the curves' largest size), nothing spare."""
    pool = Pool(12, headroom=True)
    # 12 steps/s for an hour reaches the deadline 1.2 h away at the smallest size.
    assert pool.join(0.0, job("g", steps=12 * 3600.0, deadline=1.2 * 3600.0))
    assert pool.join(0.0, job("a"))
    assert pool.join(0.0, job("b"))
    assert pool.round(0.0) == {"g": 4, "a": 4, "b": 4}
    assert pool.minimum_shares(0.0) == {"g": 3} and pool.headroom == {}
    return pool


def test_held_units_leave_what_the_policy_divides() -> None:
    pool = Pool(12, headroom=True)
    assert pool.join(0.0, job("a", largest_workers=4))
    assert pool.join(0.0, job("b", largest_workers=4))
    assert pool.divided == 12 and pool.granted == {} and pool.pinned == {}
    pool.hold("a", 3)
    pool.hold("b", 2)
    assert pool.pinned == {"a": 3, "b": 2}
    assert pool.divided == 7 and pool.view(0.0).capacity == 7
    # A pinned job is not the policy's to divide for: it is left out of its view.
    assert [v.job_id for v in pool.view(0.0).jobs] == []
    # A new grant replaces the job's last one.
    pool.hold("a", 1)
    assert pool.divided == 9 and pool.view(0.0).capacity == 9
    # More held than there is divides nothing, never a negative capacity.
    pool.hold("b", 20)
    assert pool.divided == 0


def test_a_grant_never_counts_other_grants_or_guaranteed_reservations_as_free() -> None:
    pool = guaranteed_pool()
    # a: 12 less g's 3 reserved units (b's 4 best-effort units count as available: the
    # next round takes them back, and so do a's own).
    assert pool.room("a", 0.0) == 12 - 3 == 9
    # g's own reservation is its own.
    assert pool.room("g", 0.0) == 12
    pool.hold("b", 2)
    # b's pin is not a's to take; b's own earlier pin is not subtracted from b's room (a
    # new grant replaces it).
    assert pool.room("a", 0.0) == 12 - 2 - 3 == 7
    assert pool.room("b", 0.0) == 9
    assert pool.room("g", 0.0) == 12 - 2 == 10
    # A guaranteed job holds units beyond its own: g at 4, held to 6, holds 2 more.
    pool.hold("g", 6)
    assert pool.granted == {"g": 2} and pool.room("a", 0.0) == 12 - 2 - 2 - 3 == 5
    # Holds beyond what is left: no room, never a negative one.
    pool.hold("b", 11)
    assert pool.room("a", 0.0) == 0


def test_a_pinned_job_keeps_its_units_and_the_others_divide_the_rest() -> None:
    pool = Pool(12, headroom=True)
    assert pool.join(0.0, job("a", largest_workers=4))
    assert pool.join(0.0, job("b", largest_workers=4))
    assert pool.round(0.0) == {"a": 6, "b": 6}
    pool.hold("a", 8)  # its wanted plan needs 8 units
    pool.round(60.0)
    assert units(pool) == {"a": 8, "b": 4}
    assert sum(units(pool).values()) + sum(pool.headroom.values()) <= 12
    assert pool.published["a"] == (8, (), 0) and pool.published["b"] == (4, (), 0)
    # And it stays so at the next round, whatever else happens.
    assert pool.join(100.0, job("c", 100.0))
    pool.round(100.0)
    assert pool.entries["a"].units == 8
    assert sum(units(pool).values()) <= 12


def test_headroom_is_split_from_what_the_grants_leave_among_the_others() -> None:
    pool = Pool(16, headroom=True)
    assert pool.join(0.0, job("a"))
    assert pool.join(1.0, job("b", 1.0))
    pool.round(1.0)
    assert units(pool) == {"a": 4, "b": 4} and pool.headroom == {"a": 4, "b": 4}
    pool.hold("a", 7)
    assert pool.divided == 9
    changed = pool.round(5.0)
    # a holds its 7; b gets 4 and the 5 spare as headroom.
    assert units(pool) == {"a": 7, "b": 4}
    assert pool.headroom == {"b": 5}
    assert changed == {"a": 7, "b": 4}
    assert sum(units(pool).values()) + sum(pool.headroom.values()) == 16


def test_a_job_that_leaves_drops_its_grant() -> None:
    pool = Pool(16, headroom=True)
    assert pool.join(0.0, job("a"))
    assert pool.join(1.0, job("b", 1.0))
    pool.round(1.0)
    pool.hold("a", 7)
    pool.round(5.0)
    left = pool.leave(6.0, "a")
    assert left is not None and left.job_id == "a"
    assert pool.pinned == {} and pool.divided == 16
    assert pool.round(6.0) == {"b": 4}
    assert pool.headroom == {"b": 12} and pool.published == {"b": (4, (), 12)}
