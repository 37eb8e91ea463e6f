"""Benchmark: NSGA-II candidates for one job, and weighted greedy selection over 10,000 jobs.

Run: ``.venv/bin/python bench/pareto_selection.py``. Each result is printed beside a naive
reference measured in the same run, and the command and output go to
``bench/results/pareto_selection.txt``.

1. NSGA-II (pymoo, the settings of :mod:`stride.policy.pareto`) for one job on its full
   integer space, target <= 200 ms. Reference: exhaustive enumeration of a reduced grid
   (the full grid has ~10^9 points), with the exact front; NSGA-II is also run on the reduced
   grid to compare the best throughput gain it finds with the exact one.
2. Weighted greedy selection (eq. 11-14) over 10,000 jobs with 10 candidates each, target
   <= 1 s. Reference: the naive greedy that re-scans every remaining candidate for the best
   one that fits before each pick (O(n^2), vectorized with numpy); both must pick the same.

The job environment is synthetic (DLRover-RM's throughput model with the paper's Fig. 11
coefficients, random jobs from a fixed seed): no public per-job PS/worker trace exists.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from stride.policy import pareto
from stride.policy.pareto import ClusterLimits, ParetoRequest, SearchBounds, candidates, evaluate
from stride.policy.selection import Candidate, JobCandidates, SelectionRequest, score, select
from stride.policy.throughput import PAPER_PARAMETERS, Configuration

GIB = 1024**3
T = TypeVar("T")
RESULT = Path(__file__).parent / "results" / "pareto_selection.txt"
SEED = 20261121

CURRENT = Configuration(
    workers=4, parameter_servers=2, worker_cpu=4.0, ps_cpu=8.0, batch_size=512,
    worker_memory_bytes=8 * GIB, ps_memory_bytes=16 * GIB, embedding_dim=16, model_bytes=2e8,
)  # fmt: skip
FULL_BOUNDS = SearchBounds(1, 64, 1, 16, 1, 32, 1, 32, 8, 32, 16, 64)
REDUCED_BOUNDS = SearchBounds(1, 16, 1, 8, 1, 8, 1, 8, 8, 8, 16, 16)
CLUSTER = ClusterLimits(400.0, 4000 * GIB, 32.0, 256 * GIB)


def timed(function: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Median seconds of ``repeats`` calls, and the last result."""
    durations = []
    result: T | None = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        durations.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(durations), result


def exact_front(request: ParetoRequest) -> tuple[int, NDArray[np.float64]]:
    """Every integer configuration in the box, evaluated; the non-dominated (cost, gain)."""
    lower, upper = pareto.search_box(request)
    ranges = [range(low, high + 1) for low, high in zip(lower, upper, strict=True)]
    grid = np.array(list(itertools.product(*ranges)), dtype=np.int64)
    values = evaluate(request, grid)
    feasible = np.all(values["G"] <= 0, axis=1)
    objectives = values["F"][feasible]
    order = np.lexsort((objectives[:, 1], objectives[:, 0]))  # cost up, then -gain up
    front = []
    best = np.inf
    for cost, negative_gain in objectives[order]:
        if negative_gain < best:
            best = negative_gain
            front.append((cost, -negative_gain))
    return len(grid), np.array(front)


