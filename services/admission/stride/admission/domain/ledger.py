"""Admission's model of the cluster: who holds what, how far each job got, who is guaranteed.

One :class:`Pool` per resource kind (GPUs; CPU units, :mod:`stride.policy.elasticflow.units`)
runs :class:`~stride.policy.elasticflow.guarantees.GuaranteePolicy`, the class
``stride sim --env deadline`` runs, and keeps its books the way the simulator's environment
does: a job progresses at ``curve.throughput(units)`` steps per second, except for a pause of
``pause_seconds`` after every change of its units; a round (on every arrival, completion
and capacity change) re-decides every job's units. The difference is only where events come
from: submissions, job ends and capacity changes on admission's clock.

Progress is the model's (as in the simulator): admission does not read training metrics.
A job that trains slower than its curve says can therefore miss a deadline admission
believed kept; reconciling with measured progress is the optimizer's side of the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from stride.policy.elasticflow.guarantees import (
    SCALING_PAUSE_SECONDS,
    DeadlineView,
    GuaranteePolicy,
    JobView,
)
from stride.policy.elasticflow.units import JobCurve

__all__ = ["Entry", "Guarantee", "Pool", "Verdict"]


class Guarantee(Enum):
    """How a job in a pool is treated."""

    HARD = "hard"
    """Its deadline is guaranteed under the model (hard, or a soft one that could be)."""
    BEST_EFFORT = "best-effort"
    """No guarantee: no deadline, or a soft one that could not be guaranteed."""


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

    @property
    def guarantee(self) -> Guarantee:
        return Guarantee.BEST_EFFORT if self.deadline is None else Guarantee.HARD

    def view(self) -> JobView:
        return JobView(
            self.job_id,
            self.curve.curve,
            self.remaining,
            self.deadline,
            self.submitted,
            0,
            self.units,
            self.paused_until,
            self.total_steps,
        )

    def rate(self) -> float:
        return self.curve.curve.throughput(self.units) if self.units else 0.0


@dataclass(frozen=True)
class Verdict:
    """Whether a job may join a pool, and on what terms."""

    guaranteed: bool
    """Its deadline can be guaranteed beside the guaranteed jobs."""
    earliest_deadline: float | None
    """When it was not: the earliest deadline that would be (None: none, or not asked)."""


class Pool:
    """The jobs of one resource kind, their units and the policy that decides them."""

    def __init__(self, capacity: int, pause_seconds: float = SCALING_PAUSE_SECONDS) -> None:
        self.capacity = capacity
        self.pause_seconds = pause_seconds
        self.policy = GuaranteePolicy()
        self.entries: dict[str, Entry] = {}
        """In admission order, as the simulator keeps its active jobs."""
        self.clock = 0.0
        self.wakeup: float | None = None
        """When the last round wants the next one although nothing arrives or ends (a
        guaranteed job's reservation grows at the next slot boundary), or None."""

    def advance(self, now: float) -> None:
        """Progress every holding job to ``now`` (none while paused); the simulator's rule."""
        now = max(now, self.clock)
        for entry in self.entries.values():
            if entry.units:
                start = max(entry.last_update, entry.paused_until)
                if now > start:
                    entry.remaining = max(0.0, entry.remaining - entry.rate() * (now - start))
            entry.last_update = now
        self.clock = now

    def view(self, now: float) -> DeadlineView:
        return DeadlineView(
            now,
            self.capacity,
            tuple(entry.view() for entry in self.entries.values()),
            self.pause_seconds,
        )

    def consider(self, now: float, entry: Entry) -> Verdict:
        """Whether ``entry`` (with a deadline) would be guaranteed now; changes nothing but
        the clock. The earliest deadline is worked out only when it would not."""
        self.advance(now)
        if entry.deadline is None:
            return Verdict(False, None)
        view = self.view(now)
        candidate = replace(entry, last_update=now).view()
        if self.policy.fits(view, candidate):
            return Verdict(True, None)
        return Verdict(False, self.policy.earliest_deadline(view, candidate))

    def join(self, now: float, entry: Entry) -> bool:
        """Add ``entry``; a job with a deadline joins only if the policy admits it (it keeps
        the plans that admitted it for this instant's round, as in the simulator)."""
        self.advance(now)
        entry.last_update = now
        if entry.deadline is not None and not self.policy.admit(self.view(now), entry.view()):
            self.policy.forget(entry.job_id)
            return False
        self.entries[entry.job_id] = entry
        return True

    def leave(self, now: float, job_id: str) -> Entry | None:
        """Remove a job that ended; its units are free for the next round."""
        self.advance(now)
        entry = self.entries.pop(job_id, None)
        self.policy.forget(job_id)
        return entry

    def round(self, now: float) -> dict[str, int]:
        """Decide every job's units (minimum shares, then spare by marginal return) and
        apply them with the simulator's pause rule; returns the jobs whose units changed."""
        self.advance(now)
        view = self.view(now)
        decision = self.policy.decide(view)
        wakeup = self.policy.wakeup(view, decision)
        self.wakeup = wakeup if wakeup is not None and wakeup > now else None
        changed: dict[str, int] = {}
        for job_id, entry in self.entries.items():
            units = decision.get(job_id, 0)
            if units == entry.units:
                continue
            entry.units = units
            entry.last_update = now
            if units:
                entry.paused_until = now + self.pause_seconds
            changed[job_id] = units
        return changed

    def minimum_shares(self, now: float) -> dict[str, int]:
        """Each guaranteed job's reservation in the current slot."""
        return self.policy.minimum_shares(self.view(now))

    def reservations(self, now: float) -> dict[str, tuple[int, ...]]:
        """Each guaranteed job's reservation per slot from now."""
        return self.policy.reservations(self.view(now))
