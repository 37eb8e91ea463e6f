"""DLRover-RM's resource-performance model: throughput of a PS job from its resources.

Every scaling decision of DLRover-RM's auto-scaling stage (sec. 4.3, stage 2) asks one
question: *how fast would this job train with these resources?* Sec. 4.1 answers it with an
eight-parameter model whose parameters are fitted online (:mod:`stride.policy.fitting`) and
which NSGA-II then searches (sec. 4.3). This module is that model and the two objectives
built on it, the resource cost (eq. 7) and the throughput gain (eq. 8). It is pure: no I/O,
no state.

The model (DLRover-RM sec. 4.1, eq. 1-6), for ``w`` workers with ``lambda_w`` cores each,
``p`` PS with ``lambda_p`` cores each, per-worker mini-batch ``m``, embedding dimension
``D``, model size ``M`` and network bandwidth ``B``::

    T_grad = alpha_grad * m / lambda_w        + beta_grad     (eq. 2)
    T_upd  = alpha_upd  * w / (p * lambda_p)  + beta_upd      (eq. 3)
    T_sync = alpha_sync * (M / p) / (B / w)   + beta_sync     (eq. 4)
    T_emb  = alpha_emb  * m * D / p           + beta_emb      (eq. 5)
    T_iter = T_comp + T_comm = (T_grad + T_upd) + (T_sync + T_emb)
    Psi    = w * m / T_iter                                   (eq. 1)

Choices where the paper is silent (each is tested):

- **Units.** The paper gives none. Iteration times are in **milliseconds**; ``M / B`` is a
  transfer time in seconds and enters eq. 4 converted to milliseconds. With the reported
  coefficients (sec. 6, Fig. 11: alpha_grad 3.48, alpha_upd 2.36, alpha_lookup 2.45,
  alpha_sync 0.68, sum of betas 2.45; see :data:`PAPER_PARAMETERS`) these units give
  iteration times of tens of milliseconds to a few seconds for the configurations of the
  paper's testbed, which is what a PS job of that kind shows. Throughput is samples/s.
- **The betas.** All four betas add to the same constant of ``T_iter``, so throughput data
  determines only their sum (which is why the paper reports only the sum). Only the sum
  matters to every prediction; :func:`ThroughputParameters.with_beta_sum` splits a sum
  evenly, which is how :mod:`stride.policy.fitting` reports it.
- **A zero iteration time.** Parameters that predict ``T_iter = 0`` for a configuration
  (all of them zero, or only a lookup term for a model without embeddings) would give an
  infinite throughput; :func:`throughput` raises :class:`DegenerateModel` instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec

GIB = 1024**3
MILLISECONDS_PER_SECOND = 1000.0

DEFAULT_BANDWIDTH_BYTES_PER_SECOND = 1.25e9
"""10 Gbit/s, the NIC of a commodity CPU server such as the paper's testbed (sec. 6)."""

__all__ = [
    "ALGORITHMS",
    "DEFAULT_BANDWIDTH_BYTES_PER_SECOND",
    "PAPER_PARAMETERS",
    "Configuration",
    "DegenerateModel",
    "InvalidConfiguration",
    "InvalidParameters",
    "IterationTime",
    "PredictReply",
    "PredictRequest",
    "ResourceAmounts",
    "ResourcePrices",
    "ScalingOverhead",
    "ThroughputParameters",
    "feature_row",
    "iteration_time",
    "overhead_seconds",
    "resource_cost",
    "run_predict",
    "throughput",
    "throughput_gain",
    "total_resources",
]


class InvalidParameters(PolicyError):
    """Model parameters are negative, NaN or infinite."""


class InvalidConfiguration(PolicyError):
    """A resource configuration has a non-positive count, CPU, batch size, ..."""


class DegenerateModel(PolicyError):
    """The parameters predict a zero iteration time (an infinite throughput) for a config."""


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require_number(
    error: type[PolicyError], field_name: str, value: object, *, positive: bool
) -> None:
    if not _is_number(value) or not math.isfinite(value):  # type: ignore[arg-type]
        raise error(field_name, f"must be a finite number, got {value!r}")
    if positive and value <= 0:  # type: ignore[operator]
        raise error(field_name, f"must be > 0, got {value!r}")
    if not positive and value < 0:  # type: ignore[operator]
        raise error(field_name, f"must be >= 0, got {value!r}")


