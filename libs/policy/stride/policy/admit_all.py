"""Admit every valid job with a one-worker minimum share: the stand-in admission policy.

TEMPORARY, and labelled so in every decision it makes (``admit-all/1``): the admission
issue replaces it with ElasticFlow's Minimum Satisfactory Share by progressive filling
(``elasticflow-admission``), quotas and priorities. It is a registered algorithm so that
admission reaches it through the same admit port as its successor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stride.policy.registry import AlgorithmSpec

ALGORITHM_NAME = "admit-all"
ALGORITHM_VERSION = 1

MINIMUM_WORKERS = 1
MINIMUM_CPU = 1.0
MINIMUM_MEMORY_BYTES = 2 * 1024**3
"""One worker of one core and 2 GiB: what the cold-start plan's smallest worker needs."""


@dataclass(frozen=True)
class AdmitAllRequest:
    """The job to decide on; admit-all looks only at whether it has a deadline."""

    job_name: str
    has_deadline: bool


@dataclass(frozen=True)
class AdmitAllReply:
    """Always ``admitted``, with the minimum share and a reason a user can read."""

    outcome: str
    reason: str
    minimum_workers: int
    minimum_cpu: float
    minimum_memory_bytes: int


def run(request: AdmitAllRequest) -> AdmitAllReply:
    """Admit ``request``'s job unconditionally."""
    reason = "every valid job is admitted (temporary policy)"
    if request.has_deadline:
        reason += "; its deadline is NOT guaranteed yet"
    return AdmitAllReply(
        outcome="admitted",
        reason=reason,
        minimum_workers=MINIMUM_WORKERS,
        minimum_cpu=MINIMUM_CPU,
        minimum_memory_bytes=MINIMUM_MEMORY_BYTES,
    )


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=ALGORITHM_NAME,
        version=ALGORITHM_VERSION,
        description="TEMPORARY: admit every valid job with a one-worker minimum share",
        request_type=AdmitAllRequest,
        reply_type=AdmitAllReply,
        run=run,
    ),
)
ADMIT_ALL = ALGORITHMS[0]
