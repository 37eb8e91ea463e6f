"""Job-level resource-plan candidates: the Pareto front of cost against throughput gain.

DLRover-RM's auto-scaling stage (sec. 4.3, stage 2, "Job-Level Resource Plan Candidates
Generation") runs NSGA-II over a job's fitted throughput model (eq. 6) to find the
allocations that minimize the resource cost RC (eq. 7) while maximizing the throughput gain
TG (eq. 8), the two objectives of eq. 9. No single plan is returned: the cluster-level
selection (:mod:`stride.policy.selection`, eq. 11-14) picks among each job's candidates
once it sees every job's. This module produces one job's candidates, with pymoo's NSGA-II
as the paper does (its reference "NSG, 2023" is pymoo's NSGA-II page).

The search space: six whole numbers, the workers w, the PS p, the cores per worker lambda_w and
per PS lambda_p, and the GiB per worker and per PS, each within the job's
:class:`SearchBounds` and the cluster's :class:`ClusterLimits` (a pod fits on a node; the
job's total fits in the CPU and memory it may use, as two inequality constraints).

Choices where the paper is silent or loose (each tested):

- **Objectives.** Eq. 9 minimizes ``(RC, 1/TG)``. ``1/TG`` is undefined at TG = 0 and
  flips sign below it, and for TG > 0 it orders plans exactly as ``-TG`` does, so Stride
  minimizes ``(RC, -TG)``: the same front wherever eq. 9 is defined.
- **Integers.** Cores and memory are searched in whole cores and whole GiB, as the brief
  for Stride asks: the nodes' allocatable units, and a grid NSGA-II converges on quickly.
  Integer search uses pymoo's IntegerRandomSampling with SBX crossover and polynomial
  mutation followed by RoundingRepair (pymoo's documented recipe for integer variables).
- **Memory.** The throughput model (eq. 1-6) does not read memory, so the front always
  puts memory at its lower bound; the bounds are where memory needs (OOM prediction,
  sec. 5.3) enter the search.
- **The front returned** is the non-dominated set of the final population plus the
  smallest configuration of the box (always feasible), without duplicates, ordered by cost;
  its measured values are recomputed with :mod:`stride.policy.throughput` (the vectorized
  evaluation used inside the search is checked against it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec
from stride.policy.selection import Candidate, JobCandidates
from stride.policy.throughput import (
    MILLISECONDS_PER_SECOND,
    Configuration,
    ResourcePrices,
    ScalingOverhead,
    ThroughputParameters,
    resource_cost,
    throughput,
    throughput_gain,
    total_resources,
)

GIB = 1024**3

ALGORITHM_NAME = "dlrover-pareto-candidates"
"""Registered name of the algorithm."""
ALGORITHM_VERSION = 1
"""Bump when the search settings below change (they change the candidates)."""

POPULATION_SIZE = 40
"""NSGA-II population (pymoo ``pop_size``). Forty covers a front of a few dozen plans on a
six-variable integer grid; measured with :data:`GENERATIONS` at well under 200 ms per job on
a 2-core machine (bench/pareto_selection.py)."""
GENERATIONS = 40
"""NSGA-II generations (pymoo ``("n_gen", 40)``). The paper picks NSGA-II for "its rapid
convergence ... in low-dimensional multi-objective problems"; on the benchmark's grids the
front stops improving well before 40 generations."""
MAX_POPULATION_SIZE = 1_000
MAX_GENERATIONS = 1_000
MAX_EVALUATIONS = 200_000
"""Upper bounds on what one request may ask of NSGA-II (population x generations
evaluations; the defaults make 1,600). 200,000 evaluations is about two orders of magnitude
past any front this search needs, and well inside the executor's time limit per request,
which stops whatever gets past these."""
CROSSOVER_ETA = 3.0
"""SBX distribution index. pymoo's integer example uses 3.0 (its default of 15 keeps
children so close to their parents that rounding returns the parents on small grids)."""
MUTATION_ETA = 3.0
"""Polynomial-mutation distribution index, pymoo's integer example value, for the same
reason."""
DEFAULT_HORIZON_SECONDS = 600.0
"""Seconds a new plan is expected to run before the next re-plan (TG of eq. 8 spreads the
scaling pause over it, see :func:`stride.policy.throughput.throughput_gain`). Ten minutes:
DLRover re-plans "at a fixed interval" and its sampling stage lasts minutes (sec. 4.2)."""

VARIABLES = ("workers", "parameter_servers", "worker_cpu", "ps_cpu", "worker_memory_gib",
             "ps_memory_gib")  # fmt: skip
"""The decision variables, in the order of pymoo's vector."""


