"""What the optimizer knows of one running job from its metrics: a windowed view.

DLRover's job master "collects the runtime statistics of a job" and the Brain optimizes on
them (sec. 4.1-4.3); DLRover-RM samples throughput per configuration and fits its model
on the samples (sec. 4.2-4.3). Here the view is a value, changed by pure functions:

- step metrics (``stride.metrics.v1.<job>.steps``) fill the current **window**; when the
  window spans :attr:`WindowRule.tick_seconds` of training under the job's current plan,
  it closes into one throughput **sample** of the plan's pods, a **memory point**
  (consumed samples, total and busiest PS memory) is taken, and a **decision** is due;
- usage samples (``stride.pods.v1.<job>.usage``) keep each pod's newest CPU and memory;
- metrics of an older plan version are dropped (the job was moving: the simulator also
  samples no paused job), and a pod's metrics must move forward in time.

This is exactly what the simulator's job master keeps (``stride.sim.dlrm``): the newest
:data:`SAMPLES_PER_CONFIG` samples per configuration, the newest :data:`MEMORY_WINDOW`
memory points, the sample count and the count at the last fit. The stage step
(:mod:`stride.policy.stages`) then gets the same request from both.

Stragglers and outliers: a window's throughput is the job's (the chief drives every
worker), so a slow worker shows as the job's speed, as it does in the simulator, and
dynamic sharding absorbs it. A pod whose CPU use is far below its role's median is marked
a straggler in :func:`stragglers`, for the explanation; a window whose throughput is an
outlier against the same configuration's samples (more than :data:`OUTLIER_FACTOR` off
their median) is kept out of the samples and counted.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from stride.optimizer.domain.feeding import Feeding, FeedRule, QueueWindow, add_window
from stride.policy.serialization import from_dict, to_dict
from stride.policy.stages import MEMORY_WINDOW, SAMPLES_PER_CONFIG, MemoryPoint, Pods, Sample

OUTLIER_FACTOR = 3.0
"""A window more than 3x away from the median of its configuration's samples is dropped."""
STRAGGLER_FRACTION = 0.5
"""A pod using less than half its role's median CPU is marked a straggler."""
HOT_PS_FACTOR = 1.2
"""The busiest PS is hot when its CPU use is above 1.2x the PS mean (the simulator's
threshold on its hot factor)."""
GIB = 1024**3


class MetricRefused(ValueError):
    """A metric that cannot be applied (out of order, impossible values); names the field."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


@dataclass(frozen=True)
class StepReport:
    """One window of steps as an agent reported it (``StepMetrics``)."""

    pod_name: str
    plan_version: int
    steps: int
    samples_per_second: float
    samples_consumed: int
    reported_at: float
    """Seconds since the epoch."""
    step_seconds: float
    input_queue: InputQueue | None = None


@dataclass(frozen=True)
class InputQueue:
    """The chief's input queue over a window, for a job read by steps: GoldMiner's
    indicator (sec. 3.4), which its job-level tuner reads."""

    data_workers: int
    enqueue_rate: float
    """Mini-batches that arrived per second."""
    dequeue_rate: float
    """Steps trained per second of the time the chief did not wait."""
    wait_share: float
    """Share of the window the chief waited for data."""
    queue_length: int
    """Mini-batches ready at the window's end."""
    steps_per_second: float = 0.0
    """Steps trained per second over the window, waits included."""
    queue_capacity: int = 0
    """The most mini-batches that can be ready (0: not reported)."""


@dataclass(frozen=True)
class PodUsage:
    """A pod's newest CPU and memory use (``UsageSample``)."""

    role: str
    """``worker``, ``ps``, ``chief`` or ``data_worker``."""
    cpu_used: float
    memory_used_bytes: int
    cpu_limit: float
    plan_version: int
    sampled_at: float


@dataclass(frozen=True)
class Window:
    """Step reports of the current plan not yet closed into a sample."""

    started_at: float = -1.0
    """``reported_at`` of the first report, minus its step time span; -1 when empty."""
    ended_at: float = -1.0
    steps: int = 0
    weighted_rate: float = 0.0
    """Sum of samples/s x steps, so the window's rate is weighted by steps."""

    @property
    def rate(self) -> float:
        """Samples per second over the window."""
        return self.weighted_rate / self.steps if self.steps else 0.0

    @property
    def span(self) -> float:
        """Seconds the window covers."""
        return self.ended_at - self.started_at if self.steps else 0.0


@dataclass(frozen=True)
class WindowRule:
    """When a window closes."""

    tick_seconds: float
    """Training time one sample covers (the simulator's TICK_SECONDS is 180 s)."""


