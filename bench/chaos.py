"""Chaos: a real training job and a load of simulated jobs on a `stride up` suite while every
service is SIGKILLed in turn, and so are the embedded NATS and the embedded PostgreSQL.

Run: ``make chaos`` (``.venv/bin/python bench/chaos.py [--load 200]``); writes the report with
its timeline to ``bench/results/chaos.txt`` and exits 1 if a check fails.

The suite runs as a user runs it: ``stride up`` with its defaults, the embedded (locked-down)
NATS and the embedded PostgreSQL 18, both supervised by `stride up`. Then:

1. the training job: the Wide & Deep example, small (``RECORDS`` records, ``EPOCHS`` epochs),
   priority high, submitted with ``stride submit``;
2. the load: ``--load`` simulated jobs (no pods; admission and the optimizer decide them),
   priority low, submitted through gRPC while the chaos runs;
3. the chaos, one blow every ``PACE_SECONDS``: SIGKILL admission, the optimizer, the
   executor, the config DB, the dispatcher, the checkpoint cache and the pod watcher in turn
   (the supervisor restarts each), SIGKILL the embedded nats-server (restarted on its port
   and store) and the embedded PostgreSQL's postmaster (a crash: no checkpoint; restarted
   on its socket and data, it recovers from its write-ahead log); and two network
   partitions (``bench/partitions.py``: packets dropped by nftables, matched by cgroup):
   the training job's pods cut off from the dispatcher and NATS for 30 s, first, while it
   trains, and the optimizer cut off from NATS for 30 s, last;
4. the checks, once the training job ended:
   - it succeeded, and its trainer consumed every sample index exactly once per epoch
     (``consumed.jsonl``, written by the trainer for each batch it trained on);
   - no decision is lost: every job submitted is stored, none is left undecided, and each
     has its decision event on the bus;
   - no plan is lost or applied twice: each job's plans on the bus are versions 1..n, each
     once, and the pod watcher applied the training job's versions in order, each once.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
import numpy as np
from partitions import Partition, port_of, unavailable
from suite import record, stream_messages, stride

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.bus.permissions import ADMIN
from stride.cli.endpoints import SUITE, Phase, ProcessState, SuiteState
from stride.cli.supervisor import HEALTH_NAMES
from stride.events.v1 import job_pb2, plan_pb2
from stride.runtime import tls
from stride.runtime.healthcheck import check
from stride.runtime.tokens import TokenSource

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "bench" / "results" / "chaos.txt"
RECORDS = 2_000_000
EPOCHS = 2
PACE_SECONDS = 10.0
"""Between two blows: long enough for the last victim to be back and serving, short enough
that every blow lands while the training job trains (its pods start 10-20 s after the
submission; it trains for about three minutes on two cores, and every blow of the run
lands within its first two)."""
JOB_TIMEOUT_SECONDS = 900.0
KILLED = [service for service in SUITE if service != "agent"]
"""Every supervised service (agents live in the training pods)."""


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        line = f"t+{time.monotonic() - self.started:7.1f}s  {text}"
        self.lines.append(line)
        print(line, flush=True)


def _state(state_dir: Path) -> SuiteState:
    state = SuiteState.read(state_dir)
    if state is None:
        raise RuntimeError(f"no suite in {state_dir}")
    return state


def _serving(state: SuiteState, service: str) -> bool:
    """Health over mutual TLS (this process's STRIDE_TLS_DIR is the suite's)."""
    return check(state.services[service], HEALTH_NAMES[service], 1.0)[0]


def _admission(
    state: SuiteState,
) -> tuple[admission_grpc.AdmissionServiceAsyncStub, grpc.aio.Channel]:
    """A stub to admission as the suite's admin (its token file, read at each call)."""
    token = TokenSource(path=Path(state.tokens_dir) / "admin.token")
    channel = tls.aio_channel(
        state.services["admission"], server="admission", identity="cli", token=token
    )
    stub: admission_grpc.AdmissionServiceAsyncStub = admission_grpc.AdmissionServiceStub(channel)
    return stub, channel


