"""Greedy allocation of spare devices by marginal return (ElasticFlow sec. 4.2, Algorithm 2).

After every admitted job has its minimum satisfactory share for the next slot, the cluster
may still have idle devices. Algorithm 2 gives them out one at a time to the job with the
highest *marginal return*, "the GPU time saved" by one more device, and keeps a job in the
queue only while one more device makes it finish earlier (line 9). Best-effort and
soft-deadline jobs join the same queue with a minimum share of zero (sec. 4.4).

Marginal return. Algorithm 2 measures it by re-running progressive filling for the job's
future slots after the extra device. Stride prices the future instead: every iteration done
now saves ``w_i = s_1 / T_i(s_1)`` device-time later, the cost of an iteration at the job's
most efficient size (its smallest, since the curve is concave; sec. 4.1: "using a single
GPU has the lowest GPU resource usage"). The return of growing job ``i`` from ``x`` to its
next allowed size ``x'`` is then ``w_i (T_i(x') - T_i(x)) / (x' - x) - 1`` per device:
device-time saved later minus the device spent now. With unit steps the problem is
``max sum_i w_i T_i(x_i)`` over ``x_i >= a_i``, ``sum x_i <= G`` with every device handed out
while any job can still speed up: separable and concave, so the greedy is optimal
(Theorem 2's argument), which ``test_elasticflow_allocation.py`` checks against brute force.
With power-of-two steps a step may not fit the devices left; the job then waits and smaller
steps of other jobs go first (a heuristic: with steps > 1 the greedy is not always optimal).
Minimum shares keep every deadline: a job never gets fewer devices than admission reserved.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from stride.policy.elasticflow.admission import JobKind
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.errors import PolicyError

ALGORITHM_NAME = "elasticflow-allocation"
ALGORITHM_VERSION = 1


class InvalidAllocation(PolicyError):
    """An allocation request is malformed (shares over capacity, a size not allowed, ...)."""


@dataclass(frozen=True)
class AllocationJob:
    """One job in the next slot: its curve and the devices admission reserved for it."""

    job_id: str
    curve: ScalingCurve
    """Must be monotone and concave (Theorem 2 assumes it)."""
    minimum_share: int = 0
    """a_i(0) from admission; 0 for best-effort and soft-deadline jobs."""
    kind: JobKind = JobKind.HARD


@dataclass(frozen=True)
class AllocationRequest:
    """Spread ``capacity`` devices over ``jobs`` for the next slot."""

    capacity: int
    jobs: tuple[AllocationJob, ...]
    resource_kind: str = "gpu"


@dataclass(frozen=True)
class JobAllocation:
    """Devices one job gets in the next slot."""

    job_id: str
    devices: int


@dataclass(frozen=True)
class AllocationReply:
    """Devices per job (in request order) and what is left idle."""

    allocations: tuple[JobAllocation, ...]
    idle_devices: int
    resource_kind: str = "gpu"


def marginal_weight(curve: ScalingCurve) -> float:
    """``w_i``: device-time per iteration at the curve's most efficient (smallest) size."""
    return curve.device_seconds_per_iteration


def _next_step(curve: ScalingCurve, devices: int) -> tuple[int, float] | None:
    """The next allowed size above ``devices`` that is strictly faster, with its gain."""
    return curve.next_faster(devices)


def _validate(request: AllocationRequest) -> None:
    capacity = request.capacity
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
        raise InvalidAllocation("capacity", f"must be a whole number > 0, got {capacity!r}")
    seen: set[str] = set()
    total = 0
    for index, job in enumerate(request.jobs):
        field = f"jobs[{index}]"
        if not job.job_id or job.job_id in seen:
            raise InvalidAllocation(
                f"{field}.job_id", f"must be unique and non-empty: {job.job_id!r}"
            )
        seen.add(job.job_id)
        job.curve.require_concave(f"{field}.curve")
        share = job.minimum_share
        if isinstance(share, bool) or not isinstance(share, int) or share < 0:
            raise InvalidAllocation(f"{field}.minimum_share", f"must be >= 0, got {share!r}")
        if share and job.curve.usable(share) != share:
            raise InvalidAllocation(
                f"{field}.minimum_share", f"{share} is not an allowed size of the job's curve"
            )
        total += share
    if total > capacity:
        raise InvalidAllocation(
            "jobs", f"minimum shares add up to {total} devices, capacity is {capacity}"
        )


def allocate(request: AllocationRequest) -> list[int]:
    """Algorithm 2: devices per job (request order), minimum shares first, then greedy."""
    _validate(request)
    devices = [job.minimum_share for job in request.jobs]
    spare = request.capacity - sum(devices)
    weights = [marginal_weight(job.curve) for job in request.jobs]
    # Max-heap on return per device; ties go to the earlier job so results are reproducible.

    def entry(index: int) -> tuple[float, int, int, float] | None:
        step = _next_step(request.jobs[index].curve, devices[index])
        if step is None:
            return None
        size, gain = step
        width = size - devices[index]
        return (-(weights[index] * gain / width - 1.0), index, size, gain)

    queue = [item for index in range(len(request.jobs)) if (item := entry(index)) is not None]
    heapq.heapify(queue)
    while spare > 0 and queue:
        _, index, size, _ = heapq.heappop(queue)
        width = size - devices[index]
        if width > spare:
            continue  # spare only shrinks, so this step never fits again
        devices[index] = size
        spare -= width
        item = entry(index)
        if item is not None:
            heapq.heappush(queue, item)
    return devices


def run(request: AllocationRequest) -> AllocationReply:
    """The registry entry point: Algorithm 2 on ``request``."""
    devices = allocate(request)
    return AllocationReply(
        allocations=tuple(
            JobAllocation(job.job_id, count)
            for job, count in zip(request.jobs, devices, strict=True)
        ),
        idle_devices=request.capacity - sum(devices),
        resource_kind=request.resource_kind,
    )


def total_value(request: AllocationRequest, devices: list[int]) -> float:
    """``sum_i w_i T_i(x_i)``: the objective the greedy maximizes (for tests and benches)."""
    return math.fsum(
        marginal_weight(job.curve) * job.curve.throughput(count)
        for job, count in zip(request.jobs, devices, strict=True)
    )