@dataclass(frozen=True)
class Observations:
    """The optimizer's view of one job (module docstring)."""

    plan_version: int = 0
    """The plan the current window measures."""
    request: Pods | None = None
    """The job's first plan's pods: the stage step's start without history."""
    pods: Pods | None = None
    """The current plan's pods (None: the plan has no worker or no PS role)."""
    window: Window = field(default_factory=Window)
    samples: tuple[Sample, ...] = ()
    sample_count: int = 0
    last_fit_sample_count: int = -1
    memory_points: tuple[MemoryPoint, ...] = ()
    consumed: int = 0
    usage: dict[str, PodUsage] = field(default_factory=dict)
    """Newest usage per pod of the current plan."""
    last_report: dict[str, float] = field(default_factory=dict)
    """Newest ``reported_at`` per pod (out-of-order detection)."""
    pending: int = -1
    """``sample_count`` whose decision is due and not yet made (-1: none). Stored before
    deciding, so a restart finds and makes it."""
    outliers: int = 0
    """Windows dropped as outliers."""
    last_plan_at: float = -1.0
    """When the optimizer last published a plan for the job (seconds since the epoch)."""
    hold_until: float = -1.0
    """An operator's plan holds until then: the stage step's changes are not published."""
    closed_at: float = -1.0
    """When the newest window closed, on the job's clock (its reports' time)."""
    started_at: float = -1.0
    """When the job's first window began, on the job's clock (-1 before it did)."""
    loaded: dict[str, float] = field(default_factory=dict)
    """GiB per PS of the job's first plan, gathered for the first memory point when that
    plan was replaced before its usage was applied (see :func:`add_usage`)."""
    input_queue: InputQueue | None = None
    """The chief's input queue in the newest step report that had one."""
    feeding: Feeding = field(default_factory=Feeding)
    """GoldMiner's data-worker tuning of the job (:mod:`.feeding`)."""

    def for_plan(
        self, version: int, pods: Pods | None, at: float, data_workers: int = 0
    ) -> Observations:
        """The view once plan ``version`` (with ``data_workers``) is published: a new
        window and tuning interval, fresh usage."""
        return replace(
            self,
            plan_version=version,
            request=self.request if self.request is not None else pods,
            pods=pods,
            window=Window(),
            usage={},
            pending=-1,
            last_plan_at=at,
            feeding=self.feeding.for_plan(data_workers),
        )


def add_steps(
    view: Observations, report: StepReport, rule: WindowRule, feed: FeedRule | None = None
) -> Observations:
    """``view`` with ``report`` applied; a decision is due when it closed a window, a
    tuning step when its input queue closed an interval (``feed``: None tunes nothing).

    A report already applied (same pod, same time) returns ``view`` unchanged (redelivery);
    an older one raises :class:`MetricRefused`, as do impossible values.
    """
    _check_report(report)
    seen = view.last_report.get(report.pod_name)
    if seen is not None and report.reported_at == seen:
        return view
    if seen is not None and report.reported_at < seen:
        raise MetricRefused(
            "reported_at",
            f"{report.pod_name} reported {seen - report.reported_at:.3f} s before its "
            "previous report (out of order)",
        )
    view = replace(view, last_report={**view.last_report, report.pod_name: report.reported_at})
    if report.input_queue is not None:
        view = replace(view, input_queue=report.input_queue)
        if feed is not None and report.plan_version == view.plan_version:
            view = replace(view, feeding=_fed(view.feeding, report, feed))
    view = replace(view, consumed=max(view.consumed, report.samples_consumed))
    if report.plan_version != view.plan_version or view.pods is None or view.pending >= 0:
        # Another plan's steps (the job is moving), a job the stage step cannot size, or a
        # decision still due: nothing to sample.
        return view
    window = view.window
    begin = report.reported_at - report.steps * report.step_seconds
    if view.started_at < 0:
        view = replace(view, started_at=begin)
    window = Window(
        started_at=begin if window.steps == 0 else window.started_at,
        ended_at=report.reported_at,
        steps=window.steps + report.steps,
        weighted_rate=window.weighted_rate + report.samples_per_second * report.steps,
    )
    if window.span < rule.tick_seconds or window.rate <= 0:
        return replace(view, window=window)
    return _close(replace(view, window=Window(), closed_at=window.ended_at), window.rate)


def _fed(feeding: Feeding, report: StepReport, rule: FeedRule) -> Feeding:
    queue = report.input_queue
    assert queue is not None
    window = QueueWindow(
        seconds=report.steps * report.step_seconds,
        steps_per_second=queue.steps_per_second,
        enqueue_rate=queue.enqueue_rate,
        dequeue_rate=queue.dequeue_rate,
        queue_length=queue.queue_length,
        queue_capacity=queue.queue_capacity,
    )
    return add_window(feeding, window, queue.data_workers, rule)


