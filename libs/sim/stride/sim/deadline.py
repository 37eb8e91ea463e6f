"""Environment A: deadline training jobs on a GPU cluster (ElasticFlow, seed 001 sec. 6).

Why it exists: to replay ElasticFlow's traces through Stride's ElasticFlow policies
(unchanged, from ``stride.policy.elasticflow``) and through baselines under one cluster,
one set of curves and one scaling-overhead model, and report the paper's metrics.

Model
- A job needs ``iterations`` (the trace's ``num_iteration``) and progresses at
  ``curve.throughput(devices)`` iterations/s, where the curve is the measured A100 table
  made concave (``stride.sim.traces.CurveLibrary``).
- Placement: under the Stride policy the GPUs are placed on the cluster's switch/node/GPU
  tree by the library's buddy allocation (sec. 4.3) whenever the tree's fan-outs below the
  top are powers of two (every ``cluster_specs`` shape ElasticFlow used for these traces).
  Jobs that change size are released and re-placed, largest first; a job moved to free an
  aligned block is a migration and pauses like a rescale. Placement does not change
  throughput (the measured tables are per GPU count). Baselines count GPUs.
- Scaling overhead: every time a job's GPU count changes to a non-zero value (start,
  resume, scale up or down) it pauses for :data:`SCALING_PAUSE_SECONDS` and makes no progress
  while holding its new GPUs. ElasticFlow sec. 6.6 / Fig. 12(b) measures the interval from
  suspend to restart per model and case and calls it marginal against a ~23 minute
  scheduling interval; the text gives no numbers, so we take one fixed pause of 20 s (our
  reading of Fig. 12(b)'s order of magnitude; a parameter of :func:`run_deadline`).
- Scheduling rounds run on every arrival and completion (sec. 3.2: "upon each scheduling
  event, such as job arrival or completion"). Jobs whose deadline passes keep running to
  completion (they count as missed); jobs dropped by admission control end at arrival.

Admission is incremental by default (:class:`GuaranteePlanner`, through the library's
``AdmissionControl``): at an arrival the guaranteed set and its plans are exactly those of
re-running Algorithm 1 from scratch (at a completion within the same 300 s slot the last
plans are kept: a completion only frees reservations), but an arrival is admitted when it
fits what the guaranteed jobs' plans leave free even where a from-scratch re-plan in
deadline order would fail a later job, and the round at that instant keeps those plans.
Results therefore differ from ``run_deadline(..., incremental=False)`` (the from-scratch
reference, kept for benchmarks):
on the first 300 jobs of ``itp-ef/cluster04.csv`` it drops fewer jobs and meets more
deadlines; on ``cluster01`` it drops the same jobs and meets about as many
(``bench/results/sim_speed.txt``). In an overloaded cluster, admission outcomes cascade:
small changes early (a 20 s migration pause) move the DSR of a long trace by a few points
either way, so compare policies on whole traces, not single jobs.

Baselines: EDF (elastic), EDF with admission control, Gandiva-like FIFO here;
Tiresias, Themis and Chronus in :mod:`stride.sim.deadline_baselines`.

Metrics (sec. 6.1): deadline satisfactory ratio (DSR) overall and split by lambda >= 1 /
lambda < 1 (traces README), cluster efficiency eq. 8 averaged over time up to the makespan,
best-effort JCT, makespan and scaling events.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import (
    SCALING_PAUSE_SECONDS,
    SLOT_SECONDS,
    GuaranteePlanner,
    GuaranteePolicy,
    admission_test,
)
from stride.policy.elasticflow.placement import InvalidPlacement, Placements, Topology
from stride.policy.elasticflow.priorities import unit_weight
from stride.sim.deadline_baselines import (
    ChronusPolicy,
    GandivaPolicy,
    ThemisPolicy,
    TiresiasPolicy,
)
from stride.sim.deadline_ef_policies import (
    EF_MODEL_POLICIES,
    ElasticFlowNoAdmissionPolicy,
    ElasticFlowPolicy,
    edf_now,
    ef_model_policy,
)
from stride.sim.deadline_rounds import DEFAULT_SLOT_SECONDS, RoundJob, ef_overhead, run_rounds
from stride.sim.deadline_views import DeadlinePolicy, DeadlineView, JobView
from stride.sim.engine import Event, EventKind, Simulation, SimulationError
from stride.sim.traces import ClusterSpec, CurveLibrary, TraceJob

__all__ = [
    "EF_MODEL_POLICIES",
    "MODELS",
    "POLICIES",
    "SCALING_PAUSE_SECONDS",
    "SLOT_SECONDS",
    "DeadlineCluster",
    "DeadlinePolicy",
    "DeadlineResult",
    "DeadlineView",
    "JobView",
    "PhysicalBound",
    "physical_bound",
    "run_deadline",
]

_EPSILON = 1e-6

StridePolicy = GuaranteePolicy
"""ElasticFlow as Stride runs it, from :mod:`stride.policy.elasticflow.guarantees`: the same
class the admission service runs, so ``stride sim`` and the live service decide alike."""


@dataclass(frozen=True)
class DeadlineCluster:
    """A GPU cluster: its size and, when known, its switch/node/GPU tree (for placement)."""

    num_gpus: int
    name: str = ""
    fanouts: tuple[int, ...] | None = None
    """Switches, nodes per switch, GPUs per node; None = GPUs are counted, not placed."""

    def __post_init__(self) -> None:
        if self.num_gpus <= 0:
            raise SimulationError(f"cluster.num_gpus: must be > 0, got {self.num_gpus}")
        if self.fanouts is not None and math.prod(self.fanouts) != self.num_gpus:
            raise SimulationError(
                f"cluster.fanouts: {self.fanouts} hold {math.prod(self.fanouts)} GPUs, "
                f"num_gpus is {self.num_gpus}"
            )

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> DeadlineCluster:
        """The cluster a ``cluster_specs`` file describes, with its topology."""
        fanouts = (spec.num_switch, spec.num_node_p_switch, spec.num_gpu_p_node)
        return cls(spec.total_gpus, spec.source, fanouts)

    def buddy_topology(self) -> Topology | None:
        """The tree buddy placement can use: below the top, every fan-out a power of two."""
        if self.fanouts is None:
            return None
        if any(fanout & (fanout - 1) for fanout in self.fanouts[1:]):
            return None
        return Topology(self.fanouts, ("switch", "node", "gpu"))


@dataclass
class EdfPolicy:
    """EDF, elastic to each job's maximum useful size, no admission control (sec. 6.1)."""

    name: str = "edf"

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Always admits."""
        return True

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Event-driven only."""
        return None

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """See :func:`~stride.sim.deadline_ef_policies.edf_now`."""
        return edf_now(view)


