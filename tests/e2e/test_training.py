"""Jobs that really train: Wide & Deep under TensorFlow's ParameterServerStrategy, in pods
the podwatcher runs (trainer plus agent sidecar, under cgroup limits), fed by the shard
dispatcher and checkpointed into the checkpoint cache, on real NATS and PostgreSQL.

The plans are published by the test (as the optimizer would), so each test controls the
cluster: completion with exactly-once data, scale out and in and a PS added mid-epoch
through the chief's RECONFIGURE, and recovery from a SIGKILLed worker and PS.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as dispatcher_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2, pod_pb2
from stride.testing.bus import producer_bus
from stride.testing.channels import sync_channel
from stride.testing.eventually import assert_eventually
from stride.testing.processes import ServiceProcess
from stride.testing.streams import stream_messages

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MIB = 1024**2
RECORDS = 12_000
BATCH = 256
EPOCHS = 2
PODS_PATH = Path(__file__).parent / "pods"
"""Modules the suite's pods can import: the tests' own entrypoints."""


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def plan(
    job_id: str,
    version: int,
    workers: int = 1,
    ps: int = 1,
    chief_memory: int = 1536 * MIB,
    data_workers: int = 0,
) -> plan_pb2.ResourcePlan:
    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=version,
        reason=f"test plan {version}",
        algorithm="test/1",
        roles=[
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_CHIEF, count=1, cpu=1.0, memory_bytes=chief_memory
            ),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_PS, count=ps, cpu=1.0, memory_bytes=1024 * MIB
            ),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_WORKER, count=workers, cpu=1.0, memory_bytes=1024 * MIB
            ),
            *(
                [
                    plan_pb2.RoleResources(
                        role=plan_pb2.ROLE_DATA_WORKER,
                        count=data_workers,
                        cpu=1.0,
                        memory_bytes=1024 * MIB,
                    )
                ]
                if data_workers
                else []
            ),
        ],
    )


def spec(
    job_id: str,
    records: int = RECORDS,
    entrypoint: str = "stride_examples.wide_deep:train",
    epochs: int = EPOCHS,
    **hyperparameters: str,
) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=job_id,
        user="tester",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint=entrypoint),
        dataset=job_pb2.DatasetSpec(name="criteo-synthetic", record_count=records),
        batch_size=BATCH,
        hyperparameters={"learning_rate": "0.01", "embedding_dim": "8", **hyperparameters},
        termination=job_pb2.Termination(max_epochs=epochs),
    )


class Suite:
    """The dispatcher, the checkpoint cache and the podwatcher as real processes."""

    def __init__(
        self,
        nats_url: str,
        database_url: str,
        root: Path,
        optimizer: dict[str, str] | None = None,
        **podwatcher: str,
    ) -> None:
        """``optimizer``: also run the optimizer with this environment (it then makes the
        jobs' plans)."""
        self.root = root
        self.nats_url = nats_url
        logs = root / "logs"
        logs.mkdir(parents=True)
        self.shm = Path("/dev/shm") / f"stride-e2e-{uuid.uuid4().hex[:10]}"
        common = {"STRIDE_NATS_URL": nats_url, "STRIDE_DATABASE_URL": database_url}
        self.dispatcher = ServiceProcess(
            "dispatcher",
            {
                **common,
                "STRIDE_DISPATCHER_HEALTH_INTERVAL_SECONDS": "0.2",
                # A dead data worker's steps go to another after 10 s, not the default 30.
                "STRIDE_DISPATCHER_BATCH_TIMEOUT_SECONDS": "10",
            },
            logs,
        )
        self.ckptcache = ServiceProcess(
            "ckptcache",
            {
                **common,
                "STRIDE_CKPTCACHE_STORE_DIR": str(root / "store"),
                "STRIDE_CKPTCACHE_SHM_DIR": str(self.shm),
            },
            logs,
        )
        self.podwatcher = ServiceProcess(
            "podwatcher",
            {
                **common,
                "STRIDE_PODWATCHER_LOCAL_STATE_DIR": str(root / "pods"),
                # A node holds a whole first plan (chief, PS and worker: 3 cores, 3.5 GiB), so
                # KOD2's fewest-nodes placement puts the chief beside its PS and worker, and
                # a chief that grows past its node's room has an emptier node to move to.
                "STRIDE_PODWATCHER_LOCAL_NODES": "4x(cpu=3,memory=4Gi)",
                "STRIDE_PODWATCHER_DISPATCHER_ADDRESS": self.dispatcher.address,
                "STRIDE_PODWATCHER_CKPTCACHE_ADDRESS": self.ckptcache.address,
                "STRIDE_PODWATCHER_CHECKPOINT_EVERY_STEPS": "20",
                "STRIDE_PODWATCHER_USAGE_INTERVAL_SECONDS": "1",
                "STRIDE_PODWATCHER_OOM_REPLAN_SECONDS": "5",
                "STRIDE_PODWATCHER_VERIFY_RESTORES": "true",
                "STRIDE_PODWATCHER_STEP_REPORT_SECONDS": "0.2",
                # The pods can import the tests' own entrypoints (pods/paced_wide_deep.py).
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(PODS_PATH), os.environ.get("PYTHONPATH")])
                ),
                **podwatcher,
            },
            logs,
        )

        self.optimizer = (
            None
            if optimizer is None
            else ServiceProcess("optimizer", {**common, **optimizer}, logs)
        )

    def processes(self) -> list[ServiceProcess]:
        """Every process, in the order they start."""
        return [
            self.dispatcher,
            self.ckptcache,
            self.podwatcher,
            *([self.optimizer] if self.optimizer else []),
        ]

    def start(self) -> None:
        for process in self.processes():
            process.start()

    def stop(self) -> None:
        for process in reversed(self.processes()):
            process.terminate()
        shutil.rmtree(self.shm, ignore_errors=True)

    def pod_dir(self, pod: str) -> Path:
        return self.root / "pods" / "pods" / pod

    def consumed(self, job_id: str) -> list[dict[str, Any]]:
        path = self.root / "pods" / "jobs" / job_id / "consumed.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def chief_events(self, job_id: str) -> list[dict[str, Any]]:
        """The JSON lines of every chief the job had (a moved chief has a new pod), in
        the order they were written."""
        found = []
        for path in sorted((self.root / "pods" / "pods").glob(f"{job_id}-chief-*/trainer.log")):
            for line in path.read_text().splitlines():
                if line.startswith("{"):
                    try:
                        found.append({**json.loads(line), "pod": path.parent.name})
                    except json.JSONDecodeError:
                        continue
        return sorted(found, key=lambda event: float(event.get("time", 0)))


