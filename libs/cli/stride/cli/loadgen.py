"""``stride loadgen --env dlrm``: the DLRM environment's jobs, played against the live suite.

Each job of ``stride sim --env dlrm``'s seeded population is submitted through admission
as a *simulated* job (``JobSpec.simulated``: the pod watcher starts no pods for it), and a
task plays its agents: for the plan the services published, it reports the throughput,
CPU and memory the environment's ground truth gives (``stride.sim.dlrm``), on the job's own
accelerated clock (a window of ``tick`` simulated seconds per round trip). Admission takes
simulated jobs only from an admin (the CLI's default token after ``stride up``) or a user
whose quota sets ``allow_simulated``; anyone else is refused naming ``spec.simulated``.
A plan change pauses the job as the simulator pauses it (``overhead_seconds``; 120 s for
the first pods and after an OOM kill); a PS whose memory passes its limit is OOM-killed and
reported as the pod watcher would. When the job has consumed its samples the task reports
it finished.

Alongside, each window's decision is checked against the simulator's Stride policy on
exactly the observations the task sent, so the run says how often the live services
decided what ``stride sim`` decides. Where they differ the report counts it: the usual
cause is a window whose decision came after the task's wait (``--decision-wait``).

What it does not replay: queueing for capacity (every job starts at once; the simulator
is run on a cluster too big to queue for the comparison) and random pod failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
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
from stride.policy.stages import MEMORY_WINDOW, SAMPLES_PER_CONFIG, Pods
from stride.policy.throughput import overhead_seconds
from stride.runtime import tls
from stride.sim.dlrm import (
    MAX_OOM_KILLS,
    RESTART_SECONDS,
    DlrmJobSpec,
    JobView,
    StridePolicy,
    _config,
    _one,
    _speed_sigma,
    generate_jobs,
    load_straggler_covs,
    ps_memory_gib,
    simulate,
)

GIB = 1024**3
FALLBACK_POLL_SECONDS = 2.0
"""A player learns of decisions from the bus (:class:`DecisionWatch`); only when none came
for this long does it ask the optimizer's plan API (an event lost by core NATS)."""


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
    compute: list[float] = field(default_factory=list)
    """Wall seconds the simulator's policy took to decide each window in this process."""
    differences: list[dict[str, Any]] = field(default_factory=list)
    """The windows decided otherwise than the simulator's policy: the window, both
    decisions (None: keep the pods) and whether the live one came in time."""


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