def _wait(what: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until ``what()`` held (None: it did not within ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            if what():
                return time.monotonic() - start
        except Exception:  # a process between lives: ask again
            pass
        time.sleep(0.2)
    return None


# --- the jobs -----------------------------------------------------------------------------


def training_spec(folder: Path) -> Path:
    text = (ROOT / "examples" / "wide-deep.yaml").read_text()
    text, records = re.subn(r"record_count: \d+", f"record_count: {RECORDS}", text)
    text, epochs = re.subn(r"max_epochs: \d+", f"max_epochs: {EPOCHS}", text)
    text, names = re.subn(r"name: wide-deep-ctr", "name: chaos-train", text)
    text, priority = re.subn(r"priority: normal", "priority: high", text)
    text, deadline = re.subn(r"deadline: \+6h\n", "", text)
    assert (records, epochs, names, priority, deadline) == (1, 1, 1, 1, 1)
    path = folder / "chaos-train.yaml"
    path.write_text(text)
    return path


def simulated_spec(index: int) -> job_pb2.JobSpec:
    """A job with no pods: admission and the optimizer decide it (stride loadgen plays
    such jobs' agents; here nobody does, so they stay admitted or queued)."""
    return job_pb2.JobSpec(
        name=f"chaos-load-{index}",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="bench.chaos:none"),
        dataset=job_pb2.DatasetSpec(name="synthetic", record_count=1_000_000),
        batch_size=256,
        termination=job_pb2.Termination(max_steps=100_000),
        resource_kind=job_pb2.RESOURCE_KIND_CPU,
        simulated=True,
        priority=job_pb2.PRIORITY_LOW,
        profile=job_pb2.ScalingProfile(
            kind=job_pb2.RESOURCE_KIND_CPU,
            worker_cpu=0.5,
            worker_memory_bytes=512 * 1024**2,
            ps_cpu=0.5,
            ps_memory_bytes=512 * 1024**2,
            points=[job_pb2.ProfilePoint(workers=1, ps=1, steps_per_second=10.0)],
        ),
    )


async def submit_load(
    state_dir: Path,
    count: int,
    timeline: Timeline,
    submitted: list[str],
    spread: float,
) -> int:
    """Submit ``count`` simulated jobs over about ``spread`` seconds, each with a request id,
    retrying through the outages (the same request id: a retry gets its job back, never a
    second one)."""
    failures = 0
    for index in range(count):
        request = admission_pb.SubmitJobRequest(
            spec=simulated_spec(index), request_id=f"chaos-load-{index}"
        )
        while True:
            stub, channel = _admission(_state(state_dir))
            try:
                reply = await stub.SubmitJob(request, timeout=10)
                submitted.append(reply.job.job_id)
                break
            except Exception as error:  # the outage of the moment: retry
                failures += 1
                if failures % 20 == 1:
                    timeline.note(f"load: submission {index} retried ({type(error).__name__})")
                await asyncio.sleep(1.0)
            finally:
                await channel.close(None)
        await asyncio.sleep(spread / max(1, count))
    timeline.note(f"load: {len(submitted)} simulated jobs submitted ({failures} retries)")
    return failures


# --- the blows ------------------------------------------------------------------------------


def kill_service(state_dir: Path, service: str, timeline: Timeline) -> bool:
    """SIGKILL one service; True once the supervisor restarted it and it serves again."""
    before = _state(state_dir).processes[service]
    old = before.pid
    os.kill(old, signal.SIGKILL)

    def back() -> bool:
        now = _state(state_dir)
        process = now.processes[service]
        return process.pid != old and process.phase is Phase.RUNNING and _serving(now, service)

    took = _wait(back, 60.0)
    if took is None:
        timeline.note(f"SIGKILL {service} (pid {old}): NOT serving again within 60 s")
        return False
    timeline.note(f"SIGKILL {service} (pid {old}): restarted and SERVING after {took:.1f} s")
    return True


def kill_server(state_dir: Path, server: str, timeline: Timeline) -> bool:
    """SIGKILL an embedded server (``nats`` or ``postgres``); True once the supervisor
    started it again and every service serves."""

    def process(state: SuiteState) -> ProcessState:
        found = state.nats_process if server == "nats" else state.postgres_process
        assert found is not None
        return found

    old = process(_state(state_dir)).pid
    os.kill(old, signal.SIGKILL)

    def back() -> bool:
        now = _state(state_dir)
        return (
            process(now).pid != old
            and process(now).phase is Phase.RUNNING
            and all(_serving(now, service) for service in KILLED)
        )

    took = _wait(back, 90.0)
    if took is None:
        timeline.note(f"SIGKILL {server} (pid {old}): services NOT serving within 90 s")
        return False
    timeline.note(f"SIGKILL {server} (pid {old}): back, every service SERVING after {took:.1f} s")
    return True


PARTITION_SECONDS = 30.0
"""How long a partition lasts: several times the clients' deadlines and NATS's ping
interval, so connections really break and have to come back."""
CUT_SERVICE = "optimizer"
"""The service cut off from NATS: the planner, whose plans and the decisions it consumes
must neither be lost nor applied twice across the cut."""


def _pod_pids(state_dir: Path, job_id: str) -> tuple[int, ...]:
    """The trainer and agent processes of the job's running pods."""
    pids: list[int] = []
    for path in (state_dir / "pods" / "pods").glob(f"{job_id}-*/pids.json"):
        if (path.parent / "exit.json").exists():
            continue
        try:
            pids += [int(pid) for pid in json.loads(path.read_text()).values()]
        except (OSError, ValueError):
            continue
    return tuple(pids)


def _service_pids(state_dir: Path) -> dict[str, int]:
    state = _state(state_dir)
    return {name: process.pid for name, process in state.processes.items()}


def _only_cut_failed(
    state_dir: Path, before: dict[str, int], cut: set[str], timeline: Timeline
) -> bool:
    """True if no service outside ``cut`` was restarted while the partition lasted: only
    what was cut off may fail."""
    after = _service_pids(state_dir)
    restarted = sorted(
        name for name, pid in before.items() if name not in cut and after.get(name) != pid
    )
    if restarted:
        timeline.note(f"partition: services NOT cut off were restarted: {restarted}")
        return False
    return True


def partition_pods(state_dir: Path, job_id: str, timeline: Timeline) -> bool:
    """Cut the training job's pods off from the dispatcher and NATS for
    :data:`PARTITION_SECONDS`; True once healed and the chief trains again."""
    state = _state(state_dir)
    # Cut while it trains: its pods up and its chief past its first steps.
    if _wait(lambda: chief_step(state_dir, job_id) > 0, 180.0) is None:
        timeline.note(f"partition: job {job_id} is not training: no pods to cut off")
        return False
    pids = _pod_pids(state_dir, job_id)
    ports = (port_of(state.services["dispatcher"]), port_of(state.nats_url))
    cut = Partition(f"pods-{job_id}", pids, ports)
    step = chief_step(state_dir, job_id)
    services = _service_pids(state_dir)
    cut.cut()
    timeline.note(
        f"PARTITION job {job_id}'s {len(pids)} pod processes from the dispatcher and NATS "
        f"(ports {ports[0]}, {ports[1]}) for {PARTITION_SECONDS:.0f} s; chief at step {step}"
    )
    time.sleep(PARTITION_SECONDS)
    during = chief_step(state_dir, job_id)
    cut.heal()
    if not _only_cut_failed(state_dir, services, set(), timeline):
        return False
    healed = chief_step(state_dir, job_id)
    took = _wait(lambda: chief_step(state_dir, job_id) > healed, 120.0)
    if took is None:
        timeline.note("partition healed: the chief did NOT train again within 120 s")
        return False
    timeline.note(
        f"partition healed (chief at step {during} at its end); training again after "
        f"{took:.1f} s, at step {chief_step(state_dir, job_id)}"
    )
    return True


def partition_service(state_dir: Path, service: str, timeline: Timeline) -> bool:
    """Cut one service off from NATS for :data:`PARTITION_SECONDS`; True once healed and
    every service serves."""
    state = _state(state_dir)
    pid = state.processes[service].pid
    cut = Partition(f"service-{service}", (pid,), (port_of(state.nats_url),))
    services = _service_pids(state_dir)
    cut.cut()
    timeline.note(f"PARTITION {service} (pid {pid}) from NATS for {PARTITION_SECONDS:.0f} s")
    time.sleep(PARTITION_SECONDS)
    cut.heal()
    if not _only_cut_failed(state_dir, services, {service}, timeline):
        return False
    took = _wait(lambda: all(_serving(_state(state_dir), name) for name in KILLED), 60.0)
    if took is None:
        timeline.note(f"partition of {service} healed: services NOT serving within 60 s")
        return False
    same = _state(state_dir).processes[service].pid == pid
    timeline.note(
        f"partition of {service} healed: every service SERVING after {took:.1f} s"
        + ("" if same else f" ({service} was restarted meanwhile)")
    )
    return True


def chief_step(state_dir: Path, job_id: str) -> int:
    """The training job's last step its chiefs logged (0: none yet)."""
    step = 0
    for path in (state_dir / "pods" / "pods").glob(f"{job_id}-chief-*/trainer.log"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith('{"event": "steps"'):
                step = max(step, int(json.loads(line)["step"]))
    return step


# --- the checks -----------------------------------------------------------------------------


def _pod_watcher_plans(state_dir: Path, job_id: str) -> list[int]:
    versions = []
    for line in (state_dir / "logs" / "podwatcher.log").read_text().splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("event") == "plan recorded" and entry.get("job_id") == job_id:
            versions.append(int(entry["version"]))
    return versions


async def checks(
    state_dir: Path, training: str, load: list[str], outcome: str
) -> list[tuple[str, bool, str]]:
    results: list[tuple[str, bool, str]] = []
    results.append(("training job succeeded", outcome == "succeeded", outcome))
    consumed = state_dir / "pods" / "jobs" / training / "consumed.jsonl"
    counts = np.zeros((EPOCHS, RECORDS), dtype=np.int32)
    strays = 0
    with consumed.open() as lines:
        for line in lines:
            if not line.strip():
                continue
            entry = json.loads(line)
            indices = np.asarray(entry["indices"], dtype=np.int64)
            epoch = int(entry["epoch"])
            inside = (indices >= 0) & (indices < RECORDS)
            if not 0 <= epoch < EPOCHS:
                strays += indices.size
                continue
            strays += int((~inside).sum())
            np.add.at(counts[epoch], indices[inside], 1)
    missing = int((counts == 0).sum())
    twice = int((counts > 1).sum())
    results.append(
        (
            "every sample index consumed exactly once per epoch",
            missing == 0 and twice == 0 and strays == 0,
            f"{counts.size:,} expected, {missing} never trained on, {twice} trained more than "
            f"once, {strays} outside the dataset",
        )
    )
    state = _state(state_dir)
    environ = {tls.TLS_DIR_ENV: state.tls_dir}
    stub, channel = _admission(state)
    try:
        listed = await stub.ListJobs(admission_pb.ListJobsRequest(page_size=1000), timeout=30)
    finally:
        await channel.close(None)
    jobs = {job.job_id: job for job in listed.jobs}
    submitted = [training, *load]
    absent = [job for job in submitted if job not in jobs]
    undecided = [
        job_id
        for job_id, job in jobs.items()
        if job.state == admission_pb.JOB_STATE_SUBMITTED
        or job.decision.outcome == job_pb2.ADMISSION_OUTCOME_UNSPECIFIED
    ]
    bus = await Bus.connect(state.nats_url, "chaos-check", 10, identity=ADMIN, environ=environ)
    try:
        info = await bus.js.stream_info(topics.JOBS.name, subjects_filter=">")
        by_subject: dict[str, int] = dict(info.state.subjects or {})
        decision_topics = (topics.JOB_ADMITTED, topics.JOB_REJECTED, topics.JOB_QUEUED)
        no_event = [
            job
            for job in submitted
            if not any(by_subject.get(topic.subject(job), 0) for topic in decision_topics)
        ]
        results.append(
            (
                "no decision lost",
                not absent and not undecided and not no_event,
                f"{len(submitted)} submitted, {len(jobs)} stored; not stored {absent[:3]}, "
                f"undecided {undecided[:3]}, without a decision event {no_event[:3]}",
            )
        )
        plans = await bus.js.stream_info(topics.PLANS.name, subjects_filter=">")
        plan_counts: dict[str, int] = dict(plans.state.subjects or {})
        trained = [
            plan_pb2.ResourcePlan.FromString(data).version
            for data in await stream_messages(bus, topics.PLAN.subject(training))
        ]
    finally:
        await bus.close()
    contiguous = trained == list(range(1, len(trained) + 1))
    applied = _pod_watcher_plans(state_dir, training)
    results.append(
        (
            "no plan lost or applied twice",
            bool(trained)
            and contiguous
            and applied == sorted(set(applied))
            and set(applied) <= set(trained),
            f"training job's plans on the bus {trained}, recorded by the pod watcher in order "
            f"{applied}; {len(plan_counts)} jobs with plans in all",
        )
    )
    return results


# --- the run --------------------------------------------------------------------------------


async def job_state(state_dir: Path, job_id: str) -> str:
    stub, channel = _admission(_state(state_dir))
    try:
        job = (await stub.GetJob(admission_pb.GetJobRequest(job_id=job_id), timeout=10)).job
    except Exception as error:  # an outage of the moment
        return f"unknown ({type(error).__name__})"
    finally:
        await channel.close(None)
    return admission_pb.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()


async def run(load_count: int, keep: bool) -> int:
    timeline = Timeline()
    work = Path(tempfile.mkdtemp(prefix="stride-chaos-"))
    state_dir = work / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(state_dir), "COLUMNS": "200"})
    lines = [
        "# bench/chaos.py",
        f"command: .venv/bin/python bench/chaos.py --load {load_count}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"training job: wide-deep, {RECORDS:,} records x {EPOCHS} epochs, priority high; "
        f"load: {load_count} simulated jobs, priority low",
    ]
    blows_ok = True
    partitions_missing = unavailable()
    if partitions_missing is not None:
        # Reported as a failed check: a run without its network faults is not a pass.
        lines.append(f"partitions: NOT RUN ({partitions_missing})")
    outcome = "unknown"
    results: list[tuple[str, bool, str]] = []
    try:
        up = stride("up", env=env)
        if up.returncode != 0:
            print(up.stdout + up.stderr, file=sys.stderr)
            return 1
        os.environ[tls.TLS_DIR_ENV] = _state(state_dir).tls_dir
        lines.insert(3, f"database: {_state(state_dir).database}")
        timeline.note("stride up: suite running (embedded NATS locked down, embedded PostgreSQL)")
        spec = training_spec(work)
        submitted = stride("submit", str(spec), env=env)
        found = re.search(r"job-[0-9a-f]{12}", submitted.stdout)
        if submitted.returncode != 0 or found is None:
            print(submitted.stdout + submitted.stderr, file=sys.stderr)
            return 1
        training = found.group(0)
        timeline.note(f"training job {training} submitted")
        load: list[str] = []
        blow_count = len(KILLED) + 2
        loading = asyncio.create_task(
            submit_load(state_dir, load_count, timeline, load, PACE_SECONDS * blow_count)
        )
        blows: list[Callable[[], bool]] = []
        if partitions_missing is None:
            blows.append(functools.partial(partition_pods, state_dir, training, timeline))
        blows += [
            functools.partial(kill_service, state_dir, service, timeline) for service in KILLED
        ]
        blows += [
            functools.partial(kill_server, state_dir, server, timeline)
            for server in ("nats", "postgres")
        ]
        if partitions_missing is None:
            blows.append(functools.partial(partition_service, state_dir, CUT_SERVICE, timeline))
        for blow in blows:
            await asyncio.sleep(PACE_SECONDS)
            blows_ok = await asyncio.to_thread(blow) and blows_ok
            timeline.note(
                f"training job {training}: {await job_state(state_dir, training)}, chief at "
                f"step {chief_step(state_dir, training)}"
            )
        await loading
        started = time.monotonic()
        noted = started
        while time.monotonic() - started < JOB_TIMEOUT_SECONDS:
            outcome = await job_state(state_dir, training)
            if outcome in ("succeeded", "failed", "cancelled"):
                break
            if time.monotonic() - noted >= 30.0:
                noted = time.monotonic()
                timeline.note(
                    f"training job: {outcome}, chief at step {chief_step(state_dir, training)}"
                )
            await asyncio.sleep(5.0)
        timeline.note(f"training job {training} ended: {outcome}")
        results = await checks(state_dir, training, load, outcome)
    finally:
        stride("down", env=env)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    results.insert(0, ("every blow recovered from", blows_ok, "see the timeline"))
    results.insert(
        1,
        (
            "network partitions made",
            partitions_missing is None,
            partitions_missing or f"the job's pods and {CUT_SERVICE}, {PARTITION_SECONDS:.0f} s",
        ),
    )
    lines += ["", "## timeline", *timeline.lines, "", "## checks"]
    lines += [f"{'PASS' if ok else 'FAIL'}  {name}: {detail}" for name, ok, detail in results]
    passed = all(ok for _, ok, _ in results)
    lines.append(f"result: {'PASS' if passed else 'FAIL'}")
    record(RESULT, lines)
    return 0 if passed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=200, help="simulated jobs submitted")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder")
    args = parser.parse_args()
    if args.load < 0:
        parser.error("--load: must be >= 0")
    return asyncio.run(run(args.load, args.keep))


if __name__ == "__main__":
    sys.exit(main())
