"""``stride loadgen --env dlrm``: the DLRM environment's jobs, played against the live suite.

Each job of ``stride sim --env dlrm``'s seeded population is submitted through admission
as a *simulated* job (``JobSpec.simulated``: the pod watcher starts no pods for it).
Admission takes simulated jobs only from an admin (the CLI's default token after ``stride
up``) or a user whose quota sets ``allow_simulated``; anyone else is refused naming
``spec.simulated``.

Each job is played by the simulator itself (``stride.sim.dlrm``, the job alone on a cluster
too big to queue), with :class:`LivePolicy` in its policy's place: the simulator keeps the
job's clock, progress, pauses, stragglers, 5 % measurement noise and OOM kills, from the
same seeded streams as ``stride sim``'s run of the population, and every decision it asks
of its policy is asked of the running suite. The player reports what the simulator
measured as the job's agents and the pod watcher would (PS and worker usage, a window's
steps on the job's accelerated clock, an OOM kill), waits for the optimizer's decision on
the bus (a new plan, or the announcement that the plan holds), and hands it back. So the
player is deterministic where the suite is: a job whose decisions all agree with ``stride
sim``'s ends exactly when the simulator's does.

Alongside, each window's decision is checked against the simulator's Stride policy on the
same view, so the run says how often the live services decided what ``stride sim``
decides; the usual cause of a difference is a decision that came after
``--decision-wait``. The reference and the comparison run use the optimizer's own window
and search space (``GetLoopSettings``), so a suite with a small grid (``stride up`` on a
laptop) is compared with a simulator searching the same grid.

What it does not replay: queueing for capacity (every job starts at once, and each is
compared with the simulator on a cluster too big to queue) and random pod failures (the
comparison fails none either).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.bus.signing import as_producers
from stride.events.v1 import job_pb2, metrics_pb2, optimization_pb2, plan_pb2, pod_pb2
from stride.policy.stages import Pods, SearchSpace
from stride.runtime import tls
from stride.sim.dlrm import (
    RESTART_SECONDS,
    Decision,
    DlrmJobSpec,
    JobView,
    StridePolicy,
    _one,
    generate_jobs,
    load_straggler_covs,
    simulate,
)
from stride.sim.engine import SimulationError

GIB = 1024**3
STEP_SECONDS = 1.001
"""A window's one step reports this many ticks: just over one, so it closes the window."""
FALLBACK_POLL_SECONDS = 2.0
"""A player learns of decisions from the bus (:class:`DecisionWatch`); only when none came
for this long does it ask the optimizer's plan API (an event lost by core NATS), then after
twice as long again, and so on."""

POLL_LATER = frozenset(
    {grpc.StatusCode.NOT_FOUND, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}
)
"""Answers to a fallback poll that mean "ask again later", not a failed run."""


@dataclass(frozen=True)
class Decided:
    """The newest window decision the optimizer announced for a job."""

    window: int
    plan_version: int


class DecisionWatch:
    """Every job's plans and window decisions as the optimizer publishes them
    (``stride.plans.v1.<job>`` and ``stride.plans.v1.<job>.decided``), followed once for
    all players, so no player polls the optimizer to learn that its window was decided."""

    def __init__(self) -> None:
        self.plans: dict[str, plan_pb2.ResourcePlan] = {}
        self.decided: dict[str, Decided] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._subscriptions: list[Any] = []

    async def start(self, bus: Bus) -> None:
        """Subscribe (before any job is submitted, so no plan is missed)."""
        self._subscriptions = [
            await bus.watch(topics.PLAN, self.plan),
            await bus.watch(topics.WINDOW_DECIDED, self.window),
        ]

    async def stop(self) -> None:
        for subscription in self._subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    def plan(self, job_id: str, plan: plan_pb2.ResourcePlan) -> None:
        known = self.plans.get(job_id)
        if known is None or plan.version > known.version:
            self.plans[job_id] = plan
        self.event(job_id).set()

    def window(self, job_id: str, decided: optimization_pb2.WindowDecided) -> None:
        known = self.decided.get(job_id)
        if known is None or decided.window > known.window:
            self.decided[job_id] = Decided(decided.window, decided.plan_version)
        self.event(job_id).set()

    def event(self, job_id: str) -> asyncio.Event:
        return self._wake.setdefault(job_id, asyncio.Event())


