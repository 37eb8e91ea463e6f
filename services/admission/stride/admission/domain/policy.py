"""Admission policies: given a valid job, admit, reject or queue it.

``AdmitAll`` is TEMPORARY. It is the foundation's stand-in until the admission issue
replaces it with Minimum Satisfactory Share by progressive filling (ElasticFlow sec. 4.1),
quotas and priorities. The seam is :class:`AdmissionPolicy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Protocol

from stride.admission.domain.jobs import JobSpec


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


class AdmissionPolicy(Protocol):
    """Decides on one valid job."""

    name: str

    def decide(self, spec: JobSpec, now: datetime) -> Decision:
        """Admit, reject or queue ``spec``."""
        ...


class AdmitAll:
    """TEMPORARY: admits every valid job with a one-worker minimum share.

    Replaced by the admission issue's progressive-filling policy; kept only so the job path
    runs end to end meanwhile.
    """

    name = "admit-all/1"

    def decide(self, spec: JobSpec, now: datetime) -> Decision:
        """Admit ``spec`` unconditionally."""
        return Decision(
            outcome=Outcome.ADMITTED,
            reason="every valid job is admitted (temporary policy)",
            policy=self.name,
            minimum_share=Share(workers=1, cpu=1.0, memory_bytes=2 * 1024**3),
        )