def _silence_not_compiled_notice() -> None:
    # pymoo prints (as a warning) that its C extensions are not compiled; the pure-Python
    # versions give the same results, and the test suite runs with warnings as errors.
    from pymoo.config import Config

    Config.warnings["not_compiled"] = False


class InvalidSearch(PolicyError):
    """Bounds or limits that leave no configuration to search, or a bad search setting."""


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SearchBounds:
    """The job's own limits on each decision variable (inclusive, whole numbers)."""

    min_workers: int
    max_workers: int
    min_parameter_servers: int
    max_parameter_servers: int
    min_worker_cpu: int
    """Cores per worker."""
    max_worker_cpu: int
    min_ps_cpu: int
    """Cores per PS."""
    max_ps_cpu: int
    min_worker_memory_gib: int
    max_worker_memory_gib: int
    min_ps_memory_gib: int
    max_ps_memory_gib: int

    def __post_init__(self) -> None:
        for variable in VARIABLES:
            low_name, high_name = f"min_{variable}", f"max_{variable}"
            low, high = getattr(self, low_name), getattr(self, high_name)
            for name, value in ((low_name, low), (high_name, high)):
                if not _is_integer(value) or value < 1:
                    raise InvalidSearch(name, f"must be a whole number >= 1, got {value!r}")
            if low > high:
                raise InvalidSearch(high_name, f"must be >= {low_name} ({low}), got {high}")

    def lower(self) -> list[int]:
        """Lower bounds in :data:`VARIABLES` order."""
        return [getattr(self, f"min_{variable}") for variable in VARIABLES]

    def upper(self) -> list[int]:
        """Upper bounds in :data:`VARIABLES` order."""
        return [getattr(self, f"max_{variable}") for variable in VARIABLES]


