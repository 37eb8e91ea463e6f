"""What Environment A's policies see and answer: job and cluster snapshots, one interface.

Why a module of its own: Stride's policy (``stride.policy.elasticflow.guarantees``, where
the views live, since the admission service runs it too) and the baselines
(``stride.sim.deadline_baselines``) both implement :class:`DeadlinePolicy` over these views,
and the environment drives them all the same way.
"""

from __future__ import annotations

from typing import Protocol

from stride.policy.elasticflow.guarantees import DeadlineView, JobView, edf_key

__all__ = ["DeadlinePolicy", "DeadlineView", "JobView", "edf_key"]


class DeadlinePolicy(Protocol):
    """Environment A's specialisation of :class:`stride.sim.engine.Policy`.

    ``admit`` is asked once per arrival (``candidate`` is not yet in ``view.jobs``);
    ``decide`` returns GPUs per active job (missing means 0), within capacity; ``wakeup``
    names the next instant the policy wants a round although nothing arrives or completes
    (a lease expiring, a job crossing a priority threshold), or None.
    """

    name: str

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Whether to accept the candidate (False drops it for good)."""
        ...

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """GPUs for each active job."""
        ...

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """The next time-driven round after ``decision`` takes effect, or None."""
        ...
