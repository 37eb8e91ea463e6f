"""DLRover's resource model and its sample -> optimize -> adjust stages (DLRover sec. 4.1-4.2).

DLRover sizes a parameter-server job without asking its user: it samples one worker to
measure what a worker needs (w^) and what one worker costs the PS (s^), derives the job's
plan from the throughput model (eq. 1-11), and then fixes what the model got wrong: OOM,
saturated, hot and idle parameter servers. Everything here is a pure function of a job's
observed state, so the optimizer (which owns the state) and ``stride sim`` run the same code.

Rounding, which the paper leaves open (eq. 6 asks for whole cores and counts, eq. 10-11 are
real-valued), is chosen to reproduce Table 1 exactly and to keep eq. 3 (the job fits C_total):

- ``N_w = floor(C_total / (w^ + s^))`` (eq. 10 floored, so eq. 8 holds with equality allowed);
- ``s_total = C_total - N_w * w^`` (eq. 11, unrounded; with the floor above it always
  satisfies eq. 4, ``s_total >= N_w * s^``);
- each worker gets ``w = ceil(w^)`` whole cores (eq. 6; Table 1: 2.5 -> 3, 19.4 -> 20);
- ``N_ps = max(1, floor((C_total - N_w * w) / s))`` PS of ``s`` = 16 cores each: PS get what
  the whole-core workers leave, so the plan never exceeds C_total. For both rows of Table 1
  this equals ``floor(s_total / s)`` (8 and 2). When rounding ``w`` up leaves no room for a
  PS, ``N_w`` is lowered until one fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from stride.policy.errors import PolicyError
from stride.policy.plans import MAX_PODS_PER_ROLE, Plan, PodOverride, Role, RoleResources
from stride.policy.registry import AlgorithmSpec

GIB = 1024**3

INITIAL_PLAN_NAME = "dlrover-initial-plan"
"""Registered name of the eq. 10-11 plan."""
ADJUST_NAME = "dlrover-adjust"
"""Registered name of the stage machine step."""
ALGORITHM_VERSION = 1
"""Bump when a rule or default below changes."""

C_TOTAL = 200.0
"""Most CPU cores one job may have (DLRover sec. 6: "jobs ... are allocated at most 200 CPU
cores"; Table 1 uses C_total = 200)."""
C_MAX = 32.0
"""Most cores one pod may have (sec. 6: "a single Pod can only be allowed to allocate a
maximum of 32 CPU cores"); the sampling worker gets all of them (sec. 4.2)."""
PS_CPU = 16.0
"""Cores per PS in the optimize stage: "we find that s = 16 is a reasonable value" (sec. 4.1)."""
SATURATION_THRESHOLD = 0.9
"""PS CPU utilization above which DLRover adds PS CPU ("a predefined threshold like 0.9",
sec. 4.2); also what makes a PS hot."""
IDLE_THRESHOLD = 0.5
"""Not in the paper ("PS could not make full usage of their CPU cores"). Below half use on
every PS the job clearly has PS headroom for more workers; between 0.5 and 0.9 the gain of
more workers is too uncertain to pay for a restart of the worker set."""
WORKER_CAP_K = 1024.0
"""The K of the idle-PS rule ``min(s_total / s^, sqrt(K))``; the paper never defines it.
We read sqrt(K) as a cap on the worker count and default it to 32 workers (K = 1024), above
Table 1's largest N_w of 24 so it binds only on jobs with very cheap PS."""
SAMPLING_PS_COUNT = 2
""""A few parameter servers" (sec. 4.2); Table 1 samples with 1, and 2 shows an unbalanced
partition at once (see :mod:`stride.policy.cold_start`)."""
DEFAULT_MEMORY_BYTES = 4 * GIB
"""The paper's unspecified "default memory" for sampling pods; doubled on OOM."""


class DLRoverInputError(PolicyError):
    """An input to a DLRover stage is invalid or infeasible; the field says which."""


class Stage(Enum):
    """DLRover's stages of a job (sec. 4.2)."""

    SAMPLE = "sample"
    """One worker and a few PS at C_max, to measure w^ and s^."""
    OPTIMIZE = "optimize"
    """The eq. 10-11 plan is running; w^ is re-measured and workers are scaled to s_total/s^."""
    ADJUST = "adjust"
    """Steady state: fix hot and idle PS."""


class Action(Enum):
    """What an adjust step decided."""

    NONE = "none"
    WORKER_OOM = "worker_oom"
    PS_OOM = "ps_oom"
    ADD_PS_CPU = "add_ps_cpu"
    OPTIMIZE = "optimize"
    SCALE_WORKERS = "scale_workers"
    HOT_PS = "hot_ps"
    IDLE_PS = "idle_ps"


def _check_number(field: str, value: object, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise DLRoverInputError(field, f"must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise DLRoverInputError(field, f"must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _check_count(field: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DLRoverInputError(field, f"must be a whole number >= {minimum}, got {value!r}")
    return value


def _check_memory(field: str, value: object) -> int:
    return _check_count(field, value, 1)


# --- eq. 1: the step-time and throughput model ------------------------------------------


@dataclass(frozen=True)
class ThroughputModel:
    """The parameters of eq. 1 for one model (DLRover sec. 4.1)."""

    batch_size: int
    """B, samples per step of one worker."""
    io_seconds: float
    """t_IO: reading a batch and moving parameters and gradients, per step."""
    compute_work: float
    """W_compute, in core-seconds at one core's speed r."""
    update_work: float
    """W_update, in core-seconds at one core's speed r."""
    core_rate: float
    """r, one core's computation capacity (work per second)."""
    w_hat: float
    """CPU a worker actually uses; more cores give it nothing."""
    s_hat: float
    """PS CPU one step's update actually uses."""

    def __post_init__(self) -> None:
        _check_count("batch_size", self.batch_size, 1)
        _check_number("io_seconds", self.io_seconds)
        _check_number("compute_work", self.compute_work)
        _check_number("update_work", self.update_work)
        for name in ("core_rate", "w_hat", "s_hat"):
            _check_number(name, getattr(self, name), positive=True)


def step_time(model: ThroughputModel, worker_cpu: float, s_total: float) -> float:
    """Seconds of one step of a worker with ``worker_cpu`` cores against PS with ``s_total``:
    ``t_IO + W_compute / (r * min(w_i, w^)) + W_update / (r * min(s_total, s^))`` (eq. 1)."""
    worker_cpu = _check_number("worker_cpu", worker_cpu, positive=True)
    s_total = _check_number("s_total", s_total, positive=True)
    compute = model.compute_work / (model.core_rate * min(worker_cpu, model.w_hat))
    update = model.update_work / (model.core_rate * min(s_total, model.s_hat))
    return model.io_seconds + compute + update


def job_throughput(
    model: ThroughputModel, worker_cpus: tuple[float, ...] | list[float], s_total: float
) -> float:
    """R of eq. 1: samples per second of all workers, ``sum_i B / step_time(w_i)``.

    As in the paper, the PS term uses ``min(s_total, s^)`` per step; eq. 4 (``N_w * s^ <=
    s_total``) is what keeps that true for all workers at once, so the planner enforces it
    rather than this model.
    """
    if len(worker_cpus) == 0:
        raise DLRoverInputError("worker_cpus", "needs at least one worker")
    total = 0.0
    for index, cpu in enumerate(worker_cpus):
        _check_number(f"worker_cpus[{index}]", cpu, positive=True)
        total += model.batch_size / step_time(model, cpu, s_total)
    return total


# --- eq. 10-11: the initial plan ---------------------------------------------------------


@dataclass(frozen=True)
class DLRoverLimits:
    """The cluster's limits and DLRover's tunables, defaulting to the paper's values."""

    c_total: float = C_TOTAL
    """Most cores the job may have (eq. 3)."""
    c_max: float = C_MAX
    """Most cores one pod may have (eq. 5)."""
    ps_cpu: float = PS_CPU
    """s, cores per PS in the optimize stage (sec. 4.1)."""
    saturation_threshold: float = SATURATION_THRESHOLD
    """PS utilization above which PS get more CPU or a hot PS is replaced (sec. 4.2)."""
    idle_threshold: float = IDLE_THRESHOLD
    """PS utilization below which every PS counts as idle (our choice, see the constant)."""
    worker_cap_k: float = WORKER_CAP_K
    """K of the idle-PS rule (undefined in the paper, see the constant)."""

    def __post_init__(self) -> None:
        for name in ("c_total", "c_max", "ps_cpu", "worker_cap_k"):
            _check_number(f"limits.{name}", getattr(self, name), positive=True)
        for name in ("saturation_threshold", "idle_threshold"):
            value = _check_number(f"limits.{name}", getattr(self, name), positive=True)
            if value > 1:
                raise DLRoverInputError(
                    f"limits.{name}", f"must be a utilization <= 1, got {value}"
                )
        if self.idle_threshold >= self.saturation_threshold:
            raise DLRoverInputError(
                "limits.idle_threshold",
                f"must be below saturation_threshold {self.saturation_threshold}, "
                f"got {self.idle_threshold}",
            )
        if self.ps_cpu > self.c_max:
            raise DLRoverInputError(
                "limits.ps_cpu", f"must be <= c_max {self.c_max} (eq. 5), got {self.ps_cpu}"
            )


@dataclass(frozen=True)
class InitialPlanRequest:
    """The request of ``dlrover-initial-plan``: what sampling measured."""

    w_hat: float
    """Cores the sampling worker used."""
    s_hat: float
    """Cores all PS used together while one worker trained."""
    worker_memory_bytes: int
    """Memory per worker (what the sampling worker needed without OOM)."""
    ps_memory_bytes: int
    """Memory per PS."""
    limits: DLRoverLimits = DLRoverLimits()

    def __post_init__(self) -> None:
        _check_number("w_hat", self.w_hat, positive=True)
        _check_number("s_hat", self.s_hat, positive=True)
        _check_memory("worker_memory_bytes", self.worker_memory_bytes)
        _check_memory("ps_memory_bytes", self.ps_memory_bytes)
        if not isinstance(self.limits, DLRoverLimits):
            raise DLRoverInputError("limits", f"must be DLRoverLimits, got {self.limits!r}")
        if self.w_hat > self.limits.c_max:
            raise DLRoverInputError(
                "w_hat", f"must be <= c_max {self.limits.c_max} (eq. 5), got {self.w_hat}"
            )


@dataclass(frozen=True)
class InitialPlanReply:
    """The eq. 10-11 plan and the numbers behind it."""

    plan: Plan
    worker_count: int
    """N_w."""
    worker_cpu: float
    """w: ``ceil(w^)`` whole cores."""
    s_total: float
    """Eq. 11: ``C_total - N_w * w^`` (unrounded; the PS target of the model)."""
    ps_count: int
    """N_ps."""
    ps_cpu: float
    """Cores per PS: s, or less when the budget left for PS is below s."""


def initial_plan(request: InitialPlanRequest) -> InitialPlanReply:
    """The optimize-stage plan of eq. 10-11 (DLRover sec. 4.1, and sec. 4.2 "Optimize").

    See the module docstring for the rounding. Raises :class:`DLRoverInputError` naming
    ``limits.c_total`` when not even one worker and one PS fit the job's budget.
    """
    limits = request.limits
    worker_cpu = float(math.ceil(request.w_hat))
    worker_cpu = min(worker_cpu, limits.c_max)
    # Rounding w up can eat the PS budget; at least one core must be left for a PS.
    by_model = limits.c_total / (request.w_hat + request.s_hat)
    if not math.isfinite(by_model) or by_model > MAX_PODS_PER_ROLE:
        # Tiny measured use (down to denormal floats) would ask for unboundedly many workers.
        raise DLRoverInputError(
            "w_hat",
            f"w^ = {request.w_hat} and s^ = {request.s_hat} ask for more than "
            f"{MAX_PODS_PER_ROLE} workers: measure the sampling job for longer",
        )
    worker_count = min(
        math.floor(by_model),
        math.floor((limits.c_total - 1.0) / worker_cpu),
    )
    if worker_count > MAX_PODS_PER_ROLE:
        raise DLRoverInputError(
            "w_hat",
            f"w^ = {request.w_hat} and s^ = {request.s_hat} ask for {worker_count} workers, "
            f"more than {MAX_PODS_PER_ROLE}: measure the sampling job for longer",
        )
    if worker_count < 1:
        raise DLRoverInputError(
            "limits.c_total",
            f"{limits.c_total} cores cannot hold one worker of {worker_cpu} cores "
            f"and a PS (w^ = {request.w_hat}, s^ = {request.s_hat})",
        )
    s_total = limits.c_total - worker_count * request.w_hat
    ps_budget = limits.c_total - worker_count * worker_cpu
    if ps_budget >= limits.ps_cpu:
        ps_count = math.floor(ps_budget / limits.ps_cpu)
        ps_cpu = limits.ps_cpu
    else:
        # Less than one s is left: one PS with whole cores of what there is.
        ps_count = 1
        ps_cpu = float(math.floor(ps_budget))
    plan = Plan(
        roles=(
            RoleResources(Role.PS, ps_count, ps_cpu, request.ps_memory_bytes),
            RoleResources(Role.WORKER, worker_count, worker_cpu, request.worker_memory_bytes),
        ),
        reason=(
            f"optimize: N_w = {worker_count} = floor({limits.c_total:g} / "
            f"({request.w_hat:g} + {request.s_hat:g})), s_total = {s_total:g} (eq. 10-11)"
        ),
        algorithm=f"{INITIAL_PLAN_NAME}/{ALGORITHM_VERSION}",
    )
    return InitialPlanReply(plan, worker_count, worker_cpu, s_total, ps_count, ps_cpu)


def sampling_plan(
    limits: DLRoverLimits = DLRoverLimits(),
    ps_count: int = SAMPLING_PS_COUNT,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
) -> Plan:
    """The paper's sampling plan: one worker and ``ps_count`` PS, each with C_max cores and
    the default memory (sec. 4.2 "Sampling"). Stride's own cold start is smaller, see
    :mod:`stride.policy.cold_start`."""
    _check_count("ps_count", ps_count, 1)
    _check_memory("memory_bytes", memory_bytes)
    return Plan(
        roles=(
            RoleResources(Role.PS, ps_count, limits.c_max, memory_bytes),
            RoleResources(Role.WORKER, 1, limits.c_max, memory_bytes),
        ),
        reason="sample: one worker and a few PS at C_max (DLRover sec. 4.2)",
        algorithm=f"{ADJUST_NAME}/{ALGORITHM_VERSION}",
    )


# --- sec. 4.2: the stage machine ----------------------------------------------------------


@dataclass(frozen=True)
class PodObservation:
    """What the job master saw of one pod since the last step."""

    index: int
    """The pod's index within its role."""
    cpu_used: float
    """Cores in use (a recent average)."""
    memory_used_bytes: int = 0
    """Memory in use; 0 if not measured."""
    oom_killed: bool = False
    """The pod was killed for running out of memory."""


@dataclass(frozen=True)
class AdjustRequest:
    """The request of ``dlrover-adjust``: a job's stage, current plan and observations."""

    stage: Stage
    plan: Plan
    """The plan the job runs now; needs PS and WORKER roles."""
    workers: tuple[PodObservation, ...]
    """One per worker of the plan, indexes 0..N_w-1."""
    ps: tuple[PodObservation, ...]
    """One per PS of the plan."""
    s_hat: float | None = None
    """s^ measured in the sample stage; required in optimize and adjust."""
    limits: DLRoverLimits = DLRoverLimits()

    def __post_init__(self) -> None:
        if not isinstance(self.stage, Stage):
            raise DLRoverInputError("stage", f"must be a Stage, got {self.stage!r}")
        if not isinstance(self.plan, Plan):
            raise DLRoverInputError("plan", f"must be a Plan, got {type(self.plan).__name__}")
        if not isinstance(self.limits, DLRoverLimits):
            raise DLRoverInputError("limits", f"must be DLRoverLimits, got {self.limits!r}")
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "ps", tuple(self.ps))
        for role, field, observed in (
            (Role.WORKER, "workers", self.workers),
            (Role.PS, "ps", self.ps),
        ):
            resources = self.plan.role(role)
            if resources is None or resources.count == 0:
                raise DLRoverInputError("plan.roles", f"needs at least one {role.value} pod")
            if len(observed) != resources.count:
                raise DLRoverInputError(
                    field,
                    f"has {len(observed)} observations for {resources.count} "
                    f"{role.value} pods in the plan",
                )
            for position, pod in enumerate(observed):
                path = f"{field}[{position}]"
                if not isinstance(pod, PodObservation):
                    raise DLRoverInputError(path, f"must be a PodObservation, got {pod!r}")
                if pod.index != position:
                    raise DLRoverInputError(
                        f"{path}.index",
                        f"must be {position} (pods in index order), got {pod.index!r}",
                    )
                _check_number(f"{path}.cpu_used", pod.cpu_used)
                _check_count(f"{path}.memory_used_bytes", pod.memory_used_bytes, 0)
        if self.s_hat is not None:
            _check_number("s_hat", self.s_hat, positive=True)
        elif self.stage is not Stage.SAMPLE:
            raise DLRoverInputError("s_hat", f"is required in the {self.stage.value} stage")


@dataclass(frozen=True)
class AdjustReply:
    """What the step decided: a new plan (or none), the next stage and the estimates."""

    action: Action
    stage: Stage
    """The job's stage after this step."""
    plan: Plan | None
    """The new plan; None when nothing needs to change."""
    s_hat: float | None
    """s^ to carry to the next step (set by the sample stage, refined by the idle-PS rule)."""
    w_hat: float | None = None
    """w^ this step measured, when it measured one."""


def _utilization(pod: PodObservation, cpu: float) -> float:
    return pod.cpu_used / cpu


def _plan(roles: tuple[RoleResources, ...], reason: str) -> Plan:
    return Plan(roles=roles, reason=reason, algorithm=f"{ADJUST_NAME}/{ALGORITHM_VERSION}")


def adjust(request: AdjustRequest) -> AdjustReply:
    """One step of DLRover's stage machine (sec. 4.2), rules tried in this order:

    1. a worker was OOM-killed: double the worker memory (any stage);
    2. a PS was OOM-killed: double the PS count, same size each (any stage);
    3. sample: a PS above the saturation threshold gets more CPU (doubled, capped at C_max;
       PS already at C_max are doubled in count instead; the paper only says "add more
       CPU cores"); otherwise w^ = the worker's use, s^ = all PS use, and the eq. 10-11 plan
       is returned with stage optimize;
    4. optimize: w^ is re-measured (mean worker use), ``N_w = floor(s_total / s^)`` with
       s_total the PS cores of the plan, capped so the job stays within C_total; workers get
       ``ceil(w^)`` cores and the largest memory a worker used; stage becomes adjust;
    5. adjust, hot PS: each PS above the saturation threshold is replaced by one with
       ``s = min(s_hot / s_total * s^ * N_w, C_max)`` cores, where s_hot is its use and
       s_total *all PS use* (the hot PS's share of the load; with the allocated cores the
       paper's W&D example would give 17, not its 24 cores);
    6. adjust, idle PS: when every PS is below the idle threshold, ``s^ = PS use / N_w`` and
       ``delta N_w = floor(min(s_total / s^, sqrt(K))) - N_w`` workers are added, s_total being
       the PS cores allocated. As in the paper these may exceed C_total (they are the
       low-priority workers the cluster may preempt).
    """
    limits = request.limits
    plan = request.plan
    ps = plan.role(Role.PS)
    workers = plan.role(Role.WORKER)
    assert ps is not None and workers is not None  # checked by AdjustRequest
    others = tuple(r for r in plan.roles if r.role not in (Role.PS, Role.WORKER))

    if any(pod.oom_killed for pod in request.workers):
        grown = replace(
            workers,
            memory_bytes=workers.memory_bytes * 2,
            overrides=tuple(replace(o, memory_bytes=o.memory_bytes * 2) for o in workers.overrides),
        )
        return AdjustReply(
            Action.WORKER_OOM,
            request.stage,
            _plan((*others, ps, grown), "worker OOM: relaunch with double memory (sec. 4.2)"),
            request.s_hat,
        )
    if any(pod.oom_killed for pod in request.ps):
        doubled = replace(ps, count=ps.count * 2)
        return AdjustReply(
            Action.PS_OOM,
            request.stage,
            _plan((*others, doubled, workers), "PS OOM: double the PS count (sec. 4.2)"),
            request.s_hat,
        )

    ps_sizes = ps.pod_sizes()
    ps_use = sum(pod.cpu_used for pod in request.ps)
    if request.stage is Stage.SAMPLE:
        saturated = any(
            _utilization(pod, cpu) > limits.saturation_threshold
            for pod, (cpu, _) in zip(request.ps, ps_sizes, strict=True)
        )
        if saturated:
            if ps.cpu < limits.c_max:
                more = replace(ps, cpu=min(ps.cpu * 2, limits.c_max), overrides=())
            else:
                more = replace(ps, count=ps.count * 2, overrides=())
            return AdjustReply(
                Action.ADD_PS_CPU,
                Stage.SAMPLE,
                _plan((*others, more, workers), "sample: PS CPU above 0.9, add PS CPU (sec. 4.2)"),
                None,
            )
        w_hat = max(pod.cpu_used for pod in request.workers)
        if w_hat <= 0 or ps_use <= 0:
            raise DLRoverInputError(
                "workers" if w_hat <= 0 else "ps",
                "no CPU use observed yet; sample longer before optimizing",
            )
        reply = initial_plan(
            InitialPlanRequest(
                w_hat=min(w_hat, limits.c_max),
                s_hat=ps_use,
                worker_memory_bytes=workers.memory_bytes,
                ps_memory_bytes=ps.memory_bytes,
                limits=limits,
            )
        )
        optimized = _plan(others + reply.plan.roles, reply.plan.reason)
        return AdjustReply(Action.OPTIMIZE, Stage.OPTIMIZE, optimized, ps_use, w_hat)

    s_hat = request.s_hat
    assert s_hat is not None  # checked by AdjustRequest
    s_allocated = sum(cpu for cpu, _ in ps_sizes)
    if request.stage is Stage.OPTIMIZE:
        w_hat = sum(pod.cpu_used for pod in request.workers) / len(request.workers)
        worker_cpu = min(float(max(1, math.ceil(w_hat))), limits.c_max)
        budget_workers = math.floor((limits.c_total - s_allocated) / worker_cpu)
        count = max(1, min(math.floor(s_allocated / s_hat), budget_workers))
        memory = max((pod.memory_used_bytes for pod in request.workers), default=0)
        scaled = RoleResources(
            Role.WORKER, count, worker_cpu, memory if memory > 0 else workers.memory_bytes
        )
        return AdjustReply(
            Action.SCALE_WORKERS,
            Stage.ADJUST,
            _plan(
                (*others, ps, scaled),
                f"optimize: N_w = {count} = floor(s_total {s_allocated:g} / s^ {s_hat:g}) "
                f"within C_total (sec. 4.2)",
            ),
            s_hat,
            w_hat,
        )

    worker_count = workers.count
    hot: list[PodOverride] = []
    for pod, (cpu, memory) in zip(request.ps, ps_sizes, strict=True):
        if _utilization(pod, cpu) > limits.saturation_threshold:
            needed = min(pod.cpu_used / ps_use * s_hat * worker_count, limits.c_max)
            if needed > cpu:
                hot.append(
                    PodOverride(pod.index, min(float(math.ceil(needed)), limits.c_max), memory)
                )
    if hot:
        replaced_indexes = {o.index for o in hot}
        kept = tuple(o for o in ps.overrides if o.index not in replaced_indexes)
        relieved = replace(ps, overrides=tuple(sorted(kept + tuple(hot), key=lambda o: o.index)))
        names = ", ".join(f"PS-{o.index} -> {o.cpu:g} cores" for o in hot)
        return AdjustReply(
            Action.HOT_PS,
            Stage.ADJUST,
            _plan((*others, relieved, workers), f"hot PS replaced: {names} (sec. 4.2)"),
            s_hat,
        )
    idle = all(
        _utilization(pod, cpu) < limits.idle_threshold
        for pod, (cpu, _) in zip(request.ps, ps_sizes, strict=True)
    )
    s_hat_now = ps_use / worker_count
    if idle and s_hat_now > 0:  # a denormal use divided by the workers can underflow to 0
        target = math.floor(min(s_allocated / s_hat_now, math.sqrt(limits.worker_cap_k)))
        delta = target - worker_count
        if delta > 0:
            more_workers = replace(workers, count=worker_count + delta)
            return AdjustReply(
                Action.IDLE_PS,
                Stage.ADJUST,
                _plan(
                    (*others, ps, more_workers),
                    f"idle PS: add {delta} workers, s^ = {s_hat_now:g} (sec. 4.2)",
                ),
                s_hat_now,
            )
    return AdjustReply(Action.NONE, Stage.ADJUST, None, s_hat)


def run_initial_plan(request: InitialPlanRequest) -> InitialPlanReply:
    """Registry entry point of ``dlrover-initial-plan``."""
    return initial_plan(request)


def run_adjust(request: AdjustRequest) -> AdjustReply:
    """Registry entry point of ``dlrover-adjust``."""
    return adjust(request)


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=INITIAL_PLAN_NAME,
        version=ALGORITHM_VERSION,
        description="Plan from sampled w^ and s^: N_w, s_total, N_ps (DLRover sec. 4.1, eq. 10-11)",
        request_type=InitialPlanRequest,
        reply_type=InitialPlanReply,
        run=run_initial_plan,
    ),
    AlgorithmSpec(
        name=ADJUST_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "One sample/optimize/adjust step: OOM, saturated, hot and idle PS (DLRover sec. 4.2)"
        ),
        request_type=AdjustRequest,
        reply_type=AdjustReply,
        run=run_adjust,
    ),
)
"""The algorithms of this module, for :func:`stride.policy.registry.default_registry`."""


def oom_request(plan: Plan, role: Role, index: int) -> AdjustRequest:
    """DLRover's step request for an OOM kill of pod ``index`` of ``role``."""
    observations = {}
    for each in (Role.WORKER, Role.PS):
        resources = plan.role(each)
        count = 0 if resources is None else resources.count
        observations[each] = tuple(
            PodObservation(i, 0.0, 0, oom_killed=(each is role and i == index))
            for i in range(count)
        )
    return AdjustRequest(Stage.SAMPLE, plan, observations[Role.WORKER], observations[Role.PS])