class LoadgenError(Exception):
    """Bad options or an unreachable suite; the message names the problem."""


@dataclass
class Played:
    """What one job did."""

    index: int
    job_id: str
    completed: bool
    run_seconds: float
    """Simulated seconds from its first plan to completion (NaN if it did not complete)."""
    windows: int
    plans: int
    agreed: int
    """Windows whose outcome (new pods or none) was the simulator policy's decision."""
    oom_kills: int
    start: Pods | None = None
    """The pods of its first plan (the services' cold start or warm start)."""
    latencies: list[float] = field(default_factory=list)
    """Wall seconds from each window's steps being sent to its decision being visible."""
    sent: list[float] = field(default_factory=list)
    """When each of those windows' steps were sent (``time.perf_counter``), to tell a run's
    start-up from its steady state."""
    compute: list[float] = field(default_factory=list)
    """Wall seconds the simulator's policy took to decide each window in this process."""
    differences: list[dict[str, Any]] = field(default_factory=list)
    """The windows decided otherwise than the simulator's policy: the window, both
    decisions (None: keep the pods) and whether the live one came in time."""
    error: str = ""
    """Why the job did not complete, when it was not for its OOM kills."""


def _stamp(moment: datetime) -> Timestamp:
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def _pods(plan: plan_pb2.ResourcePlan) -> Pods | None:
    roles = {role.role: role for role in plan.roles}
    workers, ps = roles.get(plan_pb2.ROLE_WORKER), roles.get(plan_pb2.ROLE_PS)
    if workers is None or ps is None or workers.count < 1 or ps.count < 1:
        return None
    return Pods(
        workers.count,
        max(1, math.ceil(workers.cpu - 1e-9)),
        max(1, math.ceil(workers.memory_bytes / GIB)),
        ps.count,
        max(1, math.ceil(ps.cpu - 1e-9)),
        max(1, math.ceil(ps.memory_bytes / GIB)),
    )


def job_spec(index: int, spec: DlrmJobSpec, prefix: str, user: str = "loadgen") -> job_pb2.JobSpec:
    """The job as a user would submit it, marked simulated. ``user``: empty when the
    submitter's token names the user (admission takes it from there)."""
    return job_pb2.JobSpec(
        name=f"{prefix}-{index}",
        user=user,
        model=job_pb2.ModelReference(
            name=spec.model_name,
            family="dlrm",
            entrypoint="stride_examples.dlrm:simulated",
            embedding_dim=spec.embedding_dim,
            parameter_count=round(spec.model_bytes / 4),
        ),
        dataset=job_pb2.DatasetSpec(
            name=f"dlrm-{index}", uri="simulated://dlrm", record_count=int(spec.total_samples)
        ),
        batch_size=spec.batch_size,
        termination=job_pb2.Termination(max_epochs=1),
        simulated=True,
    )


@dataclass
class Tally:
    """How the run goes, for the progress bar: updated as windows are decided."""

    jobs: int = 0
    windows: int = 0
    agreed: int = 0
    finished: int = 0
    failed: int = 0


class Stopped(Exception):
    """The run's wall-time bound passed: the player stops where it is."""


class LivePolicy:
    """The simulator's policy slot filled by the live suite: each decision the simulator asks
    of its Stride policy is asked of the running services instead. The simulator's own
    environment (``stride.sim.dlrm``, one job) keeps the job's clock, progress, pauses,
    stragglers, measurement noise and OOM kills, from the same seeded streams as ``stride
    sim``'s run of the population, so a job whose decisions all agree ends when the
    simulator's does; this class reports what that environment measured to the suite as
    the job's agents and the pod watcher would, and returns the plan the suite published.
    Beside each window, the simulator's Stride policy decides on the same view: the run's
    agreement."""

    name = "stride-live"
    dynamic_sharding = True
    seamless = True

    def __init__(self, player: JobPlayer) -> None:
        self.player = player
        self.tick_seconds = player.tick

    def decide(self, view: JobView) -> Decision:
        """Called by the simulator (in the player's thread): the suite's decision."""
        player = self.player
        computing = time.perf_counter()
        expected = player.reference.decide(view)
        if view.reason == "tick":
            player.compute.append(time.perf_counter() - computing)
        future = asyncio.run_coroutine_threadsafe(player.decision(view, expected), player.loop)
        return future.result()


