"""Cluster-level weighted greedy selection: which job gets which of its candidate plans.

Each job's NSGA-II front (:mod:`stride.policy.pareto`) offers plans that trade resources for
throughput; the cluster has only so much to give. DLRover-RM's auto-scaling stage ends with
a cluster-level step (sec. 4.3, "Cluster-Level Weighted Greedy Selection") that picks at
most one plan per job to maximize (eq. 12)

    sum over jobs j of  RE(A^j) * WG(A^j)      subject to  sum_j A^j <= S      (eq. 13)

where ``RE(A) = TG(A) / RC(A)`` is the plan's resource efficiency (eq. 11) and
``WG(A) = 1 / (Phi_sp / Psi^A + epsilon)^rho`` weighs a job by its remaining time under the plan:
remaining samples over predicted throughput (eq. 14). rho = 2.5 at Ant Group favours short
jobs ("to complete shorter jobs quicker and release the resources"); rho = 0 weighs all jobs
equally and rho < 0 favours long ones.

This module is independent of how candidates are made: a candidate is a resource vector
(what it asks of the pool, e.g. cores and GiB), its predicted throughput, its TG and its RC.

The greedy (eq. 12-13 are a multiple-choice knapsack, NP-hard; the paper names its method
"weighted greedy" without spelling it out). Stride's reading, documented and tested:

1. score every candidate by ``RE * WG``;
2. visit candidates from the highest score down; take one if its job has no plan yet and it
   fits in what is left of S in every resource;
3. a candidate with a score <= 0 is never taken (leaving its job as it is adds 0 to eq. 12).

Ties in score are broken by job id, then by the candidate's own values, so the selection is
the same whatever order jobs and candidates arrive in. It runs in O(n log n) for n
candidates. Guarantees (tested against brute force on small instances): with room for every
job's best plan it is optimal; in general it takes the single best plan that fits, so its
objective is at least the best single plan's, hence at least OPT / (number of jobs); and it
is maximal (no job left out has a positive plan that still fits). The paper claims no
optimality bound, and greedy by score has none better in general.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec

ALGORITHM_NAME = "dlrover-weighted-greedy"
"""Registered name of the algorithm."""
ALGORITHM_VERSION = 1
"""Bump when the score or the visiting order changes."""

DEFAULT_RHO = 2.5
"""rho of eq. 14, "a reasonable value to complete shorter jobs quicker" at Ant Group."""
DEFAULT_EPSILON = 1e-9
"""epsilon of eq. 14, "a very small value used to prevent division by zero" (a job with no
samples left). Remaining times are in seconds, so 1e-9 s never changes a real job's rank."""


