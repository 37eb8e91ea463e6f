"""Admission's model of the cluster: who holds what, how far each job got, who is guaranteed.

One :class:`Pool` per resource kind (GPUs; CPU units, :mod:`stride.policy.elasticflow.units`)
runs :class:`~stride.policy.elasticflow.guarantees.GuaranteePolicy`, the class
``stride sim --env deadline`` runs, and keeps its books the way the simulator's environment
does: a job progresses at ``curve.throughput(units)`` steps per second, except for a pause of
``pause_seconds`` after every change of its units; a round (on every arrival, completion
and capacity change) re-decides every job's units. The difference is only where events come
from: submissions, job ends and capacity changes on admission's clock.

**One instant, one round.** The simulator handles every event at an instant (ends, then
arrivals) and then runs one round. The service runs a round on every event, so several
events at one instant (a stepped replay's, or two submissions within a clock tick) make
several rounds. Each later round at the same instant first rewinds the books to what they
were before that instant's first round (units, pauses, ages, devices), so admission tests
and the final round see what the simulator sees, and only the last round's decision takes
effect: a job moved 4 -> 8 -> 4 units within an instant pays no pause. What was already
published is kept apart, so the jobs whose share the last round changed are reported.

**Headroom** (CPU pools): units no job's curve can use (every job at the largest size
its declared curve knows) would sit idle, while the optimizer, which measures the job, may
find that more helps. They are split among the running jobs as headroom, equally in whole
units (the remainder to the earliest admitted): part of each job's share, the upper bound
the optimizer plans within, but not of its units, so the policy, its guarantees and the
simulator's bookkeeping never see them. The next round takes them back as soon as any job's
units need them.

**Granted units** (CPU pools): a share request admission granted (``stride.admission.
share_requests``) holds its job to the units its wanted plan needs, until the job ends or
asks again, and those units are taken out of the capacity the policy divides, so no other
job's units or headroom count on them. A best-effort job is *pinned*: it holds exactly the
granted units and the policy divides the rest among the others (its progress is still kept
at its curve's rate). A guaranteed job stays in the policy's hands, for its deadline, and
holds the granted units beyond its own. A grant never takes a guaranteed job's reservation
for the current slot (:meth:`Pool.room`).

**Placement** (GPU pools with a known topology): after each round the GPUs are placed with
:class:`~stride.policy.elasticflow.placement.Placements`, the class the simulator places
with (buddy allocation with repacking, or best fit), and a job moved at an unchanged size
pays the scaling pause, as there.

Progress is the model's (as in the simulator): admission does not read training metrics.
A job that trains slower than its curve says can therefore miss a deadline admission
believed kept; reconciling with measured progress is the optimizer's side of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from stride.policy.elasticflow.guarantees import (
    SCALING_PAUSE_SECONDS,
    DeadlineView,
    GuaranteePolicy,
    JobView,
)
from stride.policy.elasticflow.placement import Placements, Topology
from stride.policy.elasticflow.priorities import NORMAL, unit_weight
from stride.policy.elasticflow.units import JobCurve

__all__ = ["Entry", "Pool"]


@dataclass
class Entry:
    """One job in a pool, with the books the simulator keeps for it."""

    job_id: str
    curve: JobCurve
    deadline: float | None
    """The deadline the pool plans with (None: best effort)."""
    submitted: float
    total_steps: float
    remaining: float
    units: int = 0
    paused_until: float = 0.0
    last_update: float = 0.0
    priority: int = NORMAL
    """The spec's priority class (LOW 1, NORMAL 2, HIGH 3)."""
    waiting_since: float | None = None
    """Since when it has held no units (None while it holds some): its age."""

    _view: tuple[tuple[float, int, float, float | None, int, float | None], JobView] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """The last view built and what it was built from: a waiting job's view, and a running
    one's within an instant, is asked for many times per decision."""

    def view(self, capacity: int) -> JobView:
        key = (
            self.remaining,
            self.units,
            self.paused_until,
            self.deadline,
            capacity,
            self.waiting_since,
        )
        if self._view is not None and self._view[0] == key:
            return self._view[1]
        smallest = self.curve.curve.sizes[0]
        size = self.curve.size_at(smallest)
        workers = size.workers if size is not None else smallest
        built = JobView(
            self.job_id,
            self.curve.curve,
            self.remaining,
            self.deadline,
            self.submitted,
            0,
            self.units,
            self.paused_until,
            self.total_steps,
            priority=self.priority,
            weight=unit_weight(workers, smallest, capacity),
            waiting_since=self.waiting_since,
        )
        self._view = (key, built)
        return built

    def rate(self) -> float:
        return self.curve.curve.throughput(self.units) if self.units else 0.0

    def books(self) -> _Books:
        return _Books(self.units, self.paused_until, self.last_update, self.waiting_since)

    def restore(self, books: _Books) -> None:
        self.units = books.units
        self.paused_until = books.paused_until
        self.last_update = books.last_update
        self.waiting_since = books.waiting_since