@dataclass
class EdfAdmissionPolicy:
    """EDF allocation behind ElasticFlow's admission test (an ablation of ours)."""

    name: str = "edf-ac"
    incremental: bool = True
    _planner: GuaranteePlanner = field(default_factory=GuaranteePlanner, repr=False)

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Event-driven only."""
        return None

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """The same admission test as :class:`StridePolicy`."""
        if self.incremental:
            return self._planner.admit(view, candidate)
        return admission_test(view, candidate)

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """See :func:`~stride.sim.deadline_ef_policies.edf_now`."""
        return edf_now(view)


POLICIES: Mapping[
    str,
    type[
        StridePolicy
        | EdfPolicy
        | EdfAdmissionPolicy
        | GandivaPolicy
        | TiresiasPolicy
        | ThemisPolicy
        | ChronusPolicy
        | ElasticFlowPolicy
    ],
] = {
    "stride": StridePolicy,
    "elasticflow": ElasticFlowPolicy,
    "elasticflow-noac": ElasticFlowNoAdmissionPolicy,
    "edf": EdfPolicy,
    "edf-ac": EdfAdmissionPolicy,
    "gandiva": GandivaPolicy,
    "tiresias": TiresiasPolicy,
    "themis": ThemisPolicy,
    "chronus": ChronusPolicy,
}
"""Policy names accepted by :func:`run_deadline` (baselines of ElasticFlow sec. 6.1)."""


@dataclass(frozen=True)
class DeadlineResult:
    """Metrics of one run (ElasticFlow sec. 6.1) plus per-job outcomes.

    Ratios are None when their group is empty. ``finish_times`` maps every job to its
    completion time, or None if it was dropped; ``dropped`` lists the dropped jobs.
    """

    policy: str
    seed: int
    jobs: int
    deadline_jobs: int
    met: int
    dsr: float | None
    dsr_lambda_ge_1: float | None
    dsr_lambda_lt_1: float | None
    cluster_efficiency: float
    best_effort_jct: float | None
    makespan: float
    scaling_events: int
    dropped: tuple[str, ...]
    peak_gpus_in_use: int
    migrations: int = 0
    """Jobs moved to other GPUs at the same size (buddy repacking), each paying the pause."""
    placement: str = "counted"
    """``buddy`` when GPUs were placed on the cluster's tree, ``counted`` otherwise."""
    model: str = "stride"
    """The cost model (:data:`MODELS`)."""
    admitted: int = 0
    """Jobs accepted at arrival (every job, for policies without admission control)."""
    declined: int = 0
    """Jobs refused at arrival (``len(dropped)``)."""
    best_effort: int = 0
    """Jobs without a deadline (``best_effort_fraction``)."""
    admitted_hard_met: float | None = None
    """Of the admitted jobs with a deadline, the share that met it: the guarantee kept."""
    curve_error: float = 0.0
    """Each job's true curve is its profiled one times a seeded factor in ``1 +- curve_error``."""
    finish_times: Mapping[str, float | None] = field(default_factory=dict)
    gpu_usage: tuple[tuple[float, int], ...] = ()
    """(time, GPUs allocated from then on) at every scheduling round, for the usage plot."""


