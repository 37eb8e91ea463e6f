"""Environment A under ElasticFlow's own cost model (``stride sim --model elasticflow``).

Why it exists: ElasticFlow's published simulator (pkusys/ElasticFlow, ``scheduler.py`` with
``--simulation=True``) is the reference its paper's numbers come from, and it models a
cluster differently from our default (:mod:`stride.sim.deadline`). To compare Stride with
ElasticFlow on ElasticFlow's own terms, this module replays a trace the way that simulator
does, as observed by running it (``bench/ef_head_to_head.py``) and read from its behaviour;
no code of it is used here:

- **Rounds.** Decisions happen only in rounds. After a round at ``t``, every event due by
  ``t + slot`` (arrivals, completions, a policy's wake-up) is merged into one round at
  exactly ``t + slot``; a later event gets a round at its own time. So rounds are at least
  one slot apart but not on a fixed grid, and an arrival waits up to a slot to be seen. The
  last remaining event is never postponed.
- **Completions.** A job's end is computed in the round that last sized it
  (``ceil(round + remaining / throughput)`` plus that round's overhead) and is its recorded
  finish time, the one compared with the deadline; its GPUs stay held until the round that
  processes the end. Departure: a policy that plans its jobs' ends (ElasticFlow's) has a
  job complete at the first round after its planned end; that simulator waits for the
  completion event, which a round one slot after the last can pre-empt, and re-plans the
  job's last seconds past its deadline. The same DSR on 195job (240 s slots); with 60 s
  slots ElasticFlow loses far more jobs that way in its simulator (itp cluster05: 0.481
  there, 0.688 here; ``bench/results/ef_head_to_head.txt``).
- **Overhead.** Policies that charge it (ElasticFlow's own and EDF with admission control;
  its plain EDF does not) pay it for every running job in every round, changed or not:
  2 s when the job's GPU range was used in a round since the last restart, else
  ``2 + 2 (log2 n + 1)`` s; every ``slot``-th round is a restart that adds 27 s to the jobs
  not cached (clusters of 256 GPUs and more: 7 s base, 47 s restart). The overhead delays
  the job's end and is taken off its next interval's progress.
- **Curves.** Elastic baselines read the raw measured rows (:meth:`CurveLibrary.raw_curve`:
  every runnable column up to ``min(64, batch size)``, past the peak too); Stride reads the
  concave envelope, as in the default model; both progress at the raw row's rate.
- **Non-elastic baselines** (Tiresias, Themis, Gandiva) run at the trace's recorded rate:
  ``num_iteration / duration`` on ``num_gpu`` GPUs, so a job alone runs its trace duration.
- **Counting.** DSR is ``met / jobs with a deadline``: jobs refused at admission count as
  missed; late jobs run to completion (as in the default model).

Why the default stays ours (:mod:`stride.sim.deadline`): a real cluster decides when
something happens, not at the next slot; a job that keeps its GPUs does not pay a restart
every round; and a scheduler that hands a job more GPUs than its throughput peak is a
modelling artefact, not a policy anyone would run. This model exists to calibrate against
the published simulator, not to replace ours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from stride.policy.elasticflow.curves import ScalingCurve
from stride.sim.deadline_views import DeadlinePolicy, DeadlineView, JobView
from stride.sim.engine import SimulationError

__all__ = [
    "DEFAULT_SLOT_SECONDS",
    "RoundJob",
    "RoundOutcome",
    "ef_overhead",
    "run_rounds",
]

DEFAULT_SLOT_SECONDS = 60.0
"""ElasticFlow's simulator's slot for its trace experiments (``run_fig8b.sh``); its
195-job testbed trace uses 240 s (``run_fig9.sh``)."""


def ef_overhead(gpus: int, *, restart: bool, cached: bool, cluster_gpus: int) -> float:
    """Seconds a running job loses in one round under ElasticFlow's model (module docstring)."""
    base = 7.0 if cluster_gpus >= 256 else 2.0
    if cached:
        return base
    extra = (27.0 + (20.0 if cluster_gpus >= 256 else 0.0)) if restart else 0.0
    return base + extra + 2.0 * (math.log2(max(gpus, 1)) + 1.0)