class JobPlayer:
    """One job played against the suite (:class:`LivePolicy`)."""

    def __init__(
        self,
        bus: Bus,
        optimizer: Any,
        job_id: str,
        spec: DlrmJobSpec,
        options: PlayOptions,
        watch: DecisionWatch,
        tally: Tally,
        stop: asyncio.Event,
    ) -> None:
        self.bus, self.optimizer, self.job_id, self.spec = bus, optimizer, job_id, spec
        self.options, self.watch, self.tally, self.stop = options, watch, tally, stop
        self.tick = options.tick
        self.reference = StridePolicy(options.space)
        self.loop = asyncio.get_running_loop()
        self.epoch = datetime.now(UTC)
        """The job's clock starts at its submission (its metrics carry it)."""
        self.version = 0
        self.start: Pods | None = None
        self.windows = self.agreed = self.changes = self.kills = 0
        self.seen_windows = 0
        """The optimizer's window count at the last decision seen."""
        self.memory_sent = 0
        """Memory points of the view already reported as PS usage."""
        self.workers_reported = 0
        """The plan version whose workers' usage was sent."""
        self.decided_in_time = False
        self.latencies: list[float] = []
        self.sent: list[float] = []
        self.compute: list[float] = []
        self.differences: list[dict[str, Any]] = []
        self.messages = 0
        phase = float(np.random.default_rng([spec.job_id, 7]).uniform())
        self.next_window = self.loop.time() + options.window_seconds * phase
        self.pace_until = self.loop.time() + options.pace_seconds

    def _id(self, kind: str) -> str:
        self.messages += 1
        return f"{self.job_id}.loadgen.{kind}.{self.messages}"

    def _at(self, seconds: float) -> Timestamp:
        return _stamp(self.epoch + timedelta(seconds=seconds))

    async def decision(self, view: JobView, expected: Decision) -> Decision:
        """The suite's decision on ``view`` (the simulator's ask), ``expected`` beside it."""
        if self.stop.is_set():
            raise Stopped(self.job_id)
        if view.reason == "arrival":
            return await self._first_plan()
        if view.reason == "oom":
            return await self._oom(view)
        return await self._window(view, expected)

    async def begin(self) -> None:
        """Wait for the job's plan 1: the pods it starts with, and the request its stage
        step plans from (the live optimizer's cold default, as the simulator's is the
        request)."""
        first = await self._decided(False, 0, self.options.decision_wait * 30)
        pods = None if first is None else _pods(first)
        if first is None or pods is None:
            raise LoadgenError(
                f"{self.job_id}: no plan v1 with a worker and a PS from the optimizer"
            )
        self.version, self.start = first.version, pods
        self.spec = replace(self.spec, request=pods)

    async def _first_plan(self) -> Decision:
        assert self.start is not None, "begin() waits for plan 1"
        return Decision(self.start)

    def _ps_bytes(self, point: tuple[float, float, float], ps: int) -> list[int]:
        _, total, hottest = point
        rest = (total - hottest) / (ps - 1) if ps > 1 else 0.0
        return [int(hottest * GIB)] + [int(rest * GIB)] * (ps - 1)

    async def _usage(self, view: JobView) -> None:
        """PS usage at each memory point the simulator measured since the last report, and
        each worker's once per plan (a worker's memory does not grow)."""
        pods = view.pods
        _, worker_busy, ps_busy = _one(self.spec.params, self.spec, self.spec.hot_factor, pods)
        samples: list[tuple[str, int, int, float]] = []
        if self.version != self.workers_reported:
            need = int(self.spec.worker_mem_need_gib * GIB)
            samples += [("worker", i, need, view.now) for i in range(pods.workers)]
            self.workers_reported = self.version
        # The simulator measured one point as the pods loaded and one per sample since; its
        # window keeps the newest, and those not reported yet are new.
        points, measured = view.memory_points, view.sample_count + 1
        fresh = min(len(points), measured - self.memory_sent)
        for offset, point in enumerate(points[len(points) - fresh :] if fresh > 0 else ()):
            # The pods as loaded were sampled a second before training started, and before
            # the first window as its steps tell it (``STEP_SECONDS`` of a tick back from
            # its end, whatever the tick): the optimizer waits for the window's own sample
            # and still takes this one as the first, whichever stream delivers first.
            first = self.memory_sent == 0 and offset == 0
            loaded = min(RESTART_SECONDS - 1.0, view.now - self.tick * STEP_SECONDS - 1.0)
            at = loaded if first else view.now - (fresh - 1 - offset) * 1e-3
            sizes = self._ps_bytes(point, pods.ps)
            samples += [("ps", i, size, at) for i, size in enumerate(sizes)]
        self.memory_sent = measured
        for role, index, memory, at in samples:
            worker = role == "worker"
            sample = pod_pb2.UsageSample(
                job_id=self.job_id,
                pod_name=f"{self.job_id}-{role}-{index}",
                role=plan_pb2.ROLE_WORKER if worker else plan_pb2.ROLE_PS,
                cpu_used=(pods.worker_cpu * worker_busy) if worker else (pods.ps_cpu * ps_busy),
                memory_used_bytes=memory,
                cpu_limit=float(pods.worker_cpu if worker else pods.ps_cpu),
                memory_limit_bytes=(pods.worker_mem_gib if worker else pods.ps_mem_gib) * GIB,
                sampled_at=self._at(at),
                plan_version=self.version,
            )
            await self.bus.publish(topics.POD_USAGE, self.job_id, sample, self._id("usage"))

    async def _pace(self) -> bool:
        """Wait for the job's next paced window; whether this window is paced."""
        options = self.options
        paced = options.window_seconds > 0 and self.loop.time() < self.pace_until
        if paced:
            with contextlib.suppress(TimeoutError):  # or until the run is stopped
                await asyncio.wait_for(self.stop.wait(), self.next_window - self.loop.time())
            self.next_window = max(self.next_window + options.window_seconds, self.loop.time())
        return paced

    async def _window(self, view: JobView, expected: Decision) -> Decision:
        paced = await self._pace()
        if self.stop.is_set():  # stopped while it waited for its pace: sends nothing more
            raise Stopped(self.job_id)
        await self._usage(view)
        await asyncio.sleep(0.05)  # usage before steps: they travel on different streams
        pods, observed = view.samples[-1]
        metrics = metrics_pb2.StepMetrics(
            job_id=self.job_id,
            pod_name=f"{self.job_id}-chief-0",
            global_step=self.windows + 1,
            steps=1,
            step_seconds=self.tick * STEP_SECONDS,
            samples_per_second=observed,
            samples_consumed=int(view.consumed),
            reported_at=self._at(view.now),
            plan_version=self.version,
        )
        sent = time.perf_counter()
        await self.bus.publish(topics.STEP_METRICS, self.job_id, metrics, self._id("steps"))
        self.windows += 1
        newer = await self._decided(True, self.version, self.options.decision_wait)
        if self.decided_in_time and (paced or self.options.window_seconds <= 0):
            self.latencies.append(time.perf_counter() - sent)
            self.sent.append(sent)
        got = None if newer is None else _pods(newer)
        want = expected.pods if expected.pods != pods else None
        agreed = got == want
        self.agreed += int(agreed)
        self.tally.windows += 1
        self.tally.agreed += int(agreed)
        if not agreed:
            self.differences.append(
                {
                    "window": self.windows,
                    "expected": None if want is None else asdict(want),
                    "live": None if got is None else asdict(got),
                    "in_time": self.decided_in_time,
                }
            )
        if newer is not None and got is not None:
            self.version = newer.version
            self.changes += 1
            return Decision(got)
        return Decision(None)

    async def _decided(
        self, new_window: bool, version: int, wait: float
    ) -> plan_pb2.ResourcePlan | None:
        """Wait until the optimizer has decided on the window just sent (``new_window``: it
        announced a decision on a window past the last one seen) or published a plan newer
        than ``version``; the newer plan, or None if it kept the plan. None too when that
        did not happen within ``wait`` (a window it did not take, counted as a disagreement
        by the caller)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        pause = FALLBACK_POLL_SECONDS
        poll_at = loop.time() + pause
        wake = self.watch.event(self.job_id)
        while True:
            plan = self.watch.plans.get(self.job_id)
            decided = self.watch.decided.get(self.job_id)
            if plan is not None and plan.version > version:
                if new_window:
                    # The plan is this window's decision; its own announcement may come
                    # after it and must not pass for the next window's.
                    self.seen_windows += 1
                if decided is not None:
                    self.seen_windows = max(self.seen_windows, decided.window)
                self.decided_in_time = True
                return plan
            if (
                new_window
                and decided is not None
                and decided.window > self.seen_windows
                and decided.plan_version <= version
            ):
                self.seen_windows = decided.window
                self.decided_in_time = True
                return None
            now = loop.time()
            if now >= deadline:
                self.decided_in_time = False
                return None
            if now >= poll_at:
                await self._poll()
                # Twice as long each time: when decisions are late because the suite is
                # overloaded, polls that come every few seconds from every job add to it.
                pause *= 2
                poll_at = loop.time() + pause
                continue
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), min(deadline, poll_at) - now)

    async def _poll(self) -> None:
        """Ask the plan API, for a decision whose events were lost."""
        try:
            reply = await self.optimizer.GetPlan(
                optimizer_pb.GetPlanRequest(job_id=self.job_id), timeout=10
            )
        except grpc.aio.AioRpcError as error:
            # Not planned yet, or the optimizer too busy to answer now: the bus or the next
            # poll tells, and the window's own deadline bounds the wait.
            if error.code() not in POLL_LATER:
                raise
            return
        self.watch.plan(self.job_id, reply.plan)
        if not reply.deciding and reply.windows > 0:
            self.watch.decided[self.job_id] = Decided(reply.windows, reply.plan.version)

    def play(self) -> Played:
        """The job's life in the simulator's environment, its decisions the suite's (run in
        a thread of its own: the simulator blocks on each decision)."""
        spec = replace(self.spec, submit_time=0.0)
        error = ""
        try:
            result = simulate(
                [spec],
                HUGE_CPUS,
                HUGE_MEMORY_GIB,
                "stride",
                self.options.seed,
                self.tick,
                policy=LivePolicy(self),
                pod_failures=False,
            )
            jct = result.jcts[0]
        except Stopped:
            jct, error = math.nan, "stopped by --max-wall-seconds"
        except (LoadgenError, SimulationError) as problem:
            jct, error = math.nan, str(problem)
        completed = not math.isnan(jct)
        return Played(
            index=spec.job_id,
            job_id=self.job_id,
            completed=completed,
            run_seconds=jct,
            windows=self.windows,
            plans=self.changes + 1,
            agreed=self.agreed,
            oom_kills=self.kills,
            start=self.start,
            latencies=self.latencies,
            sent=self.sent,
            differences=self.differences,
            compute=self.compute,
            error=error,
        )

    async def _oom(self, view: JobView) -> Decision:
        """A pod was OOM-killed (the hottest PS passed its memory, or a worker below its
        need took its first step): reported as the pod watcher would."""
        self.kills += 1
        worker = view.oom_role == "worker"
        event = pod_pb2.PodEvent(
            job_id=self.job_id,
            pod_name=f"{self.job_id}-{'worker' if worker else 'ps'}-0",
            role=plan_pb2.ROLE_WORKER if worker else plan_pb2.ROLE_PS,
            index=0,
            phase=pod_pb2.POD_PHASE_FAILED,
            reason=pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
        )
        await self.bus.publish(topics.POD_FAILED, self.job_id, event, self._id("oom"))
        newer = await self._decided(False, self.version, self.options.decision_wait)
        grown = None if newer is None else _pods(newer)
        if newer is None or grown is None:
            return Decision(None)
        self.version = newer.version
        self.changes += 1
        return Decision(grown)


@dataclass(frozen=True)
class PlayOptions:
    """How the jobs are played (see :func:`run`)."""

    seed: int
    tick: float
    decision_wait: float
    space: SearchSpace
    window_seconds: float = 0.0
    pace_seconds: float = math.inf


async def loop_settings(optimizer: Any) -> optimizer_pb.GetLoopSettingsResponse:
    """How the suite's optimizer decides (its window and search space)."""
    try:
        reply: optimizer_pb.GetLoopSettingsResponse = await optimizer.GetLoopSettings(
            optimizer_pb.GetLoopSettingsRequest(), timeout=10
        )
        return reply
    except grpc.aio.AioRpcError as error:
        raise LoadgenError(
            f"the optimizer did not say how it decides ({error.code().name}: {error.details()})"
        ) from None