class JobPlayer:
    """One job's simulated agents (module docstring)."""

    def __init__(
        self,
        bus: Bus,
        optimizer: Any,
        job_id: str,
        index: int,
        spec: DlrmJobSpec,
        tick: float,
        decision_wait: float,
        seed: int,
        watch: DecisionWatch,
        window_seconds: float = 0.0,
        pace_seconds: float = math.inf,
    ) -> None:
        self.bus, self.job_id, self.index = bus, job_id, index
        self.watch = watch
        self.window_seconds = window_seconds
        """Wall seconds between the job's windows (0: as soon as the last was decided)."""
        self.pace_seconds = pace_seconds
        """For how long (wall seconds from its start) the job is paced; after that its
        windows go as fast as they are decided, and their latencies are not recorded (a
        paced run measures latency at the paced load only)."""
        self.optimizer = optimizer
        """The optimizer's plan API (``OptimizerServiceStub``)."""
        self.tick, self.decision_wait = tick, decision_wait
        self.rng = np.random.default_rng([seed, index])
        self.spec = spec
        self.clock = 0.0
        self.consumed = 0.0
        self.samples: list[tuple[Pods, float]] = []
        self.sample_count = 0
        self.memory_points: list[tuple[float, float, float]] = []
        self.reference = StridePolicy()
        self.latencies: list[float] = []
        self.compute: list[float] = []
        self.differences: list[dict[str, Any]] = []
        self.messages = 0
        self.speed = 1.0
        self.start: Pods | None = None
        self.decided_in_time = False
        self.seen_windows = 0
        """The optimizer's window count at the last decision seen."""
        self.workers_reported = 0
        """The plan version whose workers' usage was sent."""
        self.epoch = datetime.now(UTC)
        """The job's accelerated clock starts at its submission (its metrics carry it)."""

    def _id(self, kind: str) -> str:
        self.messages += 1
        return f"{self.job_id}.loadgen.{kind}.{self.messages}"

    def _now(self) -> datetime:
        return self.epoch + timedelta(seconds=self.clock)

    def _ps_bytes(self, pods: Pods) -> list[int]:
        hot, cold = ps_memory_gib(self.spec, self.spec.hot_factor, pods.ps, self.consumed)
        return [int(hot * GIB)] + [int(cold * GIB)] * (pods.ps - 1)

    def _worker_bytes(self) -> int:
        return int(self.spec.worker_mem_need_gib * GIB)

    def _memory_point(self, pods: Pods) -> tuple[float, float, float]:
        memories = [size / GIB for size in self._ps_bytes(pods)]
        return self.consumed, sum(memories), max(memories)

    def _draw_speed(self, workers: int) -> None:
        cov = self.spec.straggler_cov
        if cov <= 0:
            self.speed = 1.0
            return
        sigma = _speed_sigma(cov)
        speeds = self.rng.lognormal(-sigma * sigma / 2, sigma, size=workers)
        self.speed = float(speeds.mean())  # dynamic sharding (the simulator's Stride)

    async def _usage(self, version: int, pods: Pods) -> None:
        """Each PS's usage, and each worker's once per plan (a worker's memory does not
        grow; a real pod reports every few seconds, which the optimizer reads the same)."""
        _, worker_busy, ps_busy = _one(self.spec.params, self.spec, self.spec.hot_factor, pods)
        sizes = []
        if version != self.workers_reported:
            sizes = [("worker", i, self._worker_bytes()) for i in range(pods.workers)]
            self.workers_reported = version
        sizes += [("ps", i, size) for i, size in enumerate(self._ps_bytes(pods))]
        for role, index, memory in sizes:
            worker = role == "worker"
            sample = pod_pb2.UsageSample(
                job_id=self.job_id,
                pod_name=f"{self.job_id}-{role}-{index}",
                role=plan_pb2.ROLE_WORKER if worker else plan_pb2.ROLE_PS,
                cpu_used=(pods.worker_cpu * worker_busy) if worker else (pods.ps_cpu * ps_busy),
                memory_used_bytes=memory,
                cpu_limit=float(pods.worker_cpu if worker else pods.ps_cpu),
                memory_limit_bytes=(pods.worker_mem_gib if worker else pods.ps_mem_gib) * GIB,
                sampled_at=_stamp(self._now()),
                plan_version=version,
            )
            await self.bus.publish(topics.POD_USAGE, self.job_id, sample, self._id("usage"))

    def _view(self, pods: Pods) -> JobView:
        return JobView(
            reason="tick",
            now=self.clock,
            spec=self.spec,
            pods=pods,
            consumed=self.consumed,
            samples=tuple(self.samples),
            sample_count=self.sample_count,
            worker_util=0.0,
            ps_util=0.0,
            worker_memory_used_gib=self._worker_bytes() / GIB,
            memory_points=tuple(self.memory_points),
            hot_detected=False,
            history=(),
            cluster_cpus=10**6,
            queued_jobs=0,
        )

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
        poll_at = loop.time() + FALLBACK_POLL_SECONDS
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
                poll_at = loop.time() + FALLBACK_POLL_SECONDS
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
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return
        self.watch.plan(self.job_id, reply.plan)
        if not reply.deciding and reply.windows > 0:
            self.watch.decided[self.job_id] = Decided(reply.windows, reply.plan.version)

    async def play(self) -> Played:
        """Train the job to its end under the plans the optimizer publishes."""
        first = await self._decided(False, 0, self.decision_wait * 30)
        if first is None:
            raise LoadgenError(f"{self.job_id}: no plan v1 from the optimizer")
        version, pods = first.version, _pods(first)
        if pods is None:
            raise LoadgenError(f"{self.job_id}: plan v{version} has no worker or PS")
        self.spec = replace(self.spec, request=pods)
        self.start = pods
        self._draw_speed(pods.workers)
        windows = changes = agreed = kills = 0
        # The pods as loaded, sampled a second before training starts (the optimizer takes
        # its first memory point from them, whichever stream it reads first).
        self.clock = RESTART_SECONDS - 1.0
        await self._usage(version, pods)
        self.clock = RESTART_SECONDS
        self.memory_points.append(self._memory_point(pods))
        await asyncio.sleep(0.05)  # usage before steps: they travel on different streams
        loop = asyncio.get_running_loop()
        # Paced jobs start at a random phase, as real jobs do, not all at one instant.
        phase = float(np.random.default_rng([self.index, 7]).uniform())
        next_window = loop.time() + self.window_seconds * phase
        pace_until = loop.time() + self.pace_seconds
        while True:
            paced = self.window_seconds > 0 and loop.time() < pace_until
            if paced:
                await asyncio.sleep(max(0.0, next_window - loop.time()))
                next_window = max(next_window + self.window_seconds, loop.time())
            # The job progresses at its true rate; the window reports it with the
            # simulator's 5 % measurement noise.
            rate = _one(self.spec.params, self.spec, self.spec.hot_factor, pods)[0] * self.speed
            observed = rate * float(self.rng.lognormal(0.0, 0.05))
            left = self.spec.total_samples - self.consumed
            if rate * self.tick >= left:
                self.clock += left / rate
                self.consumed = self.spec.total_samples
                break
            hot_limit = ps_memory_gib(
                self.spec, self.spec.hot_factor, pods.ps, self.consumed + rate * self.tick
            )[0]
            if hot_limit > pods.ps_mem_gib:
                kills += 1
                self.clock += self.tick / 2
                self.consumed += rate * self.tick / 2
                if kills >= MAX_OOM_KILLS:
                    return self._result(False, windows, changes, agreed, kills)
                event = pod_pb2.PodEvent(
                    job_id=self.job_id,
                    pod_name=f"{self.job_id}-ps-0",
                    role=plan_pb2.ROLE_PS,
                    index=0,
                    phase=pod_pb2.POD_PHASE_FAILED,
                    reason=pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
                )
                await self.bus.publish(topics.POD_FAILED, self.job_id, event, self._id("oom"))
                newer = await self._decided(False, version, self.decision_wait)
                if newer is not None and (grown := _pods(newer)) is not None:
                    version, pods = newer.version, grown
                    changes += 1
                self.clock += RESTART_SECONDS
                continue
            self.consumed += rate * self.tick
            self.clock += self.tick
            await self._usage(version, pods)
            await asyncio.sleep(0.05)
            metrics = metrics_pb2.StepMetrics(
                job_id=self.job_id,
                pod_name=f"{self.job_id}-chief-0",
                global_step=windows + 1,
                steps=1,
                step_seconds=self.tick * 1.001,
                samples_per_second=observed,
                samples_consumed=int(self.consumed),
                reported_at=_stamp(self._now()),
                plan_version=version,
            )
            sent = time.perf_counter()
            await self.bus.publish(topics.STEP_METRICS, self.job_id, metrics, self._id("steps"))
            windows += 1
            self.consumed = float(int(self.consumed))
            self.samples.append((pods, observed))
            same = [i for i, (p, _) in enumerate(self.samples) if p == pods]
            if len(same) > SAMPLES_PER_CONFIG:
                del self.samples[same[0]]
            self.sample_count += 1
            self.memory_points.append(self._memory_point(pods))
            del self.memory_points[:-MEMORY_WINDOW]
            view = self._view(pods)
            computing = time.perf_counter()
            expected = self.reference.decide(view).pods
            self.compute.append(time.perf_counter() - computing)
            newer = await self._decided(True, version, self.decision_wait)
            if self.decided_in_time and (paced or self.window_seconds <= 0):
                self.latencies.append(time.perf_counter() - sent)
            got = None if newer is None else _pods(newer)
            agreed += int(got == expected)
            if got != expected:
                self.differences.append(
                    {
                        "window": windows,
                        "expected": None if expected is None else asdict(expected),
                        "live": None if got is None else asdict(got),
                        "in_time": self.decided_in_time,
                    }
                )
            if newer is not None and got is not None:
                self.clock += overhead_seconds(_config(pods, self.spec), _config(got, self.spec))
                if got.workers != pods.workers:
                    self._draw_speed(got.workers)
                version, pods = newer.version, got
                changes += 1
        return self._result(True, windows, changes, agreed, kills)

    def _result(
        self, completed: bool, windows: int, changes: int, agreed: int, kills: int
    ) -> Played:
        return Played(
            index=self.index,
            job_id=self.job_id,
            completed=completed,
            run_seconds=self.clock if completed else math.nan,
            windows=windows,
            plans=changes + 1,
            agreed=agreed,
            oom_kills=kills,
            start=self.start,
            latencies=self.latencies,
            differences=self.differences,
            compute=self.compute,
        )


