"""The optimizer's side of share requests: what it asks admission for, and the answer.

When the stage step or the OOM rule wants a plan beyond the job's share, the optimizer asks
admission (``AdmissionService.RequestShare``) with the whole wanted plan, chief and data
workers included, and the claim's eq. 8 inputs, or marks an OOM fix as safety. A granted
answer carries the raised share, and the plan goes out in the same decision. A queued OOM
fix suspends the job (its pods are removed, so it is not killed again) until admission
grants it when capacity frees; then the job resumes with the fix.
"""

from __future__ import annotations

from stride.policy.contention import Claim, ShareRequest


def share_request(
    claim: Claim, held: tuple[float, float], wanted: tuple[float, float]
) -> ShareRequest:
    """``claim`` as a request for the job's whole plans: ``held`` and ``wanted`` are each
    plan's (cores, GiB) with every role counted."""
    return ShareRequest(
        job_id=claim.job_id,
        held_cpu=held[0],
        held_memory_gib=held[1],
        wanted_cpu=wanted[0],
        wanted_memory_gib=wanted[1],
        throughput_now=claim.throughput_now,
        throughput_wanted=claim.throughput_wanted,
        remaining_samples=claim.remaining_samples,
        pause_seconds=claim.pause_seconds,
        safety=claim.safety,
        cause=claim.cause,
    )