@dataclass
class _Job:
    trace: TraceJob
    curve: ScalingCurve
    deadline: float | None
    remaining: float
    unit_throughput: float
    devices: int = 0
    paused_until: float = 0.0
    last_update: float = 0.0
    version: int = 0
    ever_ran: bool = False
    finish: float | None = None
    ended: bool = False
    rate_devices: int = 0
    rate_value: float = 0.0
    attained: float = 0.0
    cached_view: JobView | None = None
    weight: float = 0.5
    """KOD2's weight on this cluster (the order within a priority class)."""
    waiting_since: float | None = None
    """Since when the job has held no GPUs (None while it holds some), as admission keeps it."""
    speed: float = 1.0
    """True throughput over profiled (``curve_error``): the policy sees the profiled curve."""
    measured: bool = False
    """Whether the job has made progress (its throughput is then measured, as the live
    agent reports it): its view carries ``measured_speed``."""

    def view(self) -> JobView:
        if self.cached_view is not None:
            return self.cached_view
        self.cached_view = JobView(
            self.trace.job_id,
            self.curve,
            self.remaining,
            self.deadline,
            self.trace.submission_time,
            self.trace.num_gpu,
            self.devices,
            self.paused_until,
            self.trace.iterations,
            self.attained,
            weight=self.weight,
            waiting_since=self.waiting_since,
            measured_speed=self.speed if self.measured and self.speed != 1.0 else None,
        )
        return self.cached_view

    def rate(self) -> float:
        if not self.devices:
            return 0.0
        if self.rate_devices != self.devices:  # cached: advance() asks on every event
            self.rate_devices = self.devices
            self.rate_value = self.curve.throughput(self.devices) * self.speed
        return self.rate_value


