"""GoldMiner's job-level tuner, live: what the optimizer keeps of a job's input queue
between tuning steps, and the data-worker role a step's configuration asks for.

The tuner itself is the policy's (:func:`stride.policy.goldminer.tune_step`, through the
``tune_data_workers`` port); ``stride sim --env dataworkers`` runs the same step. Here is
only how a live job's measurements become its observation, and its answer a plan:

- **When.** A job is tuned once its chief reports an input queue (it reads by steps: the
  model has a stateless prefix, so data workers can serve it). The job declares nothing.
  The first step starts the search (the baseline: no data workers). Every later step waits
  for an *interval*: windows of the current plan, read from as many data workers as the plan
  has (so the pods the step asked for are serving), adding up to ``interval_seconds`` of
  training (30 s: GoldMiner sec. 5.5). A new plan starts a new interval.
- **The observation.** Rates are the mean over the interval's windows, weighted by their
  training time; the queue length is the mean of the windows' ends (the paper's mean over
  the interval, sampled); the training worker's utilization is the chief's newest CPU use
  over its limit.
- **CPUs.** The tuner counts whole CPUs; a live CPU is ``cpu_unit`` cores (1 by default),
  and a data worker grows up to ``max_data_worker_cpu`` cores (the paper's container of the
  hardware ratio, 8).

Departures from sec. 3.4.1, each because Stride has another owner for it:

- **One training worker.** Stride's chief makes or receives every mini-batch and drives
  its workers (the PS strategy's coordinator), so a job has one input queue: the tuner's
  ``training_workers`` is 1 and it starts with one data worker, not one per worker.
- **The training worker's CPUs are DLRover's.** The stage step sizes workers and PS from
  their measured use (DLRover sec. 4.2); two owners of one number would undo each other.
  The tuner is given a training worker of one fixed unit (initial = max = 1), so its
  grow and shrink phases never move it; the rest of the search is the paper's.
- **No room, no step.** When a step's data workers do not fit the job's admission share or
  the cluster, the search ends at the configuration the job has (recorded with the bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from stride.optimizer.domain.administrator import (
    Administrator,
    JobStage,
    OptimizationEvent,
    RootCause,
    StageError,
    Step,
)
from stride.optimizer.domain.tuning import Explanation
from stride.policy.goldminer import (
    PipelineConfiguration,
    QueueObservation,
    TunerConfig,
    TunerState,
    TuningPhase,
)
from stride.policy.plans import Plan, PodOverride, Role, RoleResources

GIB = 1024**3


@dataclass(frozen=True)
class FeedRule:
    """How live measurements and CPUs map to the tuner's (module docstring)."""

    interval_seconds: float = 30.0
    """Training time one tuning interval covers (GoldMiner sec. 5.5: 30 s)."""
    cpu_unit: float = 1.0
    """Cores per tuner CPU."""
    max_data_worker_cpu: float = 8.0
    """Most cores one data worker grows to (sec. 3.4.1: the hardware CPU-GPU ratio)."""
    max_data_workers: int = 16
    """Most data workers a job is given."""

    def config(self) -> TunerConfig:
        """The tuner's configuration for a live job."""
        return TunerConfig(
            initial_training_worker_cpu=1,
            max_training_worker_cpu=1,
            data_worker_container_cpu=max(1, math.floor(self.max_data_worker_cpu / self.cpu_unit)),
            training_workers=1,
            max_data_workers=self.max_data_workers,
        )


@dataclass(frozen=True)
class QueueWindow:
    """One step report's input queue, as the tuner weighs it."""

    seconds: float
    """Training time the window covers (its steps x seconds per step)."""
    steps_per_second: float
    enqueue_rate: float
    dequeue_rate: float
    queue_length: int
    queue_capacity: int


