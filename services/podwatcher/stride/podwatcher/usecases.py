"""The podwatcher's use cases: run each admitted job's pods as its newest plan says, report
how they end, relaunch them within a budget, and end the job.

The life of a job here (DLRover sec. 5.1, DLRover-RM sec. 5.2):

1. ``admitted`` stores the job's spec; a plan on the bus is recorded if it is the job's
   newest (a stale or duplicate version changes nothing, whatever order they arrive in).
2. ``apply`` reconciles the pods with the newest plan (:func:`~stride.podwatcher.domain.
   reconcile.reconcile`): new pods are written PENDING, then started, then RUNNING with a
   ``started`` event through the outbox. Resizes happen in place. When the TensorFlow
   cluster changes (scale out or in, a migrated PS), the chief is sent a RECONFIGURE
   command with the new cluster; the pods it no longer needs are removed only once it
   confirms (its agent's ack), so a scale-in or migration never pulls a PS or worker from
   under a running step. New pods start before the chief pauses, so the pause never
   includes a start-up. A chief that must move gets a new pod that starts as a standby
   (TensorFlow and the job's code loaded, waiting); when the old chief has saved and
   handed over (its ack), or has ended without doing so, the standby is sent RESUME with
   the checkpoint and the new cluster, and the old chief is removed.
3. ``pod_ended`` records how a pod ended, publishes ``failed``/``succeeded``/``deleted``
   with the reason (OOMKilled read from the cgroup, Evicted, Error with the exit code and
   log tail), and then:
   - the chief succeeded: every shard of the last epoch is done, so the job SUCCEEDED,
     its other pods are removed and ``finished`` is published;
   - a pod failed within the relaunch budget: it is relaunched under its own name and
     address (a PS or worker is found again where it was). An OOM-killed pod first waits
     (``oom_replan_seconds``) for the optimizer's next plan, which gives it more memory by
     the policy's OOM rule; without one it is relaunched as it was;
   - over budget: the job FAILED with the reason, its pods are removed, ``finished``.
4. ``job_finished`` (a cancel from admission) removes the job's pods; checkpoints stay in
   the cache.
5. A plan with no pods **suspends** the job (admission preempted it, or gave its units to
   guaranteed jobs): the chief is sent PAUSE, which finishes its steps, flushes the data
   feed and saves a flash checkpoint (with the dispatcher's shard positions) before it
   answers; then every pod is removed. The seamless-migration path's order (checkpoint,
   then remove), so the job resumes where it stopped: when a plan with pods comes again,
   the new pods start and the chief restores that checkpoint, and the dispatcher puts its
   shards back as they were, nothing lost or repeated. Without a running chief, or without
   an answer in ``reconfigure_timeout_seconds``, the pods are removed all the same and the
   job resumes from its newest periodic checkpoint.

**The reconcile loop** (KOD2 sec. 4.2; Ray autoscaler v2's instance manager). Events do
not apply plans themselves: a recorded plan, an admission, a pod's end, a node restored or
a sweep only put the job's id in a rate-limited work queue (:class:`~stride.podwatcher.
workqueue.WorkQueue`), and :meth:`PodWatcher.reconcile_loop`'s workers take ids one at a
time and run a pass, :meth:`PodWatcher.apply`: read the newest plan and the job's pods,
compare them through the pure :func:`~stride.podwatcher.domain.reconcile.reconcile`, take
the step it gives and record it. A pass that fails is queued again after a back-off per
job; an OOM-killed pod's job is queued for after its wait. A job queued many times before a
worker takes it gets one pass, and one job never has two passes at once.

Each job is handled under its own lock, so a plan, a pod's end and an ack never interleave
for one job. Every step is idempotent: the database says what was done, and running it
again after a crash or a redelivery does nothing twice.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import structlog
from google.protobuf import json_format

from stride.bus import topics
from stride.bus.client import Bus
from stride.db.engine import Database, Session
from stride.db.outbox import Outbox
from stride.events.v1 import control_pb2, job_pb2, plan_pb2, pod_pb2
from stride.podwatcher.adapters.convert import (
    ROLE_TO_PROTO,
    inventory_to_proto,
    plan_from_proto,
    timestamp,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import (
    Backend,
    PodEnded,
    PodStart,
    PodUsage,
    ResizeRefused,
)
from stride.podwatcher.adapters.outbound.repository import StoredJob, StoredPlan, StoredPod
from stride.podwatcher.domain.cluster import PlanState, PodPhase
from stride.podwatcher.domain.nodes import NodeSpec, check_node_name
from stride.podwatcher.domain.plans import Arrival, classify_arrival, validate_plan
from stride.podwatcher.domain.reconcile import (
    CLUSTER_ROLES,
    PodRecord,
    PodWant,
    Reconciliation,
    Unplaceable,
    reconcile,
)
from stride.podwatcher.workqueue import WorkQueue
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound
from stride.vocabulary import Role

log = structlog.get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R")

SIMULATED = "simulated job: no pods (its agents are played by stride loadgen)"
"""Why a simulated job's plan counts as applied."""

FAILURE_REASONS = {
    "OOMKilled": pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
    "Evicted": pod_pb2.POD_FAILURE_REASON_EVICTED,
    "Error": pod_pb2.POD_FAILURE_REASON_ERROR,
    "Preempted": pod_pb2.POD_FAILURE_REASON_PREEMPTED,
    "ImagePullBackOff": pod_pb2.POD_FAILURE_REASON_IMAGE_PULL_BACK_OFF,
    "CrashLoopBackOff": pod_pb2.POD_FAILURE_REASON_CRASH_LOOP_BACK_OFF,
}
JOB_STATES = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: "SUCCEEDED",
    job_pb2.JOB_OUTCOME_FAILED: "FAILED",
    job_pb2.JOB_OUTCOME_CANCELLED: "CANCELLED",
}


class JobNotAdmitted(Exception):
    """A plan for a job whose admission the podwatcher has not seen (yet).

    Retried by the bus: admission's event usually arrives a moment later. A plan for a job
    that is never admitted ends in the dead-letter stream with this message.
    """


@dataclass(frozen=True)
class Timing:
    """How patient the podwatcher is; see the settings of the same names."""

    relaunch_budget: int = 3
    oom_replan_seconds: float = 30.0
    reconfigure_timeout_seconds: float = 180.0
    usage_interval_seconds: float = 5.0


@dataclass(frozen=True)
class PodView:
    """A pod as the API shows it: its row and its last usage sample."""

    pod: StoredPod
    usage: PodUsage | None
    address: str


@dataclass(frozen=True)
class NodeView:
    """A node and what its pods were given."""

    node: NodeSpec
    cpu_allocated: float
    memory_allocated_bytes: int
    drained: bool = False