async def run(
    nats_url: str,
    admission_address: str,
    optimizer_address: str,
    jobs: int,
    seed: int,
    tick: float,
    decision_wait: float,
    covs_path: Path,
    concurrency: int = 64,
    window_seconds: float = 0.0,
    pace_seconds: float = math.inf,
    tls_environ: Mapping[str, str] | None = None,
    token: tls.Token | None = None,
) -> tuple[list[Played], list[DlrmJobSpec]]:
    """Play ``jobs`` jobs of the seeded population against the suite; returns what each
    job did and the population. ``concurrency`` jobs play at once; ``window_seconds``
    paces each job to one window per that many wall seconds (0: each window as soon as the
    last one was decided, the suite's saturation)."""
    if jobs < 1:
        raise LoadgenError(f"--jobs: must be at least 1, got {jobs}")
    if tick <= 0 or decision_wait <= 0:
        raise LoadgenError("--tick-seconds and --decision-wait: must be positive")
    if window_seconds < 0 or not math.isfinite(window_seconds):
        raise LoadgenError(f"--window-seconds: must be >= 0, got {window_seconds}")
    if not pace_seconds > 0:
        raise LoadgenError(f"--pace-seconds: must be > 0, got {pace_seconds}")
    if concurrency < 1:
        raise LoadgenError(f"--concurrency: must be at least 1, got {concurrency}")
    # Hot PS are not replayed: the live loop records a re-partition but orders none yet.
    population = [
        replace(spec, hot_factor=1.0)
        for spec in generate_jobs(jobs, np.random.default_rng(seed), load_straggler_covs(covs_path))
    ]
    # It plays the pods' agents and the pod watcher, signing their events as they would.
    bus = await Bus.connect(
        nats_url,
        name="stride-loadgen",
        signer_for=as_producers(lambda identity: tls.load(identity, tls_environ)),
        environ=tls_environ,
    )
    limit = asyncio.Semaphore(concurrency)
    watch = DecisionWatch()
    try:
        await watch.start(bus)
        async with (
            tls.aio_channel(
                admission_address,
                server="admission",
                identity="cli",
                environ=tls_environ,
                token=token,
            ) as channel,
            tls.aio_channel(
                optimizer_address,
                server="optimizer",
                identity="cli",
                environ=tls_environ,
                token=token,
            ) as optimizer_channel,
        ):
            stub = admission_grpc.AdmissionServiceStub(channel)
            optimizer = optimizer_grpc.OptimizerServiceStub(optimizer_channel)

            async def one(index: int, spec: DlrmJobSpec) -> Played:
                async with limit:
                    reply = await stub.SubmitJob(
                        admission_pb.SubmitJobRequest(
                            spec=job_spec(
                                index, spec, f"loadgen-s{seed}", "" if token else "loadgen"
                            ),
                            request_id=f"loadgen-{seed}-{index}-{datetime.now(UTC).timestamp()}",
                        ),
                        timeout=30,
                    )
                    job_id = reply.job.job_id
                    player = JobPlayer(
                        bus,
                        optimizer,
                        job_id,
                        index,
                        spec,
                        tick,
                        decision_wait,
                        seed,
                        watch,
                        window_seconds,
                        pace_seconds,
                    )
                    played = await player.play()
                    end = job_pb2.JobFinished(
                        job_id=job_id,
                        outcome=(
                            job_pb2.JOB_OUTCOME_SUCCEEDED
                            if played.completed
                            else job_pb2.JOB_OUTCOME_FAILED
                        ),
                        message="simulated by stride loadgen",
                        finished_at=_stamp(datetime.now(UTC)),
                    )
                    await bus.publish(topics.JOB_FINISHED, job_id, end, f"{job_id}.loadgen.end")
                    return played

            played = await asyncio.gather(*(one(i, s) for i, s in enumerate(population)))
    finally:
        await watch.stop()
        await bus.close()
    return list(played), population