class InvalidSelection(PolicyError):
    """A selection input is invalid: a bad capacity, candidate, job or parameter."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_number(field: str, value: object, *, minimum: float | None, strict: bool) -> None:
    if not _is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidSelection(field, f"must be a finite number, got {value!r}")
    if minimum is not None:
        if strict and not value > minimum:  # type: ignore[operator]
            raise InvalidSelection(field, f"must be > {minimum}, got {value!r}")
        if not strict and not value >= minimum:  # type: ignore[operator]
            raise InvalidSelection(field, f"must be >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class Candidate:
    """One plan of one job, as the selection sees it."""

    resources: tuple[float, ...]
    """What the plan asks of the pool, one amount per resource of the capacity (>= 0)."""
    throughput: float
    """Psi^A: predicted samples/s under the plan (> 0), for eq. 14."""
    throughput_gain: float
    """TG(A) of eq. 8 (may be <= 0; such a plan is never taken)."""
    resource_cost: float
    """RC(A) of eq. 7 (> 0, since eq. 11 divides by it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", tuple(self.resources))
        for index, amount in enumerate(self.resources):
            _check_number(f"resources[{index}]", amount, minimum=0.0, strict=False)
        _check_number("throughput", self.throughput, minimum=0.0, strict=True)
        _check_number("throughput_gain", self.throughput_gain, minimum=None, strict=False)
        _check_number("resource_cost", self.resource_cost, minimum=0.0, strict=True)


@dataclass(frozen=True)
class JobCandidates:
    """A job needing reallocation (J of eq. 12) and its candidate plans."""

    job_id: str
    remaining_samples: float
    """Phi_sp: samples the job has left to train (>= 0), for eq. 14."""
    candidates: tuple[Candidate, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise InvalidSelection("job_id", "is required")
        _check_number("remaining_samples", self.remaining_samples, minimum=0.0, strict=False)
        object.__setattr__(self, "candidates", tuple(self.candidates))
        for index, candidate in enumerate(self.candidates):
            if not isinstance(candidate, Candidate):
                raise InvalidSelection(
                    f"candidates[{index}]", f"must be a Candidate, got {type(candidate).__name__}"
                )


@dataclass(frozen=True)
class SelectionRequest:
    """The executor's request type for ``dlrover-weighted-greedy``."""

    capacity: tuple[float, ...]
    """S of eq. 13: what the pool can give, per resource (each > 0)."""
    jobs: tuple[JobCandidates, ...]
    """Job ids unique; every candidate's resources as long as ``capacity``."""
    resource_names: tuple[str, ...] = ()
    """Names of the resources (e.g. "cpu", "memory_gib"), for messages; optional."""
    rho: float = DEFAULT_RHO
    epsilon: float = DEFAULT_EPSILON

    def __post_init__(self) -> None:
        object.__setattr__(self, "capacity", tuple(self.capacity))
        object.__setattr__(self, "jobs", tuple(self.jobs))
        object.__setattr__(self, "resource_names", tuple(self.resource_names))
        if not self.capacity:
            raise InvalidSelection("capacity", "must list at least one resource")
        for index, amount in enumerate(self.capacity):
            _check_number(f"capacity[{index}]", amount, minimum=0.0, strict=True)
        if self.resource_names and len(self.resource_names) != len(self.capacity):
            raise InvalidSelection(
                "resource_names",
                f"has {len(self.resource_names)} names for {len(self.capacity)} resources",
            )
        _check_number("rho", self.rho, minimum=None, strict=False)
        _check_number("epsilon", self.epsilon, minimum=0.0, strict=True)
        seen: set[str] = set()
        for job_index, job in enumerate(self.jobs):
            if not isinstance(job, JobCandidates):
                raise InvalidSelection(
                    f"jobs[{job_index}]", f"must be JobCandidates, got {type(job).__name__}"
                )
            if job.job_id in seen:
                raise InvalidSelection(
                    f"jobs[{job_index}].job_id", f"{job.job_id!r} appears more than once"
                )
            seen.add(job.job_id)
            for index, candidate in enumerate(job.candidates):
                if len(candidate.resources) != len(self.capacity):
                    raise InvalidSelection(
                        f"jobs[{job_index}].candidates[{index}].resources",
                        f"has {len(candidate.resources)} amounts for "
                        f"{len(self.capacity)} resources",
                    )


@dataclass(frozen=True)
class SelectedPlan:
    """The plan chosen for one job."""

    job_id: str
    candidate_index: int
    """Position of the plan in the job's ``candidates`` as given."""
    score: float
    """RE * WG of the plan (its term of eq. 12)."""


@dataclass(frozen=True)
class SelectionReply:
    """The chosen plans (by job id), the objective and the capacity left."""

    selected: tuple[SelectedPlan, ...]
    objective: float
    """Eq. 12's sum over the selected plans."""
    remaining_capacity: tuple[float, ...]


def weight(remaining_samples: float, plan_throughput: float, rho: float, epsilon: float) -> float:
    """WG(A) of eq. 14: ``1 / (Phi_sp / Psi^A + epsilon)^rho``."""
    return float((remaining_samples / plan_throughput + epsilon) ** -rho)


def score(job: JobCandidates, candidate: Candidate, rho: float, epsilon: float) -> float:
    """``RE(A) * WG(A)`` (eq. 11 times eq. 14): a plan's term of eq. 12."""
    efficiency = candidate.throughput_gain / candidate.resource_cost
    return efficiency * weight(job.remaining_samples, candidate.throughput, rho, epsilon)


def select(request: SelectionRequest) -> SelectionReply:
    """The weighted greedy of DLRover-RM sec. 4.3 (eq. 11-14); see the module docstring."""
    dimensions = len(request.capacity)
    job_of: list[int] = []
    index_in_job: list[int] = []
    scores: list[float] = []
    demands: list[tuple[float, ...]] = []
    for job_index, job in enumerate(request.jobs):
        for candidate_index, candidate in enumerate(job.candidates):
            value = score(job, candidate, request.rho, request.epsilon)
            if not math.isfinite(value):
                raise InvalidSelection(
                    f"jobs[{job_index}].candidates[{candidate_index}]",
                    f"scores {value} (RE * WG overflows; lower rho or raise epsilon)",
                )
            if value <= 0:
                continue
            job_of.append(job_index)
            index_in_job.append(candidate_index)
            scores.append(value)
            demands.append(candidate.resources)

    # Canonical visiting order: score descending, then job id, then the candidate's values,
    # so that permuting the input permutes nothing in the output.
    if scores:
        job_ids = np.array([request.jobs[j].job_id for j in job_of])
        columns: list[Any] = []
        columns.extend(np.array([c[d] for c in demands]) for d in reversed(range(dimensions)))
        candidates = [
            request.jobs[j].candidates[i] for j, i in zip(job_of, index_in_job, strict=True)
        ]
        columns.append(np.array([c.resource_cost for c in candidates]))
        columns.append(np.array([-c.throughput_gain for c in candidates]))
        columns.append(np.array([-c.throughput for c in candidates]))
        columns.append(job_ids)
        columns.append(-np.array(scores))
        order = np.lexsort(columns).tolist()
    else:
        order = []

    used = [0.0] * dimensions
    taken: set[int] = set()
    selected: list[SelectedPlan] = []
    for position in order:
        job_index = job_of[position]
        if job_index in taken:
            continue
        demand = demands[position]
        # Compare used + demand with S (not demand with S - used) so the check is the one a
        # caller makes when re-adding the chosen demands in pick order.
        if all(used[d] + demand[d] <= request.capacity[d] for d in range(dimensions)):
            for d in range(dimensions):
                used[d] += demand[d]
            taken.add(job_index)
            selected.append(
                SelectedPlan(
                    request.jobs[job_index].job_id, index_in_job[position], scores[position]
                )
            )
            if len(taken) == len(request.jobs):
                break
    remaining = [request.capacity[d] - used[d] for d in range(dimensions)]
    objective = math.fsum(plan.score for plan in selected)
    selected.sort(key=lambda plan: plan.job_id)
    return SelectionReply(
        selected=tuple(selected), objective=objective, remaining_capacity=tuple(remaining)
    )


def run(request: SelectionRequest) -> SelectionReply:
    """The registry entry point: :func:`select`."""
    return select(request)


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=ALGORITHM_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "Cluster-level weighted greedy: at most one candidate plan per job maximizing "
            "sum RE*WG under capacity S, rho = 2.5 (DLRover-RM sec. 4.3, eq. 11-14)"
        ),
        request_type=SelectionRequest,
        reply_type=SelectionReply,
        run=run,
    ),
)
"""The algorithms this module registers."""