def bench_pareto(lines: list[str]) -> None:
    full = ParetoRequest(PAPER_PARAMETERS, CURRENT, FULL_BOUNDS, CLUSTER, seed=1)
    candidates(full)  # imports pymoo once, outside the timing
    nsga_full, reply = timed(lambda: candidates(full), 10)
    reduced = ParetoRequest(PAPER_PARAMETERS, CURRENT, REDUCED_BOUNDS, CLUSTER, seed=1)
    nsga_reduced, reduced_reply = timed(lambda: candidates(reduced), 10)
    exhaustive, (points, front) = timed(lambda: exact_front(reduced), 3)
    lower, upper = pareto.search_box(full)
    full_points = int(np.prod(upper - lower + 1))
    best_exact = float(front[:, 1].max())
    best_found = max(c.throughput_gain for c in reduced_reply.candidates)
    per_point = exhaustive / points
    lines += [
        f"NSGA-II settings: population {pareto.POPULATION_SIZE}, generations {pareto.GENERATIONS}, "
        f"SBX eta {pareto.CROSSOVER_ETA}, PM eta {pareto.MUTATION_ETA}, RoundingRepair",
        f"nsga2 one job, full space ({full_points:.2e} points): {nsga_full * 1e3:.1f} ms median "
        f"of 10, {len(reply.candidates)} candidates (target <= 200 ms)",
        f"nsga2 one job, reduced grid ({points} points): {nsga_reduced * 1e3:.1f} ms; "
        f"exhaustive reference on the same grid: {exhaustive * 1e3:.1f} ms "
        f"(ratio nsga2/exhaustive {nsga_reduced / exhaustive:.2f}); "
        f"best gain found {best_found:.0f} vs exact {best_exact:.0f} "
        f"({best_found / best_exact:.3f}), exact front {len(front)} points",
        f"exhaustive extrapolated to the full space: {per_point * full_points:.0f} s "
        f"(ratio to nsga2 {per_point * full_points / nsga_full:.0f}x)",
    ]


def make_jobs(count: int, per_job: int, rng: np.random.Generator) -> list[JobCandidates]:
    jobs = []
    for index in range(count):
        cpu = rng.integers(1, 33, per_job).astype(float)
        memory = rng.integers(0, 129, per_job).astype(float)
        speed = rng.uniform(100, 10_000, per_job)
        gain = rng.uniform(-50, 2_000, per_job)
        cost = cpu + memory * 0.125 + 0.5
        jobs.append(
            JobCandidates(
                f"job-{index:05d}",
                float(rng.uniform(1e5, 1e9)),
                tuple(
                    Candidate((cpu[k], memory[k]), speed[k], gain[k], cost[k])
                    for k in range(per_job)
                ),
            )
        )
    return jobs


def naive_greedy(request: SelectionRequest) -> set[tuple[str, int]]:
    """Re-scan everything before each pick: the best-scoring plan of a job without one that
    fits (same tie-break by job id as the fast greedy via a stable pre-sort)."""
    rows = [
        (score(job, c, request.rho, request.epsilon), job.job_id, j, i, c.resources)
        for j, job in enumerate(request.jobs)
        for i, c in enumerate(job.candidates)
    ]
    rows.sort(key=lambda row: row[1])
    scores = np.array([row[0] for row in rows])
    jobs = np.array([row[2] for row in rows])
    demand = np.array([row[4] for row in rows])
    alive = scores > 0
    used = np.zeros(len(request.capacity))
    picked: set[tuple[str, int]] = set()
    while True:
        fits = alive & np.all(used + demand <= np.array(request.capacity), axis=1)
        if not fits.any():
            return picked
        best = int(np.argmax(np.where(fits, scores, -np.inf)))
        used += demand[best]
        picked.add((rows[best][1], rows[best][3]))
        alive &= jobs != jobs[best]


def bench_selection(lines: list[str]) -> None:
    rng = np.random.default_rng(SEED)
    jobs = make_jobs(10_000, 10, rng)
    request = SelectionRequest((40_000.0, 160_000.0), tuple(jobs), ("cpu", "memory_gib"))
    greedy, reply = timed(lambda: select(request), 5)
    naive, picked = timed(lambda: naive_greedy(request), 1)
    fast_picks = {(p.job_id, p.candidate_index) for p in reply.selected}
    same = "identical" if fast_picks == picked else "DIFFERENT"
    lines.append(
        f"weighted greedy, 10,000 jobs x 10 candidates: {greedy * 1e3:.0f} ms median of 5 "
        f"(target <= 1000 ms), {len(fast_picks)} jobs selected; naive O(n^2) re-scan: "
        f"{naive * 1e3:.0f} ms (ratio naive/greedy {naive / greedy:.1f}x), selections {same}"
    )


def main() -> None:
    lines: list[str] = []
    bench_pareto(lines)
    bench_selection(lines)
    output = "\n".join(lines)
    print(output)
    command = "$ .venv/bin/python bench/pareto_selection.py"
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(f"{command}\n(python {sys.version.split()[0]}, 2-core machine)\n{output}\n")


if __name__ == "__main__":
    main()