def compare(
    played: Sequence[Played], population: Sequence[DlrmJobSpec], seed: int, tick: float
) -> dict[str, Any]:
    """The live run against ``stride sim``'s Stride policy on the same jobs, all started at
    once on a cluster too big to queue (what the load generator plays)."""
    # The simulator's Stride starts a job without history from its request: here, the
    # pods the live services started it with, so both start from the same place.
    started = [
        replace(spec, submit_time=0.0, request=p.start or spec.request)
        for spec, p in zip(population, played, strict=True)
    ]
    cpus = 10 * sum(max(spec.request.cpu, 200) for spec in population)
    memory = 10 * sum(spec.request.memory_gib + 1000 for spec in population)
    result = simulate(started, cpus, memory, "stride", seed, tick)
    live = [p.run_seconds for p in played if p.completed]
    simulated = [t for t in result.jcts if not math.isnan(t)]
    windows = sum(p.windows for p in played)

    def summary(values: Sequence[float]) -> dict[str, float]:
        if not values:
            return {"median_s": math.nan, "p90_s": math.nan}
        ordered = sorted(values)
        return {
            "median_s": statistics.median(ordered),
            "p90_s": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
        }

    return {
        "jobs": len(played),
        "completed": len(live),
        "windows": windows,
        "decisions_agreed": sum(p.agreed for p in played),
        "agreement": sum(p.agreed for p in played) / windows if windows else math.nan,
        "live": summary(live),
        "sim": summary(simulated),
        "per_job": [
            {k: v for k, v in asdict(p).items() if k not in ("latencies", "compute")}
            for p in played
        ],
    }


def write_report(report: dict[str, Any], path: Path) -> None:
    """The report as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=float) + "\n")