class _Environment:
    def __init__(
        self,
        jobs: list[_Job],
        capacity: int,
        policy: DeadlinePolicy,
        pause: float,
        topology: Topology | None = None,
    ) -> None:
        self.jobs = {job.trace.job_id: job for job in jobs}
        self.capacity = capacity
        self.policy = policy
        self.pause = pause
        self.topology = topology
        self.placements = Placements(topology) if topology is not None else None
        self.active: dict[str, _Job] = {}
        self.running: dict[str, _Job] = {}
        """The active jobs holding GPUs: only they progress, so only they are advanced."""
        self.views: dict[str, JobView] = {}
        """Each active job's view, in admission order (thousands wait in overload)."""
        self.stale: set[str] = set()
        """Active jobs whose view changed since :meth:`view` last ran."""
        self.dropped: list[str] = []
        self.scaling_events = 0
        self.migrations = 0
        self.peak = 0
        self.efficiency_area = 0.0
        self.clock = 0.0
        self.round_at: float | None = None
        self.timer_at: float | None = None
        self.usage: list[tuple[float, int]] = []

    def view(self, now: float) -> DeadlineView:
        for job_id in self.stale:
            self.views[job_id] = self.active[job_id].view()
        self.stale.clear()
        return DeadlineView(now, self.capacity, tuple(self.views.values()), self.pause)

    def advance(self, now: float) -> None:
        """Account progress, attained service and eq. 8 efficiency up to ``now``."""
        area = 0.0
        for job_id, job in self.running.items():
            job.cached_view = None
            self.stale.add(job_id)
            job.attained += job.devices * (now - job.last_update)
            start = max(job.last_update, job.paused_until)
            if now > start:  # exact: no progress (and no efficiency) while paused
                job.measured = True
                rate = job.rate()
                job.remaining = max(0.0, job.remaining - rate * (now - start))
                area += rate / (job.unit_throughput * job.speed) * (now - start)
            job.last_update = now
        self.efficiency_area += area
        self.clock = now

    def request_round(self, sim: Simulation) -> None:
        if self.round_at != sim.now:
            self.round_at = sim.now
            sim.schedule(sim.now, EventKind.SCHEDULING_ROUND)

    def finish(self, job: _Job, now: float) -> None:
        if job.ended:
            raise SimulationError(f"job {job.trace.job_id}: ended twice")
        job.ended = True
        job.finish = now
        job.devices = 0
        job.cached_view = None
        if self.placements is not None:
            self.placements.forget(job.trace.job_id)
        self.running.pop(job.trace.job_id, None)
        self.active.pop(job.trace.job_id, None)
        self.views.pop(job.trace.job_id, None)
        self.stale.discard(job.trace.job_id)

    def handle(self, sim: Simulation, event: Event) -> None:
        if event.kind is EventKind.COMPLETION:
            job = self.jobs[str(event.job_id)]
            if job.ended or event.payload != job.version:
                return  # superseded by a later re-allocation: nothing happened
        self.advance(sim.now)
        if event.kind is EventKind.ARRIVAL:
            assert isinstance(event.payload, tuple)
            group = [self.jobs[job_id] for job_id in event.payload]
            for job in group:
                job.last_update = sim.now
                job.waiting_since = sim.now
                job.cached_view = None
            admit_group = getattr(self.policy, "admit_group", None)
            if admit_group is not None:  # all-or-nothing per arrival event
                said = admit_group(self.view(sim.now), tuple(job.view() for job in group))
                verdicts = [said] * len(group) if isinstance(said, bool) else list(said)
            else:
                verdicts = []
                for job in group:
                    verdict = self.policy.admit(self.view(sim.now), job.view())
                    verdicts.append(verdict)
                    if verdict:
                        self.active[job.trace.job_id] = job
                        self.views[job.trace.job_id] = job.view()
            for job, verdict in zip(group, verdicts, strict=True):
                if verdict:
                    self.active[job.trace.job_id] = job
                    self.views[job.trace.job_id] = job.view()
                    self.request_round(sim)
                else:
                    job.ended = True
                    self.dropped.append(job.trace.job_id)
        elif event.kind is EventKind.COMPLETION:
            job = self.jobs[str(event.job_id)]
            self.finish(job, sim.now)
            self.request_round(sim)
        elif event.kind is EventKind.TIMER:
            if event.time == self.timer_at:  # a later wakeup replaced an earlier one
                self.timer_at = None
                self.request_round(sim)
        elif event.kind is EventKind.SCHEDULING_ROUND:
            self.round(sim)

    def place(self, decision: dict[str, int]) -> set[str]:
        """Buddy placement (sec. 4.3) of the decision; returns the jobs that migrate."""
        assert self.placements is not None
        try:
            return self.placements.apply(decision, self.active)
        except InvalidPlacement as error:
            raise SimulationError(f"buddy placement failed: {error}") from None

    def round(self, sim: Simulation) -> None:
        view = self.view(sim.now)
        decision = self.policy.decide(view)
        total = 0
        for job_id, count in decision.items():
            if job_id not in self.active or count < 0:
                raise SimulationError(
                    f"policy {self.policy.name}: bad allocation {count} for job {job_id!r}"
                )
            total += count
        if total > self.capacity:
            raise SimulationError(
                f"policy {self.policy.name}: allocated {total} GPUs, capacity {self.capacity}"
            )
        self.peak = max(self.peak, total)
        if self.usage and self.usage[-1][0] == sim.now:
            self.usage[-1] = (sim.now, total)
        else:
            self.usage.append((sim.now, total))
        migrating = self.place(decision) if self.topology is not None else set()
        for job_id, job in self.active.items():
            count = decision.get(job_id, 0)
            if count == job.devices and job_id not in migrating:
                continue
            if job_id in migrating and count == job.devices:
                self.migrations += 1
            elif job.ever_ran:
                self.scaling_events += 1
            job.cached_view = None
            self.stale.add(job_id)
            if not job.devices:
                job.last_update = sim.now  # progress and service count from now
            job.devices = count
            job.version += 1
            job.waiting_since = None if count else sim.now
            if count == 0:
                self.running.pop(job_id, None)
                continue
            self.running[job_id] = job
            job.ever_ran = True
            job.paused_until = sim.now + self.pause
            rate = job.rate()
            if rate <= 0:
                raise SimulationError(f"job {job_id}: zero throughput on {count} GPUs")
            sim.schedule(
                job.paused_until + job.remaining / rate, EventKind.COMPLETION, job_id, job.version
            )
        wakeup = self.policy.wakeup(view, decision)
        if (
            wakeup is not None
            and wakeup > sim.now
            and (self.timer_at is None or wakeup < self.timer_at)
        ):
            self.timer_at = wakeup
            sim.schedule(wakeup, EventKind.TIMER)


