"""The optimizer's side of share requests: what it asks admission for, and the answer.

When the stage step or the OOM rule wants a plan beyond the job's share, the optimizer asks
admission (``AdmissionService.RequestShare``) with the whole wanted plan, chief and data
workers included, and the claim's eq. 8 inputs, or marks an OOM fix as safety. A granted
answer carries the raised share, and the plan goes out in the same decision. A queued OOM
fix suspends the job (its pods are removed, so it is not killed again) until admission
grants it when capacity frees; then the job resumes with the fix.
"""

from __future__ import annotations

from dataclasses import replace

import structlog

from stride.optimizer.domain.observations import GIB
from stride.optimizer.domain.tuning import pods_of
from stride.policy import stages
from stride.policy.contention import Claim, ShareBound, ShareRequest, within_share
from stride.policy.plans import Plan

log = structlog.get_logger(__name__)


def share_request(
    claim: Claim, held: tuple[float, float], wanted: tuple[float, float]
) -> ShareRequest:
    """``claim`` as a request for the job's whole plans: ``held`` and ``wanted`` are each
    plan's (cores, GiB) with every role counted."""
    return replace(
        ShareRequest.of(claim),
        held_cpu=held[0],
        held_memory_gib=held[1],
        wanted_cpu=wanted[0],
        wanted_memory_gib=wanted[1],
    )


def plan_totals(plan: Plan) -> tuple[float, float]:
    """Cores and GiB every pod of ``plan`` holds (chief and data workers included)."""
    return plan.total_cpu(), plan.total_memory_bytes() / GIB


def shrunk_into(bound: ShareBound, plan: Plan) -> tuple[stages.Pods, str] | None:
    """``plan``'s workers and PS shrunk so the whole plan (chief and data workers too) fits
    ``bound``, with why it did not; None when it fits already or cannot be made to (no
    workers and PS to shrink, or not even the smallest shape fits: logged)."""
    cpu, memory = plan_totals(plan)
    excess = bound.excess(cpu, memory)
    pods = pods_of(plan)
    if not excess or pods is None:
        return None
    fitted = within_share(pods, bound, cpu - pods.cpu, memory - pods.memory_gib)
    if fitted is None:
        log.warning("share too small for one worker and the PS", why=excess)
        return None
    return fitted, excess


def cut_to_cores(plan: Plan, cpu: float) -> stages.Pods | None:
    """``plan``'s workers and PS with their cores cut so the whole plan holds ``cpu`` cores,
    its memory as it is (memory per pod is never cut); None when it holds them already."""
    cut = shrunk_into(ShareBound(cpu, 1e18), plan)
    return None if cut is None else cut[0]
