"""Environment B: DLRM training jobs on a CPU cluster, the DLRover / DLRover-RM setting.

What it simulates (DLRover (000) sec. 6, DLRover-RM (002) sec. 6): parameter-server jobs
arrive, wait FIFO (with backfill) for CPU cores and memory, start their pods, train, and may
be rescaled by a policy. The job population is **synthetic and seeded**: there is no public
per-job PS/worker throughput trace (see ``shared/traces/README.md``). Every result
built on this module must say so.

Ground truth of one job:

- Throughput has the DLRover-RM form (:func:`stride.policy.throughput.throughput`), with
  each alpha and the beta sum drawn as ``PAPER_PARAMETERS x lognormal(0, 0.25)``.
- Hot PS: 30 % of jobs partition their embeddings unevenly; the hottest PS holds ``h / p``
  of the embedding load (``h`` ~ U(1.5, 3), capped at ``p``), which multiplies the update and
  lookup terms of eq. 3 and 5 by ``h`` and the hot PS's embedding memory by ``h``.
  Re-partitioning (Stride's instability handling) sets ``h`` to 1 at the cost of a PS change.
- Stragglers: each worker's iteration time is multiplied by a lognormal factor whose CoV is
  the median coefficient of variation of a random job of the Alibaba PAI trace
  (``pai-minibatch-time/coefficient_variation.csv``), capped at 1.0. With static sharding
  a job waits for its slowest worker (progress factor ``min speed``); with dynamic sharding
  (DLRover 000 sec. 5.2, 5.4) fast workers take more shards (factor ``mean speed``).
  Speeds are redrawn whenever the worker set changes.
- Memory: each worker needs a fixed amount; each PS holds a static share plus embedding
  memory that grows linearly with consumed samples (002 sec. 5.3). A PS whose use exceeds
  its limit is OOM-killed: the job pauses for a pod restart and, after
  :data:`MAX_OOM_KILLS` kills, fails.
- Pod failures at 1.5 % per pod-day (002 Table 4 order of magnitude); a failure pauses the
  job for a pod restart (no progress is lost: checkpoints are assumed frequent).
- A pod starts in 20 s and training initialises in 100 s (000 sec. 6.3): a job's first
  progress comes 120 s after it is placed, and so does a restart.

User requests are over-provisioned as the papers observed: cores well past the knee of the
model, memory 1.5-4x need; 5 % of jobs request too little PS memory and will OOM.

Policies (one interface, :class:`DlrmPolicy`): ``static`` (the user request), ``tuned-static``
(oracle search over the true model, once), ``stride`` (warm start, model-based scaling with
the fitted model, OOM prediction, hot-PS re-partition, dynamic sharding), ``es`` (add workers
while scaling efficiency > 0.3) and ``dlrover-heuristic`` (ps_cpu_overload 0.9, OOM x2
memory, workers x 0.9 / util). Optimus is not implemented.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from stride.policy.cold_start import JobFeatures
from stride.policy.fitting import fit_throughput_model
from stride.policy.oom import OomRequest, PsMemoryCurve, predict_oom
from stride.policy.throughput import (
    GIB,
    MILLISECONDS_PER_SECOND,
    PAPER_PARAMETERS,
    Configuration,
    ThroughputParameters,
    overhead_seconds,
)
from stride.policy.warm_start import (
    HistoricalJob,
    ResourceConfiguration,
    WarmStartRequest,
    warm_start,
)
from stride.sim.engine import Event, EventKind, Simulation, SimulationError

__all__ = [
    "DEFAULT_PAI_COV_PATH",
    "POLICIES",
    "DlrmJobSpec",
    "DlrmPolicy",
    "DlrmResult",
    "JobView",
    "Pods",
    "generate_jobs",
    "load_straggler_covs",
    "run_dlrm",
    "simulate",
]

DEFAULT_PAI_COV_PATH = Path("traces/pai-minibatch-time/coefficient_variation.csv")
"""Per-job CoV series of worker mini-batch times (Alibaba PAI), relative to the folder the
traces are kept in (``shared/`` beside the checkout here); callers pass the real path."""

POD_START_SECONDS = 20.0
"""Pod scheduling and container start (000 sec. 6.3)."""
TRAINING_INIT_SECONDS = 100.0
"""Framework and data initialisation before the first step (000 sec. 6.3)."""
RESTART_SECONDS = POD_START_SECONDS + TRAINING_INIT_SECONDS
POD_FAILURE_PER_DAY = 0.015
"""Failure probability of one pod per day."""
MAX_OOM_KILLS = 3
"""A job that is OOM-killed this many times fails."""
TICK_SECONDS = 300.0
"""How often a running job's policy is consulted."""
MAX_STRAGGLER_COV = 1.0
HOT_PS_FRACTION = 0.30
UNDER_PROVISIONED_FRACTION = 0.05
GRID_WORKERS = (1, 2, 4, 8, 12, 16, 24, 32)
GRID_WORKER_CPU = (1, 2, 4, 8, 16)
GRID_PS = (1, 2, 4, 8, 16)
GRID_PS_CPU = (1, 2, 4, 8, 16)
KNEE_FRACTION = 0.9
"""Model-based choice: the cheapest grid configuration within 90 % of the best throughput."""
MEMORY_HEADROOM = 1.1
REFIT_EVERY_TICKS = 6
"""Stride refits and re-optimises every sixth tick (30 min) once it has five samples."""
GIB_PRICE = 0.125
"""Cost of a GiB relative to a core (as :class:`stride.policy.throughput.ResourcePrices`)."""