MODELS = ("stride", "elasticflow")
"""Cost models: ``stride`` (ours, the default, this module) and ``elasticflow`` (ElasticFlow's
published simulator's, :mod:`stride.sim.deadline_rounds`)."""


def _check(
    policy_name: str,
    model: str,
    trace_jobs: Sequence[TraceJob],
    best_effort_fraction: float,
    pause_seconds: float,
    curve_error: float,
) -> None:
    known = POLICIES if model == "stride" else EF_MODEL_POLICIES
    if model not in MODELS:
        raise SimulationError(f"model: unknown {model!r} (known: {', '.join(MODELS)})")
    if policy_name not in known:
        raise SimulationError(
            f"policy_name: unknown {policy_name!r} under model {model} "
            f"(known: {', '.join(sorted(known))})"
        )
    if not trace_jobs:
        raise SimulationError("trace_jobs: is empty")
    if not 0.0 <= best_effort_fraction <= 1.0:
        raise SimulationError(
            f"best_effort_fraction: must be in [0, 1], got {best_effort_fraction}"
        )
    if pause_seconds < 0 or not math.isfinite(pause_seconds):
        raise SimulationError(f"pause_seconds: must be finite and >= 0, got {pause_seconds}")
    if not 0.0 <= curve_error < 1.0:
        raise SimulationError(f"curve_error: must be in [0, 1), got {curve_error}")


def _draws(
    seed: int, count: int, best_effort_fraction: float, curve_error: float
) -> tuple[Any, Any]:
    """The seed's only uses: which jobs are best effort, and each job's true speed factor.

    Both come from ``numpy.random.default_rng(seed)`` in that order, so with neither option
    the seed changes nothing (the trace fixes everything else)."""
    rng = np.random.default_rng(seed)
    best_effort = rng.random(count) < best_effort_fraction
    speeds = 1.0 + rng.uniform(-curve_error, curve_error, count) if curve_error else np.ones(count)
    return best_effort, speeds