@dataclass
class RoundJob:
    """One trace job as the round environment tracks it."""

    job_id: str
    submission_time: float
    deadline: float | None
    total_iterations: float
    num_gpu: int
    seen_curve: ScalingCurve
    """What the policy is shown (raw row, envelope, or the trace's fixed rate)."""
    true_curve: ScalingCurve
    """What the job really runs at (per GPU count)."""
    weight: float = 0.5
    remaining: float = 0.0
    devices: int = 0
    end_time: float = math.inf
    """When the round that processes its completion is due (its GPUs are held until then)."""
    stop_at: float = math.inf
    """No progress is counted after this (the end its last round planned)."""
    recorded: float | None = None
    """The finish to record at completion, when the policy plans it (else ``end_time``)."""
    overhead: float = 0.0
    seq: int = 0
    """Its place in the arrival order (the order admission keeps active jobs in)."""
    started: int = 0
    """Order in which jobs first got GPUs (placement order of some policies)."""
    planned: bool = False
    """Whether the policy planned its end (:meth:`planned_ends`) in the last round."""
    attained: float = 0.0
    finish: float | None = None
    ended: bool = False
    ever_ran: bool = False
    waiting_since: float | None = None
    speed: float = 1.0
    """True throughput over the shown curve's (``curve_error``)."""
    measured: bool = False
    """Whether it has made progress (its ``measured_speed`` is then known)."""

    cached: JobView | None = None
    _state: tuple[float, int, float, float | None, bool] | None = None

    def view(self, now: float) -> JobView:
        """The policy's view (no pauses in this model: ``paused_until`` is the arrival).
        Cached until the job's state changes: in overload thousands of jobs wait unchanged."""
        state = (self.remaining, self.devices, self.attained, self.waiting_since, self.measured)
        if self.cached is not None and self._state == state:
            return self.cached
        self._state = state
        self.cached = JobView(
            self.job_id,
            self.seen_curve,
            max(self.remaining, 0.0),
            self.deadline,
            self.submission_time,
            self.num_gpu,
            self.devices,
            self.submission_time,
            self.total_iterations,
            self.attained,
            weight=self.weight,
            waiting_since=self.waiting_since,
            measured_speed=self.speed if self.measured and self.speed != 1.0 else None,
        )
        return self.cached


@dataclass
class RoundOutcome:
    """What a run leaves for :mod:`stride.sim.deadline`'s result."""

    dropped: list[str] = field(default_factory=list)
    scaling_events: int = 0
    peak: int = 0
    rounds: int = 0
    efficiency_area: float = 0.0
    usage: list[tuple[float, int]] = field(default_factory=list)
    """(round time, GPUs held from then on) at every round."""


def _group_admit(policy: DeadlinePolicy, view: DeadlineView, group: list[JobView]) -> list[bool]:
    """Admission of the jobs seen in one round: all-or-nothing where the policy decides
    per group (``admit_group``), else one job at a time in arrival order, each tested beside
    the ones admitted before it."""
    admit_group = getattr(policy, "admit_group", None)
    if admit_group is not None:
        verdicts = admit_group(view, tuple(group))
        if isinstance(verdicts, bool):
            return [verdicts] * len(group)
        return [bool(verdict) for verdict in verdicts]
    verdicts = []
    for candidate in group:
        verdict = policy.admit(view, candidate)
        verdicts.append(verdict)
        if verdict:
            view = DeadlineView(
                view.now, view.capacity, (*view.jobs, candidate), view.pause_seconds
            )
    return verdicts


