"""One optimization round over every running job: each job's candidates, then one
cluster-level choice within what the cluster can still give.

DLRover-RM's auto-scaling stage (sec. 4.3) has two steps per round: job-level candidate
generation (the Pareto front of resource cost RC, eq. 7, against throughput gain TG, eq. 8,
over the job's fitted throughput model, eq. 6) and the cluster-level weighted greedy
selection of at most one candidate per job (eq. 11-14, :mod:`stride.policy.selection`). This
module runs both for a batch of jobs whose models are fitted.

**Departure from the paper, on purpose: the front is enumerated, not searched.** The paper
runs NSGA-II because its search space is large. Stride's jobs are planned on the
simulator's grid (:data:`stride.policy.stages.GRID_WORKERS` and the rest: 8 x 5 x 5 x 5 =
1,000 configurations), so the exact front is computed by evaluating eq. 1-6 on every grid
point (vectorized) and keeping the non-dominated points. It is exact where NSGA-II's is
approximate, and it is about a thousand times cheaper (``bench/cluster_round.py`` measures
both in one run: a 1,000-job round against serial NSGA-II per job); NSGA-II
(:mod:`stride.policy.pareto`) remains the generator for continuous or larger spaces.

What the round guarantees (tested, including a property test): the chosen plans' extra
cores and memory over the jobs' current pods fit in the free capacity given, every chosen
plan is within the job's core limit, and a job whose front offers nothing with a positive
score keeps its pods. Capacity is accounted as increments over current pods: a job that is
not chosen keeps what it holds, and what a shrinking job would free is not lent to others
within the same round (it is free at the next round), so no round can overcommit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stride.policy.contention import growth_candidate
from stride.policy.errors import PolicyError
from stride.policy.fitting import MIN_SAMPLES, fit_throughput_model
from stride.policy.registry import AlgorithmSpec
from stride.policy.selection import (
    DEFAULT_EPSILON,
    DEFAULT_RHO,
    Candidate,
    JobCandidates,
    SelectionRequest,
    select,
)
from stride.policy.stages import (
    GIB_PRICE,
    JobShape,
    Pods,
    Sample,
    SearchSpace,
    configuration,
    grid,
    grid_throughput,
    model_throughput,
    per_ps,
)
from stride.policy.throughput import ThroughputParameters, overhead_seconds

ALGORITHM_NAME = "stride-cluster-round"
FRONTS_NAME = "stride-job-fronts"
CHOOSE_NAME = "stride-cluster-choose"
ALGORITHM_VERSION = 1


class InvalidRound(PolicyError):
    """A round's input is invalid; ``field`` names it."""