def run_deadline(
    trace_jobs: Sequence[TraceJob],
    cluster: DeadlineCluster,
    policy_name: str,
    seed: int,
    curves: CurveLibrary,
    *,
    pause_seconds: float = SCALING_PAUSE_SECONDS,
    best_effort_fraction: float = 0.0,
    incremental: bool = True,
    model: str = "stride",
    slot: float = DEFAULT_SLOT_SECONDS,
    curve_error: float = 0.0,
) -> DeadlineResult:
    """Replay ``trace_jobs`` on ``cluster`` under a policy from :data:`POLICIES` (or, with
    ``model="elasticflow"``, :data:`EF_MODEL_POLICIES`).

    ``best_effort_fraction`` of the jobs lose their deadline (ElasticFlow sec. 6.5's mix);
    with ``curve_error`` E each job's true throughput is its profiled curve's times a factor
    drawn uniformly from ``[1 - E, 1 + E]`` while every policy sees the profiled curve. Both
    draws come from ``numpy.random.default_rng(seed)``: they are the seed's only uses, so
    without them the seed changes nothing. ``incremental=False`` makes the admission
    policies re-run Algorithm 1 from scratch at every decision (the slow reference; see
    :class:`GuaranteePlanner` for how the two can differ). ``model="elasticflow"`` replays
    the trace as ElasticFlow's published simulator does, in rounds at least ``slot``
    seconds apart (:mod:`stride.sim.deadline_rounds`); ``pause_seconds`` is then unused
    (that model's overhead is its own).
    """
    _check(policy_name, model, trace_jobs, best_effort_fraction, pause_seconds, curve_error)
    best_effort, speeds = _draws(seed, len(trace_jobs), best_effort_fraction, curve_error)
    for trace in trace_jobs:
        curve = curves.curve(trace)
        if curve.sizes[0] > cluster.num_gpus:
            raise SimulationError(
                f"{trace.source}:{trace.line} model_name: {trace.model_name} needs "
                f"{curve.sizes[0]} GPUs, cluster has {cluster.num_gpus}"
            )
        if policy_name in _FIXED_SIZE and trace.num_gpu > cluster.num_gpus:
            raise SimulationError(
                f"{trace.source}:{trace.line} num_gpu: {trace.num_gpu} exceeds the cluster's "
                f"{cluster.num_gpus} GPUs"
            )
    if model == "elasticflow":
        return _run_rounds(
            trace_jobs, cluster, policy_name, seed, curves, best_effort, speeds, slot, curve_error
        )
    policy_class = POLICIES[policy_name]
    policy: DeadlinePolicy
    if policy_class is StridePolicy or policy_class is EdfAdmissionPolicy:
        policy = policy_class(incremental=incremental)
    else:
        policy = policy_class()
    sim = Simulation(seed)
    jobs: list[_Job] = []
    for index, trace in enumerate(trace_jobs):
        curve = curves.curve(trace)
        first = curve.sizes[0]
        jobs.append(
            _Job(
                trace=trace,
                curve=curve,
                deadline=None if best_effort[index] else trace.deadline,
                remaining=trace.iterations,
                unit_throughput=curve.throughputs[0] / first,
                weight=unit_weight(first, first, cluster.num_gpus),
                speed=float(speeds[index]),
            )
        )
    topology = cluster.buddy_topology() if getattr(policy, "placement", "") == "buddy" else None
    environment = _Environment(jobs, cluster.num_gpus, policy, pause_seconds, topology)
    arriving: dict[float, list[str]] = {}
    for job in jobs:
        arriving.setdefault(job.trace.submission_time, []).append(job.trace.job_id)
    for at, group in arriving.items():
        sim.schedule(at, EventKind.ARRIVAL, group[0], tuple(group))
    sim.run(environment.handle)
    for job in jobs:
        if not job.ended:
            raise SimulationError(f"job {job.trace.job_id}: never ended")
    outcomes = [_Outcome(job.trace, job.deadline, job.finish) for job in jobs]
    return _result(
        policy_name,
        seed,
        outcomes,
        _Totals(
            capacity=environment.capacity,
            efficiency_area=environment.efficiency_area,
            scaling_events=environment.scaling_events,
            dropped=tuple(environment.dropped),
            peak=environment.peak,
            migrations=environment.migrations,
            placement="buddy" if environment.topology is not None else "counted",
            usage=tuple(environment.usage),
        ),
        model="stride",
        curve_error=curve_error,
    )