def run_rounds(
    jobs: Sequence[RoundJob],
    capacity: int,
    policy: DeadlinePolicy,
    *,
    slot: float,
    charge_overhead: bool,
    pause_seconds: float,
    node_gpus: int = 8,
) -> RoundOutcome:
    """Replay ``jobs`` (sorted by submission) through ``policy`` round by round (see the
    module docstring); fills each job's ``finish`` (None when refused)."""
    if slot <= 0 or not math.isfinite(slot):
        raise SimulationError(f"slot: must be finite and > 0, got {slot}")
    outcome = RoundOutcome()
    arrivals = sorted(jobs, key=lambda job: job.submission_time)
    for seq, job in enumerate(arrivals):
        job.remaining = job.total_iterations
        job.seq = seq
    index = 0
    active: dict[str, RoundJob] = {}
    running: dict[str, RoundJob] = {}
    """The active jobs holding GPUs (only they progress or complete)."""
    views: dict[str, JobView] = {}
    """Each active job's view, in admission order."""
    dirty: set[str] = set()
    """Jobs whose view must be rebuilt at the next round."""
    cache: set[tuple[int, int]] = set()
    now = arrivals[0].submission_time
    step = 0.0
    wakeup: float | None = None
    starts = 0
    # What the policy says about how it runs (constant over a run).
    uses_cache = getattr(policy, "overhead_cache", True)
    on_start_only = getattr(policy, "overhead_on_start_only", False)
    on_completions = getattr(policy, "rounds_on_completions", True)
    planned_ends = getattr(policy, "planned_ends", None)
    by_start = getattr(policy, "placement_order", "size") == "started"
    forget = getattr(policy, "forget", None)
    while index < len(arrivals) or active:
        # Progress over the interval that ends now, at the sizes set in the last round.
        for job in running.values():
            run = step - max(0.0, now - job.stop_at)
            run = max(0.0, run - job.overhead)
            rate = job.true_curve.throughput(job.devices)
            job.measured = job.measured or run > 0
            job.remaining -= run * rate
            job.attained += job.devices * step
            outcome.efficiency_area += run * rate / _unit_rate(job)
            job.overhead = 0.0
        # Completions whose end fell in the interval (their GPUs were held until now).
        for job in sorted(running.values(), key=lambda j: j.end_time):
            # A planned job completes at the first round after its planned end even if its
            # completion (planned end + overhead) lies a moment later. Departure from the
            # simulator, which waits for that completion: a round due a slot after the last
            # (an arrival) pre-empts it, and the job's last seconds, eaten by the round's
            # overhead, are re-planned into the next slot, often past its deadline. Same
            # DSR on 195job (240 s slots); on 60 s slots it costs ElasticFlow there (itp
            # cluster05: 0.481 in its simulator, 0.688 here; bench/ef_head_to_head.py).
            ends_at = min(job.end_time, job.stop_at) if job.planned else job.end_time
            if job.devices and ends_at <= now + 1e-9:
                job.finish = job.end_time if job.recorded is None else job.recorded
                job.ended = True
                job.devices = 0
                del active[job.job_id]
                del running[job.job_id]
                views.pop(job.job_id, None)
                if forget is not None:
                    forget(job.job_id)
        # Arrivals seen in this round, in submission order.
        group: list[RoundJob] = []
        while index < len(arrivals) and arrivals[index].submission_time <= now + 1e-9:
            group.append(arrivals[index])
            index += 1
        # Views change only for jobs that ran or were re-sized (thousands may wait).
        for job_id in dirty:
            if job_id in active:
                views[job_id] = active[job_id].view(now)
        dirty = set(running)
        view = DeadlineView(now, capacity, tuple(views.values()), pause_seconds)
        if group:
            for job in group:
                job.waiting_since = now
            verdicts = _group_admit(policy, view, [job.view(now) for job in group])
            for job, verdict in zip(group, verdicts, strict=True):
                if verdict:
                    active[job.job_id] = job
                    views[job.job_id] = job.view(now)
                else:
                    job.ended = True
                    outcome.dropped.append(job.job_id)
            view = DeadlineView(now, capacity, tuple(views.values()), pause_seconds)
        decision = policy.decide(view) if active else {}
        total = 0
        for job_id, count in decision.items():
            if job_id not in active or count < 0:
                raise SimulationError(
                    f"policy {policy.name}: bad allocation {count} for job {job_id!r}"
                )
            total += count
        if total > capacity:
            raise SimulationError(
                f"policy {policy.name}: allocated {total} GPUs, capacity {capacity}"
            )
        outcome.peak = max(outcome.peak, total)
        outcome.usage.append((now, total))
        restart = outcome.rounds > 0 and outcome.rounds % int(slot) == 0
        holding = sorted(
            (active[job_id] for job_id, count in decision.items() if count),
            key=lambda job: job.seq,
        )
        starting = {job.job_id for job in holding if not job.devices}
        ends = planned_ends() if planned_ends is not None and active else {}
        offset = 0
        for job in holding:
            if not job.ever_ran:
                starts += 1
                job.started = starts
        if by_start:
            # Whole-node jobs in the order they started, then smaller ones by size.
            big = sorted(
                (job for job in holding if decision[job.job_id] >= node_gpus),
                key=lambda job: job.started,
            )
            small = sorted(
                (job for job in holding if decision[job.job_id] < node_gpus),
                key=lambda job: (-decision[job.job_id], job.started),
            )
            placed = big + small
        else:
            placed = sorted(holding, key=lambda job: -decision[job.job_id])
        changing = {job.job_id: job for job in holding}
        changing.update(running)
        dirty.update(changing)
        for job in changing.values():
            count = decision.get(job.job_id, 0)
            if count != job.devices and job.ever_ran:
                outcome.scaling_events += 1
            if count == 0:
                if job.devices:
                    job.waiting_since = now
                job.devices = 0
                job.end_time = math.inf
                running.pop(job.job_id, None)
                continue
            job.waiting_since = None
            job.ever_ran = True
            job.devices = count
            running[job.job_id] = job
            rate = job.true_curve.throughput(count)
            if rate <= 0:
                raise SimulationError(f"job {job.job_id}: zero throughput on {count} GPUs")
            job.end_time = float(math.ceil(now + max(job.remaining, 0.0) / rate - 1e-9))
            job.recorded = None
            planned = ends.get(job.job_id)
            job.planned = planned is not None
            if planned is not None:
                job.recorded, job.end_time, job.stop_at = planned
        for job in placed:
            span = (offset, job.devices)
            offset += job.devices
            if (
                charge_overhead
                and (on_completions or index < len(arrivals))
                and (not on_start_only or job.job_id in starting)
            ):
                job.overhead = ef_overhead(
                    job.devices,
                    restart=restart,
                    cached=span in cache and uses_cache,
                    cluster_gpus=capacity,
                )
                job.end_time += job.overhead
            if job.job_id not in ends:
                job.stop_at = job.end_time
            cache.add(span)
        if restart:
            cache.clear()
        outcome.rounds += 1
        asked = policy.wakeup(view, decision) if active else None
        wakeup = asked if asked is not None and asked > now else None
        # The next round: every event due within a slot is merged into one at now + slot.
        due: list[float] = [job.end_time for job in running.values()]
        if not on_completions and index < len(arrivals):
            due = []  # rounds only with arrivals while any remain, then every slot
        elif not on_completions and active:
            due = [now + slot]
        if index < len(arrivals):
            due.append(arrivals[index].submission_time)
        if wakeup is not None:
            due.append(wakeup)
        if not due:
            if not active:
                break
            due.append(now + slot)  # everyone waits with nothing running: try again
        first = min(due)
        after = now + slot if int(first - now) <= slot and len(set(due)) > 1 else first
        step = float(int(after - now))
        now = after
    return outcome


def _unit_rate(job: RoundJob) -> float:
    """Eq. 8's normaliser: the job's throughput per GPU at its smallest size."""
    curve = job.true_curve
    return curve.throughputs[0] / curve.sizes[0]
