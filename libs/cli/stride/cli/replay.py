"""``stride replay``: a deadline trace through the live admission service, on its own clock.

``stride sim --env deadline`` and the admission service run one policy class
(:class:`~stride.policy.elasticflow.guarantees.GuaranteePolicy`); this command checks that
they also make the same decisions end to end. It starts an embedded nats-server and a real
admission process (``python -m stride.admission``, SQLite, the cluster's GPUs, its
switch/node/GPU tree and the curves table) on a replay clock: *stepped* (the default: the
replay moves it from event to event through ``ReplayClockService.Advance``, in the
simulator's order, so no decision waits on the wall clock and the two must agree job by
job) or *accelerated* (``--speedup`` times the wall clock). Then:

- every trace job is submitted through gRPC (``SubmitJob``) when its arrival comes on that
  clock, as a simulated GPU job of its model and batch size with its deadline;
- the jobs' pods are simulated here, from admission's ``stride.jobs.v1.share.<job>``
  events: a job progresses at its curve's speed on the GPUs its share gives it, pausing
  20 s after every change of size or place (the simulator's rule; shares at one instant
  count as the last one), and when its work is done a
  ``stride.jobs.v1.finished.<job>`` event is published (what the podwatcher does for
  real pods), at the moment the model says;
- the deadline satisfactory ratio (jobs done by their deadline over jobs with one; a
  refused job misses) is printed beside ``stride sim``'s Stride result on the same trace
  and cluster, with the difference in percentage points.

The optimizer and the podwatcher are not started: a trace's GPU jobs have no PS/worker
plans to make, and their pods are the model's, simulated here.
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import nats
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.signing import SignerFor, as_producers
from stride.bus.topics import TYPE_HEADER
from stride.events.v1 import job_pb2
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import SCALING_PAUSE_SECONDS, SLOT_SECONDS
from stride.runtime import tls
from stride.runtime.certs import init as init_certs
from stride.runtime.embedded_nats import NatsServer, free_port
from stride.runtime.tokens import USER_ISSUER, Signer

REPLAY_USER = "replay"
"""Whose jobs a replay submits (an admin token of that name)."""
LEAD_SECONDS = 2.0
"""Wall seconds between the admission service answering and the first arrival."""
STALL_SECONDS = 120.0
"""Wall seconds without any job ending or being decided, and no job's end scheduled,
before the replay gives up (admission stopped answering, or left jobs with no GPUs)."""


class ReplayError(RuntimeError):
    """The replay could not run (bad input, or a service that did not start)."""


@dataclass
class Tracked:
    """One trace job: what admission said and its books under the model."""

    name: str
    model: str
    batch_size: int
    arrival: float
    """Replay seconds (admission's clock)."""
    deadline: float | None
    iterations: float
    curve: ScalingCurve
    job_id: str = ""
    rejected: bool = False
    late: bool = False
    """Refused unstored: its deadline had passed when admission could take it."""
    remaining: float = 0.0
    units: int = 0
    last: float = 0.0
    paused_until: float = 0.0
    version: int = 0
    finished_at: float | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    gpus: tuple[tuple[str, int], ...] = ()
    """Where admission placed its GPUs (empty where GPUs are counted)."""
    instant: float | None = None
    """When the share last changed, and the books as they were before that instant (a
    later share at the same instant replaces the earlier one's effect, as admission's
    rounds at one instant do)."""
    before: tuple[int, float, float, tuple[tuple[str, int], ...], float | None] = (
        0,
        0.0,
        0.0,
        (),
        None,
    )
    end_at: float | None = None
    """When its work is done, as computed when its GPUs last changed (the simulator
    schedules its completion then, and keeps that time while nothing changes)."""

    @property
    def done(self) -> bool:
        return self.rejected or self.finished_at is not None


@dataclass(frozen=True)
class ReplayResult:
    """What the replay measured."""

    jobs: int
    deadline_jobs: int
    rejected: int
    met: int
    dsr: float | None
    wall_seconds: float
    speedup: float
    clock: str = "accelerated"
    """``stepped`` (moved by the replay, event to event) or ``accelerated``."""


class Replay:
    """Drives one admission service with a trace's jobs and simulates their pods."""

    def __init__(
        self,
        jobs: Sequence[Tracked],
        admission: str,
        nats_url: str,
        origin: float,
        speedup: float,
        pause_seconds: float = SCALING_PAUSE_SECONDS,
    ) -> None:
        self.jobs = list(jobs)
        self.admission = admission
        self.nats_url = nats_url
        self.origin = origin
        self.speedup = speedup
        self.pause = pause_seconds
        self.tls_environ: Mapping[str, str] = os.environ
        self.token: str | None = None
        """The submitter's user token (:attr:`AdmissionProcess.token`)."""
        """Where the admission client's TLS material comes from (:mod:`stride.runtime.tls`):
        the replay's own admission process's, by default the caller's environment."""
        self.by_id: dict[str, Tracked] = {}
        self.early: dict[str, list[job_pb2.JobShare]] = {}
        """Shares that arrived before their job's SubmitJob answer."""
        self.progress = asyncio.Event()
        self.clock = "accelerated"
        self.finishing: set[asyncio.Task[None]] = set()
        self.js: Any = None

    def _token(self) -> str | None:
        return self.token

    @functools.cached_property
    def _signers(self) -> SignerFor:
        return as_producers(lambda identity: tls.load(identity, self.tls_environ))

    def now(self) -> float:
        """Admission's clock (replay seconds)."""
        return self.origin + (time.time() - self.origin) * self.speedup

    def wall(self, at: float) -> float:
        """The wall time at which admission's clock reads ``at``."""
        return self.origin + (at - self.origin) / self.speedup

    async def run(self) -> ReplayResult:
        started = time.monotonic()
        connection = await nats.connect(self.nats_url, name="stride-replay")
        self.js = connection.jetstream()
        subscription = await self.js.subscribe(
            topics.JOB_SHARE.pattern(), cb=self._on_share, ordered_consumer=True
        )
        try:
            async with tls.aio_channel(
                self.admission,
                server="admission",
                identity="cli",
                environ=self.tls_environ,
                token=self._token,
            ) as channel:
                stub = pb_grpc.AdmissionServiceStub(channel)
                async with asyncio.TaskGroup() as group:  # a failed submission stops it all
                    for job in sorted(self.jobs, key=lambda j: j.arrival):
                        delay = self.wall(job.arrival) - time.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        group.create_task(self._submit(stub, job))
                await self._until_done()
        finally:
            await subscription.unsubscribe()
            await connection.drain()
        return self._result(time.monotonic() - started)

    def _result(self, wall_seconds: float) -> ReplayResult:
        deadline_jobs = [job for job in self.jobs if job.deadline is not None]
        met = sum(
            1
            for job in deadline_jobs
            if job.finished_at is not None
            and job.deadline is not None
            and job.finished_at <= job.deadline + 1e-6
        )
        return ReplayResult(
            jobs=len(self.jobs),
            deadline_jobs=len(deadline_jobs),
            rejected=sum(1 for job in self.jobs if job.rejected),
            met=met,
            dsr=met / len(deadline_jobs) if deadline_jobs else None,
            wall_seconds=wall_seconds,
            speedup=self.speedup,
            clock=self.clock,
        )

    async def _until_done(self) -> None:
        while not all(job.done for job in self.jobs):
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), STALL_SECONDS)
            except TimeoutError:
                if any(job.timer is not None and not job.done for job in self.jobs):
                    continue  # a long job runs on: its end is scheduled
                waiting = [job.name for job in self.jobs if not job.done][:5]
                raise ReplayError(
                    f"no job was decided or ended for {STALL_SECONDS:g} s; still running: "
                    f"{', '.join(waiting)} (see the admission log)"
                ) from None
        if self.finishing:
            await asyncio.gather(*self.finishing)

    async def _submit(self, stub: Any, job: Tracked) -> None:
        spec = _spec(job)
        request = pb.SubmitJobRequest(spec=spec, request_id=job.name)
        patience = time.monotonic() + STALL_SECONDS
        while True:
            try:
                reply = await stub.SubmitJob(request, timeout=10)
                break
            except grpc.aio.AioRpcError as error:
                retry = error.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
                if _deadline_passed(error):
                    # Admission was down past the job's deadline (the clock runs on while a
                    # service restarts): refused before it was stored, as a user would be.
                    job.rejected = job.late = True
                    self.progress.set()
                    return
                if not retry or time.monotonic() > patience:
                    raise ReplayError(
                        f"admission refused {job.name}'s submission: {error.details()}"
                    ) from None
                # Admission is restarting: the same request id finds the job if it was
                # stored before the crash, so nothing is submitted twice.
                await asyncio.sleep(0.2)
        self._accepted(job, spec, reply.job)

    def _accepted(self, job: Tracked, spec: job_pb2.JobSpec, decided: Any) -> None:
        """Admission answered a submission: start the job's books."""
        job.job_id = decided.job_id
        job.remaining = float(spec.termination.max_steps)
        job.last = job.arrival
        self.by_id[job.job_id] = job
        if decided.decision.outcome == job_pb2.ADMISSION_OUTCOME_REJECTED:
            job.rejected = True
        for share in self.early.pop(job.job_id, []):
            self._apply(job, share)
        self.progress.set()

    async def _on_share(self, msg: Any) -> None:
        share = job_pb2.JobShare.FromString(msg.data)
        job = self.by_id.get(share.job_id)
        if job is None:
            self.early.setdefault(share.job_id, []).append(share)
            return
        self._apply(job, share)

    def _apply(self, job: Tracked, share: job_pb2.JobShare, exact: float | None = None) -> None:
        """The simulator's books for one share change (:class:`Pool`'s rule): a change of
        size, or a move at the same size (a migration), pauses the job; several shares at
        one instant count as the last one alone. ``exact``: the decision's time, exactly
        (else ``decided_at``, rounded)."""
        if share.version <= job.version or job.done:
            return
        job.version = share.version
        at = exact if exact is not None else share.decided_at.ToDatetime(tzinfo=UTC).timestamp()
        self._advance(job, at)
        if job.instant != at:
            job.instant = at
            job.before = (job.units, job.paused_until, job.last, job.gpus, job.end_at)
        units, paused_until, last, gpus, end_at = job.before
        new_gpus = tuple((gpu.node, gpu.index) for gpu in share.gpus)
        moved = bool(units and gpus and new_gpus) and new_gpus != gpus
        job.units, job.paused_until, job.last, job.gpus = units, paused_until, last, new_gpus
        job.end_at = end_at
        if int(share.units) != units or moved:
            job.units = int(share.units)
            job.last = at
            job.end_at = None
            if job.units:
                job.paused_until = at + self.pause
                job.end_at = job.paused_until + job.remaining / job.curve.throughput(job.units)
        self._schedule_end(job)

    def _advance(self, job: Tracked, at: float) -> None:
        if job.units:
            start = max(job.last, job.paused_until)
            if at > start:
                rate = job.curve.throughput(job.units)
                job.remaining = max(0.0, job.remaining - rate * (at - start))
        job.last = max(job.last, at)

    def _schedule_end(self, job: Tracked) -> None:
        if job.timer is not None:
            job.timer.cancel()
            job.timer = None
        if not job.units or job.end_at is None:
            return
        end = job.end_at
        delay = max(0.0, self.wall(end) - time.time())
        version = job.version
        job.timer = asyncio.get_running_loop().call_later(delay, self._end, job, end, version)

    def _end(self, job: Tracked, end: float, version: int) -> None:
        if job.version != version or job.done:
            return
        job.finished_at = end
        task = asyncio.get_running_loop().create_task(self._publish_end(job, end))
        self.finishing.add(task)
        task.add_done_callback(self.finishing.discard)
        self.progress.set()

    async def _publish_end(self, job: Tracked, end: float) -> None:
        event = job_pb2.JobFinished(job_id=job.job_id, outcome=job_pb2.JOB_OUTCOME_SUCCEEDED)
        event.finished_at.FromDatetime(datetime.fromtimestamp(end, UTC))
        outgoing = topics.JOB_FINISHED.outgoing(job.job_id, event, f"{job.job_id}.finished")
        headers = {**outgoing.headers, "Nats-Msg-Id": outgoing.message_id}
        # The replay plays the pod watcher, which admission trusts for a job's end.
        signer = self._signers(outgoing.subject)
        if signer is not None:
            headers.update(signer.headers(outgoing.subject, headers[TYPE_HEADER], outgoing.payload))
            headers["Nats-Msg-Id"] = signer.message_id(outgoing.subject, outgoing.message_id)
        await self.js.publish(outgoing.subject, outgoing.payload, headers=headers)


