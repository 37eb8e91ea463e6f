"""The storage form of a claim (:class:`stride.policy.contention.Claim`): a plan the
cluster (or the job's share) could not hold when it was decided, kept until the job's next
decision replaces it, the job ends, or the weighted greedy grants it."""

from __future__ import annotations

import dataclasses
import json

from stride.policy.contention import Claim
from stride.policy.stages import Pods


def claim_to_json(claim: Claim) -> str:
    """The claim as JSON."""
    data = dataclasses.asdict(claim)
    return json.dumps(data, sort_keys=True)


def claim_from_json(text: str) -> Claim:
    """The claim stored by :func:`claim_to_json`."""
    data = json.loads(text)
    return Claim(
        job_id=data["job_id"],
        held=Pods(**data["held"]),
        wanted=Pods(**data["wanted"]),
        throughput_now=float(data["throughput_now"]),
        throughput_wanted=float(data["throughput_wanted"]),
        remaining_samples=float(data["remaining_samples"]),
        pause_seconds=float(data["pause_seconds"]),
        safety=bool(data["safety"]),
        cause=str(data["cause"]),
    )