class _Books(NamedTuple):
    """What a round changes of an entry (progress is advanced before any round). A tuple:
    every round at a new instant takes one per job."""

    units: int
    paused_until: float
    last_update: float
    waiting_since: float | None


@dataclass
class _Instant:
    """The books before the first round at an instant, to rewind to for the next one, and
    (while rewound) the books the last round left, to go back to if no round follows."""

    at: float
    before: dict[str, _Books] = field(default_factory=dict)
    placed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    after: dict[str, _Books] | None = None
    """Set while the books are rewound: what the last round left (see :meth:`Pool.settle`)."""
    after_placed: dict[str, tuple[int, ...]] = field(default_factory=dict)


class Pool:
    """The jobs of one resource kind, their units and the policy that decides them."""

    def __init__(
        self,
        capacity: int,
        pause_seconds: float = SCALING_PAUSE_SECONDS,
        topology: Topology | None = None,
        headroom: bool = False,
    ) -> None:
        self.capacity = capacity
        self.gives_headroom = headroom
        """Whether spare units are handed out as headroom (CPU pools; see the module)."""
        self.headroom: dict[str, int] = {}
        """Each running job's headroom after the last round."""
        self.granted: dict[str, int] = {}
        """Units granted to guaranteed jobs beyond their own (share requests; see the
        module)."""
        self.pinned: dict[str, int] = {}
        """Units best-effort jobs are held to by a grant (see the module)."""
        self.pause_seconds = pause_seconds
        self.placements = Placements(topology) if topology is not None else None
        """Where each job's devices are (GPU pools with a known tree; else counted)."""
        self.published: dict[str, tuple[int, tuple[int, ...], int]] = {}
        """Each job's units, devices and headroom as the last round (or the stored books)
        left them: what its share says."""
        self._instant: _Instant | None = None
        self.policy = GuaranteePolicy()
        self.entries: dict[str, Entry] = {}
        """In admission order, as the simulator keeps its active jobs."""
        self.clock = 0.0
        self.wakeup: float | None = None
        """When the last round wants the next one although nothing arrives or ends (a
        guaranteed job's reservation grows at the next slot boundary), or None."""
        self._view: DeadlineView | None = None
        """The last view built, until the books change (one decision asks several times)."""

    def advance(self, now: float) -> None:
        """Progress every holding job to ``now`` (none while paused); the simulator's rule."""
        now = max(now, self.clock)
        if now != self.clock:
            self._view = None
        for entry in self.entries.values():
            if entry.units:
                start = max(entry.last_update, entry.paused_until)
                if now > start:
                    entry.remaining = max(0.0, entry.remaining - entry.rate() * (now - start))
            entry.last_update = now
        self.clock = now

    def view(self, now: float) -> DeadlineView:
        """What the policy sees at ``now`` (built once per state of the books)."""
        if self._view is None or self._view.now != now:
            self._view = DeadlineView(
                now,
                self.divided,
                tuple(
                    entry.view(self.divided)
                    for job_id, entry in self.entries.items()
                    if job_id not in self.pinned
                ),
                self.pause_seconds,
            )
        return self._view

    @property
    def divided(self) -> int:
        """The capacity the policy divides: less the granted and pinned units."""
        held = sum(self.granted.values()) + sum(self.pinned.values())
        return max(0, self.capacity - held)

    def room(self, job_id: str, now: float) -> int:
        """The most units a grant may hold ``job_id`` to: capacity that neither other
        grants nor other jobs' guaranteed reservations hold now."""
        reserved = self.minimum_shares(now)
        held = sum(
            u for other, u in (*self.granted.items(), *self.pinned.items()) if other != job_id
        )
        guaranteed = sum(units for other, units in reserved.items() if other != job_id)
        return max(0, self.capacity - held - guaranteed)

    def hold(self, job_id: str, units: int) -> None:
        """Hold ``job_id`` to ``units`` in all (see the module); the next round divides the
        rest."""
        entry = self.entries[job_id]
        self.granted.pop(job_id, None)
        self.pinned.pop(job_id, None)
        if entry.deadline is None:
            self.pinned[job_id] = units
        elif units > entry.units:
            self.granted[job_id] = units - entry.units
        self._view = None

    def _snapshot(self) -> tuple[dict[str, _Books], dict[str, tuple[int, ...]]]:
        """Every job's books and devices as they stand."""
        placed = dict(self.placements.placed) if self.placements is not None else {}
        return {job_id: entry.books() for job_id, entry in self.entries.items()}, placed

    def _restore(self, books: dict[str, _Books], placed: dict[str, tuple[int, ...]]) -> None:
        """Back to a :meth:`_snapshot` (jobs that left since stay gone)."""
        for job_id, kept in books.items():
            entry = self.entries.get(job_id)
            if entry is not None:
                entry.restore(kept)
        if self.placements is not None:
            self.placements.placed = {
                job_id: devices for job_id, devices in placed.items() if job_id in self.entries
            }
        self._view = None

    def _rewind(self, now: float) -> None:
        """Before anything else at an instant a round already ran at: the books as they
        were before that round (see the module docstring)."""
        instant = self._instant
        if instant is None or instant.at != now or instant.after is not None:
            return
        instant.after, instant.after_placed = self._snapshot()
        self._restore(instant.before, instant.placed)

    def settle(self, now: float) -> None:
        """After an event at ``now`` that ran no round (a refused job): if the books were
        rewound for it, back to what the instant's last round left, which still stands (a
        refused arrival changes no decision; in the simulator the instant's one round runs
        after it, and decides the same)."""
        instant = self._instant
        if instant is None or instant.at != now or instant.after is None:
            return
        self._restore(instant.after, instant.after_placed)
        instant.after = None

    def earliest_deadline(self, now: float, entry: Entry) -> float | None:
        """The earliest deadline at which ``entry`` would be guaranteed now (None: none)."""
        self._rewind(now)
        return self.policy.earliest_deadline(self.view(now), entry.view(self.divided))

    def blocked(self, now: float) -> bool:
        """Whether no deadline can be guaranteed now beside the guaranteed jobs (see
        :meth:`GuaranteePolicy.blocked`). Asked of a refused job, before or without a
        round at ``now``: it reads the books as they are."""
        return self.policy.blocked(self.view(now))

    def join(self, now: float, entry: Entry) -> bool:
        """Add ``entry``; a job with a deadline joins only if the policy admits it (it keeps
        the plans that admitted it for this instant's round, as in the simulator)."""
        self._rewind(now)
        self.advance(now)
        entry.last_update = now
        if not entry.units and entry.waiting_since is None:
            entry.waiting_since = now
        if entry.deadline is not None and not self.policy.admit(
            self.view(now), entry.view(self.divided)
        ):
            self.policy.forget(entry.job_id)
            return False
        self.entries[entry.job_id] = entry
        if self._instant is not None and self._instant.at == now:
            self._instant.before[entry.job_id] = entry.books()
        self._view = None
        return True

    def leave(self, now: float, job_id: str) -> Entry | None:
        """Remove a job that ended; its units are free for the next round."""
        self._rewind(now)
        self.advance(now)
        entry = self.entries.pop(job_id, None)
        self.policy.forget(job_id)
        self.published.pop(job_id, None)
        self.headroom.pop(job_id, None)
        self.granted.pop(job_id, None)
        self.pinned.pop(job_id, None)
        if self.placements is not None:
            self.placements.forget(job_id)
        self._view = None
        return entry

    def devices(self, job_id: str) -> tuple[int, ...]:
        """The devices a job's GPUs are placed on (empty: not placed, or counted only)."""
        if self.placements is None:
            return ()
        return self.placements.placed.get(job_id, ())

    def round(self, now: float) -> dict[str, int]:
        """Decide every job's units (minimum shares, then spare by marginal return), place
        them, and apply them with the simulator's pause rule; returns the jobs whose share
        (units, devices or headroom) differs from what the last round published."""
        self._rewind(now)
        self.advance(now)
        if self._instant is None or self._instant.at != now:
            self._instant = _Instant(now, *self._snapshot())
        self._instant.after = None  # this round decides afresh from the rewound books
        view = self.view(now)
        decided = self.policy.decide(view)
        wakeup = self.policy.wakeup(view, decided)
        decision = {**decided, **self.pinned}
        self.wakeup = wakeup if wakeup is not None and wakeup > now else None
        moved = (
            self.placements.apply(decision, self.entries) if self.placements is not None else set()
        )
        changed: dict[str, int] = {}
        for job_id, entry in self.entries.items():
            units = decision.get(job_id, 0)
            if units != entry.units or job_id in moved:
                entry.units = units
                entry.last_update = now
                if units:
                    entry.paused_until = now + self.pause_seconds
                    entry.waiting_since = None
                else:
                    entry.waiting_since = now
        self.headroom = self._split_spare() if self.gives_headroom else {}
        for job_id, entry in self.entries.items():
            shown = (
                entry.units,
                self.devices(job_id),
                self.headroom.get(job_id, 0) + self.granted.get(job_id, 0),
            )
            if self.published.get(job_id, (0, (), 0)) != shown:
                changed[job_id] = entry.units
            self.published[job_id] = shown
        self._view = None
        return changed

    def _split_spare(self) -> dict[str, int]:
        """The units no job holds, split among the running jobs (see the module)."""
        divided = {j: e for j, e in self.entries.items() if j not in self.pinned}
        spare = self.divided - sum(entry.units for entry in divided.values())
        running = [job_id for job_id, entry in divided.items() if entry.units]
        if spare <= 0 or not running:
            return {}
        each, rest = divmod(spare, len(running))
        return {
            job_id: each + (1 if position < rest else 0)
            for position, job_id in enumerate(running)
            if each or position < rest
        }

    @property
    def notes(self) -> dict[str, str]:
        """Why jobs lost units to higher priority classes in the last round (by job id)."""
        return self.policy.notes

    def recover(self, now: float) -> None:
        """After a restart: when the next slot-boundary round is due for the units the
        books hold (the timer that would have woken it died with the process)."""
        self.advance(now)
        view = self.view(now)
        self.policy.minimum_shares(view)
        held = {job_id: entry.units for job_id, entry in self.entries.items()}
        wakeup = self.policy.wakeup(view, held)
        self.wakeup = wakeup if wakeup is not None and wakeup > now else None

    def resize(self, now: float, capacity: int, topology: Topology | None = None) -> None:
        """The cluster grew or shrank (nodes added, lost or drained): progress the books
        to ``now`` on the old capacity; the next round decides (and places) on the new
        one. A new tree drops every placement: the next round places every job afresh."""
        self._rewind(now)
        self.advance(now)
        self.capacity = capacity
        if topology is None:
            self.placements = None
        elif self.placements is None or self.placements.topology != topology:
            self.placements = Placements(topology)
        self._view = None

    def guaranteed(self, now: float) -> set[str]:
        """The jobs whose deadline is guaranteed now."""
        return set(self.minimum_shares(now))

    def minimum_shares(self, now: float) -> dict[str, int]:
        """Each guaranteed job's reservation in the current slot."""
        return self.policy.minimum_shares(self.view(now))

    def reservations(self, now: float) -> dict[str, tuple[int, ...]]:
        """Each guaranteed job's reservation per slot from now."""
        return self.policy.reservations(self.view(now))