def free_port() -> int:
    """A TCP port free on this host right now (the pod binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


PORTS_REMEMBERED = 4096
"""How many ports handed out to pods a pod watcher remembers, to never hand one out twice."""


class PortPicker:
    """Ports for new pods: from ``probe`` (a port free right now), but never one already
    handed out to a pod. A pod binds its port only once its process starts, so until then
    a probe may return the same port again; two pods given one port fail at every relaunch
    (seen: a job's worker given its parameter server's port)."""

    def __init__(self, probe: Callable[[], int]) -> None:
        self.probe = probe
        self._given: deque[int] = deque(maxlen=PORTS_REMEMBERED)

    def __call__(self, taken: Iterable[int] = ()) -> int:
        """A port neither given before nor in ``taken`` (ports the caller knows are used)."""
        avoid = {*self._given, *taken}
        for _ in range(100):
            port = self.probe()
            if port not in avoid:
                self._given.append(port)
                return port
        raise RuntimeError("no free port that is not already a pod's, after 100 probes")


def now_utc() -> datetime:
    return datetime.now(UTC)


class PodWatcher:
    """Runs jobs' pods through a backend, as their newest plans say."""

    def __init__(
        self,
        database: Database,
        outbox: Outbox,
        backend: Backend,
        bus: Bus,
        timing: Timing = Timing(),
        ports: Callable[[], int] = free_port,
        cluster: str = "local",
    ) -> None:
        self.cluster = cluster
        """The cluster's name in the node inventory's subject."""
        self._published: tuple[NodeSpec, ...] | None = None
        """The node inventory last published (None: not yet in this run)."""
        self.database = database
        self.outbox = outbox
        self.backend = backend
        self.bus = bus
        self.timing = timing
        self.ports = PortPicker(ports)
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._usage: dict[str, PodUsage] = {}
        self._timers: dict[str, asyncio.Task[None]] = {}
        self.queue = WorkQueue()
        """Jobs waiting for a pass of :meth:`reconcile_loop`."""
        self._waiting_for_room: set[str] = set()
        """Jobs whose newest plan fits the nodes but not beside the other jobs' pods now:
        applied again whenever a pod ends and frees room (Kubernetes keeps such pods
        Pending)."""

    # --- plans and admissions -------------------------------------------------------

    async def receive_all(
        self, messages: Sequence[plan_pb2.ResourcePlan]
    ) -> list[Arrival | Exception]:
        """Validate and record plans that are their jobs' newest, then apply them: a
        fetched batch, in order; per plan, how it arrived or the error it met (an invalid
        plan :class:`InvalidArgument`, dead-lettered; a job not admitted
        :class:`JobNotAdmitted`, retried, then dead-lettered).

        The batch's plans are classified against what is stored and the newer ones stored
        in one transaction (a transaction per plan was most of the pod watcher's work
        under a stream of submissions, ``bench/submit_load.py``); if it fails, each alone,
        so a bad one fails alone. Then each newly recorded plan of a job with pods is
        applied; a simulated job's plan is recorded as applied."""
        outcomes: list[Arrival | Exception] = [Arrival.STALE] * len(messages)
        valid = []
        for index, message in enumerate(messages):
            try:
                validate_plan(plan_from_proto(message))
            except InvalidArgument as error:
                outcomes[index] = error
            else:
                valid.append(index)
        recorded = await _together_or_alone(
            "plans", [messages[index] for index in valid], self._record_plans
        )
        for index, result in zip(valid, recorded, strict=True):
            if isinstance(result, Exception):
                outcomes[index] = result
                continue
            arrival, job = result
            outcomes[index] = arrival
            if isinstance(arrival, Exception) or job is None:
                continue
            plan = messages[index]
            if job.state != "RUNNING":
                log.info("plan for an ended job ignored", job_id=plan.job_id, state=job.state)
            elif arrival is Arrival.STALE:
                log.warning("stale plan ignored", job_id=plan.job_id, version=plan.version)
            elif arrival is Arrival.DUPLICATE:
                log.info("plan already recorded", job_id=plan.job_id, version=plan.version)
            else:
                log.info(
                    "plan recorded", job_id=plan.job_id, version=plan.version, reason=plan.reason
                )
                if not job.spec.simulated:
                    self.queue.add(plan.job_id)
        return outcomes

    async def _record_plans(
        self, messages: Sequence[plan_pb2.ResourcePlan]
    ) -> list[tuple[Arrival | Exception, StoredJob | None]]:
        """Classify each plan (in order, so a later one of the same job is compared with
        an earlier one of the batch) and store the newer ones of running jobs, in one
        transaction. A plan of a job not admitted is :class:`JobNotAdmitted`."""
        if not messages:
            return []
        now = now_utc()
        found: list[tuple[Arrival | Exception, StoredJob | None]] = []
        accepted: list[tuple[plan_pb2.ResourcePlan, PlanState, str]] = []
        async with self.database.transaction() as session:
            ids = [message.job_id for message in messages]
            stored = await repository.get_jobs(session, ids)
            newest: dict[str, int | None] = dict(await repository.newest_versions(session, ids))
            for message in messages:
                job = stored.get(message.job_id)
                if job is None:
                    found.append(
                        (
                            JobNotAdmitted(
                                f"no admitted job {message.job_id!r}: plan v{message.version}"
                            ),
                            None,
                        )
                    )
                    continue
                arrival = classify_arrival(message.version, newest.get(message.job_id))
                if arrival is Arrival.NEWER and job.state == "RUNNING":
                    # A simulated job's plan is applied as it is recorded: it starts no pods.
                    simulated = job.spec.simulated
                    state = PlanState.APPLIED if simulated else PlanState.RECORDED
                    accepted.append((message, state, SIMULATED if simulated else ""))
                    newest[message.job_id] = message.version
                found.append((arrival, job))
            await repository.insert_plans(session, accepted, now)
        return found

    async def admitted_all(
        self, decisions: Sequence[job_pb2.AdmissionDecision]
    ) -> list[Exception | None]:
        """Store admitted jobs' specs (idempotent), a fetched batch; per decision, None or
        the error it met.

        The specs are stored in one transaction (a transaction per job was a third of the
        pod watcher's work under a stream of submissions, ``bench/submit_load.py``); if it
        fails, each alone, so a bad one fails alone. A job stored now has no plan yet (a
        plan of a job not stored is refused and retried, and applied when it is recorded);
        one stored before (a redelivery, after a crash perhaps) is queued for a pass."""
        outcomes: list[Exception | None] = [None] * len(decisions)
        valid = []
        for index, decision in enumerate(decisions):
            if decision.HasField("spec"):
                valid.append(index)
            else:
                outcomes[index] = InvalidArgument(
                    "spec", "an admitted job's decision must carry its spec"
                )
        created = await _together_or_alone(
            "admitted jobs", [decisions[index] for index in valid], self._store_jobs
        )
        for index, new in zip(valid, created, strict=True):
            job_id = decisions[index].job_id
            if isinstance(new, Exception):
                outcomes[index] = new
            elif new:
                log.info("job admitted", job_id=job_id)
            else:
                self.queue.add(job_id)
        return outcomes

    async def _store_jobs(self, decisions: Sequence[job_pb2.AdmissionDecision]) -> list[bool]:
        """Store the decisions' jobs not stored yet, in one transaction; per decision,
        whether it stored its job (False for one stored before, in the batch too)."""
        if not decisions:
            return []
        async with self.database.transaction() as session:
            new = await repository.insert_jobs(
                session, [(decision.job_id, decision.spec) for decision in decisions], now_utc()
            )
        created = []
        for decision in decisions:
            created.append(decision.job_id in new)
            new.discard(decision.job_id)
        return created

    # --- applying ---------------------------------------------------------------------

    async def reconcile_loop(self, stop: asyncio.Event, workers: int = 4) -> None:
        """Run passes for queued jobs until ``stop`` (see the module docstring)."""

        async def worker() -> None:
            while True:
                job_id = await self.queue.get()
                try:
                    await self.apply(job_id)
                    self.queue.forget(job_id)
                except Exception as error:
                    delay = self.queue.retry(job_id)
                    log.warning(
                        "reconcile pass failed; queued again",
                        job_id=job_id,
                        error=f"{type(error).__name__}: {error}"[:500],
                        retry_in=round(delay, 3),
                        failures=self.queue.failures(job_id),
                    )
                finally:
                    self.queue.done(job_id)

        tasks = [asyncio.create_task(worker(), name=f"reconcile-{n}") for n in range(workers)]
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.queue.close()

    async def apply(self, job_id: str) -> None:
        """One pass: make the job's pods match its newest plan (see the module docstring)."""
        async with self._locks[job_id]:
            await self._apply(job_id)

    async def _apply(self, job_id: str) -> None:
        async with self.database.sessions() as session:
            job = await repository.get_job(session, job_id)
            running = job is not None and job.state == "RUNNING"
            stored = await repository.newest_plan(session, job_id) if running else None
            if job is None or stored is None or not running:
                self._waiting_for_room.discard(job_id)
                return
            simulated = job.spec.simulated
            if not simulated:
                rows = await repository.job_pods(session, job_id)
                others = [
                    p for p in await repository.live_pods(session) if p.record.job_id != job_id
                ]
        if simulated:
            # `stride loadgen` plays this job's agents: its plans are the services' to make
            # and measure, and no pod is started for them.
            if stored.state is not PlanState.APPLIED:
                await self._set_plan_state(
                    job_id, stored.plan.version, PlanState.APPLIED, SIMULATED
                )
            return
        plan = plan_from_proto(stored.plan)
        if not any(resources.count for resources in plan.roles):
            await self._suspend(job, stored, rows)
            return
        now = now_utc()
        waiting = {
            row.record.name for row in rows if self._waits_for_oom_plan(row, plan.version, now)
        }
        try:
            recon = reconcile(
                plan,
                [row.record for row in rows],
                self.backend.nodes(),
                [row.record for row in others],
            )
        except Unplaceable as error:
            try:
                reconcile(plan, [row.record for row in rows], self.backend.nodes())
            except Unplaceable:
                log.warning(
                    "plan cannot be placed", job_id=job_id, version=plan.version, why=str(error)
                )
                await self._set_plan_state(job_id, plan.version, PlanState.FAILED, str(error))
                return
            # It fits the nodes, just not beside what other jobs hold now: wait for room.
            log.info("plan waits for room", job_id=job_id, version=plan.version, why=str(error))
            self._waiting_for_room.add(job_id)
            await self._set_plan_state(
                job_id, plan.version, PlanState.RECORDED, f"waiting for room: {error}"
            )
            return
        self._waiting_for_room.discard(job_id)
        relaunch = tuple(want for want in recon.relaunch if want.name not in waiting)
        recon = replace(recon, relaunch=relaunch)
        if recon.empty:
            if (
                job.reconfigure_version == 0
                and stored.state is not PlanState.APPLIED
                and not waiting
            ):
                await self._set_plan_state(job_id, plan.version, PlanState.APPLIED, "")
            return
        log.info(
            "applying plan",
            job_id=job_id,
            version=plan.version,
            create=[w.name for w in recon.create],
            relaunch=[w.name for w in recon.relaunch],
            resize=[r.pod.name for r in recon.resize],
            migrate=[m.old.name for m in recon.migrate],
            delete=[p.name for p in recon.delete],
        )
        by_name = {row.record.name: row for row in rows}
        starts = await self._record_starts(job, plan.version, recon, by_name)
        running_chiefs = [
            row
            for row in rows
            if row.record.role is Role.CHIEF and row.record.phase is PodPhase.RUNNING
        ]
        handing_over = next((r for r in running_chiefs if r.retire_after is not None), None)
        chief = (
            # A chief move is under way: the old chief still runs the cluster and is the
            # one to command (the other running chief is its standby, which only RESUME
            # addresses). A second pass while the move waits must not command the standby.
            handing_over
            if job.reconfigure_version and handing_over is not None
            else next((r for r in running_chiefs if r.retire_after is None), None)
        )
        retiring = [*recon.delete, *(m.old for m in recon.migrate)]
        reconfigure = recon.membership_changed and chief is not None and retiring_or_new(recon)
        await self._mark_retiring(job_id, retiring, plan.version if reconfigure else None)
        problems: list[str] = []
        for start in starts:
            try:
                await self.backend.start(start)
            except Exception as error:  # the backend's words go into the plan's message
                log.exception("pod failed to start", pod=start.record.name)
                problems.append(f"{start.record.name}: {type(error).__name__}: {error}")
                await self._record_end(
                    PodEnded(start.record.name, job_id, "Error", None, f"failed to start: {error}")
                )
                continue
            await self._record_started(start)
        notes: list[str] = []
        restarted_chief = any(
            start.record.role is Role.CHIEF and not start.standby
            for start in starts
            if start.record.name in by_name  # a relaunch, not a new pod
        )
        if job.reconfigure_version and restarted_chief and job.reconfigure_version <= plan.version:
            # The chief died during a move and came back on the new cluster (its start
            # carries the newest plan's): nothing is left to move, the old pods can go.
            notes.append("the chief restarted on the new cluster")
            await self._finish_reconfigure(job, PlanState.APPLIED, notes[-1])
        for resize in recon.resize:
            problems.extend(
                await self._resize(
                    job, plan.version, resize.pod, resize.cpu, resize.memory_bytes, by_name
                )
            )
        if reconfigure and chief is not None:
            # DLRover-RM sec. 5.2: the new pods first, and the pause only once they can
            # serve, so the chief does not wait for their start-up while paused. Recorded
            # now, so a newer plan or a restart sees the change pending.
            now = now_utc()
            async with self.database.transaction() as session:
                await repository.set_reconfigure(session, job_id, plan.version, now, now)
            self._spawn(
                job_id,
                self._reconfigure_when_ready(
                    job_id,
                    chief.record.name,
                    plan.version,
                    self._cluster_json(job_id, recon, starts, by_name),
                    starts,
                ),
            )
        else:
            await self._delete_all(pod.name for pod in retiring)
        state = (
            PlanState.FAILED
            if problems
            else PlanState.APPLYING
            if reconfigure
            else PlanState.APPLIED
        )
        await self._set_plan_state(job_id, plan.version, state, "; ".join(problems or notes))

    async def _suspend(self, job: StoredJob, stored: StoredPlan, rows: list[StoredPod]) -> None:
        """The newest plan runs no pod: checkpoint through the chief (PAUSE), then remove
        every pod (see the module docstring, 5)."""
        version, reason = stored.plan.version, stored.plan.reason
        live = [row for row in rows if row.record.live]
        if not live:
            if stored.state is not PlanState.APPLIED and not job.reconfigure_version:
                await self._set_plan_state(
                    job.job_id, version, PlanState.APPLIED, "suspended: no pod runs"
                )
            return
        if job.reconfigure_version == version:
            return  # already suspending: the chief's answer (or the timeout) ends it
        if stored.state is PlanState.APPLIED:
            # Suspended already (the chief's answer or the timeout ended it): its pods are
            # on their way out; the plan's state says how it went, and stays.
            await self._delete_all(row.record.name for row in live)
            return
        chief = next(
            (
                row
                for row in live
                if row.record.role is Role.CHIEF
                and row.record.phase is PodPhase.RUNNING
                and row.retire_after is None
            ),
            None,
        )
        await self._mark_retiring(job.job_id, [row.record for row in live], version)
        if chief is None:
            await self._delete_all(row.record.name for row in live)
            await self._set_plan_state(
                job.job_id,
                version,
                PlanState.APPLIED,
                "suspended without a checkpoint (no running chief to take one); it resumes "
                "from its newest periodic checkpoint",
            )
            log.warning("job suspended without a checkpoint", job_id=job.job_id)
            return
        now = now_utc()
        async with self.database.transaction() as session:
            await repository.set_reconfigure(session, job.job_id, version, now, now)
        command = control_pb2.ControlCommand(
            job_id=job.job_id,
            pod_name=chief.record.name,
            action=control_pb2.CONTROL_ACTION_PAUSE,
            plan_version=version,
            reason=f"plan v{version} suspends the job: {reason}"[:500],
            issued_at=timestamp(now),
        )
        await self.bus.publish(
            topics.CONTROL_COMMAND, job.job_id, command, f"{job.job_id}.pause.{version}"
        )
        await self._set_plan_state(
            job.job_id,
            version,
            PlanState.APPLYING,
            "suspending: the chief saves a checkpoint, then the pods are removed",
        )
        log.info("chief told to checkpoint before a suspension", job_id=job.job_id, version=version)

    def _waits_for_oom_plan(self, row: StoredPod, version: int, now: datetime) -> bool:
        """An OOM-killed pod waits a while for a plan newer than the one it ran under."""
        if row.record.phase is not PodPhase.FAILED or row.last_failure != "OOMKilled":
            return False
        if version > row.plan_version or row.failed_at is None:
            return False
        return now - row.failed_at < timedelta(seconds=self.timing.oom_replan_seconds)

    async def _record_starts(
        self,
        job: StoredJob,
        version: int,
        recon: Reconciliation,
        by_name: dict[str, StoredPod],
    ) -> list[PodStart]:
        """Write every pod to start as PENDING (ports chosen, kept on relaunch)."""
        wants = [*recon.create, *(m.replacement for m in recon.migrate)]
        rows: list[StoredPod] = []
        taken = {port for row in by_name.values() for port in (row.port, row.agent_port)}
        for want in wants:
            port, agent_port = self.ports(taken), self.ports(taken)
            rows.append(self._new_row(job.job_id, want, version, port, agent_port))
        for want in recon.relaunch:
            old = by_name[want.name]
            record = replace(
                old.record,
                cpu=want.cpu,
                memory_bytes=want.memory_bytes,
                node=want.node,
                phase=PodPhase.PENDING,
                restarts=old.record.restarts + 1,
            )
            rows.append(replace(old, record=record, plan_version=version))
        now = now_utc()
        async with self.database.transaction() as session:
            for row in rows:
                await repository.upsert_pod(session, row, now)
        known = {**by_name, **{row.record.name: row for row in rows}}
        cluster_json = self._cluster_json(job.job_id, recon, [], known)
        spec_json = json_format.MessageToJson(job.spec, indent=None)
        training_chiefs = {
            name
            for name, row in by_name.items()
            if row.record.role is Role.CHIEF and row.record.phase is PodPhase.RUNNING
        }
        return [
            PodStart(
                row.record,
                row.port,
                row.agent_port,
                version,
                spec_json,
                cluster_json,
                # A chief while another still trains (a migrated chief's new pod, or that
                # pod relaunched before the handover): it waits to take over.
                standby=row.record.role is Role.CHIEF and bool(training_chiefs - {row.record.name}),
            )
            for row in rows
        ]

    @staticmethod
    def _new_row(job_id: str, want: PodWant, version: int, port: int, agent_port: int) -> StoredPod:
        return StoredPod(
            record=PodRecord(
                name=want.name,
                job_id=job_id,
                role=want.role,
                index=want.index,
                generation=want.generation,
                cpu=want.cpu,
                memory_bytes=want.memory_bytes,
                node=want.node,
                phase=PodPhase.PENDING,
            ),
            port=port,
            agent_port=agent_port,
            plan_version=version,
        )

    def _cluster_json(
        self,
        job_id: str,
        recon: Reconciliation,
        starts: list[PodStart],
        by_name: dict[str, StoredPod],
    ) -> str:
        ports = {name: row.port for name, row in by_name.items()}
        ports.update({start.record.name: start.port for start in starts})
        address = self.backend.address
        cluster = {
            role.value: [
                address(name, job_id, ports[name])
                for name in recon.cluster.get(role, ())
                if name in ports
            ]
            for role in CLUSTER_ROLES
        }
        return json.dumps(cluster, sort_keys=True)

    async def _mark_retiring(self, job_id: str, pods: list[PodRecord], version: int | None) -> None:
        if not pods or version is None:
            return
        async with self.database.transaction() as session:
            for pod in pods:
                row = await repository.get_pod(session, pod.name)
                if row is not None:
                    await repository.upsert_pod(
                        session, replace(row, retire_after=version), now_utc()
                    )

    async def _record_started(self, start: PodStart) -> None:
        record = replace(start.record, phase=PodPhase.RUNNING)
        async with self.database.transaction() as session:
            row = await repository.get_pod(session, record.name)
            if row is None:
                return
            await repository.upsert_pod(session, replace(row, record=record), now_utc())
            await self._event(
                session,
                topics.POD_STARTED,
                row,
                pod_pb2.POD_PHASE_RUNNING,
                "",
                None,
                "started",
                f"{row.record.restarts}",
            )
        log.info(
            "pod started",
            pod=record.name,
            node=record.node,
            cpu=record.cpu,
            memory_bytes=record.memory_bytes,
        )

    async def _resize(
        self,
        job: StoredJob,
        version: int,
        pod: PodRecord,
        cpu: float,
        memory_bytes: int,
        by_name: dict[str, StoredPod],
    ) -> list[str]:
        """Resize in place. Where the kernel refuses a memory change (it cannot reclaim
        enough below the new limit), the pod is restarted under its own name at the new
        size instead: a departure from DLRover-RM sec. 5.2's migration for this one case,
        because a replacement would need room the node may not have; the chief restores
        from the flash checkpoint as after any PS or worker restart."""
        try:
            await self.backend.resize(pod.name, cpu, memory_bytes)
        except ResizeRefused as error:
            log.warning(
                "in-place resize refused; restarting the pod at its new size",
                pod=pod.name,
                why=str(error),
            )
            row = by_name[pod.name]
            async with self.database.transaction() as session:
                await repository.upsert_pod(
                    session,
                    replace(
                        row,
                        record=replace(
                            pod, cpu=cpu, memory_bytes=memory_bytes, phase=PodPhase.FAILED
                        ),
                        plan_version=version,
                        last_failure="",
                        last_message=f"resize refused: {error}",
                    ),
                    now_utc(),
                )
            await self.backend.delete(pod.name)
            return []
        async with self.database.transaction() as session:
            current = await repository.get_pod(session, pod.name)
            if current is not None:
                row = current
                await repository.upsert_pod(
                    session,
                    replace(
                        row,
                        record=replace(row.record, cpu=cpu, memory_bytes=memory_bytes),
                        plan_version=version,
                    ),
                    now_utc(),
                )
        log.info("pod resized in place", pod=pod.name, cpu=cpu, memory_bytes=memory_bytes)
        return []

    async def _reconfigure_when_ready(
        self, job_id: str, chief: str, version: int, cluster_json: str, new: list[PodStart]
    ) -> None:
        """Send RECONFIGURE once the new pods' trainers accept connections (or after
        ``reconfigure_timeout_seconds / 2``: the chief then waits for them itself), unless a
        newer plan has come meanwhile (it sends its own)."""
        ready = await self.backend.wait_ready(new, self.timing.reconfigure_timeout_seconds / 2)
        if not ready:
            log.warning("new pods not serving yet; telling the chief anyway", job_id=job_id)
        async with self._locks[job_id]:
            async with self.database.sessions() as session:
                job = await repository.get_job(session, job_id)
            if job is None or job.state != "RUNNING" or job.reconfigure_version != version:
                return
            await self._reconfigure(job_id, chief, version, cluster_json)

    async def _reconfigure(self, job_id: str, chief: str, version: int, cluster_json: str) -> None:
        now = now_utc()
        async with self.database.transaction() as session:
            await repository.set_reconfigure(session, job_id, version, now, now)
        command = control_pb2.ControlCommand(
            job_id=job_id,
            pod_name=chief,
            action=control_pb2.CONTROL_ACTION_RECONFIGURE,
            plan_version=version,
            cluster_json=cluster_json,
            reason=f"plan v{version} changed the cluster",
            issued_at=timestamp(now),
        )
        await self.bus.publish(
            topics.CONTROL_COMMAND, job_id, command, f"{job_id}.reconfigure.{version}"
        )
        log.info(
            "chief told to move to a new cluster",
            job_id=job_id,
            version=version,
            cluster=cluster_json,
        )

    async def _resume(
        self,
        job_id: str,
        chief: StoredPod,
        version: int,
        cluster_json: str,
        paused_at: datetime,
        checkpoint_id: str,
    ) -> None:
        """Tell a standby chief to take over (DLRover-RM sec. 5.2: restore into the new
        pod, resume)."""
        command = control_pb2.ControlCommand(
            job_id=job_id,
            pod_name=chief.record.name,
            action=control_pb2.CONTROL_ACTION_RESUME,
            plan_version=version,
            cluster_json=cluster_json,
            reason=f"the chief of plan v{version} takes over",
            issued_at=timestamp(now_utc()),
            paused_at=timestamp(paused_at),
            checkpoint_id=checkpoint_id,
        )
        await self.bus.publish(
            topics.CONTROL_COMMAND, job_id, command, f"{job_id}.resume.{version}"
        )
        log.info(
            "standby chief told to take over",
            job_id=job_id,
            pod=chief.record.name,
            version=version,
            checkpoint=checkpoint_id or "newest",
        )

    def _live_cluster_json(self, rows: list[StoredPod]) -> str:
        """The cluster of the pods that stay: live, not retiring, in task order."""
        staying = [row for row in rows if row.record.live and row.retire_after is None]
        cluster = {
            role.value: [
                self.backend.address(row.record.name, row.record.job_id, row.port)
                for row in sorted(
                    (r for r in staying if r.record.role is role), key=lambda r: r.record.index
                )
            ]
            for role in CLUSTER_ROLES
        }
        return json.dumps(cluster, sort_keys=True)

    async def _delete_all(self, names: Iterable[str]) -> None:
        """Delete pods concurrently: each may take its grace period to stop."""
        await asyncio.gather(*(self._delete(name) for name in names))

    async def _delete(self, name: str) -> None:
        try:
            await self.backend.delete(name)
        except Exception:
            log.exception("pod delete failed", pod=name)

    async def _set_plan_state(
        self, job_id: str, version: int, state: PlanState, message: str
    ) -> None:
        async with self.database.transaction() as session:
            await repository.set_state(session, job_id, version, state, message[:2000], now_utc())

    # --- control acks -----------------------------------------------------------------

    async def acked(self, ack: control_pb2.ControlAck) -> None:
        """The chief answered a RECONFIGURE: remove the pods it no longer uses (and, when the
        chief itself moved, let its standby take over)."""
        if ack.action == control_pb2.CONTROL_ACTION_RESUME:
            log.info(
                "new chief took over",
                job_id=ack.job_id,
                pod=ack.pod_name,
                version=ack.plan_version,
                paused_seconds=round(ack.paused_seconds, 3),
            )
            return
        if ack.action not in (
            control_pb2.CONTROL_ACTION_RECONFIGURE,
            control_pb2.CONTROL_ACTION_PAUSE,
        ):
            return
        async with self._locks[ack.job_id]:
            async with self.database.sessions() as session:
                job = await repository.get_job(session, ack.job_id)
            if (
                job is None
                or job.reconfigure_version == 0
                or ack.plan_version < job.reconfigure_version
            ):
                return
            log.info(
                "chief confirmed the new cluster",
                job_id=ack.job_id,
                version=ack.plan_version,
                ok=ack.ok,
                paused_seconds=round(ack.paused_seconds, 3),
            )
            if ack.action == control_pb2.CONTROL_ACTION_PAUSE:
                # A suspension: the checkpoint is saved (or the chief says why not); the
                # pods go either way, and the job resumes from its newest checkpoint.
                message = (
                    f"suspended after checkpoint {ack.checkpoint_id or '(newest)'}"
                    if ack.ok
                    else f"suspended; the chief could not checkpoint: {ack.message}"
                )
                await self._finish_reconfigure(job, PlanState.APPLIED, message)
                return
            message = (
                "" if ack.ok else f"the chief could not move to the new cluster: {ack.message}"
            )
            paused_at = ack.acked_at.ToDatetime(tzinfo=UTC) - timedelta(
                seconds=max(ack.paused_seconds, 0.0)
            )
            await self._finish_reconfigure(
                job,
                PlanState.APPLIED if ack.ok else PlanState.FAILED,
                message,
                paused_at=paused_at if ack.HasField("acked_at") else None,
                checkpoint_id=ack.checkpoint_id,
            )

    async def _finish_reconfigure(
        self,
        job: StoredJob,
        state: PlanState,
        message: str,
        *,
        paused_at: datetime | None = None,
        checkpoint_id: str = "",
    ) -> None:
        """End the move to plan ``job.reconfigure_version``: a standby chief takes over (from
        ``checkpoint_id``, else the newest), then the pods the move retired are removed."""
        async with self.database.transaction() as session:
            rows = await repository.job_pods(session, job.job_id)
            await repository.set_reconfigure(session, job.job_id, 0, None, now_utc())
        standby = _standby_chief(rows, job.reconfigure_version)
        if standby is not None:
            await self._resume(
                job.job_id,
                standby,
                job.reconfigure_version,
                self._live_cluster_json(rows),
                paused_at or now_utc(),
                checkpoint_id,
            )
        await self._delete_all(
            row.record.name
            for row in rows
            if row.retire_after is not None
            and row.retire_after <= job.reconfigure_version
            and row.record.live
        )
        await self._set_plan_state(job.job_id, job.reconfigure_version, state, message)

    async def check_reconfigures(self) -> None:
        """Give up waiting for a chief that does not confirm its new cluster in time."""
        async with self.database.sessions() as session:
            pending = await repository.pending_reconfigures(session)
        limit = timedelta(seconds=self.timing.reconfigure_timeout_seconds)
        for job in pending:
            if job.reconfigure_since is not None and now_utc() - job.reconfigure_since > limit:
                async with self._locks[job.job_id]:
                    async with self.database.sessions() as session:
                        newest = await repository.newest_plan(session, job.job_id)
                    if newest is not None and not any(role.count for role in newest.plan.roles):
                        log.warning("the chief did not checkpoint in time", job_id=job.job_id)
                        await self._finish_reconfigure(
                            job,
                            PlanState.APPLIED,
                            f"suspended without the chief's checkpoint (no answer within "
                            f"{self.timing.reconfigure_timeout_seconds:g} s); it resumes from "
                            "its newest periodic checkpoint",
                        )
                        continue
                    log.warning(
                        "the chief did not confirm its new cluster in time", job_id=job.job_id
                    )
                    await self._finish_reconfigure(
                        job,
                        PlanState.FAILED,
                        f"the chief did not confirm the cluster of plan "
                        f"v{job.reconfigure_version} within "
                        f"{self.timing.reconfigure_timeout_seconds:g} s; its old pods were removed",
                    )

    # --- pod ends ---------------------------------------------------------------------

    async def pod_ended(self, ended: PodEnded) -> None:
        """Record how a pod ended and act on it (see the module docstring)."""
        async with self._locks[ended.job_id]:
            follow_up = await self._record_end(ended)
        await self.backend.acknowledge(ended.name)
        self._usage.pop(ended.name, None)
        for waiting in sorted(self._waiting_for_room - {ended.job_id}):
            self.queue.add(waiting)
        if follow_up == "end-move":
            async with self._locks[ended.job_id]:
                async with self.database.sessions() as session:
                    job = await repository.get_job(session, ended.job_id)
                if job is not None and job.reconfigure_version:
                    await self._finish_reconfigure(
                        job,
                        PlanState.APPLIED,
                        "the old chief ended before it handed over; the new chief restored "
                        "the newest checkpoint",
                    )
        elif follow_up == "apply":
            self.queue.add(ended.job_id)
        elif follow_up == "oom-wait":
            self._apply_later(ended.job_id, self.timing.oom_replan_seconds + 0.5)

    async def _record_end(self, ended: PodEnded) -> str:
        now = now_utc()
        async with self.database.transaction() as session:
            row = await repository.get_pod(session, ended.name)
            job = await repository.get_job(session, ended.job_id, for_update=True)
            if (
                row is None
                or job is None
                or row.record.phase in (PodPhase.DELETED, PodPhase.SUCCEEDED)
            ):
                return ""
            if row.record.phase is PodPhase.FAILED and ended.reason == "Deleted":
                return ""  # a failed pod restarted at a new size: its end is already recorded
            pod = row.record
            # A pod the plan dropped or replaced was going anyway: however it ended, it is gone.
            # A chief that ends before it handed over to its standby ends the move too: the
            # standby takes over from the newest checkpoint.
            moving_chief = (
                pod.role is Role.CHIEF
                and row.retire_after is not None
                and row.retire_after == job.reconfigure_version
            )
            if ended.reason == "Deleted" or row.retire_after is not None:
                await repository.upsert_pod(
                    session, replace(row, record=replace(pod, phase=PodPhase.DELETED)), now
                )
                await self._event(
                    session,
                    topics.POD_DELETED,
                    row,
                    pod_pb2.POD_PHASE_DELETED,
                    ended.message,
                    ended.exit_code,
                    "deleted",
                    "",
                )
                log.info("pod deleted", pod=pod.name)
                return "end-move" if moving_chief else ""
            if ended.reason == "Succeeded" and pod.role is Role.CHIEF:
                await repository.upsert_pod(
                    session, replace(row, record=replace(pod, phase=PodPhase.SUCCEEDED)), now
                )
                await self._event(
                    session,
                    topics.POD_SUCCEEDED,
                    row,
                    pod_pb2.POD_PHASE_SUCCEEDED,
                    "",
                    0,
                    "succeeded",
                    "",
                )
                if job.state == "RUNNING":
                    await self._end_job(
                        session,
                        job,
                        job_pb2.JOB_OUTCOME_SUCCEEDED,
                        "every shard of the last epoch is done",
                    )
                log.info("job succeeded", job_id=job.job_id)
                return "cleanup"
            reason = ended.reason if ended.reason in FAILURE_REASONS else "Error"
            message = (
                ended.message
                if ended.reason != "Succeeded"
                else "exited with code 0 before the job ended"
            )
            failed = replace(
                row,
                record=replace(pod, phase=PodPhase.FAILED),
                last_failure=reason,
                last_message=message,
                failed_at=now,
            )
            await repository.upsert_pod(session, failed, now)
            await self._event(
                session,
                topics.POD_FAILED,
                row,
                pod_pb2.POD_PHASE_FAILED,
                message,
                ended.exit_code,
                "failed",
                f"{pod.restarts}",
                FAILURE_REASONS[reason],
            )
            log.warning(
                "pod failed",
                pod=pod.name,
                reason=reason,
                message=message[:300],
                restarts=pod.restarts,
            )
            if job.state != "RUNNING":
                return ""
            if pod.restarts >= self.timing.relaunch_budget:
                why = (
                    f"pod {pod.name} failed {pod.restarts + 1} times (relaunch budget "
                    f"{self.timing.relaunch_budget}); last: {reason}: {message}"
                )
                await self._end_job(session, job, job_pb2.JOB_OUTCOME_FAILED, why)
                return "cleanup"
        if reason == "OOMKilled":
            return "oom-wait"
        return "apply"

    async def _end_job(
        self, session: Session, job: StoredJob, outcome: job_pb2.JobOutcome.ValueType, message: str
    ) -> None:
        now = now_utc()
        await repository.set_job_state(session, job.job_id, JOB_STATES[outcome], message, now)
        event = job_pb2.JobFinished(
            job_id=job.job_id, outcome=outcome, message=message[:4000], finished_at=timestamp(now)
        )
        await self.outbox.add_event(
            session, topics.JOB_FINISHED.outgoing(job.job_id, event, f"{job.job_id}.finished")
        )
        self._after_commit_cleanup(job.job_id)

    def _after_commit_cleanup(self, job_id: str) -> None:
        self.outbox.notify()
        self._spawn(job_id, self._remove_pods(job_id))

    def _spawn(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._timers[f"{key}:{id(task)}"] = task
        task.add_done_callback(lambda t: self._timers.pop(f"{key}:{id(t)}", None))

    def _apply_later(self, job_id: str, delay: float) -> None:
        self.queue.add_after(job_id, delay)

    async def _remove_pods(self, job_id: str) -> None:
        async with self._locks[job_id], self.database.sessions() as session:
            rows = await repository.job_pods(session, job_id)
        await self._delete_all(
            row.record.name
            for row in rows
            if row.record.phase in (PodPhase.PENDING, PodPhase.RUNNING)
        )
        for row in rows:
            if row.record.phase is PodPhase.FAILED:
                async with self.database.transaction() as session:
                    await repository.upsert_pod(
                        session,
                        replace(row, record=replace(row.record, phase=PodPhase.DELETED)),
                        now_utc(),
                    )

    async def job_finished(self, event: job_pb2.JobFinished) -> None:
        """A job ended elsewhere (cancelled): remove its pods; its checkpoints stay."""
        state = JOB_STATES.get(event.outcome)
        if state is None:
            raise InvalidArgument("outcome", f"unknown job outcome {event.outcome}")
        async with self._locks[event.job_id], self.database.transaction() as session:
            job = await repository.get_job(session, event.job_id, for_update=True)
            if job is None or job.state != "RUNNING":
                return
            await repository.set_job_state(session, event.job_id, state, event.message, now_utc())
        log.info("job ended; removing its pods", job_id=event.job_id, state=state)
        await self._remove_pods(event.job_id)

    async def _event(
        self,
        session: Session,
        topic: topics.Topic[pod_pb2.PodEvent],
        row: StoredPod,
        phase: pod_pb2.PodPhase.ValueType,
        message: str,
        exit_code: int | None,
        kind: str,
        attempt: str,
        reason: pod_pb2.PodFailureReason.ValueType = pod_pb2.POD_FAILURE_REASON_UNSPECIFIED,
    ) -> None:
        pod = row.record
        event = pod_pb2.PodEvent(
            job_id=pod.job_id,
            pod_name=pod.name,
            role=ROLE_TO_PROTO[pod.role],
            index=pod.index,
            phase=phase,
            reason=reason,
            message=message[:4000],
            exit_code=exit_code or 0,
            plan_version=row.plan_version,
            node=pod.node,
            occurred_at=timestamp(now_utc()),
        )
        message_id = f"{pod.name}.{kind}.{pod.restarts}{'.' + attempt if attempt else ''}"
        await self.outbox.add_event(session, topic.outgoing(pod.job_id, event, message_id))
        self.outbox.notify()

    # --- start-up, usage, views ---------------------------------------------------------

    async def startup(self) -> None:
        """Re-adopt the pods an earlier run left running and remove orphans (pods with no
        live row: started just before a crash that lost their row, or already ended)."""
        adopted = set(self.backend.adopt())
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
        known = {row.record.name for row in live if row.record.phase is not PodPhase.FAILED}
        for name in sorted(adopted - known):
            log.warning("orphan pod removed: no live row for it", pod=name)
            await self._delete(name)
        log.info("pods re-adopted", count=len(adopted & known), orphans=len(adopted - known))

    async def sweep_lost(self) -> None:
        """Rows that say RUNNING for pods the backend does not run (they vanished while the
        podwatcher was down, and no end was recorded) fail as Error and are relaunched;
        then every running job's newest plan is applied again (a crash may have cut one
        short). Run once, shortly after start-up, when the ends the backend kept have been
        recorded."""
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
            jobs = await repository.running_jobs(session)
        # A pod whose end is still on its way to being recorded is not lost.
        present = set(self.backend.known())
        for row in live:
            if row.record.phase is PodPhase.RUNNING and row.record.name not in present:
                await self.pod_ended(
                    PodEnded(
                        row.record.name,
                        row.record.job_id,
                        "Error",
                        None,
                        "lost: not running after the podwatcher restarted",
                    )
                )
        for job_id in jobs:
            self.queue.add(job_id)

    async def sample_usage(self) -> None:
        """Sample every running pod's usage and publish it."""
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
            versions: dict[str, int] = {}
            for job_id in {row.record.job_id for row in live}:
                newest = await repository.newest_plan(session, job_id)
                versions[job_id] = 0 if newest is None else newest.plan.version
        for row in live:
            if row.record.phase is not PodPhase.RUNNING:
                continue
            usage = self.backend.usage(row.record.name)
            if usage is None:
                continue
            self._usage[row.record.name] = usage
            moment = now_utc()
            sample = pod_pb2.UsageSample(
                job_id=row.record.job_id,
                pod_name=row.record.name,
                role=ROLE_TO_PROTO[row.record.role],
                cpu_used=usage.cpu_cores,
                memory_used_bytes=usage.memory_bytes,
                cpu_limit=row.record.cpu,
                memory_limit_bytes=row.record.memory_bytes,
                sampled_at=timestamp(moment),
                plan_version=versions.get(row.record.job_id, 0),
            )
            try:
                await self.bus.publish(
                    topics.POD_USAGE,
                    row.record.job_id,
                    sample,
                    f"{row.record.name}.usage.{int(moment.timestamp() * 1000)}",
                )
            except Exception:
                log.warning("usage sample not published", pod=row.record.name, exc_info=True)

    async def job_owner(self, job_id: str) -> str | None:
        """The user who submitted a job this podwatcher knows (None: it knows no such job)."""
        async with self.database.sessions() as session:
            stored = await repository.get_job(session, job_id)
        return None if stored is None else stored.spec.user

    async def job_pods(self, job_id: str) -> tuple[StoredPlan, list[PodView]]:
        """The job's newest plan and its pods (newest generation first), or NotFound."""
        if not job_id:
            raise InvalidArgument("job_id", "is required")
        async with self.database.sessions() as session:
            stored = await repository.newest_plan(session, job_id)
            rows = await repository.job_pods(session, job_id)
        if stored is None:
            raise NotFound(f"no plan recorded for job {job_id!r}")
        address = self.backend.address
        views = [
            PodView(
                row,
                self._usage.get(row.record.name),
                address(row.record.name, row.record.job_id, row.port),
            )
            for row in rows
            if row.record.phase is not PodPhase.DELETED
        ]
        return stored, views

    async def nodes(self) -> list[NodeView]:
        """Every node, drained or not, and what live pods were given on each."""
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
        views = []
        for node, drained in self.backend.all_nodes():
            on = [row.record for row in live if row.record.node == node.name]
            views.append(
                NodeView(node, sum(p.cpu for p in on), sum(p.memory_bytes for p in on), drained)
            )
        return views

    # --- node inventory (admission plans on it) ------------------------------------

    async def publish_inventory(self, reason: str) -> None:
        """Publish every node pods may be placed on now (through the outbox, so a NATS
        outage delays it and loses nothing)."""
        nodes = tuple(self.backend.nodes())
        moment = now_utc()
        message = inventory_to_proto(self.cluster, nodes, reason, moment)
        message_id = f"{self.cluster}.nodes.{int(moment.timestamp() * 1_000_000)}"
        async with self.database.transaction() as session:
            await self.outbox.add_event(
                session, topics.NODE_INVENTORY.outgoing(self.cluster, message, message_id)
            )
        self.outbox.notify()
        self._published = nodes
        log.info("node inventory published", reason=reason, nodes=len(nodes))

    async def check_inventory(self) -> None:
        """Publish the inventory if it changed since it was last published (the first
        call of a run always publishes: admission may have missed the last one)."""
        if self._published is None:
            await self.publish_inventory("start")
        elif tuple(self.backend.nodes()) != self._published:
            await self.publish_inventory("changed")

    async def drain(self, name: str) -> list[str]:
        """Take a node out of the inventory and evict its pods (their jobs relaunch them
        where their plans fit); the evicted pods' names."""
        check_node_name(name)
        if not self.backend.set_drained(name, True):
            raise NotFound(f"no node {name!r}")
        async with self.database.sessions() as session:
            live = await repository.live_pods(session)
        evicted = []
        for row in live:
            if row.record.node == name and row.record.phase is not PodPhase.FAILED:
                await self.backend.evict(row.record.name, f"node {name} drained")
                evicted.append(row.record.name)
        log.warning("node drained", node=name, evicted=len(evicted))
        await self.publish_inventory(f"{name} drained")
        return evicted

    async def restore(self, name: str) -> None:
        """Put a drained node back, and re-apply running jobs (pods waiting for room)."""
        check_node_name(name)
        if not self.backend.set_drained(name, False):
            raise NotFound(f"no node {name!r}")
        log.info("node restored", node=name)
        await self.publish_inventory(f"{name} restored")
        async with self.database.sessions() as session:
            jobs = await repository.running_jobs(session)
        for job_id in jobs:
            self.queue.add(job_id)

    async def logs(
        self, job_id: str, pod_name: str, tail: int, follow: bool
    ) -> AsyncIterator[tuple[str, list[str]]]:
        """The last ``tail`` lines of the pod's (or every pod's) log, then new ones."""
        async with self.database.sessions() as session:
            rows = await repository.job_pods(session, job_id)
        if not rows:
            raise NotFound(f"no pods recorded for job {job_id!r}")
        names = [row.record.name for row in rows]
        if pod_name:
            if pod_name not in names:
                raise NotFound(f"job {job_id!r} has no pod {pod_name!r}; it has {', '.join(names)}")
            names = [pod_name]
        for name in names:
            yield name, await self.backend.log_tail(name, tail)
        if not follow:
            return
        queue: asyncio.Queue[tuple[str, list[str]] | None] = asyncio.Queue()

        async def pump(name: str) -> None:
            try:
                async for lines in self.backend.follow_logs(name):
                    await queue.put((name, lines))
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(name)) for name in names]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                    continue
                yield item
        finally:
            for task in tasks:
                task.cancel()