# --- Configurations and jobs ---------------------------------------------------------


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
                raise SimulationError(f"Pods.{name}: must be a whole number >= 1, got {value!r}")

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
class DlrmJobSpec:
    """One synthetic job: its true model, imbalance, memory behaviour and the user request."""

    job_id: int
    submit_time: float
    params: ThroughputParameters
    batch_size: int
    embedding_dim: int
    model_bytes: float
    total_samples: float
    hot_factor: float
    """h >= 1: the hottest PS carries h/p of the embedding load (1 = even)."""
    straggler_cov: float
    worker_mem_need_gib: float
    ps_static_gib: float
    """Memory of all PS together at zero consumed samples."""
    embedding_final_gib: float
    """Embedding memory of all PS together when the job completes."""
    request: Pods
    model_name: str


def _config(pods: Pods, spec: DlrmJobSpec) -> Configuration:
    return Configuration(
        workers=pods.workers,
        parameter_servers=pods.ps,
        worker_cpu=float(pods.worker_cpu),
        ps_cpu=float(pods.ps_cpu),
        batch_size=spec.batch_size,
        worker_memory_bytes=pods.worker_mem_gib * GIB,
        ps_memory_bytes=pods.ps_mem_gib * GIB,
        embedding_dim=spec.embedding_dim,
        model_bytes=spec.model_bytes,
    )


def _grid() -> tuple[np.ndarray, ...]:
    w, lw, p, lp = np.meshgrid(GRID_WORKERS, GRID_WORKER_CPU, GRID_PS, GRID_PS_CPU, indexing="ij")
    return tuple(a.ravel().astype(float) for a in (w, lw, p, lp))


_GRID = _grid()


def _hot(h: float, p: np.ndarray | float) -> np.ndarray:
    return np.minimum(h, p) if h > 1.0 else np.ones_like(np.asarray(p, dtype=float))


def grid_throughput(
    params: ThroughputParameters,
    spec: DlrmJobSpec,
    hot_factor: float,
    w: np.ndarray,
    lw: np.ndarray,
    p: np.ndarray,
    lp: np.ndarray,
) -> np.ndarray:
    """Eq. 1-6 over arrays of (workers, worker cores, PS, PS cores), samples/s, with the hot
    PS multiplying the update and lookup terms. Equal to
    :func:`stride.policy.throughput.throughput` when ``hot_factor`` is 1 (tested)."""
    m = float(spec.batch_size)
    h = _hot(hot_factor, p)
    sync_ms = (spec.model_bytes / p) / (1.25e9 / w) * MILLISECONDS_PER_SECOND
    t = (
        params.alpha_grad * m / lw
        + params.alpha_upd * h * w / (p * lp)
        + params.alpha_emb * h * m * spec.embedding_dim / p
        + params.alpha_sync * sync_ms
        + params.beta_sum
    )
    result: np.ndarray = w * m * MILLISECONDS_PER_SECOND / t
    return result


def _one(
    params: ThroughputParameters, spec: DlrmJobSpec, hot: float, pods: Pods
) -> tuple[float, float, float]:
    """(throughput, worker busy fraction, PS busy fraction) of ``pods``."""
    m = float(spec.batch_size)
    w, lw, p, lp = float(pods.workers), float(pods.worker_cpu), float(pods.ps), float(pods.ps_cpu)
    h = min(hot, p) if hot > 1.0 else 1.0
    grad = params.alpha_grad * m / lw + params.beta_grad
    upd = params.alpha_upd * h * w / (p * lp) + params.beta_upd
    emb = params.alpha_emb * h * m * spec.embedding_dim / p + params.beta_emb
    sync = params.alpha_sync * (spec.model_bytes / p) / (1.25e9 / w) * 1000.0 + params.beta_sync
    total = grad + upd + emb + sync
    return w * m * 1000.0 / total, grad / total, min(1.0, (upd + emb) / total)


def ps_memory_gib(spec: DlrmJobSpec, hot: float, ps: int, consumed: float) -> tuple[float, float]:
    """(hottest PS, coldest PS) memory in GiB after ``consumed`` samples."""
    emb = spec.embedding_final_gib * consumed / spec.total_samples
    h = min(hot, float(ps)) if hot > 1.0 else 1.0
    hot_use = spec.ps_static_gib / ps + emb * h / ps
    cold_share = (ps - h) / (ps - 1) / ps if ps > 1 else 1.0 / ps
    return hot_use, spec.ps_static_gib / ps + emb * cold_share