async def running_suite(running: Suite, tmp_path: Path) -> AsyncIterator[Suite]:
    running.start()
    try:
        yield running
    finally:
        running.stop()
        from stride.podwatcher.adapters.outbound.backends.localpods import LocalPods

        leftovers = LocalPods(tmp_path / "pods")
        for status in leftovers.adopt():
            await leftovers.delete(status.launch.pod, grace_seconds=2)
        await leftovers.close()


@pytest.fixture
async def suite(nats_url: str, postgres_url: str, tmp_path: Path) -> AsyncIterator[Suite]:
    async for running in running_suite(Suite(nats_url, postgres_url, tmp_path), tmp_path):
        yield running


TUNING = {
    # Plans the suite's nodes hold: pods of a core at most.
    "STRIDE_OPTIMIZER_MAX_POD_CPU": "1",
    # Only GoldMiner's tuner decides after plan 1: no stage-step window closes.
    "STRIDE_OPTIMIZER_TICK_SECONDS": "86400",
    # Intervals of 3 s of training (30 s in production) and half-core data workers.
    "STRIDE_OPTIMIZER_TUNING_INTERVAL_SECONDS": "3",
    "STRIDE_OPTIMIZER_DATA_WORKER_CPU_UNIT": "0.5",
    "STRIDE_OPTIMIZER_MAX_DATA_WORKER_CPU": "1",
    "STRIDE_OPTIMIZER_MAX_DATA_WORKERS": "2",
}


