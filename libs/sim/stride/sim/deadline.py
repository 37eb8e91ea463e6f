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
from stride.sim.deadline_baselines import ChronusPolicy, ThemisPolicy, TiresiasPolicy
from stride.sim.deadline_views import DeadlinePolicy, DeadlineView, JobView, edf_key
from stride.sim.engine import Event, EventKind, Simulation, SimulationError
from stride.sim.traces import ClusterSpec, CurveLibrary, TraceJob

__all__ = [
    "POLICIES",
    "SCALING_PAUSE_SECONDS",
    "SLOT_SECONDS",
    "DeadlineCluster",
    "DeadlinePolicy",
    "DeadlineResult",
    "DeadlineView",
    "JobView",
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


def _edf_elastic(view: DeadlineView) -> dict[str, int]:
    """EDF: in deadline order each job takes its maximum useful size from what is free."""
    free = view.capacity
    result: dict[str, int] = {}
    for job in sorted(view.jobs, key=edf_key):
        take = job.curve.usable(min(job.curve.max_size, free))
        result[job.job_id] = take
        free -= take
    return result


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
        """See :func:`_edf_elastic`."""
        return _edf_elastic(view)


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
        """See :func:`_edf_elastic`."""
        return _edf_elastic(view)


@dataclass
class GandivaPolicy:
    """Gandiva-like: the trace's GPU count, strict FIFO (no backfill), no admission.

    Gandiva's time slicing and packing are not modelled; a job holds exactly ``num_gpu``
    GPUs from start to finish.
    """

    name: str = "gandiva"

    def admit(self, view: DeadlineView, candidate: JobView) -> bool:
        """Always admits."""
        return True

    def wakeup(self, view: DeadlineView, decision: dict[str, int]) -> float | None:
        """Event-driven only."""
        return None

    def decide(self, view: DeadlineView) -> dict[str, int]:
        """Running jobs keep their GPUs; waiting jobs start in arrival order while they fit."""
        free = view.capacity - sum(job.devices for job in view.jobs)
        result = {job.job_id: job.devices for job in view.jobs if job.devices}
        for job in sorted(view.jobs, key=lambda j: (j.submission_time, j.job_id)):
            if job.devices:
                continue
            if job.num_gpu > free:
                break
            result[job.job_id] = job.num_gpu
            free -= job.num_gpu
        return result


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
    ],
] = {
    "stride": StridePolicy,
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
    finish_times: Mapping[str, float | None] = field(default_factory=dict)


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
        )
        return self.cached_view

    def rate(self) -> float:
        if not self.devices:
            return 0.0
        if self.rate_devices != self.devices:  # cached: advance() asks on every event
            self.rate_devices = self.devices
            self.rate_value = self.curve.throughput(self.devices)
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
                rate = job.rate()
                job.remaining = max(0.0, job.remaining - rate * (now - start))
                area += rate / job.unit_throughput * (now - start)
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
            job = self.jobs[str(event.job_id)]
            job.last_update = sim.now
            job.waiting_since = sim.now
            job.cached_view = None
            if self.policy.admit(self.view(sim.now), job.view()):
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
) -> DeadlineResult:
    """Replay ``trace_jobs`` on ``cluster`` under a policy from :data:`POLICIES`.

    ``best_effort_fraction`` of the jobs, drawn with ``numpy.random.default_rng(seed)``,
    lose their deadline (ElasticFlow sec. 6.5's mix); it is the only use of the seed, so a
    run is fully determined by its arguments. ``incremental=False`` makes the admission
    policies re-run Algorithm 1 from scratch at every decision (the slow reference; see
    :class:`GuaranteePlanner` for how the two can differ).
    """
    if policy_name not in POLICIES:
        raise SimulationError(
            f"policy_name: unknown {policy_name!r} (known: {', '.join(sorted(POLICIES))})"
        )
    if not trace_jobs:
        raise SimulationError("trace_jobs: is empty")
    if not 0.0 <= best_effort_fraction <= 1.0:
        raise SimulationError(
            f"best_effort_fraction: must be in [0, 1], got {best_effort_fraction}"
        )
    if pause_seconds < 0 or not math.isfinite(pause_seconds):
        raise SimulationError(f"pause_seconds: must be finite and >= 0, got {pause_seconds}")
    policy_class = POLICIES[policy_name]
    policy: DeadlinePolicy
    if policy_class is StridePolicy or policy_class is EdfAdmissionPolicy:
        policy = policy_class(incremental=incremental)
    else:
        policy = policy_class()
    sim = Simulation(seed)
    best_effort = sim.rng.random(len(trace_jobs)) < best_effort_fraction
    jobs: list[_Job] = []
    for index, trace in enumerate(trace_jobs):
        curve = curves.curve(trace)
        where = f"{trace.source}:{trace.line}"
        if curve.sizes[0] > cluster.num_gpus:
            raise SimulationError(
                f"{where} model_name: {trace.model_name} needs {curve.sizes[0]} GPUs, "
                f"cluster has {cluster.num_gpus}"
            )
        if policy_name == "gandiva" and trace.num_gpu > cluster.num_gpus:
            raise SimulationError(
                f"{where} num_gpu: {trace.num_gpu} exceeds the cluster's {cluster.num_gpus} GPUs"
            )
        first = curve.sizes[0]
        jobs.append(
            _Job(
                trace=trace,
                curve=curve,
                deadline=None if best_effort[index] else trace.deadline,
                remaining=trace.iterations,
                unit_throughput=curve.throughputs[0] / first,
                weight=unit_weight(first, first, cluster.num_gpus),
            )
        )
    topology = cluster.buddy_topology() if getattr(policy, "placement", "") == "buddy" else None
    environment = _Environment(jobs, cluster.num_gpus, policy, pause_seconds, topology)
    for job in jobs:
        sim.schedule(job.trace.submission_time, EventKind.ARRIVAL, job.trace.job_id)
    sim.run(environment.handle)
    for job in jobs:
        if not job.ended:
            raise SimulationError(f"job {job.trace.job_id}: never ended")
    return _result(policy_name, seed, jobs, environment)


def _ratio(numerator: int, denominator: int) -> float | None:
    return numerator / denominator if denominator else None


def _result(policy: str, seed: int, jobs: list[_Job], env: _Environment) -> DeadlineResult:
    with_deadline = [job for job in jobs if job.deadline is not None]

    def met(job: _Job) -> bool:
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
    return DeadlineResult(
        policy=policy,
        seed=seed,
        jobs=len(jobs),
        deadline_jobs=len(with_deadline),
        met=met_count,
        dsr=_ratio(met_count, len(with_deadline)),
        dsr_lambda_ge_1=_ratio(sum(1 for job in loose if met(job)), len(loose)),
        dsr_lambda_lt_1=_ratio(sum(1 for job in tight if met(job)), len(tight)),
        cluster_efficiency=(env.efficiency_area / (env.capacity * makespan)) if makespan else 0.0,
        best_effort_jct=(sum(best_effort) / len(best_effort)) if best_effort else None,
        makespan=makespan,
        scaling_events=env.scaling_events,
        dropped=tuple(env.dropped),
        peak_gpus_in_use=env.peak,
        migrations=env.migrations,
        placement="buddy" if env.topology is not None else "counted",
        finish_times={job.trace.job_id: job.finish for job in jobs},
    )