async def _together_or_alone(
    what: str, items: Sequence[T], store: Callable[[Sequence[T]], Awaitable[list[R]]]
) -> list[R | Exception]:
    """``store(items)``, one result per item, in one transaction; if that fails, each item
    stored alone, so a bad one fails alone (its result is then the error it met)."""
    try:
        return list(await store(items))
    except Exception as error:
        if len(items) <= 1:
            return [error for _ in items]
        log.info(f"{what} not stored together; one at a time", why=str(error)[:200])
    results: list[R | Exception] = []
    for item in items:
        try:
            results += await store([item])
        except Exception as alone:
            results.append(alone)
    return results


def _standby_chief(rows: list[StoredPod], version: int) -> StoredPod | None:
    """The chief waiting to take over from one the move to plan ``version`` retires."""
    moving = any(row.record.role is Role.CHIEF and row.retire_after == version for row in rows)
    if not moving or version == 0:
        return None
    return next(
        (
            row
            for row in rows
            if row.record.role is Role.CHIEF and row.record.live and row.retire_after is None
        ),
        None,
    )


def retiring_or_new(recon: Reconciliation) -> bool:
    """Whether the chief has anything to move to or away from."""
    return bool(recon.create or recon.migrate or recon.delete)


__all__ = ["FailedPrecondition", "JobNotAdmitted", "PodWatcher", "Timing"]
