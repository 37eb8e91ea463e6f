"""What admission decides about a job: admit, reject or queue it, and why.

The decision itself is taken through the admit port (``stride.decisions``), in-process or
by the executor pool. Today's algorithm is the TEMPORARY ``admit-all``; the admission issue
replaces it with Minimum Satisfactory Share by progressive filling (ElasticFlow sec. 4.1),
quotas and priorities, through the same port.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from stride.policy.admit_all import AdmitAllReply


class Outcome(Enum):
    """What admission decided."""

    ADMITTED = "admitted"
    REJECTED = "rejected"
    QUEUED = "queued"


@dataclass(frozen=True)
class Share:
    """A minimum share of the cluster: workers and the CPU and memory they need."""

    workers: int
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class Decision:
    """An admission decision and why."""

    outcome: Outcome
    reason: str
    policy: str
    minimum_share: Share | None


def decision_from_admit_all(reply: AdmitAllReply, policy: str) -> Decision:
    """The decision the TEMPORARY admit-all algorithm (``stride.policy.admit_all``) made.

    Replaced by the admission issue's progressive-filling policy, which comes through the
    same admit port.
    """
    return Decision(
        outcome=Outcome(reply.outcome),
        reason=reply.reason,
        policy=policy,
        minimum_share=Share(
            workers=reply.minimum_workers,
            cpu=reply.minimum_cpu,
            memory_bytes=reply.minimum_memory_bytes,
        ),
    )