@dataclass(frozen=True)
class Feeding:
    """A job's data-worker tuning: the search's state and the interval being measured."""

    state: TunerState | None = None
    """The tuner's state after its last step (None before the first)."""
    data_workers: int = 0
    """Data workers of the job's current plan: an interval counts only windows that read
    from this many."""
    windows: tuple[QueueWindow, ...] = ()
    due: bool = False
    """A step is due: the first one, or an interval was measured."""
    held: str = ""
    """Why the search ended before converging, if it did (no room; an operator's plan)."""
    rate_per_cpu: float = 0.0
    """Best steps per second one tuner CPU of data workers delivered in any interval of the
    search (the enqueue rate over the data workers' CPUs): the cluster level's linear
    speedup (sec. 3.4.2). 0 until an interval read from data workers."""
    ideal_rate: float = 0.0
    """The training worker's rate when never starved (the dequeue rate) in the newest
    interval read from data workers: ``t_i`` of sec. 3.4.2."""
    given: tuple[int, ...] | None = None
    """Data-worker sizes (tuner CPUs) the cluster level last gave the job; None: the ones
    its search ended with. A plan with others was an operator's."""

    @property
    def tuning(self) -> bool:
        """Whether the search goes on (started, not converged, not ended)."""
        return not self.held and (
            self.state is None or self.state.phase is not TuningPhase.CONVERGED
        )

    @property
    def elastic(self) -> bool:
        """Whether the cluster level divides CPUs to this job's data workers: its search is
        over (converged, or no room for its next step) with data workers that were
        measured, it did not fall back, and no operator set them."""
        state = self.state
        return (
            not self.held
            and state is not None
            and state.phase is TuningPhase.CONVERGED
            and not state.fell_back
            and state.configuration.uses_data_workers
            and self.rate_per_cpu > 0
            and self.ideal_rate > 0
        )

    @property
    def given_sizes(self) -> tuple[int, ...]:
        """The data-worker sizes the optimizer last gave the job (:attr:`given`)."""
        if self.given is not None:
            return self.given
        configuration = self.state.configuration if self.state is not None else None
        if configuration is None:
            return ()
        return (configuration.data_worker_cpu,) * configuration.data_workers

    def measured(self, observation: QueueObservation) -> Feeding:
        """``self`` with what an interval of its state's configuration measured."""
        configuration = self.state.configuration if self.state is not None else None
        if configuration is None or not configuration.uses_data_workers:
            return self
        cpus = configuration.data_workers * configuration.data_worker_cpu
        return replace(
            self,
            rate_per_cpu=max(self.rate_per_cpu, observation.enqueue_rate / cpus),
            ideal_rate=observation.dequeue_rate or self.ideal_rate,
        )

    def for_plan(self, data_workers: int) -> Feeding:
        """A new plan: a new interval (what was measured was another plan's)."""
        return replace(
            self, data_workers=data_workers, windows=(), due=self.due and self.state is None
        )


def add_window(feeding: Feeding, window: QueueWindow, data_workers: int, rule: FeedRule) -> Feeding:
    """``feeding`` with a window of the current plan that read from ``data_workers``."""
    if not feeding.tuning or feeding.due:
        return feeding
    if feeding.state is None:
        return replace(feeding, due=True)  # the job reads by steps: start the search
    if data_workers != feeding.data_workers or window.seconds <= 0:
        return feeding  # the plan's data workers are not all serving yet
    windows = (*feeding.windows, window)
    due = sum(w.seconds for w in windows) >= rule.interval_seconds
    return replace(feeding, windows=windows, due=due)


def observation(feeding: Feeding, utilization: float) -> QueueObservation | None:
    """The interval's observation (None before the first step, which needs none)."""
    if feeding.state is None:
        return None
    windows = feeding.windows
    capacity = max([1, *(w.queue_capacity for w in windows)])
    return QueueObservation(
        throughput=_mean(windows, lambda w: w.steps_per_second),
        enqueue_rate=_mean(windows, lambda w: w.enqueue_rate),
        dequeue_rate=_mean(windows, lambda w: w.dequeue_rate),
        queue_length=min(float(capacity), _mean(windows, lambda w: float(w.queue_length), True)),
        queue_capacity=capacity,
        training_cpu_utilization=min(1.0, max(0.0, utilization)),
    )