def load_straggler_covs(path: Path = DEFAULT_PAI_COV_PATH) -> tuple[float, ...]:
    """The median CoV of each job row of the PAI CoV file. Raises SimulationError naming the
    file, line and field for a malformed row."""
    covs: list[float] = []
    try:
        handle = path.open(newline="")
    except OSError as error:
        raise SimulationError(f"{path}: cannot read ({error})") from error
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise SimulationError(f"{path}: line 1: empty file")
        for line, row in enumerate(reader, start=2):
            values: list[float] = []
            for column, text in enumerate(row[1:], start=1):
                if text in ("", "nan"):
                    continue
                try:
                    value = float(text)
                except ValueError as error:
                    raise SimulationError(
                        f"{path}: line {line}: field {header[column]!r}: not a number: {text!r}"
                    ) from error
                if not math.isfinite(value) or value < 0:
                    raise SimulationError(
                        f"{path}: line {line}: field {header[column]!r}: must be >= 0: {text!r}"
                    )
                values.append(value)
            if not values:
                raise SimulationError(f"{path}: line {line}: field 'cov': no values")
            covs.append(statistics.median(values))
    if not covs:
        raise SimulationError(f"{path}: no job rows")
    return tuple(covs)


def generate_jobs(
    num_jobs: int,
    rng: np.random.Generator,
    covs: tuple[float, ...],
    mean_interarrival_seconds: float = 120.0,
) -> list[DlrmJobSpec]:
    """A seeded synthetic population (see the module docstring)."""
    if num_jobs < 1:
        raise SimulationError(f"num_jobs: must be >= 1, got {num_jobs}")
    jobs: list[DlrmJobSpec] = []
    now = 0.0
    base = PAPER_PARAMETERS
    for job_id in range(num_jobs):
        now += float(rng.exponential(mean_interarrival_seconds))
        f = rng.lognormal(0.0, 0.25, size=5)
        params = ThroughputParameters.with_beta_sum(
            alpha_grad=base.alpha_grad * float(f[0]),
            alpha_upd=base.alpha_upd * float(f[1]),
            alpha_emb=base.alpha_emb * float(f[2]),
            alpha_sync=base.alpha_sync * float(f[3]),
            beta_sum=base.beta_sum * float(f[4]),
        )
        batch = int(rng.choice([64, 128, 256]))
        dim = int(rng.choice([1, 2, 4, 8]))
        model_bytes = float(np.exp(rng.uniform(math.log(1e6), math.log(5e7))))
        hot = float(rng.uniform(1.5, 3.0)) if rng.random() < HOT_PS_FRACTION else 1.0
        cov = min(MAX_STRAGGLER_COV, covs[int(rng.integers(len(covs)))])
        worker_need = float(rng.uniform(2.0, 6.0))
        ps_static = float(rng.uniform(2.0, 8.0))
        emb_final = float(rng.uniform(8.0, 60.0))
        workers = int(rng.choice([4, 8, 12, 16, 24]))
        ps = int(rng.choice([2, 4, 6, 8]))
        request_stub = Pods(
            workers, int(rng.choice([8, 12, 16])), 1, ps, int(rng.choice([8, 16])), 1
        )
        peak_hot = (ps_static + emb_final * (min(hot, ps) if hot > 1 else 1.0)) / ps
        under = rng.random() < UNDER_PROVISIONED_FRACTION
        ps_factor = rng.uniform(0.5, 0.85) if under else rng.uniform(1.5, 4.0)
        request = replace(
            request_stub,
            worker_mem_gib=max(1, math.ceil(worker_need * rng.uniform(1.5, 4.0))),
            ps_mem_gib=max(1, math.ceil(peak_hot * ps_factor)),
        )
        spec = DlrmJobSpec(
            job_id=job_id,
            submit_time=now,
            params=params,
            batch_size=batch,
            embedding_dim=dim,
            model_bytes=model_bytes,
            total_samples=1.0,
            hot_factor=hot,
            straggler_cov=cov,
            worker_mem_need_gib=worker_need,
            ps_static_gib=ps_static,
            embedding_final_gib=emb_final,
            request=request,
            model_name=f"dlrm-{int(rng.integers(8))}",
        )
        hours = float(np.exp(rng.uniform(math.log(0.5), math.log(6.0))))
        speed = _one(params, spec, hot, request)[0]
        jobs.append(replace(spec, total_samples=speed * hours * 3600.0))
    return jobs


def _features(spec: DlrmJobSpec) -> JobFeatures:
    return JobFeatures(
        model_name=spec.model_name,
        record_count=max(1, int(spec.total_samples)),
        batch_size=spec.batch_size,
        max_epochs=1,
        family="dlrm",
        embedding_dim=spec.embedding_dim,
    )


# --- Policy interface ------------------------------------------------------------------