TUNED_EPOCHS = 6
"""Epochs of the job the optimizer tunes: it must outlast a baseline interval, a data
worker's start (10-20 s: TensorFlow's import) and an interval read from it."""


@pytest.fixture
async def tuned_suite(nats_url: str, postgres_url: str, tmp_path: Path) -> AsyncIterator[Suite]:
    """The suite with the optimizer, which makes the plans."""
    built = Suite(nats_url, postgres_url, tmp_path, optimizer=TUNING)
    async for running in running_suite(built, tmp_path):
        yield running


async def submit(
    suite: Suite,
    job_id: str,
    workers: int = 1,
    ps: int = 1,
    records: int = RECORDS,
    entrypoint: str = "stride_examples.wide_deep:train",
    epochs: int = EPOCHS,
    data_workers: int = 0,
    **hyperparameters: str,
) -> Bus:
    bus = await producer_bus(suite.nats_url, name="test")
    await bus.ensure_streams()
    decision = job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        spec=spec(job_id, records, entrypoint, epochs, **hyperparameters),
    )
    await bus.publish(topics.JOB_ADMITTED, job_id, decision, f"{job_id}.admitted")
    first = plan(job_id, 1, workers, ps, data_workers=data_workers)
    await bus.publish(topics.PLAN, job_id, first, f"{job_id}.plan.1")
    return bus


async def finished(suite: Suite, job_id: str, timeout: float = 300) -> job_pb2.JobFinished:
    async def probe() -> job_pb2.JobFinished:
        messages = await stream_messages(suite.nats_url, topics.JOB_FINISHED.subject(job_id))
        assert messages, "not finished yet"
        return job_pb2.JobFinished.FromString(messages[0].data)

    end: job_pb2.JobFinished = await assert_eventually(probe, timeout=timeout, interval=1.0)
    return end


async def trained_steps(suite: Suite, job_id: str, at_least: int, timeout: float = 240) -> None:
    async def probe() -> bool:
        steps = [e["step"] for e in suite.chief_events(job_id) if e.get("event") == "steps"]
        assert steps and steps[-1] >= at_least, steps[-3:]
        return True

    await assert_eventually(probe, timeout=timeout, interval=0.5)


LONG = 48_000
"""Records of the jobs whose pods are killed while they train."""
LONGER = 204_800
LONGER_EPOCHS = 3
PACE = "8"
"""Records, epochs and steps per second of the job moved three times while it trains: it
must still be training after the last move, and new pods take 10-60 s to start on two loaded
cores (a loaded CI runner took 250 s for the three). Its first chief schedules 8 steps a
second (pods/paced_wide_deep.py: 300 s for the 2,400 steps), so it outlasts the moves
without spending the cores the start-ups need; the chief that takes over trains at full
speed to the end."""


def check_exactly_once(
    consumed: list[dict[str, Any]], records: int = RECORDS, epochs: int = EPOCHS
) -> None:
    counts = Counter((entry["epoch"], index) for entry in consumed for index in entry["indices"])
    expected = {(epoch, index) for epoch in range(epochs) for index in range(records)}
    assert set(counts) == expected, f"{len(expected - set(counts))} samples never trained on"
    assert set(counts.values()) == {1}, counts.most_common(3)


def dataset_state(suite: Suite, job_id: str) -> dispatcher_pb.GetDatasetStateResponse:
    with sync_channel(suite.dispatcher.address, "dispatcher") as channel:
        reply: dispatcher_pb.GetDatasetStateResponse = dispatcher_grpc.DispatcherServiceStub(
            channel
        ).GetDatasetState(dispatcher_pb.GetDatasetStateRequest(job_id=job_id, dataset="train"))
    return reply