STEPPED_ORIGIN = 0.0
"""Where a stepped replay's clock starts: trace time 0 is the epoch, so admission's times are
the simulator's own numbers and their arithmetic (the slot grid above all) is the same to
the last bit."""
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class SteppedReplay(Replay):
    """A replay on admission's stepped clock (``replay_stepped``): the replay moves the
    clock from event to event, as the simulator's event queue does, so no decision waits
    on the wall clock and the live service decides what ``stride sim`` decides.

    At each instant, in the simulator's order: the clock moves there
    (``ReplayClockService.Advance``); the jobs whose work the model says is done end
    (``stride.jobs.v1.finished``, and the replay waits until admission has taken the end);
    the jobs arriving then are submitted; the rounds due then run (``Advance`` with
    ``inclusive``); and the replay reads the job stream up to its last message before it
    computes the next instant from the shares it got. A restarted admission is waited for:
    its clock stands still meanwhile, so nothing is lost by the outage.
    """

    def __init__(
        self,
        jobs: Sequence[Tracked],
        admission: str,
        nats_url: str,
        pause_seconds: float = SCALING_PAUSE_SECONDS,
    ) -> None:
        super().__init__(jobs, admission, nats_url, STEPPED_ORIGIN, 1.0, pause_seconds)
        self.clock = "stepped"
        self.clock_now = STEPPED_ORIGIN
        self.seen = 0
        """The last stream sequence of STRIDE_JOBS this replay has read."""
        self.seen_changed = asyncio.Event()
        self.steps = 0

    def now(self) -> float:
        return self.clock_now

    async def run(self) -> ReplayResult:
        started = time.monotonic()
        connection = await nats.connect(self.nats_url, name="stride-replay")
        self.js = connection.jetstream()
        subscription = await self.js.subscribe(
            topics.JOBS.subjects[0], cb=self._on_job_event, ordered_consumer=True
        )
        try:
            async with tls.aio_channel(
                self.admission,
                server="admission",
                identity="cli",
                environ=self.tls_environ,
                token=self._token,
            ) as channel:
                await self._drive(
                    pb_grpc.AdmissionServiceStub(channel), pb_grpc.ReplayClockServiceStub(channel)
                )
        finally:
            await subscription.unsubscribe()
            await connection.drain()
        return self._result(time.monotonic() - started)

    async def _drive(self, stub: Any, clock: Any) -> None:
        arrivals = sorted(self.jobs, key=lambda j: j.arrival)
        following = 0
        next_round: float | None = None
        while True:
            ends = [(self._end_time(job), job) for job in self.jobs if self._running(job)]
            instants = [end for end, _ in ends]
            if following < len(arrivals):
                instants.append(arrivals[following].arrival)
            if next_round is not None:
                instants.append(next_round)
            if not instants:
                break
            at = min(instants)
            self.steps += 1
            await self._move_clock(clock, at, inclusive=False)
            for job in self.jobs:  # the simulator advances its running jobs at every event
                if self._running(job):
                    self._advance(job, at)
            for end, job in sorted(ends, key=lambda item: item[0]):
                if end <= at:
                    await self._finish(stub, job, end)
            while following < len(arrivals) and arrivals[following].arrival <= at:
                await self._submit(stub, arrivals[following])
                following += 1
            next_round = await self._move_clock(clock, at, inclusive=True)
            await self._read_all()
        unfinished = [job.name for job in self.jobs if not job.done][:5]
        if unfinished:
            raise ReplayError(
                f"admission left jobs without GPUs and has no round due: {', '.join(unfinished)}"
            )

    def _running(self, job: Tracked) -> bool:
        return not job.done and job.units > 0 and bool(job.job_id) and job.end_at is not None

    def _end_time(self, job: Tracked) -> float:
        assert job.end_at is not None
        return job.end_at

    def _schedule_end(self, job: Tracked) -> None:
        """Ends are the replay's next instants here, not timers."""

    async def _call(self, method: Any, request: Any, what: str) -> Any:
        """One gRPC call, retried while admission restarts (its clock stands still)."""
        patience = time.monotonic() + STALL_SECONDS
        while True:
            try:
                return await method(request, timeout=30)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRY_CODES or time.monotonic() > patience:
                    raise ReplayError(f"admission: {what}: {error.details()}") from None
                await asyncio.sleep(0.2)

    async def _move_clock(self, clock: Any, at: float, inclusive: bool) -> float | None:
        to = Timestamp()
        to.FromDatetime(datetime.fromtimestamp(at, UTC))
        request = pb.AdvanceRequest(to=to, inclusive=inclusive, to_unix_seconds=at)
        reply = await self._call(clock.Advance, request, "moving the clock")
        self.clock_now = at
        if not reply.HasField("next_round"):
            return None
        return float(reply.next_round_unix_seconds)

    def _apply(self, job: Tracked, share: job_pb2.JobShare, exact: float | None = None) -> None:
        """As the accelerated replay, at the clock's exact time: every share a step reads
        was decided at the instant the clock stands at (``decided_at`` is rounded)."""
        decided = share.decided_at.ToDatetime(tzinfo=UTC).timestamp()
        if exact is None and abs(decided - self.clock_now) < 1e-3:
            exact = self.clock_now
        super()._apply(job, share, exact)

    async def _finish(self, stub: Any, job: Tracked, end: float) -> None:
        job.finished_at = end
        await self._publish_end(job, end)
        request = pb.GetJobRequest(job_id=job.job_id)
        patience = time.monotonic() + STALL_SECONDS
        while True:
            reply = await self._call(stub.GetJob, request, f"reading {job.name}")
            if reply.job.state not in (pb.JOB_STATE_ADMITTED, pb.JOB_STATE_QUEUED):
                return
            if time.monotonic() > patience:
                raise ReplayError(f"admission did not take {job.name}'s end (see its log)")
            await asyncio.sleep(0.002)

    async def _submit(self, stub: Any, job: Tracked) -> None:
        spec = _spec(job)
        reply = await self._call(
            stub.SubmitJob,
            pb.SubmitJobRequest(spec=spec, request_id=job.name),
            f"submitting {job.name}",
        )
        self._accepted(job, spec, reply.job)

    async def _on_job_event(self, msg: Any) -> None:
        self.seen = max(self.seen, msg.metadata.sequence.stream)
        self.seen_changed.set()
        if topics.JOB_SHARE.key_of(msg.subject) is not None:
            await self._on_share(msg)

    async def _read_all(self) -> None:
        """Wait until every message now in the job stream has been read (and its share
        applied to the books)."""
        info = await self.js.stream_info(topics.JOBS.name)
        last = info.state.last_seq
        patience = time.monotonic() + STALL_SECONDS
        while self.seen < last:
            self.seen_changed.clear()
            try:
                await asyncio.wait_for(self.seen_changed.wait(), 1.0)
            except TimeoutError:
                if time.monotonic() > patience:
                    raise ReplayError(
                        f"the job stream stopped at {self.seen} of {last} messages"
                    ) from None


