"""A small discrete-event core shared by the simulator's environments.

Why it exists: the three environments (A: deadline jobs on GPUs, B: DLRM jobs on CPUs,
C: data workers) all replay a trace through a policy, and they need the same things:
a clock, an ordered event queue, a seeded random source and a loop. Keeping those here,
with no knowledge of jobs or resources, lets each environment own its state and its
policy interface while sharing one well-tested ordering rule.

Ordering rule: events pop by ``(time, kind priority, sequence)``. At equal times,
completions and failures free resources before arrivals and overhead ends are seen, and the
scheduling round runs last, so a round sees every change that happened at its instant.
Among events with equal time and kind, the one pushed first pops first, so a run is a pure
function of its inputs and seed.

Usage::

    sim = Simulation(seed=1)
    sim.schedule(0.0, EventKind.ARRIVAL, payload="job-1")

    def handle(sim: Simulation, event: Event) -> None:
        ...  # mutate environment state, push new events with sim.schedule(...)

    sim.run(handle, until=3600.0)
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

__all__ = [
    "Event",
    "EventKind",
    "Policy",
    "Simulation",
    "SimulationError",
]


class SimulationError(ValueError):
    """Bad input to the simulator; the message names the file, line and field when known."""


class EventKind(enum.IntEnum):
    """What happened. The integer value is the tie-break priority at equal times (lower first).

    Frees come first (COMPLETION, FAILURE), then things that add demand or capacity
    (OVERHEAD_END, ARRIVAL), then the decision (SCHEDULING_ROUND), then TIMER for
    environment-specific bookkeeping such as metric sampling.
    """

    COMPLETION = 0
    """A job finished its work; its resources are free."""
    FAILURE = 1
    """A job or worker failed (e.g. out of memory); the environment decides what follows."""
    OVERHEAD_END = 2
    """A scaling, migration or restart pause ended; the job runs at its new allocation."""
    ARRIVAL = 3
    """A job was submitted."""
    SCHEDULING_ROUND = 4
    """The policy is asked to decide."""
    TIMER = 5
    """Anything else the environment wants at a given time."""


@dataclass(frozen=True, order=False)
class Event:
    """One scheduled event.

    Attributes:
        time: simulated seconds since the start of the run.
        kind: what happened; also the tie-break priority at equal times.
        sequence: insertion counter, the final tie-break (deterministic FIFO).
        job_id: the job concerned, or None for cluster-wide events.
        payload: anything the environment attaches (e.g. an allocation version, so a stale
            completion can be recognised and ignored after a re-allocation).
    """

    time: float
    kind: EventKind
    sequence: int
    job_id: Hashable | None = None
    payload: object = None

    @property
    def sort_key(self) -> tuple[float, int, int]:
        """The heap key: time, then kind priority, then insertion order."""
        return (self.time, int(self.kind), self.sequence)


@dataclass
class _Entry:
    key: tuple[float, int, int]
    event: Event = field(compare=False)

    def __lt__(self, other: _Entry) -> bool:
        return self.key < other.key


Handler = Callable[["Simulation", Event], None]
"""An environment's event handler: reads the event, mutates its state, schedules more."""


class Simulation:
    """A clock, an event heap and a seeded random source.

    The environment owns all job and resource state; the simulation only orders events.
    Randomness must come from ``self.rng`` (a numpy Generator seeded from ``seed``) so a run
    is reproducible; nothing here touches global random state.
    """

    def __init__(self, seed: int) -> None:
        """Create an empty simulation at time 0 with ``numpy.random.default_rng(seed)``."""
        if seed < 0:
            raise SimulationError(f"seed: must be >= 0, got {seed}")
        self.seed = seed
        self.rng: np.random.Generator = np.random.default_rng(seed)
        self.now: float = 0.0
        self._heap: list[_Entry] = []
        self._sequence = 0
        self.events_processed = 0

    def schedule(
        self,
        time: float,
        kind: EventKind,
        job_id: Hashable | None = None,
        payload: object = None,
    ) -> Event:
        """Push an event and return it. ``time`` must be finite and not in the past."""
        if not math.isfinite(time):
            raise SimulationError(f"time: must be finite, got {time}")
        if time < self.now - 1e-9:
            raise SimulationError(f"time: {time} is before the current time {self.now}")
        event = Event(max(time, self.now), kind, self._sequence, job_id, payload)
        self._sequence += 1
        heapq.heappush(self._heap, _Entry(event.sort_key, event))
        return event

    def pending(self) -> int:
        """How many events are queued."""
        return len(self._heap)

    def peek_time(self) -> float | None:
        """The time of the next event, or None when the queue is empty."""
        return self._heap[0].event.time if self._heap else None

    def has_pending(self, kind: EventKind, time: float) -> bool:
        """Whether an event of ``kind`` is already queued at exactly ``time``.

        Environments use this to avoid queuing duplicate scheduling rounds for one instant.
        Linear in the queue size; call it only for rare kinds or small queues.
        """
        return any(e.event.kind == kind and e.event.time == time for e in self._heap)

    def step(self) -> Event | None:
        """Pop the next event, advance the clock to it and return it (None when empty)."""
        if not self._heap:
            return None
        event = heapq.heappop(self._heap).event
        self.now = event.time
        self.events_processed += 1
        return event

    def run(self, handler: Handler, until: float = math.inf, max_events: int = 50_000_000) -> None:
        """Process events in order with ``handler`` until the queue is empty or time > until.

        Events later than ``until`` stay queued, and the clock stops at ``until`` (or at the
        last event when the queue empties first). ``max_events`` guards against a policy
        that schedules forever; exceeding it raises SimulationError.
        """
        processed = 0
        while self._heap:
            if self._heap[0].event.time > until:
                self.now = until
                return
            event = self.step()
            assert event is not None
            handler(self, event)
            processed += 1
            if processed > max_events:
                raise SimulationError(
                    f"max_events: more than {max_events} events; the policy may loop"
                )


StateT_contra = TypeVar("StateT_contra", contravariant=True)
DecisionT_co = TypeVar("DecisionT_co", covariant=True)


class Policy(Protocol[StateT_contra, DecisionT_co]):
    """The shape every environment's policy takes: a name and ``decide(state) -> decision``.

    Each environment specialises it with its own frozen view of the state (what the policy
    may see: time, queued and running jobs, free capacity) and its own decision type (e.g.
    a map from job to allocation). Policies must be pure given the view and must not keep
    references to the environment's mutable state; any randomness comes in through the view.
    """

    name: str
    """Registry name used by the CLI and in results."""

    def decide(self, state: StateT_contra) -> DecisionT_co:
        """Return the decision for one scheduling round."""
        ...