async def trains_to_the_end(suite: Suite, job: str, **submitted: Any) -> None:
    """Submit ``job``; it succeeds, trains on every sample once and its loss falls."""
    bus = await submit(suite, job, **submitted)
    try:
        end = await finished(suite, job)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    check_exactly_once(suite.consumed(job))
    losses = [e["loss"] for e in suite.chief_events(job) if e.get("event") == "steps"]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses


async def test_wide_and_deep_trains_to_completion_on_every_sample_once(suite: Suite) -> None:
    job = new_job()
    await trains_to_the_end(suite, job, workers=2)
    # Its feature offsets hold no state, so the chief reads it by steps (GoldMiner's mode,
    # here without data workers: the chief makes each batch) and consumed every one.
    state = dataset_state(suite, job)
    assert state.consumed_step == EPOCHS * -(-RECORDS // BATCH) - 1, state
    assert (state.todo, state.doing) == (0, 0), state

    def only_the_chief_is_left() -> bool:
        with sync_channel(suite.podwatcher.address, "podwatcher") as channel:
            pods = (
                pb_grpc.PodWatcherServiceStub(channel)
                .GetJobPods(pb.GetJobPodsRequest(job_id=job))
                .pods
            )
        phases = {p.name: p.phase for p in pods}
        assert phases == {f"{job}-chief-0": pod_pb2.POD_PHASE_SUCCEEDED}, phases
        return True

    await assert_eventually(only_the_chief_is_left, timeout=30)


async def test_the_optimizer_gives_the_text_example_data_workers_and_a_sigkilled_one_loses_nothing(
    tuned_suite: Suite,
) -> None:
    """GoldMiner live. examples/criteo-text.yaml's entrypoint (string records decoded,
    hashed and crossed in the model: the part GoldMiner's partitioning gives data workers,
    found, not declared), admitted without data workers and planned by the optimizer. Its
    chief reports its input queue; GoldMiner's tuner in the optimizer profiles the baseline,
    adds a data worker, and judges it from the windows the chief measured reading from it.
    That data worker is SIGKILLed while it feeds the chief: its steps go back by time-out,
    the pod watcher relaunches it, and every sample is still trained exactly once."""
    suite, job = tuned_suite, new_job()
    bus = await producer_bus(suite.nats_url, name="test")
    try:
        await bus.ensure_streams()
        decision = job_pb2.AdmissionDecision(
            job_id=job,
            outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
            spec=spec(job, LONG, "stride_examples.criteo_text:train", TUNED_EPOCHS),
        )
        await bus.publish(topics.JOB_ADMITTED, job, decision, f"{job}.admitted")

        async def fed_by_a_data_worker() -> bool:
            steps = [e for e in suite.chief_events(job) if e.get("event") == "steps"]
            assert any(e.get("data_workers", 0) >= 1 for e in steps), steps[-3:]
            return True

        await assert_eventually(fed_by_a_data_worker, timeout=240, interval=0.5)
        pids = json.loads((suite.pod_dir(f"{job}-data-worker-0") / "pids.json").read_text())
        os.kill(pids["trainer"], signal.SIGKILL)
        end = await finished(suite, job)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    check_exactly_once(suite.consumed(job), LONG, TUNED_EPOCHS)
    messages = await stream_messages(suite.nats_url, topics.POD_FAILED.subject(job))
    failed = [pod_pb2.PodEvent.FromString(m.data) for m in messages]
    assert any(e.pod_name == f"{job}-data-worker-0" for e in failed), failed
    messages = await stream_messages(suite.nats_url, topics.PLAN.subject(job))
    plans = [plan_pb2.ResourcePlan.FromString(m.data) for m in messages]
    tuned = [p for p in plans if p.algorithm.startswith("goldminer-tune-step")]
    assert tuned, [(p.version, p.algorithm, p.reason) for p in plans]
    (first,) = [r for r in tuned[0].roles if r.role == plan_pb2.ROLE_DATA_WORKER]
    assert (first.count, first.cpu) == (1, 0.5), tuned[0]
    # The chief followed it: windows of that plan, read from the data worker, which the
    # tuner judged (its next step needs a whole interval of them).
    events = suite.chief_events(job)
    steps = [e for e in events if e.get("event") == "steps"]
    fed = [e for e in steps if e.get("plan") == tuned[0].version and e.get("data_workers") == 1]
    assert fed, [(e.get("plan"), e.get("data_workers")) for e in steps][-10:]
    # Steps came from the chief (the baseline) and from data workers, each taken once.
    queues = [e for e in events if e.get("event") == "input queue"]
    sources = {source for queue in queues for source in queue["by_source"]}
    assert "local" in sources and len(sources) >= 2, queues
    assert sum(queue["taken"] for queue in queues) == TUNED_EPOCHS * -(-LONG // BATCH), queues
    assert suite.optimizer is not None
    with sync_channel(suite.optimizer.address, "optimizer") as channel:
        found = (
            optimizer_grpc.OptimizerServiceStub(channel)
            .ListOptimizationEvents(optimizer_pb.ListOptimizationEventsRequest(job_id=job))
            .events
        )
    tuning = [e.detail for e in found if e.root_cause == optimization_pb2.ROOT_CAUSE_INPUT_QUEUE]
    assert tuning[0].startswith("profile-baseline"), tuning
    assert len(tuning) >= 3 and "data worker" in " ".join(tuning[2:]), tuning
    losses = [e["loss"] for e in steps]
    assert len(losses) >= 3 and losses[-1] < losses[0], losses


def pods_and_nodes(suite: Suite, job_id: str) -> tuple[list[pb.Pod], list[pb.Node]]:
    with sync_channel(suite.podwatcher.address, "podwatcher") as channel:
        stub = pb_grpc.PodWatcherServiceStub(channel)
        pods = list(stub.GetJobPods(pb.GetJobPodsRequest(job_id=job_id)).pods)
        nodes = list(stub.ListNodes(pb.ListNodesRequest()).nodes)
    return pods, nodes


async def reconfigured(suite: Suite, job_id: str, version: int, event: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any]:
        found = [
            e
            for e in suite.chief_events(job_id)
            if e.get("event") == event and e["version"] == version
        ]
        # On failure: what each chief said last besides its routine reports.
        said = [
            (e["pod"], e.get("event"), e.get("version"), e.get("why") or e.get("error"))
            for e in suite.chief_events(job_id)
            if e.get("event") not in ("steps", "checkpoint")
        ]
        assert found, said[-12:]
        return found[0]

    result: dict[str, Any] = await assert_eventually(probe, timeout=180, interval=0.5)
    return result


async def test_scale_out_and_in_a_second_ps_and_a_moved_chief_while_training(
    suite: Suite,
) -> None:
    job = new_job()
    bus = await submit(
        suite,
        job,
        workers=1,
        records=LONGER,
        entrypoint="paced_wide_deep:train",
        epochs=LONGER_EPOCHS,
        steps_per_second=PACE,
    )
    try:
        await trained_steps(suite, job, 10)
        # Workers only: followed in place, the variables stay on the PS, nothing saved.
        await bus.publish(topics.PLAN, job, plan(job, 2, workers=3), f"{job}.plan.2")
        moved = await reconfigured(suite, job, 2, "reconfigured")
        assert moved["change"] == "workers", moved
        # A second PS: checkpoint, reconnect, rebuild over both PS, restore.
        await bus.publish(topics.PLAN, job, plan(job, 3, workers=1, ps=2), f"{job}.plan.3")
        moved = await reconfigured(suite, job, 3, "reconfigured")
        assert moved["change"] == "parameter servers", moved

        # The chief needs more memory than its node has left: a new chief pod starts on
        # another node as a standby, the old one checkpoints and hands over, the new one
        # restores and resumes (DLRover-RM sec. 5.2).
        async def retired() -> tuple[list[pb.Pod], list[pb.Node]]:
            # The workers plan 3 dropped are removed once the chief confirmed; until then
            # they hold room (KOD2 packs the job's pods, so that room is the chief's
            # neighbours').
            pods, nodes = pods_and_nodes(suite, job)
            live = sorted(p.name for p in pods if p.phase == pod_pb2.POD_PHASE_RUNNING)
            assert len(live) == 4, live
            return pods, nodes

        pods, nodes = await assert_eventually(retired, timeout=60)
        chief = next(p for p in pods if p.role == plan_pb2.ROLE_CHIEF)
        free = {n.name: n.memory_bytes - n.memory_allocated_bytes for n in nodes}
        bigger = chief.memory_bytes + free[chief.node] + 256 * MIB
        assert any(room >= bigger for name, room in free.items() if name != chief.node), free
        await bus.publish(
            topics.PLAN,
            job,
            plan(job, 4, workers=1, ps=2, chief_memory=bigger),
            f"{job}.plan.4",
        )
        resumed = await reconfigured(suite, job, 4, "resumed")
        assert resumed["pod"] == f"{job}-chief-0-g1", resumed
        end = await finished(suite, job, timeout=600)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    events = suite.chief_events(job)
    check_moves(job, events)
    # A move checkpoints after the shards it finished, so nothing is lost or repeated.
    check_exactly_once(suite.consumed(job), LONGER, LONGER_EPOCHS)
    await check_added_workers_trained(suite, job, events)


def check_moves(job: str, events: list[dict[str, Any]]) -> None:
    """One hand-over, to the new chief, and two restores: the PS change (into the same
    chief) and the takeover (the new chief), each of the flash checkpoint made for it and
    bit-identical to it; the workers-only move saved nothing."""
    handed = [e for e in events if e.get("event") == "handed over"]
    assert [(e["pod"], e["version"]) for e in handed] == [(f"{job}-chief-0", 4)], handed
    restored = [e for e in events if e.get("event") == "restored"]
    assert [e["pod"] for e in restored] == [f"{job}-chief-0", f"{job}-chief-0-g1"], restored
    saved = {e["id"]: e["digest"] for e in events if e.get("why") == "reconfigure"}
    for event in restored:  # bit-identical: the same digest over every variable's bytes
        assert event["digest"] == saved[event["checkpoint"]], (event, saved)
    assert len(saved) == 2, saved


async def check_added_workers_trained(suite: Suite, job: str, events: list[dict[str, Any]]) -> None:
    """The workers added in place really trained between the two moves: the steps were
    spread over all three, so each added one used CPU as the first worker did (an idle
    TensorFlow server uses next to none; their start-up was before)."""
    began = next(e["time"] for e in events if e.get("event") == "reconfigured")
    ended = next(e["time"] for e in events if e.get("event") == "moving" and e["version"] == 3)
    usage = [
        pod_pb2.UsageSample.FromString(m.data)
        for m in await stream_messages(suite.nats_url, topics.POD_USAGE.subject(job))
    ]

    def used(pod: str) -> float:
        samples = [
            u.cpu_used
            for u in usage
            if u.pod_name == pod and began + 1 < u.sampled_at.ToMicroseconds() / 1e6 < ended
        ]
        assert samples, (pod, began, ended)
        return sum(samples) / len(samples)

    first = used(f"{job}-worker-0")
    for added in (f"{job}-worker-1", f"{job}-worker-2"):
        assert used(added) > first / 3, (added, used(added), first)


async def test_a_sigkilled_worker_and_ps_are_relaunched_and_the_job_completes(
    suite: Suite,
) -> None:
    job = new_job()
    bus = await submit(suite, job, workers=2, records=LONG)
    try:
        await trained_steps(suite, job, 20)
        worker_pids = json.loads((suite.pod_dir(f"{job}-worker-1") / "pids.json").read_text())
        os.kill(worker_pids["trainer"], signal.SIGKILL)

        async def failed(pod: str) -> pod_pb2.PodEvent:
            messages = await stream_messages(suite.nats_url, topics.POD_FAILED.subject(job))
            found = [pod_pb2.PodEvent.FromString(m.data) for m in messages]
            mine = [e for e in found if e.pod_name == pod]
            assert mine, found
            return mine[0]

        failure = await assert_eventually(lambda: failed(f"{job}-worker-1"), timeout=30)
        assert failure.reason == pod_pb2.POD_FAILURE_REASON_ERROR
        assert "SIGKILL" in failure.message
        await trained_steps(suite, job, 40)
        ps_pids = json.loads((suite.pod_dir(f"{job}-ps-0") / "pids.json").read_text())
        os.kill(ps_pids["trainer"], signal.SIGKILL)
        await assert_eventually(lambda: failed(f"{job}-ps-0"), timeout=30)
        end = await finished(suite, job)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    events = suite.chief_events(job)
    assert any(e.get("event") == "cluster failure" for e in events)
    assert any(e.get("event") == "restored" for e in events)
    counts = Counter(
        (entry["epoch"], index) for entry in suite.consumed(job) for index in entry["indices"]
    )
    expected = {(epoch, index) for epoch in range(EPOCHS) for index in range(LONG)}
    assert set(counts) == expected  # nothing lost
    repeated = sum(count - 1 for count in counts.values())
    assert repeated <= 20 * BATCH  # at most one checkpoint interval (20 steps) repeated


async def test_a_worker_under_its_need_is_oom_killed_and_the_oom_rule_relaunches_it(
    suite: Suite,
) -> None:
    from stride.policy import dlrover
    from stride.policy.plans import Plan, Role, RoleResources

    job = new_job()
    bus = await producer_bus(suite.nats_url, name="test")
    await bus.ensure_streams()
    try:
        decision = job_pb2.AdmissionDecision(
            job_id=job, outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED, spec=spec(job)
        )
        await bus.publish(topics.JOB_ADMITTED, job, decision, f"{job}.admitted")
        starved = plan(job, 1)
        starved.roles[2].memory_bytes = 200 * MIB  # a TensorFlow worker and its agent need more
        await bus.publish(topics.PLAN, job, starved, f"{job}.plan.1")

        async def oom() -> pod_pb2.PodEvent:
            messages = await stream_messages(suite.nats_url, topics.POD_FAILED.subject(job))
            found = [pod_pb2.PodEvent.FromString(m.data) for m in messages]
            assert found, "no failure yet"
            return found[0]

        failure = await assert_eventually(oom, timeout=120, interval=0.5)
        assert failure.pod_name == f"{job}-worker-0"
        assert failure.reason == pod_pb2.POD_FAILURE_REASON_OOM_KILLED, failure.message
        assert "oom_kill counter" in failure.message
        # The optimizer's OOM rule (DLRover sec. 4.2, what `stride sim` applies and the live
        # optimizer runs on this event: tests/integration/test_optimizer_scale_and_oom.py),
        # decided here by the same policy function: double the workers' memory.
        roles = tuple(
            RoleResources(Role.parse(plan_pb2.Role.Name(r.role)), r.count, r.cpu, r.memory_bytes)
            for r in starved.roles
        )
        reply = dlrover.adjust(
            dlrover.AdjustRequest(
                dlrover.Stage.SAMPLE,
                Plan(roles=roles, reason="the test's starved plan", algorithm="test/1"),
                (dlrover.PodObservation(0, 0.0, 0, oom_killed=True),),
                (dlrover.PodObservation(0, 0.0, 0),),
            )
        )
        assert reply.plan is not None
        grown = reply.plan.role(Role.WORKER)
        assert grown is not None and grown.memory_bytes == 400 * MIB
        relaunch = plan(job, 2)
        relaunch.roles[2].memory_bytes = grown.memory_bytes
        await bus.publish(topics.PLAN, job, relaunch, f"{job}.plan.2")
        end = await finished(suite, job)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    with sync_channel(suite.podwatcher.address, "podwatcher") as channel:
        pods = pb_grpc.PodWatcherServiceStub(channel).GetJobPods(pb.GetJobPodsRequest(job_id=job))
    assert pods.plan.plan.version == 2


async def test_an_entrypoint_with_a_loop_of_its_own_trains_on_the_dispatchers_data(
    suite: Suite,
) -> None:
    job = new_job()
    bus = await submit(suite, job, workers=2, entrypoint="stride_examples.wide_deep:train_own_loop")
    try:
        end = await finished(suite, job)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    state = dataset_state(suite, job)
    assert state.finished and (state.todo, state.doing) == (0, 0), state
    losses = [e["loss"] for e in suite.chief_events(job) if e.get("event") == "own loop"]
    # Every batch of both epochs came through the tf.data dataset (one line per 10).
    assert len(losses) == (-(-RECORDS // BATCH) * EPOCHS) // 10, losses
    assert losses[-1] < losses[0], losses


def no_pods(job_id: str, version: int) -> plan_pb2.ResourcePlan:
    """The optimizer's plan for a job admission preempted (its share went to zero)."""
    message = plan(job_id, version)
    for role in message.roles:
        role.count = 0
    message.reason = "share: suspended: admission's share is zero (preempted)"
    return message


async def test_a_suspended_job_checkpoints_loses_its_pods_and_resumes_where_it_stopped(
    suite: Suite,
) -> None:
    """Preemption's path (DLRover-RM sec. 5.2's order): the chief saves a flash checkpoint
    after the shards it finished, every pod goes, and later new pods restore it and the
    dispatcher's shards as they were: every sample once per epoch, no step trained twice."""
    job = new_job()
    bus = await submit(suite, job, workers=1)  # 94 steps: suspended at about the 10th
    try:
        await trained_steps(suite, job, 10)
        await bus.publish(topics.PLAN, job, no_pods(job, 2), f"{job}.plan.2")

        async def suspended() -> pb.RecordedPlan:
            with sync_channel(suite.podwatcher.address, "podwatcher") as channel:
                reply = pb_grpc.PodWatcherServiceStub(channel).GetJobPods(
                    pb.GetJobPodsRequest(job_id=job)
                )
            recorded: pb.RecordedPlan = reply.plan
            assert recorded.plan.version == 2 and recorded.state == pb.PLAN_STATE_APPLIED
            assert not [p for p in reply.pods if p.phase == pod_pb2.POD_PHASE_RUNNING]
            return recorded

        done = await assert_eventually(suspended, timeout=120, interval=0.5)
        assert done.message.startswith("suspended after checkpoint "), done.message
        saved = [
            e
            for e in suite.chief_events(job)
            if e.get("event") == "checkpoint" and e.get("why") == "pause"
        ]
        assert len(saved) == 1 and done.message.endswith(saved[0]["id"]), (saved, done.message)
        stopped_at = max(e["step"] for e in suite.chief_events(job) if e.get("event") == "steps")
        state = dataset_state(suite, job)
        assert not state.finished and state.doing == 0, state  # its shards went back
        await bus.publish(topics.PLAN, job, plan(job, 3, workers=1), f"{job}.plan.3")
        end = await finished(suite, job)
    finally:
        await bus.close()
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED, end.message
    check_exactly_once(suite.consumed(job))
    restored = [e for e in suite.chief_events(job) if e.get("event") == "restored"]
    assert [e["checkpoint"] for e in restored] == [saved[0]["id"]], restored
    assert restored[0]["digest"] == saved[0]["digest"]  # bit-identical
    # It went on from the step it paused at: nothing after the last reported step was lost.
    assert restored[0]["step"] == saved[0]["step"] >= stopped_at, (restored, saved, stopped_at)
