"""The event core: ordering, determinism and bad input."""

from __future__ import annotations

import pytest

from stride.sim.engine import Event, EventKind, Simulation, SimulationError


def test_events_pop_by_time_then_kind_then_insertion() -> None:
    sim = Simulation(seed=0)
    sim.schedule(5.0, EventKind.ARRIVAL, "late")
    sim.schedule(1.0, EventKind.SCHEDULING_ROUND, "round")
    sim.schedule(1.0, EventKind.ARRIVAL, "a1")
    sim.schedule(1.0, EventKind.COMPLETION, "done")
    sim.schedule(1.0, EventKind.ARRIVAL, "a2")
    seen: list[object] = []

    def handle(_: Simulation, event: Event) -> None:
        seen.append(event.job_id)

    sim.run(handle)
    assert seen == ["done", "a1", "a2", "round", "late"]
    assert sim.now == 5.0


def test_run_stops_at_until_and_keeps_later_events() -> None:
    sim = Simulation(seed=0)
    sim.schedule(1.0, EventKind.TIMER)
    sim.schedule(10.0, EventKind.TIMER)
    sim.run(lambda _s, _e: None, until=5.0)
    assert sim.now == 5.0 and sim.pending() == 1 and sim.peek_time() == 10.0


def test_handlers_can_schedule_and_past_events_are_rejected() -> None:
    sim = Simulation(seed=0)
    sim.schedule(0.0, EventKind.TIMER, payload=3)
    times: list[float] = []

    def handle(s: Simulation, event: Event) -> None:
        times.append(s.now)
        left = int(event.payload)  # type: ignore[call-overload]
        if left:
            s.schedule(s.now + 2.0, EventKind.TIMER, payload=left - 1)
        with pytest.raises(SimulationError, match="before the current time"):
            s.schedule(s.now - 1.0, EventKind.TIMER)

    sim.run(handle)
    assert times == [0.0, 2.0, 4.0, 6.0]


def test_same_seed_same_random_stream() -> None:
    assert Simulation(7).rng.random(3).tolist() == Simulation(7).rng.random(3).tolist()
    with pytest.raises(SimulationError, match="seed"):
        Simulation(-1)


def test_runaway_policy_is_stopped() -> None:
    sim = Simulation(seed=0)
    sim.schedule(0.0, EventKind.TIMER)

    def forever(s: Simulation, _: Event) -> None:
        s.schedule(s.now, EventKind.TIMER)

    with pytest.raises(SimulationError, match="max_events"):
        sim.run(forever, max_events=100)