def space_of(settings: optimizer_pb.GetLoopSettingsResponse) -> SearchSpace:
    """The optimizer's search space, for the reference policy and the simulator."""
    return SearchSpace(
        workers=tuple(settings.workers),
        worker_cpu=tuple(settings.worker_cpu),
        ps=tuple(settings.ps),
        ps_cpu=tuple(settings.ps_cpu),
        job_cpu_limit=int(settings.job_cpu_limit),
    )


def _check_options(
    jobs: int,
    tick: float | None,
    decision_wait: float,
    window_seconds: float,
    pace_seconds: float,
    concurrency: int,
    max_wall_seconds: float,
) -> None:
    """LoadgenError naming the option that is out of range."""
    if jobs < 1:
        raise LoadgenError(f"--jobs: must be at least 1, got {jobs}")
    if (tick is not None and tick <= 0) or decision_wait <= 0:
        raise LoadgenError("--tick-seconds and --decision-wait: must be positive")
    if window_seconds < 0 or not math.isfinite(window_seconds):
        raise LoadgenError(f"--window-seconds: must be >= 0, got {window_seconds}")
    if not pace_seconds > 0:
        raise LoadgenError(f"--pace-seconds: must be > 0, got {pace_seconds}")
    if concurrency < 1:
        raise LoadgenError(f"--concurrency: must be at least 1, got {concurrency}")
    if not max_wall_seconds > 0:
        raise LoadgenError(f"--max-wall-seconds: must be > 0, got {max_wall_seconds}")