@dataclass(frozen=True)
class ClusterLimits:
    """What the cluster lets this job have: totals (its current holding included) and the
    largest pod a node can host."""

    cpu_cores: float
    """Cores the job may hold in all: the cluster's free cores plus its own."""
    memory_bytes: int
    """Memory the job may hold in all, likewise."""
    max_pod_cpu: float
    """Cores of the largest node's allocatable CPU."""
    max_pod_memory_bytes: int
    """Memory of the largest node's allocatable memory."""

    def __post_init__(self) -> None:
        for name in ("cpu_cores", "max_pod_cpu"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise InvalidSearch(name, f"must be a positive, finite number, got {value!r}")
        for name in ("memory_bytes", "max_pod_memory_bytes"):
            value = getattr(self, name)
            if not _is_integer(value) or value <= 0:
                raise InvalidSearch(name, f"must be a positive whole number, got {value!r}")


@dataclass(frozen=True)
class ParetoRequest:
    """The executor's request type for ``dlrover-pareto-candidates``."""

    params: ThroughputParameters
    """The job's fitted throughput model (eq. 6)."""
    current: Configuration
    """The job's configuration now: the base of RC and TG, and the source of the fixed
    model inputs (batch size, embedding dimension, model size, bandwidth)."""
    bounds: SearchBounds
    cluster: ClusterLimits
    prices: ResourcePrices = field(default_factory=ResourcePrices)
    overhead: ScalingOverhead = field(default_factory=ScalingOverhead)
    horizon_seconds: float = DEFAULT_HORIZON_SECONDS
    seed: int = 0
    """NSGA-II's random seed: the same request gives the same candidates."""
    population_size: int = POPULATION_SIZE
    generations: int = GENERATIONS

    def __post_init__(self) -> None:
        expected = (
            ("params", ThroughputParameters),
            ("current", Configuration),
            ("bounds", SearchBounds),
            ("cluster", ClusterLimits),
            ("prices", ResourcePrices),
            ("overhead", ScalingOverhead),
        )
        for name, kind in expected:
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise InvalidSearch(name, f"must be {kind.__name__}, got {type(value).__name__}")
        if (
            not _is_number(self.horizon_seconds)
            or not math.isfinite(self.horizon_seconds)
            or self.horizon_seconds <= 0
        ):
            raise InvalidSearch(
                "horizon_seconds", f"must be a positive number, got {self.horizon_seconds!r}"
            )
        if not _is_integer(self.seed) or self.seed < 0:
            raise InvalidSearch("seed", f"must be a whole number >= 0, got {self.seed!r}")
        if (
            not _is_integer(self.population_size)
            or not 4 <= self.population_size <= MAX_POPULATION_SIZE
        ):
            raise InvalidSearch(
                "population_size",
                f"must be a whole number in [4, {MAX_POPULATION_SIZE}], "
                f"got {self.population_size!r}",
            )
        if not _is_integer(self.generations) or not 1 <= self.generations <= MAX_GENERATIONS:
            raise InvalidSearch(
                "generations",
                f"must be a whole number in [1, {MAX_GENERATIONS}], got {self.generations!r}",
            )
        if self.population_size * self.generations > MAX_EVALUATIONS:
            raise InvalidSearch(
                "generations",
                f"{self.population_size} x {self.generations} evaluations exceed "
                f"{MAX_EVALUATIONS:,}; ask for a smaller population or fewer generations",
            )


@dataclass(frozen=True)
class ParetoCandidate:
    """One plan on the front, with its objectives."""

    configuration: Configuration
    throughput: float
    """Predicted samples/s (eq. 1)."""
    throughput_gain: float
    """TG over the current configuration (eq. 8), samples/s."""
    resource_cost: float
    """RC of the additional resources (eq. 7); negative when the plan releases resources."""
    additional_cpu: float
    """Cores held minus cores held now."""
    additional_memory_bytes: int
    """Memory held minus memory held now."""


@dataclass(frozen=True)
class ParetoReply:
    """The front, cheapest first (so the most throughput last)."""

    candidates: tuple[ParetoCandidate, ...]


def search_box(request: ParetoRequest) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Lower and upper bounds of the integer search: the job's bounds clipped to a pod.

    Raises :class:`InvalidSearch` when clipping empties a variable's range, or when even
    the smallest configuration exceeds the cluster's totals.
    """
    bounds, cluster = request.bounds, request.cluster
    lower = np.array(bounds.lower(), dtype=np.int64)
    upper = np.array(bounds.upper(), dtype=np.int64)
    pod_cpu = math.floor(cluster.max_pod_cpu)
    pod_memory_gib = cluster.max_pod_memory_bytes // GIB
    for index, variable, cap, cap_name in (
        (2, "worker_cpu", pod_cpu, "max_pod_cpu"),
        (3, "ps_cpu", pod_cpu, "max_pod_cpu"),
        (4, "worker_memory_gib", pod_memory_gib, "max_pod_memory_bytes"),
        (5, "ps_memory_gib", pod_memory_gib, "max_pod_memory_bytes"),
    ):
        upper[index] = min(upper[index], cap)
        if upper[index] < lower[index]:
            raise InvalidSearch(
                f"cluster.{cap_name}",
                f"leaves no room for bounds.min_{variable} = {lower[index]} in one pod",
            )
    smallest_cpu = float(lower[0] * lower[2] + lower[1] * lower[3])
    smallest_memory = int(lower[0] * lower[4] + lower[1] * lower[5]) * GIB
    if smallest_cpu > cluster.cpu_cores:
        raise InvalidSearch(
            "cluster.cpu_cores",
            f"{cluster.cpu_cores} cores cannot hold the smallest plan ({smallest_cpu} cores)",
        )
    if smallest_memory > cluster.memory_bytes:
        raise InvalidSearch(
            "cluster.memory_bytes",
            f"{cluster.memory_bytes} bytes cannot hold the smallest plan ({smallest_memory})",
        )
    return lower, upper


def configuration_of(
    current: Configuration, values: NDArray[np.int64] | list[int]
) -> Configuration:
    """The configuration a decision vector stands for (model inputs from ``current``)."""
    workers, ps, worker_cpu, ps_cpu, worker_gib, ps_gib = (int(v) for v in values)
    return Configuration(
        workers=workers,
        parameter_servers=ps,
        worker_cpu=float(worker_cpu),
        ps_cpu=float(ps_cpu),
        batch_size=current.batch_size,
        worker_memory_bytes=worker_gib * GIB,
        ps_memory_bytes=ps_gib * GIB,
        embedding_dim=current.embedding_dim,
        model_bytes=current.model_bytes,
        bandwidth_bytes_per_second=current.bandwidth_bytes_per_second,
    )


def evaluate(request: ParetoRequest, population: NDArray[Any]) -> dict[str, NDArray[np.float64]]:
    """Objectives ``(RC, -TG)`` and constraints (CPU, memory over the cluster's totals) of
    each row of ``population``: eq. 1-8 vectorized for NSGA-II's inner loop.

    The same numbers as :func:`~stride.policy.throughput.resource_cost` and
    :func:`~stride.policy.throughput.throughput_gain` (a test holds it to them).
    """
    params, current = request.params, request.current
    x = np.asarray(population, dtype=np.float64)
    workers, ps, worker_cpu, ps_cpu, worker_gib, ps_gib = x.T
    m = float(current.batch_size)
    sync_seconds = (current.model_bytes / ps) / (current.bandwidth_bytes_per_second / workers)
    iteration_ms = (
        params.alpha_grad * m / worker_cpu
        + params.alpha_upd * workers / (ps * ps_cpu)
        + params.alpha_emb * m * current.embedding_dim / ps
        + params.alpha_sync * sync_seconds * MILLISECONDS_PER_SECOND
        + params.beta_sum
    )
    with np.errstate(divide="ignore"):
        # A zero time would be an infinite throughput; such parameters are refused before
        # the search (see run), so the division is safe.
        speed = workers * m * MILLISECONDS_PER_SECOND / iteration_ms
    old_speed = throughput(params, current)

    overhead = request.overhead
    ps_changed = (
        (ps != current.parameter_servers)
        | (ps_cpu != current.ps_cpu)
        | (ps_gib * GIB != current.ps_memory_bytes)
    )
    worker_resized = (worker_cpu != current.worker_cpu) | (
        worker_gib * GIB != current.worker_memory_bytes
    )
    count_changed = workers != current.workers
    pause = np.zeros_like(speed)
    pause = np.where(ps_changed, np.maximum(pause, overhead.ps_change_seconds), pause)
    pause = np.where(worker_resized, np.maximum(pause, overhead.worker_resize_seconds), pause)
    pause = np.where(count_changed, np.maximum(pause, overhead.worker_count_seconds), pause)
    horizon = request.horizon_seconds
    gain = (speed - old_speed) - speed * np.minimum(pause, horizon) / horizon

    held = total_resources(current)
    cpu = workers * worker_cpu + ps * ps_cpu
    memory_gib = workers * worker_gib + ps * ps_gib
    cost = (cpu - held.cpu_cores) * request.prices.cpu_per_core + (
        memory_gib - held.memory_bytes / GIB
    ) * request.prices.memory_per_gib
    cluster = request.cluster
    return {
        "F": np.column_stack([cost, -gain]),
        "G": np.column_stack([cpu - cluster.cpu_cores, memory_gib - cluster.memory_bytes / GIB]),
    }


def _non_dominated(objectives: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Rows of a two-objective minimization not dominated by any other row."""
    keep = np.ones(len(objectives), dtype=bool)
    for index, row in enumerate(objectives):
        dominated = np.all(objectives <= row, axis=1) & np.any(objectives < row, axis=1)
        keep[index] = not dominated.any()
    return keep


def candidates(request: ParetoRequest) -> ParetoReply:
    """NSGA-II over the job's integer configurations (DLRover-RM sec. 4.3, eq. 9):
    the non-dominated plans of the final population, cheapest first."""
    _silence_not_compiled_notice()
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.operators.sampling.rnd import IntegerRandomSampling
    from pymoo.optimize import minimize

    lower, upper = search_box(request)
    # Refuse degenerate parameters up front (an infinite throughput is no answer).
    throughput(request.params, request.current)
    throughput(request.params, configuration_of(request.current, lower))

    class _JobProblem(Problem):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(n_var=len(VARIABLES), n_obj=2, n_ieq_constr=2, xl=lower, xu=upper,
                             vtype=int)  # fmt: skip

        def _evaluate(
            self, x: NDArray[Any], out: dict[str, Any], *args: Any, **kwargs: Any
        ) -> None:
            out.update(evaluate(request, x))

    algorithm = NSGA2(
        pop_size=request.population_size,
        sampling=IntegerRandomSampling(),
        crossover=SBX(eta=CROSSOVER_ETA, vtype=float, repair=RoundingRepair()),
        mutation=PM(eta=MUTATION_ETA, vtype=float, repair=RoundingRepair()),
        eliminate_duplicates=True,
    )
    result = minimize(
        _JobProblem(), algorithm, ("n_gen", request.generations), seed=request.seed, verbose=False
    )
    # The smallest configuration is always feasible (search_box checked it): adding it means
    # a tight cluster still gets an answer even if a small population found nothing feasible.
    decisions = np.vstack([np.asarray(result.pop.get("X")).astype(np.int64), lower[None, :]])
    decisions = decisions[np.all(evaluate(request, decisions)["G"] <= 0, axis=1)]
    if len(decisions) == 0:
        raise InvalidSearch("cluster", "no configuration within the bounds fits the cluster")
    decisions = np.unique(decisions, axis=0)
    objectives = evaluate(request, decisions)["F"]
    front = decisions[_non_dominated(objectives)]
    found = [_candidate(request, row) for row in front]
    found.sort(key=lambda c: (c.resource_cost, -c.throughput_gain, _key(c.configuration)))
    return ParetoReply(candidates=tuple(found))


def _key(configuration: Configuration) -> tuple[float, ...]:
    return (
        configuration.workers,
        configuration.parameter_servers,
        configuration.worker_cpu,
        configuration.ps_cpu,
        configuration.worker_memory_bytes,
        configuration.ps_memory_bytes,
    )


def _candidate(request: ParetoRequest, row: NDArray[np.int64]) -> ParetoCandidate:
    configuration = configuration_of(request.current, row)
    held = total_resources(request.current)
    wanted = total_resources(configuration)
    return ParetoCandidate(
        configuration=configuration,
        throughput=throughput(request.params, configuration),
        throughput_gain=throughput_gain(
            request.params,
            request.current,
            configuration,
            request.horizon_seconds,
            request.overhead,
        ),
        resource_cost=resource_cost(configuration, request.prices, request.current),
        additional_cpu=wanted.cpu_cores - held.cpu_cores,
        additional_memory_bytes=int(wanted.memory_bytes - held.memory_bytes),
    )


def job_candidates(job_id: str, remaining_samples: float, reply: ParetoReply) -> JobCandidates:
    """One job's front as input to the cluster-level selection (eq. 11-14).

    Only plans that cost something and gain something are kept: eq. 11 divides the gain by
    the cost, so a plan with RC <= 0 (it releases resources) has no resource efficiency, and
    one with TG <= 0 can never raise eq. 12's sum. The resources a plan asks of the cluster
    are its *additional* cores and GiB, each floored at zero (released resources are not
    lent to other jobs within the same selection round).
    """
    kept = [
        Candidate(
            resources=(max(0.0, c.additional_cpu), max(0.0, c.additional_memory_bytes / GIB)),
            throughput=c.throughput,
            throughput_gain=c.throughput_gain,
            resource_cost=c.resource_cost,
        )
        for c in reply.candidates
        if c.resource_cost > 0 and c.throughput_gain > 0
    ]
    return JobCandidates(job_id=job_id, remaining_samples=remaining_samples, candidates=tuple(kept))


def run(request: ParetoRequest) -> ParetoReply:
    """The registry entry point: :func:`candidates`."""
    return candidates(request)


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=ALGORITHM_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "NSGA-II Pareto candidates of one job: resource cost vs throughput gain over "
            "integer workers, PS, cores and memory (DLRover-RM sec. 4.2-4.3, eq. 7-9)"
        ),
        request_type=ParetoRequest,
        reply_type=ParetoReply,
        run=run,
    ),
)
"""The algorithms this module registers."""