@dataclass(frozen=True)
class JobView:
    """What a policy may see of one job at a decision point.

    ``reason`` is "arrival", "tick" or "oom". Observations are what a job master measures:
    noisy throughputs of the configurations the job has run (with their pods), CPU busy
    fractions and PS memory samples. The oracle alone reads ``spec`` (the true model).
    """

    reason: str
    now: float
    spec: DlrmJobSpec
    pods: Pods
    consumed: float
    samples: tuple[tuple[Pods, float], ...]
    worker_util: float
    ps_util: float
    memory_points: tuple[tuple[float, float, float], ...]
    """(consumed samples, hottest PS GiB, coldest PS GiB) at past ticks."""
    hot_detected: bool
    history: tuple[HistoricalJob, ...]
    cluster_cpus: int


@dataclass(frozen=True)
class Decision:
    """A policy's answer: new pods (or None to keep) and whether to re-partition the PS."""

    pods: Pods | None = None
    repartition: bool = False


class DlrmPolicy(Protocol):
    """One decision per job event; ``dynamic_sharding`` selects the straggler model and
    ``seamless`` whether rescaling pauses like :func:`overhead_seconds` (True) or like a
    checkpoint-restart of every pod (False)."""

    name: str
    dynamic_sharding: bool
    seamless: bool

    def decide(self, view: JobView) -> Decision:
        """Pods for this job now."""
        ...


def _knee(
    params: ThroughputParameters,
    spec: DlrmJobSpec,
    hot: float,
    budget_cpu: float,
    memory: Callable[[int, int], tuple[int, int]],
) -> Pods:
    """Cheapest grid configuration within KNEE_FRACTION of the best throughput in budget."""
    w, lw, p, lp = _GRID
    cpu = w * lw + p * lp
    thr = grid_throughput(params, spec, hot, w, lw, p, lp)
    ok = cpu <= budget_cpu
    if not ok.any():
        ok = cpu <= cpu.min()
    best = float(thr[ok].max())
    good = ok & (thr >= KNEE_FRACTION * best)
    index = np.flatnonzero(good)
    # Cheapest in cores (memory follows the configuration); ties: higher throughput, index.
    order = sorted(index.tolist(), key=lambda i: (float(cpu[i]), -float(thr[i]), i))
    i = order[0]
    workers, ps = int(w[i]), int(p[i])
    wmem, pmem = memory(workers, ps)
    return Pods(workers, int(lw[i]), wmem, ps, int(lp[i]), pmem)


class StaticPolicy:
    """The user's request, unchanged (static sharding; OOM kills repeat)."""

    name = "static"
    dynamic_sharding = False
    seamless = False

    def decide(self, view: JobView) -> Decision:
        """The request on arrival; nothing afterwards."""
        return Decision(view.spec.request if view.reason == "arrival" else None)


class TunedStaticPolicy:
    """Oracle: the knee of the *true* model within the user's CPU budget, memory from the
    true peak plus 10 %, fixed for the whole run (static sharding)."""

    name = "tuned-static"
    dynamic_sharding = False
    seamless = False

    def decide(self, view: JobView) -> Decision:
        """Searched once, on arrival."""
        if view.reason != "arrival":
            return Decision()
        spec = view.spec

        def memory(workers: int, ps: int) -> tuple[int, int]:
            peak = ps_memory_gib(spec, spec.hot_factor, ps, spec.total_samples)[0]
            return (
                math.ceil(spec.worker_mem_need_gib * MEMORY_HEADROOM),
                math.ceil(peak * MEMORY_HEADROOM),
            )

        pods = _knee(spec.params, spec, spec.hot_factor, spec.request.cpu, memory)
        return Decision(pods)