@dataclass(frozen=True)
class RoundJob:
    """One running job with a fitted model."""

    job_id: str
    shape: JobShape
    pods: Pods
    """What the job runs now."""
    remaining_samples: float
    worker_mem_gib: int
    """GiB each worker needs (its measured use with headroom)."""
    ps_total_gib: float
    """GiB the PS need in all (the OOM prediction's peak), spread over however many PS."""
    core_limit: int
    """The most cores the job may hold (its share, or the search space's limit)."""
    params: ThroughputParameters | None = None
    """The job's fitted model; None to fit it here from ``samples``."""
    samples: tuple[Sample, ...] = ()
    """Measured throughput per configuration, for the fit (eq. 6 by NNLS, RMSLE)."""

    def __post_init__(self) -> None:
        if not self.job_id:
            raise InvalidRound("job_id", "is required")
        object.__setattr__(self, "samples", tuple(self.samples))
        if self.params is None and (
            len(self.samples) < MIN_SAMPLES or len({s.pods for s in self.samples}) < 3
        ):
            raise InvalidRound(
                f"{self.job_id}.samples",
                f"a job without a fitted model needs at least {MIN_SAMPLES} samples of at "
                f"least 3 configurations, got {len(self.samples)}",
            )
        for name in ("remaining_samples", "ps_total_gib"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidRound(f"{self.job_id}.{name}", f"must be >= 0, got {value}")
        if self.worker_mem_gib < 1 or self.core_limit < 1:
            raise InvalidRound(
                f"{self.job_id}.worker_mem_gib/core_limit",
                f"must be >= 1, got {self.worker_mem_gib}/{self.core_limit}",
            )


@dataclass(frozen=True)
class RoundRequest:
    """Every job of the round, and what the cluster can still give beyond their pods."""

    jobs: tuple[RoundJob, ...]
    free_cpu: float
    """Cores free beyond every running job's current pods (within admitted shares)."""
    free_memory_gib: float
    space: SearchSpace = field(default_factory=SearchSpace)
    rho: float = DEFAULT_RHO
    """rho of eq. 14 (2.5 at Ant Group: shorter jobs first)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        _check_free(self.free_cpu, self.free_memory_gib)
        _check_unique(job.job_id for job in self.jobs)


def _check_free(cpu: float, memory_gib: float) -> None:
    for name, value in (("free_cpu", cpu), ("free_memory_gib", memory_gib)):
        if not math.isfinite(value) or value < 0:
            raise InvalidRound(name, f"must be a finite number >= 0, got {value}")


def _check_unique(job_ids: Iterable[str]) -> None:
    seen: set[str] = set()
    for job_id in job_ids:
        if job_id in seen:
            raise InvalidRound("jobs", f"{job_id!r} appears more than once")
        seen.add(job_id)


@dataclass(frozen=True)
class RoundChoice:
    """What the round decided for one job."""

    job_id: str
    pods: Pods | None
    """The new pods, or None to keep the current ones."""
    predicted_throughput: float
    """The model's samples/s for the pods the job will run."""
    front: int
    """Candidates on the job's front (the alternatives the round weighed)."""
    score: float
    """RE x WG of the chosen candidate (eq. 11 x 14); 0 when the job keeps its pods."""
    bound: str = ""
    """Why a better candidate was not taken ("cluster capacity"), if one was not."""


@dataclass(frozen=True)
class RoundReply:
    """One choice per job (in the request's order), eq. 12's objective, and what is left."""

    choices: tuple[RoundChoice, ...]
    objective: float
    free_cpu_left: float
    free_memory_gib_left: float
    candidates: int
    """Candidates on all the fronts together."""


@dataclass(frozen=True)
class JobFront:
    """One job's exact Pareto front on the grid: the candidates and their pods."""

    job_id: str
    remaining_samples: float
    pods: tuple[Pods, ...]
    candidates: tuple[Candidate, ...]
    current_throughput: float
    """The model's samples/s for the job's current pods."""
    fit_rmsle: float = -1.0
    """RMSLE of the fit made for this front; -1 when the model was given."""


@dataclass(frozen=True)
class FrontsRequest:
    """The executor's request for ``stride-job-fronts``: a chunk of a round's jobs."""

    jobs: tuple[RoundJob, ...]
    space: SearchSpace = field(default_factory=SearchSpace)


@dataclass(frozen=True)
class FrontsReply:
    """One front per job, in the request's order."""

    fronts: tuple[JobFront, ...]


@dataclass(frozen=True)
class ChooseRequest:
    """The executor's request for ``stride-cluster-choose``: every front of the round."""

    fronts: tuple[JobFront, ...]
    free_cpu: float
    free_memory_gib: float
    rho: float = DEFAULT_RHO

    def __post_init__(self) -> None:
        object.__setattr__(self, "fronts", tuple(self.fronts))
        _check_free(self.free_cpu, self.free_memory_gib)
        _check_unique(front.job_id for front in self.fronts)


def job_front(job: RoundJob, space: SearchSpace) -> JobFront:
    """The job's candidates: the grid configurations within its core limit that no other
    is both cheaper (eq. 7) and faster than, among those faster than its current pods, as
    selection candidates (their increments over the current pods as resources). Fits the
    model first when the job brings samples instead."""
    params, fit_error = job.params, -1.0
    if params is None:
        configs = [configuration(sample.pods, job.shape) for sample in job.samples]
        params, fit_error, _ = fit_throughput_model(configs, [s.throughput for s in job.samples])
    w, lw, p, lp = grid(space)
    speed = grid_throughput(params, job.shape, 1.0, w, lw, p, lp)
    ps_mem = np.array([per_ps(job.ps_total_gib, int(n)) for n in p], dtype=float)
    cores = w * lw + p * lp
    memory = w * job.worker_mem_gib + p * ps_mem
    cost = cores + GIB_PRICE * memory
    now = model_throughput(params, job.shape, job.pods)
    allowed = np.flatnonzero((cores <= job.core_limit) & (speed > now))
    # Cheapest first (then fastest): a point is on the front when it is faster than every
    # cheaper point.
    order = allowed[np.lexsort((-speed[allowed], cost[allowed]))]
    front: list[int] = []
    best = -math.inf
    for index in order.tolist():
        if speed[index] > best:
            front.append(index)
            best = float(speed[index])
    held = configuration(job.pods, job.shape)
    pods: list[Pods] = []
    candidates: list[Candidate] = []
    for index in front:
        chosen = Pods(
            int(w[index]),
            int(lw[index]),
            job.worker_mem_gib,
            int(p[index]),
            int(lp[index]),
            int(ps_mem[index]),
        )
        pods.append(chosen)
        candidates.append(
            growth_candidate(
                job.pods,
                chosen,
                now,
                float(speed[index]),
                job.remaining_samples,
                overhead_seconds(held, configuration(chosen, job.shape)),
            )
        )
    return JobFront(
        job.job_id, job.remaining_samples, tuple(pods), tuple(candidates), now, fit_error
    )


def job_fronts(request: FrontsRequest) -> FrontsReply:
    """The map step of a round: every job's front (a chunk per executor replica)."""
    return FrontsReply(tuple(job_front(job, request.space) for job in request.jobs))


def choose(request: ChooseRequest) -> RoundReply:
    """The reduce step of a round: the weighted greedy over every job's front within the
    free capacity, one choice per front (in order)."""
    fronts = request.fronts
    selection = select(
        SelectionRequest(
            capacity=(max(request.free_cpu, 1e-9), max(request.free_memory_gib, 1e-9)),
            jobs=tuple(
                JobCandidates(front.job_id, front.remaining_samples, front.candidates)
                for front in fronts
            ),
            resource_names=("cpu", "memory_gib"),
            rho=request.rho,
            epsilon=DEFAULT_EPSILON,
        )
    )
    chosen = {plan.job_id: plan for plan in selection.selected}
    choices = []
    for front in fronts:
        plan = chosen.get(front.job_id)
        if plan is None:
            wanted = any(c.throughput_gain > 0 for c in front.candidates)
            choices.append(
                RoundChoice(
                    front.job_id,
                    None,
                    front.current_throughput,
                    len(front.candidates),
                    0.0,
                    "cluster capacity" if wanted else "",
                )
            )
            continue
        candidate = front.candidates[plan.candidate_index]
        choices.append(
            RoundChoice(
                front.job_id,
                front.pods[plan.candidate_index],
                candidate.throughput,
                len(front.candidates),
                plan.score,
            )
        )
    cpu_left, memory_left = selection.remaining_capacity
    return RoundReply(
        choices=tuple(choices),
        objective=selection.objective,
        free_cpu_left=min(request.free_cpu, cpu_left),
        free_memory_gib_left=min(request.free_memory_gib, memory_left),
        candidates=sum(len(front.candidates) for front in fronts),
    )


def cluster_round(request: RoundRequest) -> RoundReply:
    """A whole round in one process: :func:`job_fronts`, then :func:`choose`."""
    fronts = job_fronts(FrontsRequest(request.jobs, request.space)).fronts
    return choose(ChooseRequest(fronts, request.free_cpu, request.free_memory_gib, request.rho))


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=ALGORITHM_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "One optimization round over running jobs: each job's exact Pareto front of "
            "cost against throughput gain on the grid, then the weighted greedy within the "
            "free capacity (DLRover-RM sec. 4.3, eq. 7-14)"
        ),
        request_type=RoundRequest,
        reply_type=RoundReply,
        run=cluster_round,
    ),
    AlgorithmSpec(
        name=FRONTS_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "A round's map step: fit each job's throughput model (NNLS) if needed and "
            "enumerate its exact Pareto front of cost against throughput gain on the grid"
        ),
        request_type=FrontsRequest,
        reply_type=FrontsReply,
        run=job_fronts,
    ),
    AlgorithmSpec(
        name=CHOOSE_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "A round's reduce step: the weighted greedy (eq. 11-14) over every job's front "
            "within the free capacity"
        ),
        request_type=ChooseRequest,
        reply_type=RoundReply,
        run=choose,
    ),
)
"""The algorithms this module registers."""