_FIXED_SIZE = frozenset({"gandiva", "tiresias", "themis", "chronus"})
"""Baselines that run a job on its trace GPU count only."""


def _run_rounds(
    trace_jobs: Sequence[TraceJob],
    cluster: DeadlineCluster,
    policy_name: str,
    seed: int,
    curves: CurveLibrary,
    best_effort: Any,
    speeds: Any,
    slot: float,
    curve_error: float,
) -> DeadlineResult:
    """``run_deadline`` under ElasticFlow's cost model (:mod:`stride.sim.deadline_rounds`)."""
    policy, charges, seen = ef_model_policy(policy_name, slot)
    jobs: list[RoundJob] = []
    for index, trace in enumerate(trace_jobs):
        raw = curves.raw_curve(trace)
        speed = float(speeds[index])
        if policy_name in _FIXED_SIZE:
            # Non-elastic: the trace's own rate on its own GPU count (the trace's duration).
            fixed = ScalingCurve((trace.num_gpu,), (trace.iterations / trace.duration,))
            shown, true = fixed, _scaled(fixed, speed)
        else:
            shown = curves.curve(trace) if seen == "envelope" else raw
            true = _scaled(raw, speed)
        first = shown.sizes[0]
        jobs.append(
            RoundJob(
                job_id=trace.job_id,
                submission_time=trace.submission_time,
                deadline=None if best_effort[index] else trace.deadline,
                total_iterations=trace.iterations,
                num_gpu=trace.num_gpu,
                seen_curve=shown,
                true_curve=true,
                weight=unit_weight(first, first, cluster.num_gpus),
                speed=speed,
            )
        )
    outcome = run_rounds(
        jobs,
        cluster.num_gpus,
        policy,
        slot=slot,
        charge_overhead=charges,
        pause_seconds=ef_overhead(64, restart=False, cached=False, cluster_gpus=cluster.num_gpus),
    )
    by_id = {job.job_id: job for job in jobs}
    for job in jobs:
        if not job.ended:
            raise SimulationError(f"job {job.job_id}: never ended")
    outcomes = [
        _Outcome(trace, by_id[trace.job_id].deadline, by_id[trace.job_id].finish)
        for trace in trace_jobs
    ]
    return _result(
        policy_name,
        seed,
        outcomes,
        _Totals(
            capacity=cluster.num_gpus,
            efficiency_area=outcome.efficiency_area,
            scaling_events=outcome.scaling_events,
            dropped=tuple(outcome.dropped),
            peak=outcome.peak,
            migrations=0,
            placement="counted",
            usage=tuple(outcome.usage),
        ),
        model="elasticflow",
        curve_error=curve_error,
    )


def _scaled(curve: ScalingCurve, speed: float) -> ScalingCurve:
    if speed == 1.0:
        return curve
    return ScalingCurve(curve.sizes, tuple(value * speed for value in curve.throughputs))


@dataclass(frozen=True)
class _Outcome:
    trace: TraceJob
    deadline: float | None
    finish: float | None