def training_utilization(view: Observations) -> float:
    """The chief's newest CPU use over its limit (0 before it reported usage)."""
    chief = [u for u in view.usage.values() if u.role == "chief" and u.cpu_limit > 0]
    return chief[-1].cpu_used / chief[-1].cpu_limit if chief else 0.0


def _close(view: Observations, rate: float) -> Observations:
    assert view.pods is not None
    same = [s.throughput for s in view.samples if s.pods == view.pods]
    if same and not (
        statistics.median(same) / OUTLIER_FACTOR <= rate <= statistics.median(same) * OUTLIER_FACTOR
    ):
        return replace(view, outliers=view.outliers + 1)
    samples = [*view.samples, Sample(view.pods, rate)]
    indices = [i for i, s in enumerate(samples) if s.pods == view.pods]
    if len(indices) > SAMPLES_PER_CONFIG:
        del samples[indices[0]]
    count = view.sample_count + 1
    return replace(view, samples=tuple(samples), sample_count=count, pending=count)


def with_memory_point(view: Observations) -> Observations:
    """``view`` with a memory point from its PS's usage now (taken when the window's
    decision is made, once the PS reported their usage of the window: see
    :func:`measured`), bounded to :data:`MEMORY_WINDOW` points."""
    point = memory_point(view)
    if point is None:
        return view
    return replace(view, memory_points=(*view.memory_points, point)[-MEMORY_WINDOW:])


def memory_point(view: Observations) -> MemoryPoint | None:
    """(consumed, total PS GiB, busiest PS GiB) from the current plan's PS usage, or None
    before every PS reported."""
    ps = [u for u in view.usage.values() if u.role == "ps"]
    if view.pods is None or not ps or len(ps) < view.pods.ps:
        return None
    memories = [u.memory_used_bytes / GIB for u in ps]
    return MemoryPoint(float(view.consumed), sum(memories), max(memories))


def add_usage(view: Observations, pod_name: str, usage: PodUsage) -> Observations:
    """``view`` with a pod's newest usage (of the current plan; others are dropped)."""
    if not math.isfinite(usage.cpu_used) or usage.cpu_used < 0:
        raise MetricRefused("cpu_used", f"must be a finite number >= 0, got {usage.cpu_used}")
    if usage.memory_used_bytes < 0:
        raise MetricRefused("memory_used_bytes", f"must be >= 0, got {usage.memory_used_bytes}")
    if usage.plan_version != view.plan_version:
        return _loaded(view, pod_name, usage)
    known = view.usage.get(pod_name)
    if known is not None and usage.sampled_at <= known.sampled_at:
        return view
    view = replace(view, usage={**view.usage, pod_name: usage})
    if not view.memory_points:
        # The profiler's first memory sample: the PS as loaded, before training (the
        # simulator takes it when the job's pods start). Usage and steps travel on
        # different streams, so the first window may have closed before this usage, taken
        # before it began, is applied: it is still the first sample, at 0 samples consumed.
        point = memory_point(view)
        ps = [u for u in view.usage.values() if u.role == "ps"]
        if point is not None and view.sample_count == 0:
            view = replace(view, memory_points=(point,))
        elif point is not None and all(u.sampled_at <= view.started_at for u in ps):
            view = replace(view, memory_points=(replace(point, consumed=0.0),))
    return view


def _loaded(view: Observations, pod_name: str, usage: PodUsage) -> Observations:
    """The first plan's PS usage applied after a newer plan (an OOM kill right after the
    pods loaded: the kill and the usage travel on different streams). Other plans' usage
    is dropped; this one still is the pods-as-loaded measurement the first memory point
    needs, so it is gathered until every PS of the first plan reported."""
    if (
        view.memory_points
        or usage.role != "ps"
        or usage.plan_version != 1
        or view.plan_version <= 1
        or view.request is None
    ):
        return view
    loaded = {**view.loaded, pod_name: usage.memory_used_bytes / GIB}
    if len(loaded) < view.request.ps:
        return replace(view, loaded=loaded)
    point = MemoryPoint(0.0, sum(loaded.values()), max(loaded.values()))
    return replace(view, loaded={}, memory_points=(point,))


def job_clock(view: Observations, fallback: float) -> float:
    """Now on the job's clock: the time of its newest report, or ``fallback`` (the wall
    clock) before it reported. Holds and intervals are measured on it, so a job whose
    agents run on an accelerated clock (``stride loadgen``) is held as long in its time
    as a real one is in ours."""
    return max(view.last_report.values(), default=fallback)