def _mean(
    windows: tuple[QueueWindow, ...], value: Callable[[QueueWindow], float], plain: bool = False
) -> float:
    """Mean of ``value`` over the windows, weighted by time unless ``plain``; a value every
    window shares is returned as it is (no rounding from the weighting)."""
    values = [float(value(w)) for w in windows]
    if not values:
        return 0.0
    if all(v == values[0] for v in values):
        return values[0]
    if plain:
        return math.fsum(values) / len(values)
    total = math.fsum(w.seconds for w in windows)
    return math.fsum(v * w.seconds for v, w in zip(values, windows, strict=True)) / total


def configuration_of(plan: Plan, rule: FeedRule) -> PipelineConfiguration:
    """The tuner's configuration a plan holds (its data workers, in whole tuner CPUs)."""
    role = _data_role(plan)
    if role is None or role.count == 0:
        return PipelineConfiguration(0, 0, 1)
    return PipelineConfiguration(role.count, max(1, round(role.cpu / rule.cpu_unit)), 1)


def with_configuration(
    plan: Plan, configuration: PipelineConfiguration, rule: FeedRule, reason: str, algorithm: str
) -> Plan:
    """``plan`` with the data workers ``configuration`` asks for."""
    sizes = (configuration.data_worker_cpu,) * configuration.data_workers
    return with_data_workers(plan, sizes, rule, reason, algorithm)


def with_data_workers(
    plan: Plan, sizes: tuple[int, ...], rule: FeedRule, reason: str, algorithm: str
) -> Plan:
    """``plan`` with a data worker of each of ``sizes`` tuner CPUs, largest first: the first
    size is the role's, a smaller one an override of its pod ("smaller data workers to use
    fragmented CPUs", sec. 3.4.1). New data workers get a worker's memory (the
    pre-processing they take on ran in the chief's process)."""
    count = len(sizes)
    cpu = sizes[0] * rule.cpu_unit if sizes else 0.0
    roles: list[RoleResources] = []
    placed = False
    for resources in plan.roles:
        if resources.role is not Role.DATA_WORKER:
            roles.append(resources)
            continue
        placed = True
        roles.append(
            replace(
                resources,
                count=count,
                cpu=cpu or resources.cpu,
                overrides=_smaller(resources, sizes, rule),
            )
        )
    if not placed and count:
        memories = {r.role: r.memory_bytes for r in plan.roles}
        memory = memories.get(Role.WORKER, memories.get(Role.CHIEF, GIB))
        role = RoleResources(Role.DATA_WORKER, count, cpu, memory)
        roles.append(replace(role, overrides=_smaller(role, sizes, rule)))
    return Plan(roles=tuple(roles), reason=reason, algorithm=algorithm)


def _smaller(
    role: RoleResources, sizes: tuple[int, ...], rule: FeedRule
) -> tuple[PodOverride, ...]:
    """The data-worker role's overrides for ``sizes``: each pod that keeps one keeps its
    memory (an OOM rule's) at its new size; a pod smaller than the first gets one."""
    kept = {o.index: o for o in role.overrides}
    overrides = []
    for index, size in enumerate(sizes):
        cpu = size * rule.cpu_unit
        if index in kept:
            overrides.append(replace(kept[index], cpu=cpu))
        elif size != sizes[0]:
            overrides.append(PodOverride(index, cpu, role.memory_bytes))
    return tuple(overrides)


def _data_role(plan: Plan) -> RoleResources | None:
    return next((r for r in plan.roles if r.role is Role.DATA_WORKER), None)


def on_tuned(
    existing: Administrator,
    plan: Plan | None,
    event_id: str,
    explanation: Explanation,
    now: datetime,
) -> tuple[Step, Explanation]:
    """A tuning step as the job's event, and as its next plan version when ``plan`` (the
    data workers it asks for) is given. The stage stays where the job's last decision put
    it."""
    if existing.stage is JobStage.FINISHED:
        raise StageError(f"job {existing.job_id} has finished; it gets no more plans")
    cause = RootCause.INPUT_QUEUE
    event = OptimizationEvent(
        event_id, existing.job_id, existing.stage, cause, explanation.detail, now
    )
    explained = replace(explanation, stage=existing.stage.value, root_cause=cause.value)
    if plan is None:
        return Step(existing, existing, (event,), ()), explained
    administrator, versioned = existing.publish(plan, now)
    return Step(existing, administrator, (event,), (versioned,)), explained