def _options(
    settings: optimizer_pb.GetLoopSettingsResponse,
    seed: int,
    tick: float | None,
    decision_wait: float,
    window_seconds: float,
    pace_seconds: float,
) -> PlayOptions:
    """How the jobs are played, at the optimizer's window and grid."""
    if tick is not None and not math.isclose(tick, settings.tick_seconds):
        raise LoadgenError(
            f"--tick-seconds: {tick:g} is not the optimizer's window of "
            f"{settings.tick_seconds:g} s (STRIDE_OPTIMIZER_TICK_SECONDS); leave it "
            "out to play at the suite's"
        )
    return PlayOptions(
        seed,
        settings.tick_seconds,
        decision_wait,
        space_of(settings),
        window_seconds,
        pace_seconds,
    )


@dataclass
class _Stage:
    """What every job's play shares: the bus, the APIs, the decision watch, the bound."""

    bus: Bus
    admission: Any
    optimizer: Any
    options: PlayOptions
    watch: DecisionWatch
    tally: Tally
    stop: asyncio.Event
    limit: asyncio.Semaphore
    threads: ThreadPoolExecutor
    user: str

    async def one(self, spec: DlrmJobSpec) -> Played:
        """Submit one job, play it to its end (or the bound), and report its end as the
        pod watcher would."""
        async with self.limit:
            if self.stop.is_set():
                return _unplayed(spec, "stopped by --max-wall-seconds before it began")
            seed = self.options.seed
            reply = await self.admission.SubmitJob(
                admission_pb.SubmitJobRequest(
                    spec=job_spec(spec.job_id, spec, f"loadgen-s{seed}", self.user),
                    request_id=f"loadgen-{seed}-{spec.job_id}-{datetime.now(UTC).timestamp()}",
                ),
                timeout=30,
            )
            job_id = reply.job.job_id
            player = JobPlayer(
                self.bus,
                self.optimizer,
                job_id,
                spec,
                self.options,
                self.watch,
                self.tally,
                self.stop,
            )
            try:
                await player.begin()
            except LoadgenError as error:
                played = _unplayed(spec, str(error))
            else:
                played = await asyncio.get_running_loop().run_in_executor(self.threads, player.play)
            self.tally.finished += int(played.completed)
            self.tally.failed += int(not played.completed)
            await self._ended(job_id, played)
            return played

    async def all(self, population: Sequence[DlrmJobSpec], max_wall_seconds: float) -> list[Played]:
        """Every job played; after ``max_wall_seconds`` each stops at its next decision."""
        tasks = [asyncio.create_task(self.one(spec)) for spec in population]
        _, pending = await asyncio.wait(
            tasks, timeout=max_wall_seconds if math.isfinite(max_wall_seconds) else None
        )
        if pending:
            self.stop.set()
            await asyncio.wait(pending)
        return [task.result() for task in tasks]

    async def _ended(self, job_id: str, played: Played) -> None:
        outcome = (
            job_pb2.JOB_OUTCOME_SUCCEEDED
            if played.completed
            else job_pb2.JOB_OUTCOME_CANCELLED
            if self.stop.is_set()
            else job_pb2.JOB_OUTCOME_FAILED
        )
        end = job_pb2.JobFinished(
            job_id=job_id,
            outcome=outcome,
            message="simulated by stride loadgen" + (f": {played.error}" if played.error else ""),
            finished_at=_stamp(datetime.now(UTC)),
        )
        await self.bus.publish(topics.JOB_FINISHED, job_id, end, f"{job_id}.loadgen.end")