class StridePolicy:
    """Stride's three stages (DLRover-RM sec. 4.3, 5): warm start from finished jobs, then
    model-based scaling on the fitted model, and instability handling (OOM prediction,
    hot-PS re-partition, dynamic sharding against stragglers)."""

    name = "stride"
    dynamic_sharding = True
    seamless = True

    def decide(self, view: JobView) -> Decision:
        """See the class docstring."""
        spec = view.spec
        if view.reason == "arrival":
            if view.history:
                reply = warm_start(WarmStartRequest(_features(spec), view.history))
                c = reply.configuration
                return Decision(
                    Pods(
                        c.worker_count,
                        max(1, round(c.worker_cpu)),
                        max(1, math.ceil(c.worker_memory_bytes / GIB)),
                        max(1, c.ps_count),
                        max(1, round(c.ps_cpu)),
                        max(1, math.ceil(c.ps_memory_bytes / GIB)),
                    )
                )
            return Decision(spec.request)
        pods = view.pods
        growth = self._memory_model(view)
        if view.reason == "oom":
            if growth is None:
                return Decision(replace(pods, ps_mem_gib=pods.ps_mem_gib * 2))
            return Decision(replace(pods, ps_mem_gib=max(pods.ps_mem_gib * 2, growth(pods.ps))))
        repartition = view.hot_detected
        distinct = {s[0] for s in view.samples}
        target = pods
        if len(distinct) < 3:
            # Sampling stage: probe a different shape so the fit has regressors to work on.
            probes = (
                replace(pods, workers=max(1, pods.workers // 2), worker_cpu=pods.worker_cpu * 2),
                replace(pods, ps=pods.ps * 2, ps_cpu=max(1, pods.ps_cpu // 2)),
            )
            target = probes[len(distinct) - 1] if len(distinct) >= 1 else pods
            if target.cpu > spec.request.cpu * 2:
                target = pods
        elif len(view.samples) < 5 or len(view.samples) % REFIT_EVERY_TICKS != 0:
            target = pods
        else:
            configs = [_config(p, spec) for p, _ in view.samples]
            params, _, _ = fit_throughput_model(configs, [t for _, t in view.samples])
            hot = 1.0

            def memory(workers: int, ps: int) -> tuple[int, int]:
                wmem = math.ceil(spec.worker_mem_need_gib * MEMORY_HEADROOM)
                return wmem, growth(ps) if growth is not None else pods.ps_mem_gib

            try:
                best = _knee(params, spec, hot, max(pods.cpu, spec.request.cpu), memory)
            except ValueError:
                best = pods
            now_thr = float(view.samples[-1][1])
            pred_best = _one(params, spec, 1.0, best)[0]
            pred_now = _one(params, spec, 1.0, pods)[0]
            cheaper = best.cpu < 0.8 * pods.cpu and pred_best >= 0.9 * pred_now
            faster = pred_best > 1.1 * pred_now and now_thr > 0
            if cheaper or faster:
                target = best
        if growth is not None and target.ps_mem_gib < growth(target.ps):
            target = replace(target, ps_mem_gib=growth(target.ps))
        return Decision(None if target == pods else target, repartition)

    @staticmethod
    def _memory_model(view: JobView) -> Callable[[int], int] | None:
        """GiB per PS that holds the predicted peak (stride.policy.oom), or None."""
        points = view.memory_points
        if len(points) < 2 or len({p[0] for p in points}) < 2:
            return None
        ps = view.pods.ps
        hot_curve = PsMemoryCurve(tuple(p[0] for p in points), tuple(p[1] * GIB for p in points))
        cold_curve = PsMemoryCurve(tuple(p[0] for p in points), tuple(p[2] * GIB for p in points))
        curves = (hot_curve,) + (cold_curve,) * (ps - 1)
        reply = predict_oom(
            OomRequest(
                curves,
                view.pods.ps_mem_gib * GIB,
                int(view.consumed),
                math.ceil(view.spec.total_samples),
            )
        )
        total = sum(f.predicted_peak_bytes for f in reply.forecasts) / GIB
        # After re-partition the load is even: each of n PS holds total / n, plus headroom.
        return lambda n: max(1, math.ceil(total / n * MEMORY_HEADROOM))


class EsPolicy:
    """ES autoscaling (000 sec. 6 baseline): from the request, add workers (25 %, at least
    one) while the last addition's scaling efficiency exceeds 0.3; checkpoint-restart."""

    name = "es"
    dynamic_sharding = False
    seamless = False

    def decide(self, view: JobView) -> Decision:
        """See the class docstring."""
        if view.reason == "arrival":
            return Decision(view.spec.request)
        if view.reason != "tick" or not view.samples:
            return Decision()
        pods = view.pods
        last = [s for s in view.samples if s[0] == pods]
        earlier = [s for s in view.samples if s[0].workers < pods.workers]
        if earlier:
            before_pods, before = earlier[-1]
            now = last[-1][1] if last else 0.0
            added = pods.workers - before_pods.workers
            efficiency = ((now - before) / added) / (before / before_pods.workers)
            if efficiency <= 0.3:
                return Decision()
            # Only keep growing from the newest configuration.
        if any(s[0].workers > pods.workers for s in view.samples):
            return Decision()
        return Decision(replace(pods, workers=pods.workers + max(1, pods.workers // 4)))


class DlroverHeuristicPolicy:
    """DLRover's open-source rules: PS CPU x2 when its utilisation > 0.9 (ps_cpu_overload),
    PS memory x2 on OOM, workers x (0.9 / worker utilisation); dynamic sharding."""

    name = "dlrover-heuristic"
    dynamic_sharding = True
    seamless = True

    def decide(self, view: JobView) -> Decision:
        """See the class docstring."""
        pods = view.pods
        if view.reason == "arrival":
            return Decision(view.spec.request)
        if view.reason == "oom":
            return Decision(replace(pods, ps_mem_gib=pods.ps_mem_gib * 2))
        target = pods
        if view.ps_util > 0.9:
            target = replace(target, ps_cpu=min(32, target.ps_cpu * 2))
        elif view.worker_util > 0:
            wanted = max(1, min(64, round(pods.workers * view.worker_util / 0.9)))
            if abs(wanted - pods.workers) >= max(1, pods.workers // 4):
                target = replace(target, workers=wanted)
        return Decision(None if target == pods else target)


POLICIES: dict[str, Callable[[], DlrmPolicy]] = {
    "static": StaticPolicy,
    "tuned-static": TunedStaticPolicy,
    "stride": StridePolicy,
    "es": EsPolicy,
    "dlrover-heuristic": DlroverHeuristicPolicy,
}
"""Policies by name. Optimus (fixed +PS/+worker increments) is not implemented."""


# --- Simulation --------------------------------------------------------------------------


@dataclass
class _Job:
    spec: DlrmJobSpec
    pods: Pods | None = None
    initial: Pods | None = None
    consumed: float = 0.0
    last: float = 0.0
    rate: float = 0.0
    paused_until: float = 0.0
    version: int = 0
    hot: float = 1.0
    speed_factor: float = 1.0
    oom_kills: int = 0
    start: float | None = None
    end: float | None = None
    failed: bool = False
    samples: list[tuple[Pods, float]] = field(default_factory=list)
    memory_points: list[tuple[float, float, float]] = field(default_factory=list)
    cpu_used_s: float = 0.0
    cpu_alloc_s: float = 0.0
    mem_used_s: float = 0.0
    mem_alloc_s: float = 0.0


@dataclass(frozen=True)
class DlrmResult:
    """Metrics of one run. The job population is synthetic and seeded (see module doc)."""

    policy: str
    seed: int
    num_jobs: int
    completed: int
    failed: int
    jct_median_s: float
    jct_p90_s: float
    completion_rate: float
    cpu_utilization: float
    """Core-seconds used over core-seconds allocated, all jobs."""
    memory_utilization: float
    oom_kills: int
    scaling_events: int
    makespan_s: float
    peak_cpu: int
    peak_memory_gib: int
    jcts: tuple[float, ...]
    """Per-job JCT in job-id order, NaN for failed jobs."""
    ends: tuple[int, ...]
    """How many times each job ended (must be 1 each)."""
    synthetic: bool = True


class _Env:
    def __init__(
        self, jobs: list[DlrmJobSpec], cpus: int, mem: int, policy: DlrmPolicy, sim: Simulation
    ) -> None:
        self.jobs = {j.job_id: _Job(j, hot=j.hot_factor) for j in jobs}
        self.cpus, self.mem = cpus, mem
        self.used_cpu, self.used_mem = 0, 0
        self.peak_cpu, self.peak_mem = 0, 0
        self.policy = policy
        self.sim = sim
        self.queue: list[int] = []
        self.history: list[HistoricalJob] = []
        self.scaling_events = 0
        self.oom_kills = 0
        self.ends = [0] * len(jobs)

    # accounting
    def _advance(self, job: _Job, now: float) -> None:
        if job.pods is None:
            job.last = now
            return
        dt = now - job.last
        if dt > 0:
            progress_from = max(job.last, min(job.paused_until, now))
            run_dt = now - progress_from
            before = job.consumed
            job.consumed = min(job.spec.total_samples, job.consumed + job.rate * run_dt)
            _, wbusy, pbusy = _one(job.spec.params, job.spec, job.hot, job.pods)
            running = run_dt / dt
            p = job.pods
            used_cpu = running * (
                p.workers * p.worker_cpu * wbusy * job.speed_factor + p.ps * p.ps_cpu * pbusy
            )
            mid = (before + job.consumed) / 2
            hot_mem, cold_mem = ps_memory_gib(job.spec, job.hot, p.ps, mid)
            used_mem = p.workers * job.spec.worker_mem_need_gib + min(
                p.ps * p.ps_mem_gib, hot_mem + cold_mem * (p.ps - 1)
            )
            job.cpu_used_s += used_cpu * dt
            job.cpu_alloc_s += p.cpu * dt
            job.mem_used_s += min(used_mem, p.memory_gib) * dt
            job.mem_alloc_s += p.memory_gib * dt
        job.last = now

    def _speed(self, job: _Job, workers: int) -> float:
        cov = job.spec.straggler_cov
        if cov <= 0:
            return 1.0
        sigma = math.sqrt(math.log(1 + cov * cov))
        times = self.sim.rng.lognormal(-sigma * sigma / 2, sigma, size=workers)
        speeds = 1.0 / times
        return float(speeds.mean() if self.policy.dynamic_sharding else speeds.min())

    def _reschedule(self, job: _Job) -> None:
        job.version += 1
        assert job.pods is not None
        job.rate = _one(job.spec.params, job.spec, job.hot, job.pods)[0] * job.speed_factor
        now = self.sim.now
        begin = max(now, job.paused_until)
        remaining = job.spec.total_samples - job.consumed
        self.sim.schedule(
            begin + remaining / job.rate, EventKind.COMPLETION, job.spec.job_id, job.version
        )
        # OOM: first consumed count at which the hottest PS exceeds its limit.
        spec, p = job.spec, job.pods
        hot_now = ps_memory_gib(spec, job.hot, p.ps, job.consumed)[0]
        hot_end = ps_memory_gib(spec, job.hot, p.ps, spec.total_samples)[0]
        if hot_end > p.ps_mem_gib:
            if hot_now >= p.ps_mem_gib:
                at = job.consumed
            else:
                frac = (p.ps_mem_gib - hot_now) / (hot_end - hot_now)
                at = job.consumed + frac * remaining
            self.sim.schedule(
                begin + (at - job.consumed) / job.rate,
                EventKind.FAILURE,
                job.spec.job_id,
                ("oom", job.version),
            )
        hazard = p.count * POD_FAILURE_PER_DAY / 86400.0
        self.sim.schedule(
            now + float(self.sim.rng.exponential(1.0 / hazard)),
            EventKind.FAILURE,
            job.spec.job_id,
            ("pod", job.version),
        )

    def _fits(self, extra_cpu: int, extra_mem: int) -> bool:
        return self.used_cpu + extra_cpu <= self.cpus and self.used_mem + extra_mem <= self.mem

    def _set_pods(self, job: _Job, pods: Pods, pause: float) -> None:
        old = job.pods
        self.used_cpu += pods.cpu - (old.cpu if old else 0)
        self.used_mem += pods.memory_gib - (old.memory_gib if old else 0)
        assert self.used_cpu <= self.cpus and self.used_mem <= self.mem
        self.peak_cpu = max(self.peak_cpu, self.used_cpu)
        self.peak_mem = max(self.peak_mem, self.used_mem)
        if old is None or old.workers != pods.workers:
            job.speed_factor = self._speed(job, pods.workers)
        job.pods = pods
        job.paused_until = max(job.paused_until, self.sim.now + pause)
        self._reschedule(job)

    def _view(self, job: _Job, reason: str) -> JobView:
        pods = job.pods if job.pods is not None else job.spec.request
        _, wbusy, pbusy = _one(job.spec.params, job.spec, job.hot, pods)
        return JobView(
            reason=reason,
            now=self.sim.now,
            spec=job.spec,
            pods=pods,
            consumed=job.consumed,
            samples=tuple(job.samples),
            worker_util=wbusy * job.speed_factor,
            ps_util=pbusy,
            memory_points=tuple(job.memory_points),
            hot_detected=job.hot > 1.2 and pods.ps > 1,
            history=tuple(self.history[-200:]),
            cluster_cpus=self.cpus,
        )

    def _try_start(self) -> None:
        waiting: list[int] = []
        for job_id in self.queue:
            job = self.jobs[job_id]
            if job.initial is None:
                # Decided once, when the job first reaches the head of the scan.
                pods = self.policy.decide(self._view(job, "arrival")).pods or job.spec.request
                if pods.cpu > self.cpus or pods.memory_gib > self.mem:
                    pods = job.spec.request
                job.initial = pods
            pods = job.initial
            if self._fits(pods.cpu, pods.memory_gib):
                job.start = self.sim.now
                job.last = self.sim.now
                self._set_pods(job, pods, RESTART_SECONDS)
                self.sim.schedule(self.sim.now + TICK_SECONDS, EventKind.TIMER, job_id, None)
            else:
                waiting.append(job_id)
        self.queue = waiting

    def _finish(self, job: _Job, failed: bool) -> None:
        assert job.pods is not None
        self._advance(job, self.sim.now)
        job.end = self.sim.now
        job.failed = failed
        self.ends[job.spec.job_id] += 1
        self.used_cpu -= job.pods.cpu
        self.used_mem -= job.pods.memory_gib
        job.version += 1
        if not failed:
            p = job.pods
            self.history.append(
                HistoricalJob(
                    str(job.spec.job_id),
                    _features(job.spec),
                    ResourceConfiguration(
                        p.workers,
                        float(p.worker_cpu),
                        p.worker_mem_gib * GIB,
                        p.ps,
                        float(p.ps_cpu),
                        p.ps_mem_gib * GIB,
                    ),
                )
            )
        self._try_start()

    def _apply(self, job: _Job, decision: Decision) -> None:
        assert job.pods is not None
        pods = decision.pods
        changed = False
        pause = 0.0
        if decision.repartition and job.hot > 1.0:
            job.hot = 1.0
            changed = True
            pause = overhead_seconds(
                _config(job.pods, job.spec),
                _config(replace(job.pods, ps_cpu=job.pods.ps_cpu + 1), job.spec),
            )
        if pods is not None and pods != job.pods:
            extra_cpu = pods.cpu - job.pods.cpu
            extra_mem = pods.memory_gib - job.pods.memory_gib
            if self._fits(extra_cpu, extra_mem):
                if self.policy.seamless:
                    pause = max(
                        pause,
                        overhead_seconds(_config(job.pods, job.spec), _config(pods, job.spec)),
                    )
                else:
                    pause = RESTART_SECONDS
                self._set_pods(job, pods, pause)
                self.scaling_events += 1
                self._try_start()
                return
        if changed:
            job.paused_until = max(job.paused_until, self.sim.now + pause)
            self.scaling_events += 1
            self._reschedule(job)

    def handle(self, sim: Simulation, event: Event) -> None:
        if event.kind == EventKind.ARRIVAL:
            assert isinstance(event.job_id, int)
            self.queue.append(event.job_id)
            self._try_start()
            return
        assert isinstance(event.job_id, int)
        job = self.jobs[event.job_id]
        if job.end is not None:
            return
        if event.kind == EventKind.COMPLETION:
            if event.payload == job.version:
                self._finish(job, failed=False)
            return
        if event.kind == EventKind.FAILURE:
            assert isinstance(event.payload, tuple)
            what, version = event.payload
            if version != job.version:
                return
            self._advance(job, sim.now)
            if what == "pod":
                job.paused_until = max(job.paused_until, sim.now + RESTART_SECONDS)
                self._reschedule(job)
                return
            self.oom_kills += 1
            job.oom_kills += 1
            if job.oom_kills >= MAX_OOM_KILLS:
                self._finish(job, failed=True)
                return
            job.paused_until = max(job.paused_until, sim.now + RESTART_SECONDS)
            decision = self.policy.decide(self._view(job, "oom"))
            before = job.version
            self._apply(job, decision)
            if job.version == before:
                self._reschedule(job)
            return
        if event.kind == EventKind.TIMER:
            self._advance(job, sim.now)
            assert job.pods is not None
            if sim.now >= job.paused_until and job.rate > 0:
                noise = float(sim.rng.lognormal(0.0, 0.05))
                job.samples.append((job.pods, job.rate * noise))
                hot_mem, cold_mem = ps_memory_gib(job.spec, job.hot, job.pods.ps, job.consumed)
                job.memory_points.append((job.consumed, hot_mem, cold_mem))
                self._apply(job, self.policy.decide(self._view(job, "tick")))
            sim.schedule(sim.now + TICK_SECONDS, EventKind.TIMER, job.spec.job_id, None)


def simulate(
    jobs: list[DlrmJobSpec], cluster_cpus: int, cluster_memory_gib: int, policy_name: str, seed: int
) -> DlrmResult:
    """Run ``jobs`` under a policy on a cluster of ``cluster_cpus`` cores and
    ``cluster_memory_gib`` GiB (aggregate capacity, no node packing)."""
    if policy_name not in POLICIES:
        raise SimulationError(f"policy_name: unknown {policy_name!r}; known: {sorted(POLICIES)}")
    for spec in jobs:
        r = spec.request
        if r.cpu > cluster_cpus or r.memory_gib > cluster_memory_gib:
            raise SimulationError(
                f"job {spec.job_id}: request ({r.cpu} cores, {r.memory_gib} GiB) exceeds the "
                f"cluster ({cluster_cpus} cores, {cluster_memory_gib} GiB)"
            )
    policy = POLICIES[policy_name]()
    sim = Simulation(seed)
    env = _Env(jobs, cluster_cpus, cluster_memory_gib, policy, sim)
    for spec in jobs:
        sim.schedule(spec.submit_time, EventKind.ARRIVAL, spec.job_id)
    sim.run(env.handle)
    states = [env.jobs[spec.job_id] for spec in jobs]
    jcts = tuple(
        (s.end - s.spec.submit_time) if s.end is not None and not s.failed else math.nan
        for s in states
    )
    done = [x for x in jcts if not math.isnan(x)]
    cpu_alloc = sum(s.cpu_alloc_s for s in states)
    mem_alloc = sum(s.mem_alloc_s for s in states)
    return DlrmResult(
        policy=policy_name,
        seed=seed,
        num_jobs=len(jobs),
        completed=len(done),
        failed=sum(1 for s in states if s.failed),
        jct_median_s=float(np.median(done)) if done else math.nan,
        jct_p90_s=float(np.percentile(done, 90)) if done else math.nan,
        completion_rate=len(done) / len(jobs),
        cpu_utilization=sum(s.cpu_used_s for s in states) / cpu_alloc if cpu_alloc else 0.0,
        memory_utilization=sum(s.mem_used_s for s in states) / mem_alloc if mem_alloc else 0.0,
        oom_kills=env.oom_kills,
        scaling_events=env.scaling_events,
        makespan_s=max((s.end or 0.0) for s in states),
        peak_cpu=env.peak_cpu,
        peak_memory_gib=env.peak_mem,
        jcts=jcts,
        ends=tuple(env.ends),
    )


def run_dlrm(
    num_jobs: int,
    cluster_cpus: int,
    cluster_memory_gib: int,
    policy_name: str,
    seed: int,
    straggler_covs_path: Path = DEFAULT_PAI_COV_PATH,
) -> DlrmResult:
    """Generate ``num_jobs`` synthetic seeded DLRM jobs and run them under ``policy_name``.

    The population depends only on ``seed`` (the same for every policy); straggler CoVs
    come from the PAI trace. Raises SimulationError for bad input.
    """
    if cluster_cpus < 1 or cluster_memory_gib < 1:
        raise SimulationError("cluster_cpus, cluster_memory_gib: must be >= 1")
    jobs = generate_jobs(
        num_jobs, np.random.default_rng(seed), load_straggler_covs(straggler_covs_path)
    )
    return simulate(jobs, cluster_cpus, cluster_memory_gib, policy_name, seed)