def _require_integer(
    error: type[PolicyError], field_name: str, value: object, minimum: int
) -> None:
    if not _is_integer(value) or value < minimum:  # type: ignore[operator]
        raise error(field_name, f"must be a whole number >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class ThroughputParameters:
    """The eight non-negative parameters of eq. 6, with iteration times in milliseconds.

    ``alpha_emb`` is the paper's alpha_lookup (sec. 6 names it so).
    """

    alpha_grad: float
    """ms per (sample / core) of one worker: gradient computation, eq. 2."""
    beta_grad: float
    """ms, constant part of eq. 2."""
    alpha_upd: float
    """ms per (worker / PS core): parameter update on the PS, eq. 3."""
    beta_upd: float
    """ms, constant part of eq. 3."""
    alpha_emb: float
    """ms per (sample x embedding dimension / PS): embedding lookups, eq. 5."""
    beta_emb: float
    """ms, constant part of eq. 5."""
    alpha_sync: float
    """Multiplier of the model transfer time (M/p)/(B/w) in ms: parameter sync, eq. 4."""
    beta_sync: float
    """ms, constant part of eq. 4."""

    def __post_init__(self) -> None:
        for item in fields(self):
            _require_number(InvalidParameters, item.name, getattr(self, item.name), positive=False)

    @property
    def beta_sum(self) -> float:
        """The sum of the four betas: the only combination of them throughput determines."""
        return self.beta_grad + self.beta_upd + self.beta_emb + self.beta_sync

    @classmethod
    def with_beta_sum(
        cls,
        *,
        alpha_grad: float,
        alpha_upd: float,
        alpha_emb: float,
        alpha_sync: float,
        beta_sum: float,
    ) -> ThroughputParameters:
        """Parameters with ``beta_sum`` split evenly over the four betas (see module doc)."""
        _require_number(InvalidParameters, "beta_sum", beta_sum, positive=False)
        quarter = beta_sum / 4.0
        return cls(
            alpha_grad=alpha_grad,
            beta_grad=quarter,
            alpha_upd=alpha_upd,
            beta_upd=quarter,
            alpha_emb=alpha_emb,
            beta_emb=quarter,
            alpha_sync=alpha_sync,
            beta_sync=quarter,
        )


PAPER_PARAMETERS = ThroughputParameters.with_beta_sum(
    alpha_grad=3.48, alpha_upd=2.36, alpha_emb=2.45, alpha_sync=0.68, beta_sum=2.45
)
"""The coefficients DLRover-RM reports for its testbed (sec. 6, Fig. 11), betas split evenly."""


@dataclass(frozen=True)
class Configuration:
    """One resource configuration of a PS training job: what eq. 1-5 and eq. 7 read.

    Sizes of every worker are equal, and so are those of every PS (as in the paper's model).
    """

    workers: int
    """w: number of workers, >= 1."""
    parameter_servers: int
    """p: number of PS, >= 1."""
    worker_cpu: float
    """lambda_w: cores per worker, > 0."""
    ps_cpu: float
    """lambda_p: cores per PS, > 0."""
    batch_size: int
    """m: samples in one worker's mini-batch, >= 1 (fixed during training, sec. 4.1)."""
    worker_memory_bytes: int = 0
    """Memory per worker; only the cost (eq. 7) reads it. 0 when unknown."""
    ps_memory_bytes: int = 0
    """Memory per PS; only the cost (eq. 7) reads it. 0 when unknown."""
    embedding_dim: int = 0
    """D: embedding dimension, 0 for a model without embedding tables (eq. 5 vanishes)."""
    model_bytes: float = 0.0
    """M: size of the dense model parameters that workers pull and push (eq. 4)."""
    bandwidth_bytes_per_second: float = DEFAULT_BANDWIDTH_BYTES_PER_SECOND
    """B: network bandwidth shared by the workers (eq. 4), > 0."""

    def __post_init__(self) -> None:
        error = InvalidConfiguration
        _require_integer(error, "workers", self.workers, 1)
        _require_integer(error, "parameter_servers", self.parameter_servers, 1)
        _require_number(error, "worker_cpu", self.worker_cpu, positive=True)
        _require_number(error, "ps_cpu", self.ps_cpu, positive=True)
        _require_integer(error, "batch_size", self.batch_size, 1)
        _require_integer(error, "worker_memory_bytes", self.worker_memory_bytes, 0)
        _require_integer(error, "ps_memory_bytes", self.ps_memory_bytes, 0)
        _require_integer(error, "embedding_dim", self.embedding_dim, 0)
        _require_number(error, "model_bytes", self.model_bytes, positive=False)
        _require_number(
            error, "bandwidth_bytes_per_second", self.bandwidth_bytes_per_second, positive=True
        )


def feature_row(config: Configuration) -> tuple[float, float, float, float]:
    """The regressors of the four alphas: (m/lambda_w, w/(p lambda_p), m D/p, (M/p)/(B/w) ms).

    ``T_iter = alpha . features + beta_sum``, which is linear in the parameters: the fact the
    NNLS fit of :mod:`stride.policy.fitting` rests on.
    """
    w = config.workers
    p = config.parameter_servers
    m = config.batch_size
    sync_ms = (config.model_bytes / p) / (config.bandwidth_bytes_per_second / w)
    return (
        m / config.worker_cpu,
        w / (p * config.ps_cpu),
        m * config.embedding_dim / p,
        sync_ms * MILLISECONDS_PER_SECOND,
    )


@dataclass(frozen=True)
class IterationTime:
    """One iteration's time, in ms, by the parts of eq. 2-5."""

    grad_ms: float
    update_ms: float
    sync_ms: float
    embedding_ms: float

    @property
    def computation_ms(self) -> float:
        """T_comp = T_grad + T_upd."""
        return self.grad_ms + self.update_ms

    @property
    def communication_ms(self) -> float:
        """T_comm = T_sync + T_emb."""
        return self.sync_ms + self.embedding_ms

    @property
    def total_ms(self) -> float:
        """T_iter = T_comp + T_comm."""
        return self.computation_ms + self.communication_ms


def iteration_time(params: ThroughputParameters, config: Configuration) -> IterationTime:
    """T_iter of ``config`` by its parts (eq. 2-5)."""
    grad, update, lookup, sync = feature_row(config)
    return IterationTime(
        grad_ms=params.alpha_grad * grad + params.beta_grad,
        update_ms=params.alpha_upd * update + params.beta_upd,
        sync_ms=params.alpha_sync * sync + params.beta_sync,
        embedding_ms=params.alpha_emb * lookup + params.beta_emb,
    )


def throughput(params: ThroughputParameters, config: Configuration) -> float:
    """Psi_thp = w m / T_iter in samples per second (eq. 1).

    Raises :class:`DegenerateModel` when the parameters predict no time at all for
    ``config``: an infinite throughput is never a useful answer.
    """
    total_ms = iteration_time(params, config).total_ms
    if not total_ms > 0:
        raise DegenerateModel(
            "params", "predict a zero iteration time for this configuration (all terms zero)"
        )
    return config.workers * config.batch_size * MILLISECONDS_PER_SECOND / total_ms


# --- Resource cost, eq. 7 ---------------------------------------------------------------


@dataclass(frozen=True)
class ResourcePrices:
    """Money(a_r) of eq. 7: the price of one unit of each resource (per unit of time).

    The paper names CPU and memory and gives no prices. The defaults price a GiB at an
    eighth of a core, the core-to-memory price ratio of general-purpose cloud instances
    (4-8 GiB per core); operators set their own.
    """

    cpu_per_core: float = 1.0
    memory_per_gib: float = 0.125

    def __post_init__(self) -> None:
        _require_number(PolicyError, "cpu_per_core", self.cpu_per_core, positive=False)
        _require_number(PolicyError, "memory_per_gib", self.memory_per_gib, positive=False)


@dataclass(frozen=True)
class ResourceAmounts:
    """Amounts of each priced resource (a_r of eq. 7); negative in a change means released."""

    cpu_cores: float
    memory_bytes: float


def total_resources(config: Configuration) -> ResourceAmounts:
    """The CPU and memory ``config`` holds: its workers' and its PS's."""
    return ResourceAmounts(
        cpu_cores=config.workers * config.worker_cpu + config.parameter_servers * config.ps_cpu,
        memory_bytes=float(
            config.workers * config.worker_memory_bytes
            + config.parameter_servers * config.ps_memory_bytes
        ),
    )


def resource_cost(
    candidate: Configuration,
    prices: ResourcePrices | None = None,
    current: Configuration | None = None,
) -> float:
    """RC(A) = sum_r a_r x Money(a_r) (eq. 7).

    A is "the additional allocated resources", so with ``current`` given the cost is that
    of ``candidate`` minus ``current`` (negative when the candidate releases resources);
    without it, of everything ``candidate`` holds.
    """
    prices = prices or ResourcePrices()
    wanted = total_resources(candidate)
    held = total_resources(current) if current is not None else ResourceAmounts(0.0, 0.0)
    cpu = wanted.cpu_cores - held.cpu_cores
    memory_gib = (wanted.memory_bytes - held.memory_bytes) / GIB
    return cpu * prices.cpu_per_core + memory_gib * prices.memory_per_gib


# --- Throughput gain, eq. 8 -------------------------------------------------------------


@dataclass(frozen=True)
class ScalingOverhead:
    """Seconds a job loses to a change of its resources: the Overhead(A) of eq. 8.

    The paper estimates these "through statistical analysis ... of historical jobs (e.g.
    the time required to start a worker/PS)" and gives no numbers; the defaults are
    placeholders for a cluster's own statistics. With seamless migration (sec. 5.2) new
    pods start while the old ones train, so only the switch-over pauses the job.
    """

    ps_change_seconds: float = 60.0
    """Pause when the PS count or a PS's size changes: checkpoint, restart, restore."""
    worker_resize_seconds: float = 30.0
    """Pause when a worker's CPU or memory changes (the worker restarts)."""
    worker_count_seconds: float = 0.0
    """Pause when only the worker count changes: none, since dynamic sharding (sec. 5.1)
    lets a new worker take shards and a removed one give them back."""

    def __post_init__(self) -> None:
        for item in fields(self):
            _require_number(PolicyError, item.name, getattr(self, item.name), positive=False)


def overhead_seconds(
    current: Configuration, candidate: Configuration, overhead: ScalingOverhead | None = None
) -> float:
    """Seconds of training the change from ``current`` to ``candidate`` costs (the largest
    applicable pause: they happen together, not one after another)."""
    overhead = overhead or ScalingOverhead()
    pauses = [0.0]
    if (current.parameter_servers, current.ps_cpu, current.ps_memory_bytes) != (
        candidate.parameter_servers,
        candidate.ps_cpu,
        candidate.ps_memory_bytes,
    ):
        pauses.append(overhead.ps_change_seconds)
    if (current.worker_cpu, current.worker_memory_bytes) != (
        candidate.worker_cpu,
        candidate.worker_memory_bytes,
    ):
        pauses.append(overhead.worker_resize_seconds)
    if current.workers != candidate.workers:
        pauses.append(overhead.worker_count_seconds)
    return max(pauses)


def throughput_gain(
    params: ThroughputParameters,
    current: Configuration,
    candidate: Configuration,
    horizon_seconds: float,
    overhead: ScalingOverhead | None = None,
) -> float:
    """TG(A) = Delta Psi - Overhead(A) in samples/s (eq. 8).

    The paper subtracts a time from a throughput; Stride makes them commensurable over the
    ``horizon_seconds`` the new plan is expected to run (until the next re-plan or the job's
    end). Over that horizon the scaled job trains ``Psi_new (H - o)`` samples against
    ``Psi_old H`` without scaling, so the average gain is
    ``(Psi_new - Psi_old) - Psi_new o / H``: Overhead(A) = Psi_new o / H.
    """
    _require_number(PolicyError, "horizon_seconds", horizon_seconds, positive=True)
    old = throughput(params, current)
    new = throughput(params, candidate)
    pause = overhead_seconds(current, candidate, overhead)
    return (new - old) - new * min(pause, horizon_seconds) / horizon_seconds


# --- The registered prediction ----------------------------------------------------------

PREDICT_ALGORITHM_NAME = "dlrover-throughput-predict"


@dataclass(frozen=True)
class PredictRequest:
    """Predict the throughput of each configuration under fitted parameters."""

    params: ThroughputParameters
    configurations: tuple[Configuration, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.params, ThroughputParameters):
            raise InvalidParameters("params", "must be ThroughputParameters")
        if not self.configurations:
            raise InvalidConfiguration("configurations", "must not be empty")
        for index, config in enumerate(self.configurations):
            if not isinstance(config, Configuration):
                raise InvalidConfiguration(f"configurations[{index}]", "must be a Configuration")


@dataclass(frozen=True)
class PredictReply:
    """Throughputs in samples/s and iteration times in ms, in request order."""

    throughputs: tuple[float, ...]
    iteration_times_ms: tuple[float, ...]


def run_predict(request: PredictRequest) -> PredictReply:
    """The registry entry point of ``dlrover-throughput-predict``."""
    speeds: list[float] = []
    times: list[float] = []
    for index, config in enumerate(request.configurations):
        try:
            speeds.append(throughput(request.params, config))
        except DegenerateModel as error:
            raise DegenerateModel(f"configurations[{index}]", error.problem) from error
        times.append(iteration_time(request.params, config).total_ms)
    return PredictReply(throughputs=tuple(speeds), iteration_times_ms=tuple(times))


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=PREDICT_ALGORITHM_NAME,
        version=1,
        description=(
            "Throughput of PS-job configurations from the 8-parameter resource-performance "
            "model (DLRover-RM sec. 4.1, eq. 1-6)"
        ),
        request_type=PredictRequest,
        reply_type=PredictReply,
        run=run_predict,
    ),
)
"""This module's registered algorithms."""
