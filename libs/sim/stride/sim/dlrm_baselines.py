"""The DLRM environment's elastic baselines, written from their papers: Optimus and ES.

Both are pure functions over plain numbers, so the hand-computed tests in
``tests/unit/sim/test_dlrm_baselines.py`` pin them; :mod:`stride.sim.dlrm` adapts them to
the environment's jobs.

**Optimus** (Peng et al., EuroSys'18: sec. 3.2 the speed model, sec. 4.1 the allocation).
The paper's full text was not available here; the rules below are from its section map
(the introduction), The Morning Paper's summary of it, and the authors' published
scheduler (``pengyanghua/optimus``), read, not copied.

- Speed model, asynchronous training (sec. 3.2): ``f(p, w) = w / (t0 + t1 w/p + t2 w +
  t3 p)``. It is linear in theta after inversion (``w / f = [1, w/p, w, p] . theta``) and
  fitted by non-negative least squares (sec. 3.2: NNLS) to every (p, w, speed) the job has
  measured; at least :data:`OPTIMUS_MIN_POINTS` distinct (p, w) are needed.
- Profiling (sec. 3.2): "we run a job for a few steps with different resource
  configurations" before it starts; the authors' scheduler measures 8 configurations with
  ``p = w``. :data:`OPTIMUS_PROFILE` lists ours; each run costs
  :data:`OPTIMUS_PROFILE_RUN_SECONDS` ("tens of seconds").
- Allocation (sec. 4.1), every round: every job first gets one PS and one worker, in
  arrival order, while they fit ("to avoid starvation"); then, repeatedly, the task (one
  PS or one worker) with the largest *marginal gain* is added, the gain being the
  reduction of the job's remaining time ``R / f(p, w) - R / f(p', w')`` divided by the
  task's share of its dominant resource; it stops when the best gain is negative (here:
  not positive, departure 6) or the best task no longer fits. Per-task sizes are the
  job's own and never change.

Departures, each stated where the code makes it:

1. Remaining work ``R`` is the job's termination condition minus what it consumed, not
   sec. 3.1's loss-curve estimate of the steps to convergence: our jobs end at a sample
   count, which every policy knows.
2. The gain is divided by the task's *share* of the cluster's dominant resource (the
   blog's wording); the authors' code divides by the raw amount. The two rank tasks alike
   when every task is CPU-dominant, as here.
3. A job holds at most :data:`stride.policy.stages.JOB_CPU_LIMIT` cores (or its request),
   the testbed rule every policy here obeys (000 sec. 6.1); a job at its limit takes no
   more tasks and the greedy goes on with the others.
4. How DLRover's authors ran Optimus (000 sec. 6.3, 002 sec. 6): every three minutes, and
   "adding or removing a fixed number of nodes each time" (2 PS or 4 workers for
   Wide & Deep, 1 and 1 for xDeepFM). So a job moves toward its Optimus allocation by at
   most :data:`OPTIMUS_PS_STEP` PS and :data:`OPTIMUS_WORKER_STEP` workers per round (the
   Wide & Deep steps, the faster of the two). Both may move in one restart, which favours
   Optimus (one pause instead of two).
5. Only jobs whose counts change restart; the authors' scheduler relaunches every job each
   round. This favours Optimus.
6. A zero gain stops the greedy as a negative one does, and the profiling runs vary PS and
   workers independently (:data:`OPTIMUS_PROFILE`).

**ES** (Or, Zhang, Freedman, "Resource Elasticity in Distributed Deep Learning",
MLSys'20, as 000 sec. 6.3 ran it): workers only, ``step`` at a time (4 for Wide & Deep,
1 for xDeepFM: :data:`ES_STEP`), every three minutes, while the scaling efficiency
``s = ((R_new - R_old) / (k_new - k_old)) / (R_old / k_old)`` (the throughput one added
worker brings over one existing worker's) exceeds 0.3 (:data:`ES_THRESHOLD`; the MLSys
code's default is 0.1). The search over measured worker counts ``k_1 < k_2 < ...``:

- with one count measured, try ``k + step``;
- if every adjacent pair passes, try ``k_max + step`` (within the job's limit);
- otherwise, unless the first :data:`ES_PASSES_TO_STAY` pairs all pass, try
  ``k_min - step`` (at least one worker) while ``k_min`` is above one: ES scales in to
  find where scaling starts to pay;
- otherwise stay at the lower end of the first failing pair.

ES starts from the user's request (000 and 002 do not say; ES itself starts at the job's
configured workers) and keeps the request's PS and per-pod sizes.

Neither handles memory: an OOM-killed pod restarts with the same limit.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

__all__ = [
    "ES_PASSES_TO_STAY",
    "ES_STEP",
    "ES_THRESHOLD",
    "OPTIMUS_MIN_POINTS",
    "OPTIMUS_PROFILE",
    "OPTIMUS_PROFILE_RUN_SECONDS",
    "OPTIMUS_PS_STEP",
    "OPTIMUS_WORKER_STEP",
    "OptimusJob",
    "es_target",
    "fit_optimus_model",
    "optimus_allocate",
    "optimus_speed",
    "step_toward",
]

OPTIMUS_MIN_POINTS = 4
"""Distinct (p, w) the asynchronous model needs (four coefficients)."""
OPTIMUS_PROFILE = ((1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (2, 8), (4, 8))
"""(PS, workers) of the eight profiling runs. Departure: the authors' scheduler draws
``p = w`` (1-10), on which ``w/p`` is constant and ``w`` and ``p`` move together, so only two
of the four coefficients are identifiable; the paper's "different resource configurations"
is read as varying both, which favours Optimus."""
OPTIMUS_PROFILE_RUN_SECONDS = 30.0
"""One profiling run: "a few steps ... tens of seconds" (sec. 3.2)."""
OPTIMUS_PS_STEP = 2
OPTIMUS_WORKER_STEP = 4
"""Most PS and workers one round adds or removes (000 sec. 6.3, Wide & Deep)."""
ES_STEP = 4
"""Workers ES adds or removes at a time (000 sec. 6.3 for Wide & Deep; the MLSys default)."""
ES_THRESHOLD = 0.3
"""Scaling efficiency an added step must exceed (000 sec. 6.3)."""
ES_PASSES_TO_STAY = 3
"""Consecutive passing pairs from the smallest count before ES stops scaling in (the MLSys
code's ``min_consecutive_passes_for_remove``)."""


def fit_optimus_model(points: Sequence[tuple[int, int, float]]) -> np.ndarray:
    """NNLS fit of ``f(p, w) = w / (t0 + t1 w/p + t2 w + t3 p)`` to (PS, workers, speed)
    points; returns (t0, t1, t2, t3) >= 0. Raises ValueError for fewer than
    :data:`OPTIMUS_MIN_POINTS` distinct (p, w) or a non-positive speed."""
    if len({(p, w) for p, w, _ in points}) < OPTIMUS_MIN_POINTS:
        raise ValueError(
            f"points: need {OPTIMUS_MIN_POINTS} distinct (ps, workers), got "
            f"{len({(p, w) for p, w, _ in points})}"
        )
    if any(not speed > 0 for _, _, speed in points):
        raise ValueError("points: every speed must be positive")
    rows = np.array([[1.0, w / p, float(w), float(p)] for p, w, _ in points])
    time = np.array([w / speed for _, w, speed in points])
    scale = float(time.max())
    theta, _ = nnls(rows, time / scale)
    result: np.ndarray = theta * scale
    return result


def optimus_speed(theta: np.ndarray, ps: int, workers: int) -> float:
    """The model's speed with ``ps`` PS and ``workers`` workers (inf if it predicts no
    time per step)."""
    time = float(theta @ np.array([1.0, workers / ps, float(workers), float(ps)]))
    return workers / time if time > 0 else math.inf


@dataclass(frozen=True)
class OptimusJob:
    """What Optimus's allocation knows of one job."""

    job_id: int
    remaining: float
    """Work left, in the unit of the speed model (samples)."""
    theta: np.ndarray | None
    """The fitted speed model, or None if the job cannot be estimated yet (it stays at one
    PS and one worker)."""
    worker_cpu: int
    worker_mem_gib: int
    ps_cpu: int
    first_ps_mem_gib: int
    """Memory of the job's first PS."""
    ps_mem_gib: int
    """Memory each further PS adds."""
    cpu_limit: int
    """Most cores the job may hold."""


def _remaining_time(job: OptimusJob, ps: int, workers: int) -> float:
    assert job.theta is not None
    speed = optimus_speed(job.theta, ps, workers)
    return 0.0 if math.isinf(speed) else job.remaining / speed


def optimus_allocate(
    jobs: Sequence[OptimusJob], cluster_cpus: int, cluster_memory_gib: int
) -> dict[int, tuple[int, int]]:
    """Optimus's allocation (sec. 4.1): job id -> (PS, workers) for the jobs that get any.

    ``jobs`` are in arrival order; a job left out does not fit one PS and one worker.
    """
    free_cpu, free_mem = float(cluster_cpus), float(cluster_memory_gib)
    alloc: dict[int, tuple[int, int]] = {}
    by_id: dict[int, OptimusJob] = {}
    for job in jobs:
        cpu = job.ps_cpu + job.worker_cpu
        mem = job.first_ps_mem_gib + job.worker_mem_gib
        if cpu <= free_cpu and mem <= free_mem:
            alloc[job.job_id] = (1, 1)
            by_id[job.job_id] = job
            free_cpu -= cpu
            free_mem -= mem

    def share(cpu: int, mem: int) -> float:
        return max(cpu / cluster_cpus, mem / cluster_memory_gib)

    def best_task(job: OptimusJob) -> tuple[float, str] | None:
        ps, workers = alloc[job.job_id]
        now = _remaining_time(job, ps, workers)
        options = []
        held = ps * job.ps_cpu + workers * job.worker_cpu
        if held + job.ps_cpu <= job.cpu_limit:
            gain = (now - _remaining_time(job, ps + 1, workers)) / share(job.ps_cpu, job.ps_mem_gib)
            options.append((gain, "ps"))
        if held + job.worker_cpu <= job.cpu_limit:
            gain = (now - _remaining_time(job, ps, workers + 1)) / share(
                job.worker_cpu, job.worker_mem_gib
            )
            options.append((gain, "worker"))
        # Ties go to the PS, as in the authors' scheduler (``ps_util >= worker_util``).
        return max(options, key=lambda o: (o[0], o[1] == "ps")) if options else None

    heap: list[tuple[float, int, str]] = []
    order = {job.job_id: i for i, job in enumerate(jobs)}
    for job_id, job in by_id.items():
        if job.theta is None:
            continue
        task = best_task(job)
        if task is not None:
            heapq.heappush(heap, (-task[0], order[job_id], task[1]))
    while heap:
        negative_gain, index, kind = heapq.heappop(heap)
        if -negative_gain <= 0:
            # Departure: the paper stops when every gain is negative; a zero gain (NNLS
            # often fits exact zeros) would only hold capacity for nothing.
            break
        job = jobs[index]
        cpu, mem = (
            (job.ps_cpu, job.ps_mem_gib) if kind == "ps" else (job.worker_cpu, job.worker_mem_gib)
        )
        if cpu > free_cpu or mem > free_mem:
            break
        ps, workers = alloc[job.job_id]
        alloc[job.job_id] = (ps + 1, workers) if kind == "ps" else (ps, workers + 1)
        free_cpu -= cpu
        free_mem -= mem
        task = best_task(job)
        if task is not None:
            heapq.heappush(heap, (-task[0], index, task[1]))
    return alloc


def step_toward(current: int, target: int, step: int) -> int:
    """``current`` moved toward ``target`` by at most ``step``."""
    if target > current:
        return min(target, current + step)
    return max(target, current - step)


def es_target(measured: Mapping[int, float], current: int, step: int, max_workers: int) -> int:
    """ES's next worker count from the mean throughput ``measured`` at each worker count
    (module docstring); ``current`` if it stays."""
    counts = sorted(measured)
    if not counts:
        return current
    if len(counts) == 1:
        k = counts[0]
        return k + step if k + step <= max_workers else current
    passes = []
    for low, high in itertools.pairwise(counts):
        before, after = measured[low], measured[high]
        efficiency = ((after - before) / (high - low)) / (before / low)
        passes.append(efficiency > ES_THRESHOLD)
    if all(passes):
        top = counts[-1]
        return top + step if top + step <= max_workers else top
    first_ok = 0
    while first_ok < len(passes) and passes[first_ok]:
        first_ok += 1
    if first_ok < ES_PASSES_TO_STAY and counts[0] > 1:
        return max(1, counts[0] - step)
    return counts[first_ok]