def measured(view: Observations, rule: WindowRule) -> bool:
    """Whether every worker and PS of the current plan reported its usage, each PS within
    the window a due decision is on (its memory makes the window's memory point): the stage
    step sizes memory from them, so a decision waits for them. Usage and steps travel on
    different streams, so either may arrive first."""
    if view.pods is None:
        return False
    # Strictly after the window's start: a sample taken at the very moment the previous
    # window closed measured that window (an agent stamps both with one clock).
    fresh_after = view.closed_at - rule.tick_seconds if view.pending >= 0 else -math.inf
    workers = sum(u.role == "worker" for u in view.usage.values())
    ps = sum(u.role == "ps" and u.sampled_at > fresh_after for u in view.usage.values())
    return workers >= view.pods.workers and ps >= view.pods.ps


def worker_memory_used_gib(view: Observations) -> float:
    """The most memory any worker of the current plan uses, in GiB (0 before a report)."""
    used = [u.memory_used_bytes for u in view.usage.values() if u.role == "worker"]
    return max(used, default=0) / GIB


def hot_ps(view: Observations) -> bool:
    """Whether the busiest PS uses clearly more CPU than the PS mean (and there are two)."""
    cpu = [u.cpu_used for u in view.usage.values() if u.role == "ps"]
    if len(cpu) < 2 or sum(cpu) <= 0:
        return False
    return max(cpu) > HOT_PS_FACTOR * (sum(cpu) / len(cpu))


def stragglers(view: Observations) -> tuple[str, ...]:
    """Workers using less than :data:`STRAGGLER_FRACTION` of the workers' median CPU."""
    workers = {name: u.cpu_used for name, u in view.usage.items() if u.role == "worker"}
    if len(workers) < 2:
        return ()
    median = statistics.median(workers.values())
    return tuple(sorted(n for n, cpu in workers.items() if cpu < STRAGGLER_FRACTION * median))


def _check_report(report: StepReport) -> None:
    if report.steps < 1:
        raise MetricRefused("steps", f"must be at least 1, got {report.steps}")
    for name in ("samples_per_second", "step_seconds", "reported_at"):
        value = getattr(report, name)
        if not math.isfinite(value) or value < 0:
            raise MetricRefused(name, f"must be a finite number >= 0, got {value}")
    if report.samples_consumed < 0:
        raise MetricRefused("samples_consumed", f"must be >= 0, got {report.samples_consumed}")
    if report.plan_version < 0:
        raise MetricRefused("plan_version", f"must be >= 0, got {report.plan_version}")


# --- Storage form ----------------------------------------------------------------------


def _pods(value: Any) -> Pods | None:
    return None if value is None else Pods(**value)


def to_json(view: Observations) -> str:
    """The view as JSON (the optimizer stores it beside the administrator)."""

    def pods(p: Pods | None) -> dict[str, int] | None:
        return None if p is None else p.__dict__.copy()

    return json.dumps(
        {
            "plan_version": view.plan_version,
            "request": pods(view.request),
            "pods": pods(view.pods),
            "window": view.window.__dict__,
            "samples": [[pods(s.pods), s.throughput] for s in view.samples],
            "sample_count": view.sample_count,
            "last_fit_sample_count": view.last_fit_sample_count,
            "memory_points": [list(p.__dict__.values()) for p in view.memory_points],
            "consumed": view.consumed,
            "usage": {name: u.__dict__ for name, u in view.usage.items()},
            "last_report": view.last_report,
            "pending": view.pending,
            "outliers": view.outliers,
            "last_plan_at": view.last_plan_at,
            "hold_until": view.hold_until,
            "closed_at": view.closed_at,
            "started_at": view.started_at,
            "loaded": view.loaded,
            "input_queue": None if view.input_queue is None else view.input_queue.__dict__,
            "feeding": to_dict(view.feeding),
        },
        sort_keys=True,
    )


def from_json(text: str) -> Observations:
    """The view stored by :func:`to_json`."""
    data = json.loads(text)
    return Observations(
        plan_version=data["plan_version"],
        request=_pods(data["request"]),
        pods=_pods(data["pods"]),
        window=Window(**data["window"]),
        samples=tuple(Sample(Pods(**p), rate) for p, rate in data["samples"]),
        sample_count=data["sample_count"],
        last_fit_sample_count=data["last_fit_sample_count"],
        memory_points=tuple(MemoryPoint(*p) for p in data["memory_points"]),
        consumed=data["consumed"],
        usage={name: PodUsage(**u) for name, u in data["usage"].items()},
        last_report={k: float(v) for k, v in data["last_report"].items()},
        pending=data["pending"],
        outliers=data["outliers"],
        last_plan_at=data["last_plan_at"],
        hold_until=data["hold_until"],
        closed_at=data["closed_at"],
        started_at=data.get("started_at", -1.0),
        loaded={k: float(v) for k, v in data.get("loaded", {}).items()},
        input_queue=InputQueue(**queue) if (queue := data.get("input_queue")) else None,
        feeding=from_dict(Feeding, data["feeding"]) if "feeding" in data else Feeding(),
    )
