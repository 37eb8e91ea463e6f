"""Stride's stage step: one decision for one job, from what its job master measured.

This is the per-job policy both ``stride sim --env dlrm`` and the live optimizer run, so the
two make the same decisions from the same observations. It is DLRover-RM's three stages
(sec. 4.3, 5) on a grid of configurations:

1. **Pre-scaling** (on arrival): warm start from the finished jobs most similar to this one
   (:mod:`stride.policy.warm_start`, Algorithm 1), moved into the search space; with no
   history, the job's request (the cold default) stands.
2. **Scaling** (every tick): a sampling stage of one-dimensional probes (worker cores, PS,
   PS cores, workers in turn, one factor of two per tick) so the five coefficients of
   eq. 1-6 are identifiable from the job's own samples; then model-based scaling on the
   fitted model (:func:`stride.policy.fitting.fit_throughput_model`, NNLS): the cheapest
   configuration within :data:`ALMOST_BEST_FRACTION` of the best predicted throughput
   within the job's core limit, taken only when it is clearly cheaper or faster.
3. **Instability handling**: OOM prediction (:mod:`stride.policy.oom`, 002 sec. 5.3) sizes
   PS memory just above the predicted peak and raises it before the limit is hit (doubling
   only before two memory samples exist); a hot PS is re-partitioned; dynamic sharding
   absorbs stragglers.

Departures from the papers, each a choice where they are silent:

- The search space is a grid (:class:`SearchSpace`), not NSGA-II's continuous space: the
  simulator's oracle searches the same grid, which keeps the comparison fair, and an
  exhaustive search of ~1,000 points is exact and cheaper than a genetic one at this size.
  The live optimizer passes a grid bounded by the largest pod a node can hold.
- A job refits at most every :data:`REFIT_EVERY_TICKS` samples; the caller keeps the count
  of the last fit (``last_fit_sample_count``) as the job's state, so the step itself is a
  pure function.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import numpy as np

from stride.policy.cold_start import JobFeatures
from stride.policy.errors import PolicyError
from stride.policy.fitting import fit_throughput_model
from stride.policy.oom import DEFAULT_HEADROOM, OomRequest, PsMemoryCurve, predict_oom
from stride.policy.registry import AlgorithmSpec
from stride.policy.throughput import (
    GIB,
    MILLISECONDS_PER_SECOND,
    Configuration,
    ThroughputParameters,
)
from stride.policy.warm_start import HistoricalJob, WarmStartRequest, warm_start

ALGORITHM_NAME = "stride-stage-step"
"""Registered name of the algorithm."""
ALGORITHM_VERSION = 1
"""Bump when a threshold or a rule changes."""
ALGORITHM = f"{ALGORITHM_NAME}/{ALGORITHM_VERSION}"
"""``name/version`` as recorded with every decision."""

GRID_WORKERS = (1, 2, 4, 8, 12, 16, 24, 32)
GRID_WORKER_CPU = (1, 2, 4, 8, 16)
GRID_PS = (1, 2, 4, 8, 16)
GRID_PS_CPU = (1, 2, 4, 8, 16)
JOB_CPU_LIMIT = 200
"""Most cores a scaling policy gives one job (000 sec. 6.1: "jobs in the experiment are
allocated at most 200 CPU cores"; the well-tuned configurations of 000 Table 2 use 192-200),
or the user's request when that is larger."""
ALMOST_BEST_FRACTION = 0.95
"""'Almost reaches the best throughput' (000 sec. 6.2, 002 sec. 6.1): the tuned-static oracle
and Stride's model-based stage take the cheapest configuration within 95 % of the best."""
MEMORY_HEADROOM = 1.1
"""Memory above a measured or predicted need (:data:`stride.policy.oom.DEFAULT_HEADROOM`)."""
MEMORY_SHRINK_SLACK = 1.25
"""Stride lowers a pod's memory only when it holds more than 25 % over the predicted need,
so one noisy prediction does not cost a PS restart for a GiB."""
PROBE_CONFIGS = 5
"""Distinct configurations the sampling stage measures: one per coefficient of eq. 6."""
PROBE_MIN_REMAINING_SECONDS = 1800.0
"""A warm-started job probes only when it has more than half an hour to go: a probe costs a
pause and minutes at a worse shape, which a short job cannot earn back (the Overhead term of
002 eq. 8). A cold-started job always probes: it has nothing else to go on. Chosen on seed 2
(600 jobs, median JCT over the tuned-static-dyn oracle: 1800 s 1.11x, 3600 s 1.14x,
7200 s 1.23x, never 1.27x, always 1.37x); reports use seed 1."""
SHRINK_MIN_REMAINING_SECONDS = 1800.0
"""Stride lowers memory without another reason to change the pods only when the job has
more than this left: the pause must buy enough pod-seconds of freed memory. On seed 2 this
took Stride's median JCT from 1.11x to 1.02x the tuned-static-dyn oracle and its memory
utilisation from 0.63 to 0.52 (900 s: 1.06x and 0.59)."""
WARM_PS_MEMORY_MARGIN = 0.10
"""PS memory a warm-started job gets above its similar jobs' measured need. Their needs
vary (the simulator's population: +-10 % around the model's footprint); a PS that needs
more is raised by the OOM prediction before its limit (its memory grows with progress).
Chosen on seed 2 (600 jobs: 0.25 left 21 % of jobs below half CPU and memory use, 0.10
left 8 %, one OOM kill and no failure); reports use seeds 1-5."""
WARM_WORKER_MEMORY_MARGIN = 0.25
"""Worker memory above the similar jobs' measured need. A worker needs its memory from its
first step, so the margin covers the whole spread: (1 + 0.10) / (1 - 0.10) = 1.22 over the
need with headroom 1.1 takes 1.11, and 1.25 leaves room for rounding."""
REFIT_EVERY_TICKS = 3
"""Stride fits and optimises once it has sampled, then refits every third tick. At the
simulator's one-minute tick of a seamless policy, 6 left the slowest decile of jobs 5-8 %
behind the oracle on seeds 1, 2 and 7 (they reach their best pods late); 3 brought it to
3.5-5 % with the median below the oracle (2 was no better)."""
FASTER_BY = 0.10
"""The model-based stage moves a job to faster pods only when the fit predicts at least this
much more throughput (fits are noisy: a smaller bar has a job chase its own noise)."""
GIB_PRICE = 0.125
"""Cost of a GiB relative to a core (as :class:`stride.policy.throughput.ResourcePrices`)."""
SAMPLES_PER_CONFIG = 5
"""Throughput samples a job master keeps per configuration (the newest): the step's input
is this window, in the simulator and in the live optimizer alike."""
MEMORY_WINDOW = 24
"""Memory points a job master keeps (the newest): the window of the OOM fit."""
LINK_BYTES_PER_SECOND = 1.25e9
"""The 10 Gbit/s link of eq. 5 (DLRover-RM sec. 4.2)."""


class InvalidStageRequest(PolicyError):
    """A stage-step request is not something the policy can decide on."""


class Reason(Enum):
    """Why the step runs."""

    ARRIVAL = "arrival"
    """The job is about to get its first pods."""
    TICK = "tick"
    """A metric window closed: a new throughput sample."""
    OOM = "oom"
    """A PS was OOM-killed."""


class Stage(Enum):
    """The stage a decision was made in (DLRover sec. 4.2, DLRover-RM sec. 4.3)."""

    COLD_START = "cold_start"
    WARM_START = "warm_start"
    SAMPLING = "sampling"
    OPTIMIZING = "optimizing"
    STEADY = "steady"


@dataclass(frozen=True)
class Pods:
    """A job's pods: whole cores and whole GiB per pod."""

    workers: int
    worker_cpu: int
    worker_mem_gib: int
    ps: int
    ps_cpu: int
    ps_mem_gib: int

    def __post_init__(self) -> None:
        for name in ("workers", "worker_cpu", "worker_mem_gib", "ps", "ps_cpu", "ps_mem_gib"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidStageRequest(
                    f"Pods.{name}", f"must be a whole number >= 1, got {value!r}"
                )

    @property
    def cpu(self) -> int:
        """Cores held by all pods."""
        return self.workers * self.worker_cpu + self.ps * self.ps_cpu

    @property
    def memory_gib(self) -> int:
        """GiB held by all pods."""
        return self.workers * self.worker_mem_gib + self.ps * self.ps_mem_gib

    @property
    def count(self) -> int:
        """Number of pods."""
        return self.workers + self.ps


@dataclass(frozen=True)
class JobShape:
    """What eq. 1-6 need of a job besides its pods."""

    batch_size: int
    embedding_dim: int
    model_bytes: float
    total_samples: float
    """The termination condition: samples to consume in all."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InvalidStageRequest("shape.batch_size", f"must be >= 1, got {self.batch_size}")
        if self.embedding_dim < 0:
            raise InvalidStageRequest(
                "shape.embedding_dim", f"must be >= 0, got {self.embedding_dim}"
            )
        for name in ("model_bytes", "total_samples"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise InvalidStageRequest(f"shape.{name}", f"must be positive, got {value}")


@dataclass(frozen=True)
class SearchSpace:
    """The grid of configurations the step searches, and the job's core limit."""

    workers: tuple[int, ...] = GRID_WORKERS
    worker_cpu: tuple[int, ...] = GRID_WORKER_CPU
    ps: tuple[int, ...] = GRID_PS
    ps_cpu: tuple[int, ...] = GRID_PS_CPU
    job_cpu_limit: int = JOB_CPU_LIMIT

    def __post_init__(self) -> None:
        for name in ("workers", "worker_cpu", "ps", "ps_cpu"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values) or list(values) != sorted(set(values)):
                raise InvalidStageRequest(
                    f"space.{name}", f"must be increasing whole numbers >= 1, got {values}"
                )
        if self.job_cpu_limit < 1:
            raise InvalidStageRequest(
                "space.job_cpu_limit", f"must be >= 1, got {self.job_cpu_limit}"
            )

    def limit_for(self, request: Pods) -> int:
        """The job's core limit: the space's, or the request's if that is larger."""
        return max(self.job_cpu_limit, request.cpu)


def search_space(max_pod_cpu: float | None, job_cpu_limit: int | None) -> SearchSpace:
    """The simulator's grid without per-pod cores above the largest pod a node holds
    (``max_pod_cpu``), and the job's core limit (None: :data:`JOB_CPU_LIMIT`): the space the
    live optimizer searches, and ``stride loadgen``'s reference with it."""
    worker_cpu: tuple[int, ...] = GRID_WORKER_CPU
    ps_cpu: tuple[int, ...] = GRID_PS_CPU
    if max_pod_cpu is not None:
        top = max(1, math.floor(max_pod_cpu))
        worker_cpu = tuple(c for c in GRID_WORKER_CPU if c <= top) or (1,)
        ps_cpu = tuple(c for c in GRID_PS_CPU if c <= top) or (1,)
    return SearchSpace(
        workers=GRID_WORKERS,
        worker_cpu=worker_cpu,
        ps=GRID_PS,
        ps_cpu=ps_cpu,
        job_cpu_limit=job_cpu_limit or JOB_CPU_LIMIT,
    )


@dataclass(frozen=True)
class Sample:
    """One measured throughput (samples/s) of a configuration."""

    pods: Pods
    throughput: float


@dataclass(frozen=True)
class MemoryPoint:
    """PS memory measured after ``consumed`` samples."""

    consumed: float
    total_ps_gib: float
    busiest_ps_gib: float


@dataclass(frozen=True)
class StageRequest:
    """What the job master knows of one job at a decision point."""

    reason: Reason
    features: JobFeatures
    shape: JobShape
    request: Pods
    """The user's pods (or the cold default): the start without history."""
    pods: Pods
    """The pods the job runs now (the request on arrival)."""
    consumed: float = 0.0
    samples: tuple[Sample, ...] = ()
    """Oldest first; a bounded window per configuration."""
    sample_count: int = 0
    """Throughput samples taken so far (ticks that ran)."""
    worker_memory_used_gib: float = 0.0
    memory_points: tuple[MemoryPoint, ...] = ()
    hot_detected: bool = False
    """The busiest PS carries clearly more than its share (re-partition it)."""
    history: tuple[HistoricalJob, ...] = ()
    """Finished jobs, for warm start."""
    last_fit_sample_count: int = -1
    """``sample_count`` at the job's last fit; -1 if never fitted."""
    space: SearchSpace = field(default_factory=SearchSpace)

    def __post_init__(self) -> None:
        if self.consumed < 0 or not math.isfinite(self.consumed):
            raise InvalidStageRequest("consumed", f"must be >= 0, got {self.consumed}")
        for i, sample in enumerate(self.samples):
            if not math.isfinite(sample.throughput) or sample.throughput <= 0:
                raise InvalidStageRequest(
                    f"samples[{i}].throughput", f"must be positive, got {sample.throughput}"
                )
        if self.reason is Reason.TICK and not self.samples:
            raise InvalidStageRequest("samples", "a tick needs at least one throughput sample")
        if self.sample_count < len(self.samples):
            raise InvalidStageRequest(
                "sample_count",
                f"is {self.sample_count}, fewer than the {len(self.samples)} samples given",
            )


@dataclass(frozen=True)
class StageReply:
    """The step's decision and why."""

    pods: Pods | None
    """New pods, or None to keep the current ones."""
    repartition: bool
    """Re-partition the PS (a hot PS)."""
    stage: Stage
    root_cause: str
    """One line naming the rule that decided (``probe worker_cpu``, ``model: faster``)."""
    fitted_at: int = -1
    """``sample_count`` of this step's fit, or -1 if it did not fit (keep the old one)."""
    fit_rmsle: float = -1.0
    """RMSLE of the fit on the samples; -1 without a fit."""
    predicted_throughput: float = -1.0
    """The fitted model's throughput for the chosen pods; -1 without a fit."""
    predicted_current: float = -1.0
    """The fitted model's throughput for the current pods; -1 without a fit."""
    cost: float = -1.0
    """Eq. 7 cost (cores + GIB_PRICE x GiB) of the pods chosen (or kept)."""
    bound: str = ""
    """The constraint that bound the choice (``job core limit``), if one did."""


# --- Grid ------------------------------------------------------------------------------


def configuration(pods: Pods, shape: JobShape) -> Configuration:
    """``pods`` as the throughput model's configuration."""
    return Configuration(
        workers=pods.workers,
        parameter_servers=pods.ps,
        worker_cpu=float(pods.worker_cpu),
        ps_cpu=float(pods.ps_cpu),
        batch_size=shape.batch_size,
        worker_memory_bytes=pods.worker_mem_gib * GIB,
        ps_memory_bytes=pods.ps_mem_gib * GIB,
        embedding_dim=shape.embedding_dim,
        model_bytes=shape.model_bytes,
    )


def grid(space: SearchSpace) -> tuple[np.ndarray, ...]:
    """(workers, worker cores, PS, PS cores) of every grid point, as float arrays."""
    w, lw, p, lp = np.meshgrid(
        space.workers, space.worker_cpu, space.ps, space.ps_cpu, indexing="ij"
    )
    return tuple(a.ravel().astype(float) for a in (w, lw, p, lp))


def _hot(h: float, p: np.ndarray | float) -> np.ndarray:
    return np.minimum(h, p) if h > 1.0 else np.ones_like(np.asarray(p, dtype=float))


def grid_throughput(
    params: ThroughputParameters,
    shape: JobShape,
    hot_factor: float,
    w: np.ndarray,
    lw: np.ndarray,
    p: np.ndarray,
    lp: np.ndarray,
) -> np.ndarray:
    """Eq. 1-6 over arrays of (workers, worker cores, PS, PS cores), samples/s, with a hot
    PS multiplying the update and lookup terms. Equal to
    :func:`stride.policy.throughput.throughput` when ``hot_factor`` is 1 (tested)."""
    m = float(shape.batch_size)
    h = _hot(hot_factor, p)
    sync_ms = (shape.model_bytes / p) / (LINK_BYTES_PER_SECOND / w) * MILLISECONDS_PER_SECOND
    t = (
        params.alpha_grad * m / lw
        + params.alpha_upd * h * w / (p * lp)
        + params.alpha_emb * h * m * shape.embedding_dim / p
        + params.alpha_sync * sync_ms
        + params.beta_sum
    )
    result: np.ndarray = w * m * MILLISECONDS_PER_SECOND / t
    return result


def model_throughput(params: ThroughputParameters, shape: JobShape, pods: Pods) -> float:
    """Eq. 1-6 for one configuration with even PS load, samples/s."""
    m = float(shape.batch_size)
    w, lw, p, lp = float(pods.workers), float(pods.worker_cpu), float(pods.ps), float(pods.ps_cpu)
    grad = params.alpha_grad * m / lw + params.beta_grad
    upd = params.alpha_upd * w / (p * lp) + params.beta_upd
    emb = params.alpha_emb * m * shape.embedding_dim / p + params.beta_emb
    sync_ms = (shape.model_bytes / p) / (LINK_BYTES_PER_SECOND / w) * MILLISECONDS_PER_SECOND
    sync = params.alpha_sync * sync_ms + params.beta_sync
    return w * m * MILLISECONDS_PER_SECOND / (grad + upd + emb + sync)


MemoryRule = Callable[[int, int], tuple[int, int]]
"""GiB per worker and per PS for (workers, PS)."""


def almost_best(
    throughput: np.ndarray, cost: np.ndarray, allowed: np.ndarray, fraction: float
) -> int:
    """Grid index of the cheapest allowed configuration within ``fraction`` of the best
    allowed throughput; ties go to the higher throughput, then the lower index."""
    if not allowed.any():
        allowed = cost <= cost.min()
    best = float(throughput[allowed].max())
    good = np.flatnonzero(allowed & (throughput >= fraction * best))
    order = np.lexsort((good, -throughput[good], cost[good]))
    return int(good[order[0]])


def grid_pods(space: SearchSpace, index: int, memory: MemoryRule) -> Pods:
    """The pods of grid point ``index`` with memory from ``memory``."""
    w, lw, p, lp = grid(space)
    workers, ps = int(w[index]), int(p[index])
    wmem, pmem = memory(workers, ps)
    return Pods(workers, int(lw[index]), wmem, ps, int(lp[index]), pmem)


def grid_cost(space: SearchSpace, memory: MemoryRule) -> np.ndarray:
    """Eq. 7 cost (cores + GIB_PRICE x GiB) of every grid configuration."""
    w, lw, p, lp = grid(space)
    wmem = np.array([memory(int(n), 1)[0] for n in space.workers], dtype=float)
    pmem = np.array([memory(1, int(n))[1] for n in space.ps], dtype=float)
    w_index = np.searchsorted(space.workers, w)
    p_index = np.searchsorted(space.ps, p)
    gib = w * wmem[w_index] + p * pmem[p_index]
    result: np.ndarray = w * lw + p * lp + GIB_PRICE * gib
    return result


def pods_cost(pods: Pods) -> float:
    """Eq. 7 cost of ``pods``."""
    return float(pods.cpu + GIB_PRICE * pods.memory_gib)


def per_ps(total_gib: float, ps: int) -> int:
    """Whole GiB per PS that hold ``total_gib`` spread over ``ps``."""
    return max(1, math.ceil(total_gib / ps))


_PROBE_DIMENSIONS = ("workers", "worker_cpu", "ps", "ps_cpu")
_PROBE_MOVES: tuple[tuple[tuple[str, float], ...], ...] = (
    (("workers", 2.0),),
    (("workers", 0.5),),
    (("worker_cpu", 2.0),),
    (("worker_cpu", 0.5),),
    (("ps", 2.0), ("ps_cpu", 0.5)),
    (("ps", 0.5), ("ps_cpu", 2.0)),
    (("ps", 2.0),),
    (("ps", 0.5),),
    (("ps_cpu", 2.0),),
    (("ps_cpu", 0.5),),
)
"""The sampling stage's moves, cheapest pause first: the worker count (no pause: dynamic
sharding), a worker's cores (a worker restart), then the PS (a PS change). Moving the PS
count and a PS's cores against each other keeps the PS cores and separates the ``1/p``
terms of eq. 3-5 from the update term in one PS change."""


def _design_row(pods: Pods, shape: JobShape) -> np.ndarray:
    """The terms of eq. 2-5 that multiply each alpha, and the beta sum's 1: the fit is
    identifiable when these rows span as many dimensions as they can."""
    w, lw, p, lp = float(pods.workers), float(pods.worker_cpu), float(pods.ps), float(pods.ps_cpu)
    return np.array(
        [
            shape.batch_size / lw,
            w / (p * lp),
            shape.batch_size * shape.embedding_dim / p,
            (shape.model_bytes / p) / (LINK_BYTES_PER_SECOND / w),
            1.0,
        ]
    )


def _rank(rows: list[np.ndarray]) -> int:
    matrix = np.array(rows)
    scale = np.abs(matrix).max(axis=0)
    scale[scale == 0] = 1.0
    return int(np.linalg.matrix_rank(matrix / scale, tol=1e-9))


def next_probe(
    pods: Pods,
    space: SearchSpace,
    limit: int,
    sampled: frozenset[Pods] | set[Pods],
    shape: JobShape,
) -> Pods | None:
    """The sampling stage's next configuration: the cheapest move (:data:`_PROBE_MOVES`)
    from ``pods`` that stays in ``space`` and ``limit``, was not sampled, and adds a
    dimension to the fit's design (:func:`_design_row`); None when no move does.

    From a start in the middle of the space this measures, in turn, twice the workers (no
    pause), twice a worker's cores, twice the PS with half the cores each, and the workers
    back: five configurations that identify eq. 1-6 for two pauses (30 s and 60 s), where
    one dimension at a time took three (30, 60 and 60 s)."""
    shapes = {(q.workers, q.worker_cpu, q.ps, q.ps_cpu) for q in sampled}
    rows = [_design_row(q, shape) for q in sampled] or [_design_row(pods, shape)]
    have = _rank(rows)
    for move in _PROBE_MOVES:
        changed: dict[str, int] = {}
        for name, factor in move:
            value = getattr(pods, name) * factor
            if value != int(value) or not 1 <= value <= getattr(space, name)[-1]:
                break
            changed[name] = int(value)
        else:
            candidate = replace(pods, **changed)
            key = (candidate.workers, candidate.worker_cpu, candidate.ps, candidate.ps_cpu)
            if (
                candidate.cpu <= limit
                and key not in shapes
                and _rank([*rows, _design_row(candidate, shape)]) > have
            ):
                return candidate
    return None


def within_search_space(pods: Pods, space: SearchSpace, limit: int) -> Pods:
    """``pods`` moved into ``space``: counts and per-pod cores within the grid's ranges and
    at most ``limit`` cores (workers, then PS cores, then worker cores give way).

    Without this, warm start compounds: a finished job's configuration (a probe with twice
    the PS, say) becomes the next similar job's start, and Stride wandered to 80 PS."""
    pods = replace(
        pods,
        workers=min(pods.workers, space.workers[-1]),
        worker_cpu=min(pods.worker_cpu, space.worker_cpu[-1]),
        ps=min(pods.ps, space.ps[-1]),
        ps_cpu=min(pods.ps_cpu, space.ps_cpu[-1]),
    )
    if pods.cpu > limit:
        room = (limit - pods.ps * pods.ps_cpu) // pods.worker_cpu
        pods = replace(pods, workers=max(1, room))
    while pods.cpu > limit and pods.ps_cpu > 1:
        pods = replace(pods, ps_cpu=pods.ps_cpu // 2)
    while pods.cpu > limit and pods.worker_cpu > 1:
        pods = replace(pods, worker_cpu=pods.worker_cpu // 2)
    return pods


def ps_memory_need(
    pods: Pods, consumed: float, total_samples: float, points: tuple[MemoryPoint, ...]
) -> Callable[[int], int] | None:
    """GiB per PS that holds the predicted peak with ``n`` PS, or None before two memory
    samples at different progress exist.

    The linear growth in consumed samples is fitted and extrapolated to the job's last
    sample by :func:`stride.policy.oom.predict_oom`, one curve per PS of the current count
    with the even share of the measured total (Stride re-partitions a hot PS, so its
    layouts are even). The need for ``n`` PS is the predicted total over ``n`` plus the
    library's headroom, in whole GiB.
    """
    if len(points) < 2 or len({p.consumed for p in points}) < 2:
        return None
    ps = pods.ps
    share = PsMemoryCurve(
        tuple(p.consumed for p in points), tuple(p.total_ps_gib / ps * GIB for p in points)
    )
    reply = predict_oom(
        OomRequest(
            (share,) * ps,
            pods.ps_mem_gib * GIB,
            int(consumed),
            math.ceil(total_samples),
            headroom=DEFAULT_HEADROOM,
        )
    )
    total = sum(f.predicted_peak_bytes for f in reply.forecasts) / GIB
    return lambda n: max(1, math.ceil(total / n * (1.0 + DEFAULT_HEADROOM)))


# --- The step --------------------------------------------------------------------------


def _arrival(request: StageRequest) -> StageReply:
    start = request.request
    if not request.history:
        return StageReply(
            start, False, Stage.COLD_START, "no similar finished job: the cold default"
        )
    c = warm_start(WarmStartRequest(request.features, request.history)).configuration
    space = request.space
    moved = within_search_space(
        Pods(
            c.worker_count,
            max(1, round(c.worker_cpu)),
            start.worker_mem_gib,
            max(1, c.ps_count),
            max(1, round(c.ps_cpu)),
            1,
        ),
        space,
        space.limit_for(start),
    )
    # Memory too comes from similar jobs (Algorithm 1 warm-starts the whole resource
    # configuration), but only from jobs of the same model, whose embedding tables are this
    # job's: their workers' memory and their PS memory in total, spread over this job's PS,
    # with the WARM_*_MEMORY_MARGIN on top until the first ticks measure this job. That is
    # closer than the request, which users over-provision (000 sec. 2) or under-provision
    # (the 5 % that OOM). Without a finished job of the same model the request's memory
    # (the user's total PS memory over the PS) stands.
    same_model = tuple(
        h for h in request.history if h.features.model_name == request.features.model_name
    )
    if same_model:
        m = warm_start(WarmStartRequest(request.features, same_model)).configuration
        pods = replace(
            moved,
            worker_mem_gib=max(
                1, math.ceil(m.worker_memory_bytes / GIB * (1.0 + WARM_WORKER_MEMORY_MARGIN))
            ),
            ps_mem_gib=per_ps(
                m.ps_count * m.ps_memory_bytes / GIB * (1.0 + WARM_PS_MEMORY_MARGIN), moved.ps
            ),
        )
    else:
        pods = replace(moved, ps_mem_gib=per_ps(start.ps * start.ps_mem_gib, moved.ps))
    return StageReply(
        pods,
        False,
        Stage.WARM_START,
        f"warm start from {min(len(request.history), 5)} similar finished job(s)",
        cost=pods_cost(pods),
    )


def stage_step(request: StageRequest) -> StageReply:
    """One decision for one job (module docstring)."""
    if request.reason is Reason.ARRIVAL:
        return _arrival(request)
    pods = request.pods
    space = request.space
    limit = space.limit_for(request.request)
    need = ps_memory_need(
        pods, request.consumed, request.shape.total_samples, request.memory_points
    )
    worker_mem = max(1, math.ceil(request.worker_memory_used_gib * MEMORY_HEADROOM))

    def memory(workers: int, ps: int) -> tuple[int, int]:
        if need is None:
            return worker_mem, per_ps(pods.ps * pods.ps_mem_gib, ps)
        return worker_mem, need(ps)

    if request.reason is Reason.OOM:
        if need is None:
            # No growth measured yet: DLRover's reaction, double the memory.
            doubled = replace(pods, ps_mem_gib=pods.ps_mem_gib * 2)
            return StageReply(
                doubled, False, Stage.STEADY, "PS OOM-killed before growth was measured: x2"
            )
        raised = replace(pods, ps_mem_gib=max(pods.ps_mem_gib + 1, need(pods.ps)))
        return StageReply(
            raised, False, Stage.STEADY, "PS OOM-killed: memory above the predicted peak"
        )
    repartition = request.hot_detected
    distinct = {s.pods for s in request.samples}
    target = pods
    stage = Stage.STEADY
    cause = "the plan holds"
    remaining_s = (request.shape.total_samples - request.consumed) / max(
        request.samples[-1].throughput, 1e-9
    )
    probing = len(distinct) < PROBE_CONFIGS and (
        not request.history or remaining_s > PROBE_MIN_REMAINING_SECONDS
    )
    probe = next_probe(pods, space, limit, distinct, request.shape) if probing else None
    last_fit = request.last_fit_sample_count
    fitted_at = -1
    fit_error = predicted = predicted_now = -1.0
    bound = ""
    if probe is not None:
        # Sampling stage: one cheap move per tick until the five coefficients of eq. 1-6
        # are identifiable from the job's own samples.
        target = replace(
            probe, ps_mem_gib=memory(probe.workers, probe.ps)[1], worker_mem_gib=worker_mem
        )
        stage = Stage.SAMPLING
        changed = [n for n in _PROBE_DIMENSIONS if getattr(probe, n) != getattr(pods, n)]
        cause = f"probe {'+'.join(changed)} ({len(distinct)} of {PROBE_CONFIGS})"
    elif (
        len(distinct) >= 3
        and request.sample_count >= 5
        and (last_fit < 0 or request.sample_count - last_fit >= REFIT_EVERY_TICKS)
    ):
        fitted_at = request.sample_count
        shape = request.shape
        configs = [configuration(s.pods, shape) for s in request.samples]
        params, fit_error, _ = fit_throughput_model(
            configs, [s.throughput for s in request.samples]
        )
        # After re-partition the load is even (hot factor 1) and dynamic sharding makes
        # stragglers average out, so the fitted model is the job's expected speed.
        w, lw, p, lp = grid(space)
        modelled = grid_throughput(params, shape, 1.0, w, lw, p, lp)
        allowed = w * lw + p * lp <= limit
        if not allowed.all() and modelled[allowed].max() < modelled.max():
            bound = f"job core limit ({limit} cores)"
        best = grid_pods(
            space,
            almost_best(modelled, grid_cost(space, memory), allowed, ALMOST_BEST_FRACTION),
            memory,
        )
        pred_best = model_throughput(params, shape, best)
        pred_now = model_throughput(params, shape, pods)
        predicted, predicted_now = pred_best, pred_now
        cheaper = best.cpu < 0.8 * pods.cpu and pred_best >= 0.9 * pred_now
        faster = pred_best > (1.0 + FASTER_BY) * pred_now
        stage = Stage.OPTIMIZING
        if cheaper or faster:
            target = best
            cause = f"model: {'faster' if faster else 'cheaper'} (fit RMSLE {fit_error:.3f})"
        else:
            predicted = pred_now
            cause = f"model: the current pods are within 10% of the best (RMSLE {fit_error:.3f})"
    if need is not None:
        # OOM prediction (002 sec. 5.3): memory just above the predicted peak, raised as
        # soon as the peak is predicted to pass the limit, lowered when far above it.
        # Lowering only frees memory for others and costs the job a pause, so a job that is
        # about to finish (or changes shape anyway) alone pays it.
        wanted = need(target.ps)
        reshaping = target != pods
        worth = reshaping or remaining_s > SHRINK_MIN_REMAINING_SECONDS
        too_much = target.ps_mem_gib > wanted * MEMORY_SHRINK_SLACK
        if target.ps_mem_gib < wanted or (too_much and worth):
            if target.ps_mem_gib < wanted and target == pods:
                cause = "OOM predicted: PS memory raised above the predicted peak"
                bound = "OOM margin"
            elif target == pods:
                cause = "PS memory lowered to the predicted peak"
            target = replace(target, ps_mem_gib=wanted)
        if target.worker_mem_gib < worker_mem or (
            target.worker_mem_gib > worker_mem and (worth or target != pods)
        ):
            if target == pods:
                cause = "worker memory sized to its measured use"
            target = replace(target, worker_mem_gib=worker_mem)
    if repartition and target == pods:
        cause = "hot PS: re-partition"
    return StageReply(
        None if target == pods else target,
        repartition,
        stage,
        cause,
        fitted_at=fitted_at,
        fit_rmsle=fit_error,
        predicted_throughput=predicted,
        predicted_current=predicted_now,
        cost=pods_cost(target),
        bound=bound,
    )


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=ALGORITHM_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "Stride's per-job stage step: warm start, probes, model-based scaling on the "
            "fitted eq. 1-6, OOM prediction and hot-PS re-partition (DLRover-RM sec. 4.3, 5)"
        ),
        request_type=StageRequest,
        reply_type=StageReply,
        run=stage_step,
    ),
)
"""The algorithms this module registers."""
