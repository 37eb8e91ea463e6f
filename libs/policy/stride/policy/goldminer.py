"""GoldMiner's data-worker scheduling: job-level tuning and cluster-level allocation.

GoldMiner (sec. 3.3) moves a job's data pre-processing into stateless *data workers* that
fill a queue the training worker drains. Their elasticity is what its scheduler exploits
(sec. 3.4), at two levels connected by the state of that queue:

- **Job level** (sec. 3.4.1): find, by profiling, whether data workers help at all, how many
  CPUs one data worker should use, and how few CPUs the training worker needs.
  :func:`tune_step` is that search as a pure step function: it takes the tuner's state and
  what was observed over the last tuning interval, and returns the next configuration to
  try. A caller (the optimizer) applies the configuration, waits an interval (30 s in the
  paper, sec. 5.5) and calls it again with the new observation until ``converged``.
- **Cluster level** (sec. 3.4.2): hand a CPU budget for data workers out across jobs, one
  CPU at a time, to the job with the best metric: MaxTP (``Δt/Δc * g``), SRTF
  (``n(c+Δc)/(t+Δt)``) or Fair (``(t+Δt)/t_i``). :func:`allocate_data_worker_cpus` does
  this with a priority queue; because every metric only changes for the job that was just
  served (and is monotone in its allocation), one heap entry per job gives exactly the
  allocation of re-sorting all jobs at every step.

Thresholds the paper leaves vague have documented defaults in :class:`TunerConfig`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec

__all__ = [
    "ALGORITHMS",
    "AllocationPolicy",
    "ClusterAllocationReply",
    "ClusterAllocationRequest",
    "InvalidAllocationInput",
    "InvalidTuningInput",
    "JobAllocation",
    "JobThroughputCurve",
    "PipelineConfiguration",
    "QueueObservation",
    "TunerConfig",
    "TunerReply",
    "TunerRequest",
    "TunerState",
    "TuningAction",
    "TuningPhase",
    "allocate_data_worker_cpus",
    "linear_curve",
    "queue_is_ideal",
    "run_cluster_allocation",
    "run_tune_step",
    "tune_step",
]

TUNE_STEP_NAME = "goldminer-tune-step"
"""Registered name of the job-level tuner step."""
CLUSTER_ALLOCATION_NAME = "goldminer-cluster-allocation"
"""Registered name of the cluster-level allocation."""
MAX_CPU_BUDGET = 1_000_000
"""Largest data-worker CPU budget accepted: the allocation takes one step per CPU, and a
million cores is far beyond any single cluster Stride schedules."""
CONCAVITY_TOLERANCE = 1e-9
"""Relative slack (of the curve's largest throughput) allowed when checking that marginal
gains do not increase, so that rounding in measured curves is not called non-concave."""


class InvalidTuningInput(PolicyError):
    """A job-level tuning input (configuration, observation, state) is invalid."""


class InvalidAllocationInput(PolicyError):
    """A cluster-level allocation input (curve, budget, job list) is invalid."""


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(
    error: type[PolicyError], field: str, value: object, minimum: int, maximum: int | None = None
) -> None:
    if not _is_integer(value) or value < minimum:  # type: ignore[operator]
        raise error(field, f"must be a whole number >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:  # type: ignore[operator]
        raise error(field, f"must be at most {maximum}, got {value!r}")


def _check_number(
    error: type[PolicyError],
    field: str,
    value: object,
    *,
    minimum: float = 0.0,
    maximum: float | None = None,
    strictly_above_minimum: bool = False,
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise error(field, f"must be a finite number, got {value!r}")
    too_small = value <= minimum if strictly_above_minimum else value < minimum
    if too_small:
        relation = ">" if strictly_above_minimum else ">="
        raise error(field, f"must be finite and {relation} {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise error(field, f"must be at most {maximum}, got {value!r}")


# --------------------------------------------------------------------------------------
# Job level (sec. 3.4.1)
# --------------------------------------------------------------------------------------


class TuningPhase(Enum):
    """Where the job-level search is. The phases run in this order (sec. 3.4.1, 5.5)."""

    BASELINE = "baseline"
    """Profiling the job without data workers to get the baseline throughput."""
    DATA_WORKER_SIZE = "data-worker-size"
    """Growing the CPUs of the data-worker process from 1."""
    DATA_WORKER_COUNT = "data-worker-count"
    """Adding data workers of the chosen size (the scheduler's step in sec. 5.5)."""
    TRAINING_WORKER_SIZE = "training-worker-size"
    """Shrinking the training worker's CPUs while throughput holds."""
    CONVERGED = "converged"
    """Done: the configuration is kept until the caller restarts tuning."""


class TuningAction(Enum):
    """What the reply's configuration changes, for logs and plans."""

    PROFILE_BASELINE = "profile-baseline"
    GROW_DATA_WORKER = "grow-data-worker"
    ADD_DATA_WORKER = "add-data-worker"
    GROW_TRAINING_WORKER = "grow-training-worker"
    SHRINK_TRAINING_WORKER = "shrink-training-worker"
    ROLL_BACK = "roll-back"
    FALL_BACK = "fall-back"
    KEEP = "keep"


@dataclass(frozen=True)
class PipelineConfiguration:
    """A job's data-pipeline resources: its data workers and its training worker's CPUs.

    ``data_workers == 0`` is GoldMiner's "original mode" (pre-processing inside the training
    worker), and then ``data_worker_cpu`` is 0 too.
    """

    data_workers: int
    """Number of data workers; 0 means none."""
    data_worker_cpu: int
    """CPUs each data-worker process uses (sec. 3.4.1 "data worker size")."""
    training_worker_cpu: int
    """CPUs of each training worker (sec. 3.4.1 "training worker size"); at least 1."""

    def __post_init__(self) -> None:
        _check_count(InvalidTuningInput, "data_workers", self.data_workers, 0)
        _check_count(InvalidTuningInput, "data_worker_cpu", self.data_worker_cpu, 0)
        _check_count(InvalidTuningInput, "training_worker_cpu", self.training_worker_cpu, 1)
        if (self.data_workers == 0) != (self.data_worker_cpu == 0):
            raise InvalidTuningInput(
                "data_worker_cpu", "must be 0 exactly when data_workers is 0 (and >= 1 otherwise)"
            )

    @property
    def uses_data_workers(self) -> bool:
        """Whether pre-processing runs in data workers."""
        return self.data_workers > 0


@dataclass(frozen=True)
class QueueObservation:
    """What one tuning interval measured for the configuration in the tuner's state.

    The queue is GoldMiner's "unified performance indicator" (sec. 3.4): the rates at which
    it is filled and drained show how fast the data and the training sides are.
    """

    throughput: float
    """Training steps per second the job achieved over the interval."""
    enqueue_rate: float = 0.0
    """Batches per second the data workers can deliver when the queue does not block them;
    0 when there are no data workers."""
    dequeue_rate: float = 0.0
    """Steps per second the training worker can consume when the queue is never empty: the
    job's ideal throughput ``t_i`` of sec. 3.4.2; 0 when there are no data workers."""
    queue_length: float = 0.0
    """Mean number of batches waiting in the queue over the interval."""
    queue_capacity: int = 1
    """The queue's capacity in batches."""
    training_cpu_utilization: float = 0.0
    """Mean CPU utilization of the training worker, 0..1."""

    def __post_init__(self) -> None:
        for name in ("throughput", "enqueue_rate", "dequeue_rate", "queue_length"):
            _check_number(InvalidTuningInput, name, getattr(self, name))
        _check_count(InvalidTuningInput, "queue_capacity", self.queue_capacity, 1)
        if self.queue_length > self.queue_capacity:
            raise InvalidTuningInput(
                "queue_length", f"must be at most queue_capacity ({self.queue_capacity})"
            )
        _check_number(
            InvalidTuningInput,
            "training_cpu_utilization",
            self.training_cpu_utilization,
            maximum=1.0,
        )


@dataclass(frozen=True)
class TunerConfig:
    """Starting point, limits and thresholds of the job-level search.

    Defaults marked "paper" are the paper's; the others are Stride's choices where the paper
    gives no number, each with its reason.
    """

    initial_training_worker_cpu: int = 8
    """Paper (sec. 5.5, 3.4.1): "a training worker container with 8 CPUs"; "for most
    workloads the initial 8 CPUs are already sufficient for the training worker"."""
    data_worker_container_cpu: int = 8
    """Paper (sec. 3.4.1): the data-worker container gets "the CPU-GPU ratio of the machine
    by default" (8 in sec. 5.5); the process grows from 1 CPU up to it."""
    training_workers: int = 1
    """Training workers of the job: the search starts with "a single data worker container
    per training worker" (sec. 3.4.1)."""
    max_data_workers: int = 64
    """Most data workers the job may get while tuning. In the paper the cluster scheduler
    adds them (sec. 5.5); Stride's default is what the largest model in sec. 4 needed
    (DeepFM, "up to 256 data workers" over 4 training workers) per training worker."""
    max_training_worker_cpu: int = 32
    """Most CPUs a training worker may grow to when it is the bottleneck: one whole node of
    the paper's 64-GPU testbed class (Stride's choice; the paper names no cap)."""
    linear_speedup_efficiency: float = 0.9
    """Stride's choice. One more data-worker CPU is "linear speedup" (sec. 3.4.1) when it
    adds at least this fraction of the throughput the first CPU gave."""
    ideal_rate_tolerance: float = 0.05
    """Stride's choice. The queue is ideal, "the data worker is as fast as the training
    worker" (sec. 3.4.1), when enqueue_rate >= (1 - this) * dequeue_rate: 5% is within the
    noise of one 30-second interval."""
    ideal_queue_fill: float = 0.9
    """Stride's choice. A queue that stays at least this full on average is also ideal: the
    producers are ahead, so the training worker never waits."""
    throughput_drop_tolerance: float = 0.05
    """Stride's choice. Shrinking the training worker "maintains the current performance"
    (sec. 3.4.1) while throughput stays within this fraction of the one before shrinking."""
    comparable_performance: float = 0.95
    """Stride's choice. Data workers are kept only if the tuned throughput is at least this
    fraction of the baseline without them ("comparable performance", sec. 3.4.1)."""
    diminishing_return_ratio: float = 0.5
    """Stride's choice. Another data worker shows "diminishing returns" (sec. 3.4.1) when it
    adds less than this fraction of the average throughput per data worker so far."""
    training_cpu_utilization_threshold: float = 0.9
    """Stride's choice. The training worker is grown on diminishing returns only when its
    CPU utilization is at least this (sec. 3.4.1 "higher than a threshold"); 0.9 is the
    threshold DLRover uses for a saturated PS (DLRover sec. 4.2)."""

    def __post_init__(self) -> None:
        _check_count(
            InvalidTuningInput, "initial_training_worker_cpu", self.initial_training_worker_cpu, 1
        )
        _check_count(
            InvalidTuningInput, "data_worker_container_cpu", self.data_worker_container_cpu, 1
        )
        _check_count(InvalidTuningInput, "training_workers", self.training_workers, 1)
        _check_count(InvalidTuningInput, "max_data_workers", self.max_data_workers, 1)
        if self.max_data_workers < self.training_workers:
            raise InvalidTuningInput(
                "max_data_workers", "must be at least training_workers (one data worker each)"
            )
        _check_count(
            InvalidTuningInput,
            "max_training_worker_cpu",
            self.max_training_worker_cpu,
            self.initial_training_worker_cpu,
        )
        for name in (
            "linear_speedup_efficiency",
            "ideal_rate_tolerance",
            "ideal_queue_fill",
            "throughput_drop_tolerance",
            "comparable_performance",
            "diminishing_return_ratio",
            "training_cpu_utilization_threshold",
        ):
            _check_number(InvalidTuningInput, name, getattr(self, name), maximum=1.0)


@dataclass(frozen=True)
class TunerState:
    """Everything the search remembers between steps; returned in each reply, passed back."""

    phase: TuningPhase
    configuration: PipelineConfiguration
    """The configuration being measured in the current interval."""
    baseline_throughput: float = 0.0
    """Throughput without data workers (measured in the BASELINE phase)."""
    size_throughputs: tuple[float, ...] = ()
    """Throughput at data-worker sizes 1, 2, ... measured so far (DATA_WORKER_SIZE)."""
    reference_throughput: float = 0.0
    """Throughput before the change being measured: the previous data-worker count, or the
    training-worker size before shrinking (the level that must be maintained)."""
    previous_throughput: float = 0.0
    """Throughput one data worker fewer, kept while a training-worker growth is measured."""
    last_action: TuningAction = TuningAction.PROFILE_BASELINE
    """The action that produced ``configuration``."""
    fell_back: bool = False
    """Whether the job went back to running without data workers."""
    intervals: int = 0
    """Observations consumed so far."""

    def __post_init__(self) -> None:
        if not isinstance(self.phase, TuningPhase):
            raise InvalidTuningInput("phase", f"must be a TuningPhase, got {self.phase!r}")
        if not isinstance(self.configuration, PipelineConfiguration):
            raise InvalidTuningInput("configuration", "must be a PipelineConfiguration")
        for name in ("baseline_throughput", "reference_throughput", "previous_throughput"):
            _check_number(InvalidTuningInput, name, getattr(self, name))
        for index, value in enumerate(self.size_throughputs):
            _check_number(InvalidTuningInput, f"size_throughputs[{index}]", value)
        _check_count(InvalidTuningInput, "intervals", self.intervals, 0)
        uses = self.configuration.uses_data_workers
        if self.phase is TuningPhase.BASELINE and uses:
            raise InvalidTuningInput("configuration.data_workers", "must be 0 while profiling")
        if self.phase in (TuningPhase.DATA_WORKER_SIZE, TuningPhase.DATA_WORKER_COUNT) and not uses:
            raise InvalidTuningInput(
                "configuration.data_workers", f"must be >= 1 in phase {self.phase.value}"
            )
        if self.phase is TuningPhase.DATA_WORKER_COUNT and self.configuration.data_workers < 2:
            raise InvalidTuningInput(
                "configuration.data_workers", "must be >= 2 while data workers are being added"
            )
        if self.phase is TuningPhase.DATA_WORKER_SIZE and (
            len(self.size_throughputs) != self.configuration.data_worker_cpu - 1
        ):
            raise InvalidTuningInput(
                "size_throughputs",
                "must hold one throughput per data-worker size tried below the current one",
            )


@dataclass(frozen=True)
class TunerRequest:
    """The executor's request type for ``goldminer-tune-step``.

    ``state`` None starts a search (``observation`` must then be None too); otherwise
    ``observation`` is what the interval measured for ``state.configuration``.
    """

    config: TunerConfig = TunerConfig()
    state: TunerState | None = None
    observation: QueueObservation | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.config, TunerConfig):
            raise InvalidTuningInput("config", "must be a TunerConfig")
        if self.state is None:
            if self.observation is not None:
                raise InvalidTuningInput("observation", "must be null when state is null")
            return
        if not isinstance(self.state, TunerState):
            raise InvalidTuningInput("state", "must be a TunerState")
        if not isinstance(self.observation, QueueObservation):
            raise InvalidTuningInput("observation", "is required when a state is given")
        configuration = self.state.configuration
        if configuration.data_worker_cpu > self.config.data_worker_container_cpu:
            raise InvalidTuningInput(
                "state.configuration.data_worker_cpu",
                f"exceeds config.data_worker_container_cpu "
                f"({self.config.data_worker_container_cpu})",
            )
        if configuration.data_workers > self.config.max_data_workers:
            raise InvalidTuningInput(
                "state.configuration.data_workers",
                f"exceeds config.max_data_workers ({self.config.max_data_workers})",
            )
        if configuration.training_worker_cpu > self.config.max_training_worker_cpu:
            raise InvalidTuningInput(
                "state.configuration.training_worker_cpu",
                f"exceeds config.max_training_worker_cpu ({self.config.max_training_worker_cpu})",
            )


@dataclass(frozen=True)
class TunerReply:
    """The next configuration to apply, and the state to send back with its observation."""

    state: TunerState
    action: TuningAction
    converged: bool
    reason: str

    @property
    def configuration(self) -> PipelineConfiguration:
        """The configuration to apply for the next interval."""
        return self.state.configuration


def queue_is_ideal(observation: QueueObservation, config: TunerConfig) -> bool:
    """Whether the data side keeps up with training (sec. 3.4.1 "ideal state").

    Ideal when the data workers can enqueue at least as fast as training dequeues (within
    ``config.ideal_rate_tolerance``), or when the queue stays at least
    ``config.ideal_queue_fill`` full: either shows the training worker does not wait.
    """
    rates_ideal = (
        observation.dequeue_rate > 0
        and observation.enqueue_rate
        >= (1.0 - config.ideal_rate_tolerance) * observation.dequeue_rate
    )
    fill_ideal = observation.queue_length >= config.ideal_queue_fill * observation.queue_capacity
    return rates_ideal or fill_ideal


def tune_step(request: TunerRequest) -> TunerReply:
    """One step of GoldMiner's job-level search (sec. 3.4.1, walked through in sec. 5.5).

    1. Baseline: run without data workers (``config.initial_training_worker_cpu`` CPUs).
    2. Data-worker size: one data worker per training worker; its process grows from 1 CPU.
       Stop when the queue is ideal (keep that size; no more data workers are needed), or
       when a CPU adds sublinear speedup (keep the largest size with linear speedup), or
       when the container's CPUs are used up (keep them all).
    3. Data-worker count: add data workers of that size while the queue is not ideal and
       each one still pays (see ``diminishing_return_ratio``). On diminishing returns with a
       busy training worker (``training_cpu_utilization_threshold``) grow the training
       worker one CPU at a time while that raises throughput and it stays busy, then judge
       the last data worker again (without growing further). A data worker that still does
       not pay is given back, with the training CPU that did not help, and tuning ends.
    4. Fallback: if the tuned throughput is not ``comparable_performance`` of the baseline,
       go back to no data workers and stop.
    5. Training-worker size: if the queue is ideal, take one CPU at a time from the training
       worker while throughput holds; at the first drop roll back one step and stop.

    Choices where the paper is silent: step 3's give-back of a data worker that did not
    help; and the fallback is decided once data-worker tuning ends (the paper's "after
    tuning for a threshold of time": every phase is bounded, so tuning always ends).
    """
    config, state, observation = request.config, request.state, request.observation
    if state is None:
        start = PipelineConfiguration(0, 0, config.initial_training_worker_cpu)
        return TunerReply(
            state=TunerState(TuningPhase.BASELINE, start),
            action=TuningAction.PROFILE_BASELINE,
            converged=False,
            reason="profile the job without data workers for a baseline",
        )
    assert observation is not None  # TunerRequest guarantees it
    state = replace(state, intervals=state.intervals + 1)
    step = _PHASE_STEPS[state.phase]
    return step(config, state, observation)


def _baseline_step(
    config: TunerConfig, state: TunerState, observation: QueueObservation
) -> TunerReply:
    first = PipelineConfiguration(config.training_workers, 1, config.initial_training_worker_cpu)
    return _move(
        state,
        TuningPhase.DATA_WORKER_SIZE,
        first,
        TuningAction.GROW_DATA_WORKER,
        f"baseline {observation.throughput:g} steps/s; start data workers at 1 CPU",
        baseline_throughput=observation.throughput,
        size_throughputs=(),
    )


def _size_step(config: TunerConfig, state: TunerState, observation: QueueObservation) -> TunerReply:
    configuration = state.configuration
    size = configuration.data_worker_cpu
    throughputs = (*state.size_throughputs, observation.throughput)
    # Recorded with the move (a state in this phase holds only the sizes below its own).
    recorded = {"size_throughputs": throughputs}
    if queue_is_ideal(observation, config):
        return _data_workers_tuned(
            config,
            state,
            configuration,
            observation.throughput,
            True,
            f"queue ideal at data-worker size {size}",
            **recorded,
        )
    first_cpu_gain = throughputs[0]
    if size >= 2:
        gain = throughputs[-1] - throughputs[-2]
        if gain < config.linear_speedup_efficiency * first_cpu_gain:
            linear_size = size - 1
            return _start_count(
                config,
                state,
                replace(configuration, data_worker_cpu=linear_size),
                throughputs[-2],
                f"sublinear speedup at {size} CPUs; data-worker size {linear_size}",
                **recorded,
            )
    if size >= config.data_worker_container_cpu:
        return _start_count(
            config,
            state,
            configuration,
            observation.throughput,
            f"linear speedup up to the container's {size} CPUs",
            **recorded,
        )
    return _move(
        state,
        TuningPhase.DATA_WORKER_SIZE,
        replace(configuration, data_worker_cpu=size + 1),
        TuningAction.GROW_DATA_WORKER,
        f"linear speedup at {size} CPUs; try {size + 1}",
        **recorded,
    )


def _start_count(
    config: TunerConfig,
    state: TunerState,
    configuration: PipelineConfiguration,
    throughput: float,
    why: str,
    **changes: Any,
) -> TunerReply:
    if configuration.data_workers >= config.max_data_workers:
        return _data_workers_tuned(config, state, configuration, throughput, False, why, **changes)
    return _move(
        state,
        TuningPhase.DATA_WORKER_COUNT,
        replace(configuration, data_workers=configuration.data_workers + 1),
        TuningAction.ADD_DATA_WORKER,
        f"{why}; add a data worker",
        reference_throughput=throughput,
        **changes,
    )


def _count_step(
    config: TunerConfig, state: TunerState, observation: QueueObservation
) -> TunerReply:
    configuration = state.configuration
    throughput = observation.throughput
    if queue_is_ideal(observation, config):
        return _data_workers_tuned(
            config,
            state,
            configuration,
            throughput,
            True,
            f"queue ideal with {configuration.data_workers} data workers",
        )
    busy = observation.training_cpu_utilization >= config.training_cpu_utilization_threshold
    if state.last_action is not TuningAction.GROW_TRAINING_WORKER:
        return _judge_last_data_worker(
            config, state, configuration, throughput, state.reference_throughput, busy
        )
    # The last step grew the training worker: keep growing it while that helps and it is
    # still busy, then judge the data worker that showed diminishing returns again.
    if throughput > state.reference_throughput:
        if busy and configuration.training_worker_cpu < config.max_training_worker_cpu:
            return _grow_training_worker(state, configuration, throughput, "it helped")
        return _judge_last_data_worker(
            config, state, configuration, throughput, state.previous_throughput, False
        )
    reverted = replace(configuration, training_worker_cpu=configuration.training_worker_cpu - 1)
    return _judge_last_data_worker(
        config, state, reverted, state.reference_throughput, state.previous_throughput, False
    )


def _judge_last_data_worker(
    config: TunerConfig,
    state: TunerState,
    configuration: PipelineConfiguration,
    throughput: float,
    throughput_before: float,
    may_grow_training_worker: bool,
) -> TunerReply:
    """Keep adding data workers if the last one paid, else grow the trainer or give it back.

    ``throughput_before`` is the throughput one data worker fewer.
    """
    fewer = configuration.data_workers - 1
    gain = throughput - throughput_before
    if gain > 0 and gain >= config.diminishing_return_ratio * throughput_before / fewer:
        return _add_or_finish(
            config,
            state,
            configuration,
            throughput,
            f"data worker {configuration.data_workers} added {gain:g} steps/s",
        )
    if may_grow_training_worker and (
        configuration.training_worker_cpu < config.max_training_worker_cpu
    ):
        state = replace(state, previous_throughput=throughput_before)
        return _grow_training_worker(
            state, configuration, throughput, "diminishing returns with a busy training worker"
        )
    return _data_workers_tuned(
        config,
        state,
        replace(configuration, data_workers=fewer),
        throughput_before,
        False,
        f"diminishing returns from data worker {configuration.data_workers}: give it back",
    )


def _grow_training_worker(
    state: TunerState, configuration: PipelineConfiguration, throughput: float, why: str
) -> TunerReply:
    """Sec. 3.4.1: "request the scheduler for more CPUs for the training worker"."""
    return _move(
        state,
        TuningPhase.DATA_WORKER_COUNT,
        replace(configuration, training_worker_cpu=configuration.training_worker_cpu + 1),
        TuningAction.GROW_TRAINING_WORKER,
        f"{why}; grow the training worker by one CPU",
        reference_throughput=throughput,
    )


def _add_or_finish(
    config: TunerConfig,
    state: TunerState,
    configuration: PipelineConfiguration,
    throughput: float,
    why: str,
) -> TunerReply:
    if configuration.data_workers >= config.max_data_workers:
        return _data_workers_tuned(
            config, state, configuration, throughput, False, f"{why}; data-worker cap reached"
        )
    return _move(
        state,
        TuningPhase.DATA_WORKER_COUNT,
        replace(configuration, data_workers=configuration.data_workers + 1),
        TuningAction.ADD_DATA_WORKER,
        f"{why}; add another",
        reference_throughput=throughput,
    )


def _data_workers_tuned(
    config: TunerConfig,
    state: TunerState,
    configuration: PipelineConfiguration,
    throughput: float,
    ideal: bool,
    why: str,
    **changes: Any,
) -> TunerReply:
    """Data-worker tuning has ended at ``configuration``: fall back, shrink, or stop.

    ``changes`` are further state fields to record with the move.
    """
    if throughput < config.comparable_performance * state.baseline_throughput:
        original = PipelineConfiguration(0, 0, config.initial_training_worker_cpu)
        return _move(
            state,
            TuningPhase.CONVERGED,
            original,
            TuningAction.FALL_BACK,
            f"{why}; {throughput:g} steps/s is not comparable to the baseline "
            f"{state.baseline_throughput:g}: run without data workers",
            fell_back=True,
            **changes,
        )
    if ideal and configuration.training_worker_cpu > 1:
        return _move(
            state,
            TuningPhase.TRAINING_WORKER_SIZE,
            replace(configuration, training_worker_cpu=configuration.training_worker_cpu - 1),
            TuningAction.SHRINK_TRAINING_WORKER,
            f"{why}; try a smaller training worker",
            reference_throughput=throughput,
            **changes,
        )
    return _move(state, TuningPhase.CONVERGED, configuration, TuningAction.KEEP, why, **changes)


def _training_size_step(
    config: TunerConfig, state: TunerState, observation: QueueObservation
) -> TunerReply:
    configuration = state.configuration
    cpu = configuration.training_worker_cpu
    floor = (1.0 - config.throughput_drop_tolerance) * state.reference_throughput
    if observation.throughput < floor:
        return _move(
            state,
            TuningPhase.CONVERGED,
            replace(configuration, training_worker_cpu=cpu + 1),
            TuningAction.ROLL_BACK,
            f"throughput dropped at {cpu} training CPUs; roll back to {cpu + 1}",
        )
    if cpu <= 1:
        return _move(
            state,
            TuningPhase.CONVERGED,
            configuration,
            TuningAction.KEEP,
            "throughput holds with a 1-CPU training worker",
        )
    return _move(
        state,
        TuningPhase.TRAINING_WORKER_SIZE,
        replace(configuration, training_worker_cpu=cpu - 1),
        TuningAction.SHRINK_TRAINING_WORKER,
        f"throughput holds at {cpu} training CPUs; try {cpu - 1}",
    )


def _converged_step(
    config: TunerConfig, state: TunerState, observation: QueueObservation
) -> TunerReply:
    del config, observation  # a converged search keeps its configuration
    return TunerReply(state, TuningAction.KEEP, True, "converged")


def _move(
    state: TunerState,
    phase: TuningPhase,
    configuration: PipelineConfiguration,
    action: TuningAction,
    reason: str,
    **changes: Any,
) -> TunerReply:
    new_state = replace(
        state, phase=phase, configuration=configuration, last_action=action, **changes
    )
    return TunerReply(new_state, action, phase is TuningPhase.CONVERGED, reason)


_PHASE_STEPS: dict[
    TuningPhase, Callable[[TunerConfig, TunerState, QueueObservation], TunerReply]
] = {
    TuningPhase.BASELINE: _baseline_step,
    TuningPhase.DATA_WORKER_SIZE: _size_step,
    TuningPhase.DATA_WORKER_COUNT: _count_step,
    TuningPhase.TRAINING_WORKER_SIZE: _training_size_step,
    TuningPhase.CONVERGED: _converged_step,
}


def run_tune_step(request: TunerRequest) -> TunerReply:
    """The registry entry point for ``goldminer-tune-step``: :func:`tune_step`."""
    return tune_step(request)


# --------------------------------------------------------------------------------------
# Cluster level (sec. 3.4.2)
# --------------------------------------------------------------------------------------


class AllocationPolicy(Enum):
    """The cluster-wide objective, each with its scaling metric (sec. 3.4.2)."""

    MAX_TP = "maxtp"
    """Throughput: serve the largest ``Δt/Δc * g``."""
    SRTF = "srtf"
    """Shortest remaining time first: serve the smallest ``n(c+Δc)/(t+Δt)``."""
    FAIR = "fair"
    """Fairness: serve the smallest normalized throughput ``(t+Δt)/t_i``."""


@dataclass(frozen=True)
class JobThroughputCurve:
    """One job's training throughput against the CPUs its data workers get.

    ``throughputs[c]`` is the throughput with ``c`` data-worker CPUs, from ``c = 0``. The
    curve must be non-decreasing and concave (marginal gains never grow): data workers are
    data-parallel, so a CPU is never worth more than the one before it (sec. 3.4.2), and
    the job-level tuner keeps data workers only where speedup is linear (sec. 3.4.1).

    Beyond the measured points the scheduler is optimistic as in the paper, "assumes the
    speedup of the next scaling step the same as that of the previous step" (sec. 3.4.2):
    the last measured gain repeats until ``ideal_throughput`` is reached. With no
    ``ideal_throughput`` the curve ends at its last point (its queue is then ideal).
    """

    job_id: str
    throughputs: tuple[float, ...]
    """Throughput at 0, 1, 2, ... data-worker CPUs; at least one point."""
    gpus: int = 1
    """GPUs the job trains on (``g`` of MaxTP)."""
    remaining_steps: int = 0
    """Training steps left (``n`` of SRTF); must be positive under SRTF."""
    ideal_throughput: float | None = None
    """Throughput of the training workers when never starved, from the queue state
    (``t_i`` of Fair); at least the last measured throughput. None: the last point."""
    max_data_worker_cpu: int = 0
    """Largest data-worker size from job-level tuning; a job's CPUs are packed into workers
    of this size plus one smaller one ("smaller data workers to use fragmented CPUs",
    sec. 3.4.1). 0: one data worker takes all of the job's CPUs."""
    max_cpu: int | None = None
    """Most data-worker CPUs the job may get, e.g. what its admission share leaves beside
    its training pods (Stride's; the paper's jobs have no such bound). None: unbounded."""

    def __post_init__(self) -> None:
        error = InvalidAllocationInput
        if not isinstance(self.job_id, str) or not self.job_id:
            raise error("job_id", "must be a non-empty string")
        if not isinstance(self.throughputs, tuple) or not self.throughputs:
            raise error("throughputs", "must hold at least one throughput (at 0 CPUs)")
        for index, value in enumerate(self.throughputs):
            _check_number(error, f"throughputs[{index}]", value)
        scale = max(1.0, *self.throughputs)
        gains = [b - a for a, b in zip(self.throughputs, self.throughputs[1:], strict=False)]
        for index, gain in enumerate(gains):
            if gain < 0:
                raise error(
                    f"throughputs[{index + 1}]", "must not be below the throughput before it"
                )
            if index and gain > gains[index - 1] + CONCAVITY_TOLERANCE * scale:
                raise error(
                    f"throughputs[{index + 1}]",
                    "makes the curve non-concave (a marginal gain larger than the one before)",
                )
        _check_count(error, "gpus", self.gpus, 1)
        _check_count(error, "remaining_steps", self.remaining_steps, 0)
        if self.ideal_throughput is not None:
            _check_number(error, "ideal_throughput", self.ideal_throughput)
            if self.ideal_throughput < self.throughputs[-1]:
                raise error("ideal_throughput", "must be at least the last throughput of the curve")
        _check_count(error, "max_data_worker_cpu", self.max_data_worker_cpu, 0)
        if self.max_cpu is not None:
            _check_count(error, "max_cpu", self.max_cpu, 0, MAX_CPU_BUDGET)

    @property
    def ideal(self) -> float:
        """``t_i``: the ideal throughput, or the last point when none was given."""
        return self.throughputs[-1] if self.ideal_throughput is None else self.ideal_throughput

    def has_room(self, cpu: int) -> bool:
        """Whether one more CPU than ``cpu`` raises the job's throughput and is allowed
        ("room for improvement", sec. 3.4.2)."""
        if self.max_cpu is not None and cpu >= self.max_cpu:
            return False
        return self.throughput_at(cpu + 1) > self.throughput_at(cpu)

    def throughput_at(self, cpu: int) -> float:
        """The (measured or optimistically extrapolated) throughput at ``cpu`` CPUs."""
        points = self.throughputs
        if cpu < len(points):
            return points[cpu]
        last_gain = points[-1] - points[-2] if len(points) >= 2 else 0.0
        return min(self.ideal, points[-1] + (cpu - len(points) + 1) * last_gain)


def linear_curve(
    job_id: str,
    rate_per_cpu: float,
    ideal_throughput: float,
    *,
    gpus: int = 1,
    remaining_steps: int = 0,
    max_data_worker_cpu: int = 0,
    max_cpu: int | None = None,
) -> JobThroughputCurve:
    """A job's curve as the scheduler sees it after job-level tuning: no throughput without
    data-worker CPUs, ``rate_per_cpu`` from each CPU ("data workers are data-parallel",
    the optimistic linear speedup of sec. 3.4.2) until ``ideal_throughput``, the training
    workers' rate "derived from the queue state". The simulator and the live optimizer
    both build their curves here."""
    first = min(ideal_throughput, rate_per_cpu)
    return JobThroughputCurve(
        job_id=job_id,
        throughputs=(0.0, first),
        gpus=gpus,
        remaining_steps=remaining_steps,
        ideal_throughput=ideal_throughput,
        max_data_worker_cpu=max_data_worker_cpu,
        max_cpu=max_cpu,
    )


@dataclass(frozen=True)
class ClusterAllocationRequest:
    """The executor's request type for ``goldminer-cluster-allocation``."""

    policy: AllocationPolicy
    cpu_budget: int
    """CPUs available to data workers across all jobs; positive."""
    jobs: tuple[JobThroughputCurve, ...]
    """Jobs competing for data workers; job ids are unique. May be empty."""

    def __post_init__(self) -> None:
        if not isinstance(self.policy, AllocationPolicy):
            raise InvalidAllocationInput(
                "policy", f"must be an AllocationPolicy, got {self.policy!r}"
            )
        _check_count(InvalidAllocationInput, "cpu_budget", self.cpu_budget, 1, MAX_CPU_BUDGET)
        seen: set[str] = set()
        for index, job in enumerate(self.jobs):
            if not isinstance(job, JobThroughputCurve):
                raise InvalidAllocationInput(f"jobs[{index}]", "must be a JobThroughputCurve")
            if job.job_id in seen:
                raise InvalidAllocationInput(f"jobs[{index}].job_id", f"{job.job_id!r} repeats")
            seen.add(job.job_id)
            if self.policy is AllocationPolicy.SRTF and job.remaining_steps <= 0:
                raise InvalidAllocationInput(
                    f"jobs[{index}].remaining_steps", "must be positive under the SRTF policy"
                )


@dataclass(frozen=True)
class JobAllocation:
    """One job's share of the data-worker CPUs."""

    job_id: str
    data_worker_cpu: int
    """Total CPUs of the job's data workers."""
    data_worker_sizes: tuple[int, ...]
    """CPUs of each data worker (largest first)."""
    throughput: float
    """Estimated throughput with that allocation."""
    normalized_throughput: float
    """``throughput / t_i`` (1 for a job whose ideal throughput is 0)."""


@dataclass(frozen=True)
class ClusterAllocationReply:
    """The allocation, in the order of the request's jobs."""

    policy: AllocationPolicy
    allocations: tuple[JobAllocation, ...]
    cpu_used: int
    total_throughput: float
    """GPU-weighted cluster throughput ``sum(g * t)``: the quantity MaxTP maximizes."""


def _metric(policy: AllocationPolicy) -> Callable[[JobThroughputCurve, int, float, float], float]:
    """The policy's metric as a key where smaller is served first.

    Arguments: the job, its current CPUs ``c``, its throughput ``t`` at ``c`` and the
    throughput ``t + Δt`` at ``c + 1`` (``Δc`` = 1 CPU).
    """
    if policy is AllocationPolicy.MAX_TP:
        return lambda job, cpu, now, after: -(after - now) * job.gpus
    if policy is AllocationPolicy.SRTF:
        return lambda job, cpu, now, after: job.remaining_steps * (cpu + 1) / after
    return lambda job, cpu, now, after: after / job.ideal


def _pack(cpu: int, max_size: int) -> tuple[int, ...]:
    if cpu == 0:
        return ()
    if max_size == 0 or max_size >= cpu:
        return (cpu,)
    whole, rest = divmod(cpu, max_size)
    return (max_size,) * whole + ((rest,) if rest else ())


def _reply(request: ClusterAllocationRequest, cpus: dict[str, int]) -> ClusterAllocationReply:
    allocations = []
    total = 0.0
    for job in request.jobs:
        cpu = cpus[job.job_id]
        throughput = job.throughput_at(cpu)
        total += job.gpus * throughput
        normalized = throughput / job.ideal if job.ideal > 0 else 1.0
        allocations.append(
            JobAllocation(
                job.job_id, cpu, _pack(cpu, job.max_data_worker_cpu), throughput, normalized
            )
        )
    return ClusterAllocationReply(request.policy, tuple(allocations), sum(cpus.values()), total)


def allocate_data_worker_cpus(request: ClusterAllocationRequest) -> ClusterAllocationReply:
    """GoldMiner's cluster-level heuristic (sec. 3.4.2), one CPU per step.

    While CPUs are left, the job "with the largest improvement to the metric" gets one;
    only jobs with "room for improvement" compete, i.e. whose next CPU raises throughput
    (a job at its ideal throughput, or on the flat end of its curve, is skipped: under
    Fair it would otherwise win forever without gaining anything). Ties go to the smaller
    job id, so the result does not depend on the order of the jobs.

    Every metric is monotone in a job's own allocation on a concave curve (MaxTP's gain
    shrinks; SRTF's ``(c+1)/t(c+1)`` grows since ``t(c)/c`` falls; Fair's ``t(c+1)/t_i``
    grows), and only the served job's metric changes, so a heap with one entry per job
    gives exactly the allocation of re-sorting all jobs every step. On a concave curve,
    MaxTP's greedy is also optimal for ``sum(g * t)`` (marginal allocation).
    """
    metric = _metric(request.policy)
    cpus = {job.job_id: 0 for job in request.jobs}
    by_id = {job.job_id: job for job in request.jobs}
    # One entry per job with room: (metric, job id). Ids are unique, so ties never reach
    # a comparison of anything else.
    heap: list[tuple[float, str]] = []
    for job in request.jobs:
        if job.has_room(0):
            heap.append((metric(job, 0, job.throughput_at(0), job.throughput_at(1)), job.job_id))
    heapq.heapify(heap)
    budget = request.cpu_budget
    while budget > 0 and heap:
        _, job_id = heapq.heappop(heap)
        job = by_id[job_id]
        cpus[job_id] += 1
        budget -= 1
        cpu = cpus[job_id]
        if job.has_room(cpu):
            now, after = job.throughput_at(cpu), job.throughput_at(cpu + 1)
            heapq.heappush(heap, (metric(job, cpu, now, after), job_id))
    return _reply(request, cpus)


def allocate_data_worker_cpus_by_resorting(
    request: ClusterAllocationRequest,
) -> ClusterAllocationReply:
    """Reference implementation: recompute and sort every job's metric at every step.

    Kept for tests and the benchmark; :func:`allocate_data_worker_cpus` must match it.
    """
    metric = _metric(request.policy)
    cpus = {job.job_id: 0 for job in request.jobs}
    for _ in range(request.cpu_budget):
        candidates = []
        for job in request.jobs:
            cpu = cpus[job.job_id]
            if job.has_room(cpu):
                now, after = job.throughput_at(cpu), job.throughput_at(cpu + 1)
                candidates.append((metric(job, cpu, now, after), job.job_id))
        if not candidates:
            break
        candidates.sort()
        cpus[candidates[0][1]] += 1
    return _reply(request, cpus)


def run_cluster_allocation(request: ClusterAllocationRequest) -> ClusterAllocationReply:
    """The registry entry point for ``goldminer-cluster-allocation``."""
    return allocate_data_worker_cpus(request)


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=TUNE_STEP_NAME,
        version=1,
        description=(
            "One step of job-level data-worker tuning from queue state: baseline, data-worker "
            "size, count, fallback, training-worker size (GoldMiner sec. 3.4.1, 5.5)"
        ),
        request_type=TunerRequest,
        reply_type=TunerReply,
        run=run_tune_step,
    ),
    AlgorithmSpec(
        name=CLUSTER_ALLOCATION_NAME,
        version=1,
        description=(
            "Cluster-level data-worker CPU allocation by the MaxTP, SRTF or Fair metric "
            "(GoldMiner sec. 3.4.2)"
        ),
        request_type=ClusterAllocationRequest,
        reply_type=ClusterAllocationReply,
        run=run_cluster_allocation,
    ),
)
"""This module's algorithms, for :func:`stride.policy.registry.default_registry`."""