@contextlib.asynccontextmanager
async def _stubs(
    admission_address: str,
    optimizer_address: str,
    tls_environ: Mapping[str, str] | None,
    token: tls.Token | None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Admission's and the optimizer's APIs, as the CLI calls them."""
    async with (
        tls.aio_channel(
            admission_address, server="admission", identity="cli", environ=tls_environ, token=token
        ) as admission,
        tls.aio_channel(
            optimizer_address, server="optimizer", identity="cli", environ=tls_environ, token=token
        ) as optimizer,
    ):
        yield (
            admission_grpc.AdmissionServiceStub(admission),
            optimizer_grpc.OptimizerServiceStub(optimizer),
        )


async def run(
    nats_url: str,
    admission_address: str,
    optimizer_address: str,
    jobs: int,
    seed: int,
    tick: float | None,
    decision_wait: float,
    covs_path: Path,
    concurrency: int = 64,
    window_seconds: float = 0.0,
    pace_seconds: float = math.inf,
    tls_environ: Mapping[str, str] | None = None,
    token: tls.Token | None = None,
    max_wall_seconds: float = math.inf,
    tally: Tally | None = None,
) -> tuple[list[Played], list[DlrmJobSpec], PlayOptions]:
    """Play ``jobs`` jobs of the seeded population against the suite; returns what each
    job did, the population and how they were played. ``tick``: the optimizer's window
    (None: ask it); ``concurrency`` jobs play at once; ``window_seconds`` paces each job to
    one window per that many wall seconds (0: each window as soon as the last one was
    decided, the suite's saturation); after ``max_wall_seconds`` every job stops where it
    is (a partial report). ``tally`` is kept up to date for a progress display."""
    _check_options(
        jobs, tick, decision_wait, window_seconds, pace_seconds, concurrency, max_wall_seconds
    )
    # Hot PS are not replayed: the live loop records a re-partition but orders none yet.
    population = [
        replace(spec, hot_factor=1.0)
        for spec in generate_jobs(jobs, np.random.default_rng(seed), load_straggler_covs(covs_path))
    ]
    tally = tally if tally is not None else Tally()
    tally.jobs = jobs
    # It plays the pods' agents and the pod watcher, signing their events as they would.
    bus = await Bus.connect(
        nats_url,
        name="stride-loadgen",
        signer_for=as_producers(lambda identity: tls.load(identity, tls_environ)),
        environ=tls_environ,
    )
    watch = DecisionWatch()
    stop = asyncio.Event()
    # The simulator blocks on each decision: one thread per job playing.
    threads = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="loadgen")
    try:
        await watch.start(bus)
        async with _stubs(admission_address, optimizer_address, tls_environ, token) as stubs:
            admission, optimizer = stubs
            settings = await loop_settings(optimizer)
            options = _options(settings, seed, tick, decision_wait, window_seconds, pace_seconds)
            stage = _Stage(
                bus,
                admission,
                optimizer,
                options,
                watch,
                tally,
                stop,
                asyncio.Semaphore(concurrency),
                threads,
                "" if token else "loadgen",
            )
            played = await stage.all(population, max_wall_seconds)
    finally:
        stop.set()
        threads.shutdown(wait=False, cancel_futures=True)
        await watch.stop()
        await bus.close()
    return played, population, options


def _unplayed(spec: DlrmJobSpec, why: str) -> Played:
    return Played(spec.job_id, "", False, math.nan, 0, 0, 0, 0, error=why)


HUGE_CPUS = 10**7
HUGE_MEMORY_GIB = 10**8
"""A cluster too big to queue on: each job is played alone, as in the comparison."""


def compare(
    played: Sequence[Played],
    population: Sequence[DlrmJobSpec],
    seed: int,
    tick: float,
    space: SearchSpace | None = None,
) -> dict[str, Any]:
    """The live run against ``stride sim``'s Stride policy on the same jobs, all started at
    once on a cluster too big to queue (what the load generator plays), with the suite's
    search space and window, and no random pod failures (the players play none). Run times
    are compared over the jobs that completed live. A simulator that cannot run the jobs
    makes the report say why (``comparable`` false) instead of failing."""
    # The simulator's Stride starts a job without history from its request: here, the
    # pods the live services started it with, so both start from the same place.
    started = [
        replace(spec, submit_time=0.0, request=p.start or spec.request)
        for spec, p in zip(population, played, strict=True)
    ]
    windows = sum(p.windows for p in played)
    report: dict[str, Any] = {
        "jobs": len(played),
        "completed": sum(p.completed for p in played),
        "windows": windows,
        "decisions_agreed": sum(p.agreed for p in played),
        "agreement": sum(p.agreed for p in played) / windows if windows else math.nan,
        "comparable": True,
        "why": "",
        "per_job": [
            {k: v for k, v in asdict(p).items() if k not in ("latencies", "sent", "compute")}
            for p in played
        ],
    }
    try:
        result = simulate(
            started,
            HUGE_CPUS,
            HUGE_MEMORY_GIB,
            "stride",
            seed,
            tick,
            policy=StridePolicy(space or SearchSpace()),
            pod_failures=False,
        )
    except SimulationError as error:
        report.update(comparable=False, why=f"stride sim cannot run these jobs: {error}")
        report["live"] = report["sim"] = _summary([])
        return report
    done = [i for i, p in enumerate(played) if p.completed]
    report["live"] = _summary([played[i].run_seconds for i in done])
    report["sim"] = _summary([result.jcts[i] for i in done if not math.isnan(result.jcts[i])])
    report["sim_completed"] = sum(not math.isnan(t) for t in result.jcts)
    if not done:
        report.update(comparable=False, why="no job completed live, so no run time compares")
    return report


def _summary(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"median_s": math.nan, "p90_s": math.nan}
    ordered = sorted(values)
    return {
        "median_s": statistics.median(ordered),
        "p90_s": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    """The report as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=float) + "\n")