def _deadline_passed(error: grpc.aio.AioRpcError) -> bool:
    details = error.details() or ""
    return (
        error.code() == grpc.StatusCode.INVALID_ARGUMENT
        and details.startswith("spec.deadline")
        and "not in the future" in details
    )


def _spec(job: Tracked) -> job_pb2.JobSpec:
    """A trace job as a user would submit it: a simulated GPU job of a known model."""
    spec = job_pb2.JobSpec(
        name=job.name,
        user=REPLAY_USER,
        model=job_pb2.ModelReference(name=job.model, entrypoint="stride_replay.simulated:train"),
        dataset=job_pb2.DatasetSpec(
            name="trace",
            uri="trace://replay",
            record_count=max(1, round(job.iterations)) * job.batch_size,
        ),
        batch_size=job.batch_size,
        termination=job_pb2.Termination(max_steps=max(1, round(job.iterations))),
        resource_kind=job_pb2.RESOURCE_KIND_GPU,
        simulated=True,
    )
    if job.deadline is not None:
        spec.deadline.FromDatetime(datetime.fromtimestamp(job.deadline, UTC))
    return spec


@dataclass(frozen=True)
class Comparison:
    """The live replay beside the simulator on the same trace and cluster."""

    live: ReplayResult
    sim_dsr: float | None
    sim_wall_seconds: float
    gpus: int
    trace: str
    cluster: str
    differing: tuple[str, ...] = ()
    """Jobs the live service and the simulator treated differently: refused by one only,
    or on time in one only (empty without ``--sim``)."""

    @property
    def difference_pp(self) -> float | None:
        if self.live.dsr is None or self.sim_dsr is None:
            return None
        return 100.0 * (self.live.dsr - self.sim_dsr)