@dataclass(frozen=True)
class _Totals:
    capacity: int
    efficiency_area: float
    scaling_events: int
    dropped: tuple[str, ...]
    peak: int
    migrations: int
    placement: str
    usage: tuple[tuple[float, int], ...]


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _result(
    policy: str,
    seed: int,
    jobs: list[_Outcome],
    totals: _Totals,
    *,
    model: str,
    curve_error: float,
) -> DeadlineResult:
    with_deadline = [job for job in jobs if job.deadline is not None]

    def met(job: _Outcome) -> bool:
        return (
            job.finish is not None
            and job.deadline is not None
            and job.finish <= job.deadline + _EPSILON
        )

    tight = [job for job in with_deadline if (job.trace.tightness or 0.0) < 1.0]
    loose = [job for job in with_deadline if (job.trace.tightness or 0.0) >= 1.0]
    finished = [job.finish for job in jobs if job.finish is not None]
    start = min(job.trace.submission_time for job in jobs)
    makespan = (max(finished) - start) if finished else 0.0
    best_effort = [
        job.finish - job.trace.submission_time
        for job in jobs
        if job.deadline is None and job.finish is not None
    ]
    met_count = sum(1 for job in with_deadline if met(job))
    dropped = set(totals.dropped)
    admitted_hard = [job for job in with_deadline if job.trace.job_id not in dropped]
    return DeadlineResult(
        policy=policy,
        seed=seed,
        jobs=len(jobs),
        deadline_jobs=len(with_deadline),
        met=met_count,
        dsr=_ratio(met_count, len(with_deadline)),
        dsr_lambda_ge_1=_ratio(sum(1 for job in loose if met(job)), len(loose)),
        dsr_lambda_lt_1=_ratio(sum(1 for job in tight if met(job)), len(tight)),
        cluster_efficiency=(
            (totals.efficiency_area / (totals.capacity * makespan)) if makespan else 0.0
        ),
        best_effort_jct=(sum(best_effort) / len(best_effort)) if best_effort else None,
        makespan=makespan,
        scaling_events=totals.scaling_events,
        dropped=totals.dropped,
        peak_gpus_in_use=totals.peak,
        migrations=totals.migrations,
        placement=totals.placement,
        model=model,
        admitted=len(jobs) - len(dropped),
        declined=len(dropped),
        best_effort=len(jobs) - len(with_deadline),
        admitted_hard_met=_ratio(sum(1 for job in admitted_hard if met(job)), len(admitted_hard)),
        curve_error=curve_error,
        finish_times={job.trace.job_id: job.finish for job in jobs},
        gpu_usage=totals.usage,
    )


@dataclass(frozen=True)
class PhysicalBound:
    """The share of a trace's deadline jobs that could meet their deadline running alone on
    the empty cluster, at their fastest size: no policy can do better on those groups."""

    all: float | None
    lambda_ge_1: float | None
    lambda_lt_1: float | None


def physical_bound(
    trace_jobs: Sequence[TraceJob],
    cluster: DeadlineCluster,
    curves: CurveLibrary,
    *,
    model: str = "stride",
    pause_seconds: float = SCALING_PAUSE_SECONDS,
) -> PhysicalBound:
    """:class:`PhysicalBound` of a trace under a cost model.

    Alone, a job starts at its arrival on its fastest size within the cluster and pays one
    start: under ``stride`` the pause, on the concave curve; under ``elasticflow`` one
    round's overhead on a new GPU range, on the raw row, its end rounded up to a second
    (as that simulator does). Every job with a deadline counts (best-effort draws aside).
    """
    if model not in MODELS:
        raise SimulationError(f"model: unknown {model!r} (known: {', '.join(MODELS)})")
    feasible: list[tuple[float, bool]] = []
    for trace in trace_jobs:
        if trace.deadline is None:
            continue
        if model == "stride":
            curve = curves.curve(trace)
            size = curve.usable(min(curve.max_size, cluster.num_gpus))
            rate = curve.throughput(size)
            end = trace.submission_time + pause_seconds + trace.iterations / rate
        else:
            raw = curves.raw_curve(trace)
            sizes = [size for size in raw.sizes if size <= cluster.num_gpus]
            size = max(sizes, key=raw.throughput)
            end = math.ceil(trace.submission_time + trace.iterations / raw.throughput(size))
            end += ef_overhead(size, restart=False, cached=False, cluster_gpus=cluster.num_gpus)
        feasible.append((trace.tightness or 0.0, end <= trace.deadline + _EPSILON))
    loose = [ok for tightness, ok in feasible if tightness >= 1.0]
    tight = [ok for tightness, ok in feasible if tightness < 1.0]
    return PhysicalBound(
        all=_ratio(sum(ok for _, ok in feasible), len(feasible)),
        lambda_ge_1=_ratio(sum(loose), len(loose)),
        lambda_lt_1=_ratio(sum(tight), len(tight)),
    )