def replay_trace(
    trace: Path,
    cluster: Path,
    curves: Path,
    speedup: float,
    window: Any = None,
    state_dir: Path | None = None,
    simulate: bool = True,
    clock: str = "stepped",
) -> Comparison:
    """Run a trace through a fresh admission service and (``simulate``) ``stride sim``.

    ``clock``: ``stepped`` (the replay moves admission's clock from event to event; the
    decisions are the simulator's at any speed) or ``accelerated`` (admission's clock runs
    ``speedup`` times the wall clock; a decision's latency is multiplied by it)."""
    if clock not in ("stepped", "accelerated"):
        raise ReplayError(f"--clock: {clock!r} is not stepped or accelerated")
    from stride.sim.deadline import DeadlineCluster, run_deadline
    from stride.sim.traces import load_cluster_spec, load_curves, load_deadline_trace

    for option, path, folder in (
        ("--trace", trace, False),
        ("--cluster", cluster, False),
        ("--curves", curves, True),
    ):
        if not (path.is_dir() if folder else path.is_file()):
            kind = "folder" if folder else "file"
            raise ReplayError(f"{option}: {path} is not a {kind}")
    trace_jobs = load_deadline_trace(trace, window)
    if not trace_jobs:
        raise ReplayError(f"--trace: {trace} has no job in the window")
    spec = load_cluster_spec(cluster)
    gpus = DeadlineCluster.from_spec(spec).num_gpus
    library = load_curves(curves)
    for job in trace_jobs:
        library.curve(job)  # every job's model and batch size must be known (names the line)
    sim_dsr, sim_wall = None, 0.0
    sim_result = None
    if simulate:
        began = time.monotonic()
        sim_result = run_deadline(trace_jobs, DeadlineCluster.from_spec(spec), "stride", 0, library)
        sim_wall, sim_dsr = time.monotonic() - began, sim_result.dsr
    workdir = Path(state_dir or tempfile.mkdtemp(prefix="stride-replay-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = NatsServer(workdir / "nats").start()
    stepped = clock == "stepped"
    fanouts = DeadlineCluster.from_spec(spec).fanouts
    admission = AdmissionProcess(
        workdir,
        server.url,
        gpus,
        curves,
        speedup,
        stepped=stepped,
        topology="x".join(map(str, fanouts)) if fanouts else None,
    )
    try:
        admission.start()
        if stepped:
            tracked = track(trace_jobs, library, trace_jobs[0].submission_time)
            stepped_replay = SteppedReplay(tracked, admission.address, server.url)
            stepped_replay.tls_environ = admission.env
            stepped_replay.token = admission.token
            live = asyncio.run(stepped_replay.run())
        else:
            tracked = track(trace_jobs, library, admission.first_slot_after(LEAD_SECONDS))
            replay = Replay(tracked, admission.address, server.url, admission.origin, speedup)
            replay.tls_environ = admission.env
            replay.token = admission.token
            live = asyncio.run(replay.run())
    finally:
        admission.stop()
        server.stop()
    differing: tuple[str, ...] = ()
    if sim_result is not None:
        differing = _differing(trace_jobs, tracked, sim_result)
    return Comparison(live, sim_dsr, sim_wall, gpus, str(trace), str(cluster), differing)


def _differing(trace_jobs: Sequence[Any], tracked: Sequence[Tracked], sim: Any) -> tuple[str, ...]:
    """The trace jobs refused by one side only, or on time on one side only."""
    dropped = set(sim.dropped)
    differ = []
    for trace_job, job in zip(trace_jobs, tracked, strict=True):
        sim_finish = sim.finish_times.get(trace_job.job_id)
        sim_met = (
            sim_finish is not None
            and trace_job.deadline is not None
            and sim_finish <= trace_job.deadline + 1e-6
        )
        live_met = (
            job.finished_at is not None
            and job.deadline is not None
            and job.finished_at <= job.deadline + 1e-6
        )
        if (trace_job.job_id in dropped) != job.rejected or sim_met != live_met:
            differ.append(job.name)
    return tuple(differ)


def track(trace_jobs: Sequence[Any], library: Any, start: float) -> list[Tracked]:
    """The trace's jobs on admission's clock, the first arriving at ``start``."""
    offset = start - trace_jobs[0].submission_time
    return [
        Tracked(
            name=f"trace-{job.line or index}",
            model=job.model_name,
            batch_size=job.batch_size,
            arrival=job.submission_time + offset,
            deadline=None if job.deadline is None else job.deadline + offset,
            iterations=job.iterations,
            curve=library.curve(job),
        )
        for index, job in enumerate(trace_jobs)
    ]


class AdmissionProcess:
    """``python -m stride.admission`` on a replay clock, restartable after a kill (the
    clock's origin is kept, so its time goes on as if it had never stopped)."""

    def __init__(
        self,
        workdir: Path,
        nats_url: str,
        gpus: int,
        curves: Path,
        speedup: float,
        *,
        stepped: bool = False,
        topology: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.origin = time.time()
        self.speedup = speedup
        self.log = workdir / "admission.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.env = {
            **os.environ,
            "STRIDE_ADMISSION_NATS_URL": nats_url,
            "STRIDE_ADMISSION_DATABASE_URL": f"sqlite:///{workdir / 'admission.db'}",
            "STRIDE_ADMISSION_GRPC_HOST": "127.0.0.1",
            "STRIDE_ADMISSION_GRPC_PORT": str(self.port),
            "STRIDE_ADMISSION_CAPACITY_SOURCE": "settings",
            "STRIDE_ADMISSION_CLUSTER_GPUS": str(gpus),
            "STRIDE_ADMISSION_CURVES_DIR": str(curves),
            "STRIDE_ADMISSION_LOG_LEVEL": os.environ.get("STRIDE_ADMISSION_LOG_LEVEL", "warning"),
        }
        if not tls.configured():
            # A replay's admission service is its own: certificates of its own, in its folder.
            init_certs(workdir / "tls", identities=("admission", "cli", "podwatcher", USER_ISSUER))
            self.env[tls.TLS_DIR_ENV] = str(workdir / "tls")
        material = tls.load(USER_ISSUER, self.env)
        self.token: str | None = (
            None
            if material is None
            else Signer(material).user_token(REPLAY_USER, admin=True, ttl=30 * 24 * 3600.0)
        )
        """The replay's user token (an admin: a stepped replay drives the clock)."""
        if topology is not None:  # placed on the trace cluster's tree, as stride sim places
            self.env["STRIDE_ADMISSION_CLUSTER_TOPOLOGY"] = topology
        if stepped:
            self.env["STRIDE_ADMISSION_REPLAY_STEPPED"] = "true"
            self.env["STRIDE_ADMISSION_REPLAY_ORIGIN"] = repr(STEPPED_ORIGIN)
        else:
            self.env["STRIDE_ADMISSION_REPLAY_SPEEDUP"] = repr(float(speedup))
            self.env["STRIDE_ADMISSION_REPLAY_ORIGIN"] = repr(self.origin)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start (or start again) and wait until it serves."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stride.admission"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        _wait_serving(self.address, self.process, self.log, self.env)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def first_slot_after(self, lead: float) -> float:
        """The first slot boundary of admission's clock ``lead`` wall seconds from now:
        trace time 0 falls on one, as it does in the simulator."""
        later = self.origin + (time.time() + lead - self.origin) * self.speedup
        return math.ceil(later / SLOT_SECONDS) * SLOT_SECONDS


def _wait_serving(
    address: str, process: subprocess.Popen[bytes], log: Path, environ: Mapping[str, str]
) -> None:
    deadline = time.monotonic() + 60
    with tls.sync_channel(address, server="admission", identity="cli", environ=environ) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                raise ReplayError(f"the admission service exited: {' | '.join(tail)}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise ReplayError(f"the admission service did not serve within 60 s (log: {log})")
