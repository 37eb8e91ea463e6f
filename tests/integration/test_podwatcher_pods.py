"""The podwatcher runs real pods: scripted trainers with real agent sidecars, under the
kernel's limits, on real NATS and PostgreSQL.

The trainer here is :mod:`stride.testing.scripted_trainer` (it follows a script from the
job's hyperparameters instead of training), so these tests check the pod lifecycle in
seconds: plans applied (scale out and in through the chief's confirmation), events with
their reasons (a real cgroup OOM kill, an exit code and its log), relaunches within the
budget, the job's end, cancel, and re-adoption after the podwatcher is SIGKILLed.
Training for real is in ``tests/e2e/test_training.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.message import Message
from nats.aio.msg import Msg

from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import cluster_pb2, control_pb2, job_pb2, plan_pb2, pod_pb2
from stride.podwatcher.adapters.outbound.backends.localpods import LocalPods, firewall
from stride.podwatcher.adapters.outbound.backends.localpods.firewall import TfFirewall
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.processes import ServiceProcess
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

MIB = 1024**2
GIB = 1024**3
SCRIPTED = "stride.testing.scripted_trainer"
Stub = Any


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:10]}"


def plan(
    job_id: str,
    version: int,
    workers: int = 1,
    ps: int = 1,
    worker_memory: int = 256 * MIB,
) -> plan_pb2.ResourcePlan:
    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=version,
        reason=f"test plan {version}",
        algorithm="test/1",
        roles=[
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_CHIEF, count=1, cpu=0.5, memory_bytes=256 * MIB
            ),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_PS, count=ps, cpu=0.5, memory_bytes=256 * MIB
            ),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_WORKER, count=workers, cpu=0.5, memory_bytes=worker_memory
            ),
        ],
    )


async def admit(bus: Bus, job_id: str, **script: str) -> None:
    spec = job_pb2.JobSpec(name=job_id, user="tester", hyperparameters=script)
    decision = job_pb2.AdmissionDecision(
        job_id=job_id, outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED, spec=spec
    )
    await bus.publish(topics.JOB_ADMITTED, job_id, decision, f"{job_id}.admitted")


class Podwatcher:
    """The podwatcher as a real process, restartable and killable."""

    def __init__(self, nats_url: str, database_url: str, state: Path, **extra: str) -> None:
        self.state = state
        env = {
            "STRIDE_PODWATCHER_NATS_URL": nats_url,
            "STRIDE_PODWATCHER_DATABASE_URL": database_url,
            "STRIDE_PODWATCHER_GRPC_HOST": "127.0.0.1",
            "STRIDE_PODWATCHER_LOCAL_STATE_DIR": str(state / "pods"),
            "STRIDE_PODWATCHER_LOCAL_NODES": "2x(cpu=2,memory=2Gi)",
            "STRIDE_PODWATCHER_TRAINER_MODULE": SCRIPTED,
            "STRIDE_PODWATCHER_USAGE_INTERVAL_SECONDS": "0.5",
            "STRIDE_PODWATCHER_OOM_REPLAN_SECONDS": "60",
            "STRIDE_PODWATCHER_RELAUNCH_BUDGET": "2",
            "STRIDE_PODWATCHER_HEALTH_INTERVAL_SECONDS": "0.2",
            **extra,
        }
        (state / "logs").mkdir(parents=True, exist_ok=True)
        self.process = ServiceProcess("podwatcher", env, state / "logs")

    @property
    def address(self) -> str:
        return self.process.address


async def serving(stub: Stub) -> None:
    async def probe() -> bool:
        try:
            await stub.ListNodes(pb.ListNodesRequest(), timeout=2)
        except grpc.aio.AioRpcError as error:
            raise AssertionError(f"not serving yet: {error.code()}") from None
        return True

    await assert_eventually(probe, timeout=30)


@contextlib.asynccontextmanager
async def running_podwatcher(
    nats_url: str, postgres_url: str, tmp_path: Path, **extra: str
) -> AsyncIterator[tuple[Podwatcher, Stub, Bus]]:
    """A podwatcher process serving, a bus connection and a stub; its pods removed after."""
    podwatcher = Podwatcher(nats_url, postgres_url, tmp_path, **extra)
    podwatcher.process.start()
    bus = await producer_bus(nats_url, name="test")
    channel = aio_channel(podwatcher.address, "podwatcher")
    try:
        stub = pb_grpc.PodWatcherServiceStub(channel)
        await serving(stub)
        yield podwatcher, stub, bus
    finally:
        await channel.close(None)
        await bus.close()
        podwatcher.process.terminate()
        # Pods outlive the podwatcher by design: remove what this test left.
        leftovers = LocalPods(tmp_path / "pods")
        for status in leftovers.adopt():
            await leftovers.delete(status.launch.pod, grace_seconds=2)
        await leftovers.close()
        if firewall.unavailable() is None:  # the guard of their TensorFlow ports too
            TfFirewall(tmp_path / "pods").remove()


@pytest.fixture
async def harness(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Podwatcher, Stub, Bus]]:
    async with running_podwatcher(nats_url, postgres_url, tmp_path) as running:
        yield running


async def pods_of(stub: Stub, job_id: str) -> dict[str, pb.Pod]:
    try:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job_id))
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.NOT_FOUND:
            return {}
        raise
    return {pod.name: pod for pod in reply.pods}


async def running(stub: Stub, job_id: str, *names: str) -> dict[str, pb.Pod]:
    async def probe() -> tuple[dict[str, pb.Pod]]:
        pods = await pods_of(stub, job_id)
        live = {n for n, p in pods.items() if p.phase == pod_pb2.POD_PHASE_RUNNING}
        assert live == set(names), pods
        return (pods,)  # truthy even when no pod runs

    return (await assert_eventually(probe, timeout=30))[0]


M = TypeVar("M", bound=Message)


async def events(nats_url: str, topic: topics.Topic[M], job_id: str) -> list[M]:
    messages: list[Msg] = await stream_messages(nats_url, topic.subject(job_id))
    return [topic.message_type.FromString(m.data) for m in messages]


async def at_least(nats_url: str, topic: topics.Topic[M], job_id: str, count: int) -> list[M]:
    """The job's events on ``topic`` once there are ``count`` (the outbox relays them a
    moment after the change it records)."""

    async def probe() -> list[M]:
        found = await events(nats_url, topic, job_id)
        assert len(found) >= count, found
        return found

    result: list[M] = await assert_eventually(probe, timeout=20)
    return result


async def test_a_job_runs_scales_out_and_in_and_succeeds(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    podwatcher, stub, bus = harness
    job = new_job()
    chief, ps, w0, w1 = (f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0", f"{job}-worker-1")
    await admit(bus, job, script_chief="finish-on-file", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    pods = await running(stub, job, chief, ps, w0)
    assert pods[w0].cpu == 0.5 and pods[w0].memory_bytes == 256 * MIB
    assert {p.node for p in pods.values()} <= {"node-0", "node-1"}

    async def all_started() -> bool:
        started = await events(nats_url, topics.POD_STARTED, job)
        assert sorted(e.pod_name for e in started) == sorted([chief, ps, w0])
        return True

    await assert_eventually(all_started, timeout=20)  # the outbox relays a moment later

    async def sampled() -> bool:
        pods = await pods_of(stub, job)
        assert pods[w0].memory_used_bytes > 0, pods[w0]
        usage = await events(nats_url, topics.POD_USAGE, job)
        return any(u.pod_name == w0 and u.memory_limit_bytes == 256 * MIB for u in usage)

    await assert_eventually(sampled, timeout=20)
    nodes = (await stub.ListNodes(pb.ListNodesRequest())).nodes
    assert sum(n.memory_allocated_bytes for n in nodes) == 3 * 256 * MIB

    # Scale out: the new worker starts first, then the chief is told the new cluster.
    await bus.publish(topics.PLAN, job, plan(job, 2, workers=2), f"{job}.plan.2")
    await running(stub, job, chief, ps, w0, w1)

    async def reconfigure(version: int) -> control_pb2.ControlCommand:
        commands = await events(nats_url, topics.CONTROL_COMMAND, job)
        mine = [c for c in commands if c.plan_version == version]
        assert mine, commands
        return mine[0]

    command = await assert_eventually(lambda: reconfigure(2), timeout=20)
    assert command.pod_name == chief
    assert command.action == control_pb2.CONTROL_ACTION_RECONFIGURE
    cluster = json.loads(command.cluster_json)
    assert len(cluster["worker"]) == 2 and len(cluster["ps"]) == 1 and len(cluster["chief"]) == 1
    await bus.publish(
        topics.CONTROL_ACK,
        job,
        control_pb2.ControlAck(
            job_id=job,
            pod_name=chief,
            action=control_pb2.CONTROL_ACTION_RECONFIGURE,
            plan_version=2,
            ok=True,
        ),
        f"{job}.ack.2",
    )

    async def applied(version: int) -> bool:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job))
        assert reply.plan.plan.version == version and reply.plan.state == pb.PLAN_STATE_APPLIED, (
            reply.plan
        )
        return True

    await assert_eventually(lambda: applied(2), timeout=20)

    # Scale in: worker-1 stays until the chief confirms it no longer uses it.
    await bus.publish(topics.PLAN, job, plan(job, 3, workers=1), f"{job}.plan.3")
    command = await assert_eventually(lambda: reconfigure(3), timeout=20)
    assert len(json.loads(command.cluster_json)["worker"]) == 1
    assert w1 in await running(stub, job, chief, ps, w0, w1)
    await bus.publish(
        topics.CONTROL_ACK,
        job,
        control_pb2.ControlAck(
            job_id=job,
            pod_name=chief,
            action=control_pb2.CONTROL_ACTION_RECONFIGURE,
            plan_version=3,
            ok=True,
        ),
        f"{job}.ack.3",
    )
    await running(stub, job, chief, ps, w0)

    async def w1_deleted() -> bool:
        deleted = await events(nats_url, topics.POD_DELETED, job)
        assert [e.pod_name for e in deleted] == [w1]
        return True

    await assert_eventually(w1_deleted, timeout=20)
    # A stale plan changes nothing.
    await bus.publish(topics.PLAN, job, plan(job, 2, workers=2), f"{job}.plan.2-again")
    await assert_eventually(lambda: applied(3), timeout=20)

    # The chief finishes: the job succeeded, and every pod goes.
    (podwatcher.state / "pods" / "jobs" / job / "finish").touch()

    async def finished() -> job_pb2.JobFinished:
        ends = await events(nats_url, topics.JOB_FINISHED, job)
        assert ends, "no finished event"
        return ends[0]

    end = await assert_eventually(finished, timeout=20)
    assert end.outcome == job_pb2.JOB_OUTCOME_SUCCEEDED
    await running(stub, job)
    succeeded = await at_least(nats_url, topics.POD_SUCCEEDED, job, 1)
    assert [e.pod_name for e in succeeded] == [chief]
    starts = (podwatcher.state / "pods" / "jobs" / job / "starts.log").read_text().splitlines()
    assert len(starts) == 1, starts  # the chief was never restarted


async def test_failures_are_relaunched_within_the_budget_then_the_job_fails(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    _, stub, bus = harness
    job = new_job()
    await admit(bus, job, script_worker="exit:3", script_chief="run", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")

    async def failed_job() -> job_pb2.JobFinished:
        ends = await events(nats_url, topics.JOB_FINISHED, job)
        assert ends
        return ends[0]

    end = await assert_eventually(failed_job, timeout=60)
    assert end.outcome == job_pb2.JOB_OUTCOME_FAILED
    assert f"pod {job}-worker-0 failed 3 times (relaunch budget 2)" in end.message
    failures = await at_least(nats_url, topics.POD_FAILED, job, 3)
    assert len(failures) == 3
    for failure in failures:
        assert failure.reason == pod_pb2.POD_FAILURE_REASON_ERROR
        assert failure.exit_code == 3
        assert "exit code 3" in failure.message and "failing on purpose" in failure.message
    await running(stub, job)  # every pod removed


async def test_a_kernel_oom_kill_is_reported_and_a_bigger_plan_relaunches_the_pod(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    _, stub, bus = harness
    job = new_job()
    await admit(bus, job, script_worker="oom", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1, worker_memory=96 * MIB), f"{job}.plan.1")

    async def oom() -> pod_pb2.PodEvent:
        failures = await events(nats_url, topics.POD_FAILED, job)
        assert failures
        return failures[0]

    failure = await assert_eventually(oom, timeout=30)
    assert failure.pod_name == f"{job}-worker-0"
    assert failure.reason == pod_pb2.POD_FAILURE_REASON_OOM_KILLED, failure
    # It waits for the optimizer's next plan rather than relaunching at the same size.
    pods = await pods_of(stub, job)
    assert pods[f"{job}-worker-0"].phase == pod_pb2.POD_PHASE_FAILED
    assert pods[f"{job}-worker-0"].last_failure == pod_pb2.POD_FAILURE_REASON_OOM_KILLED
    await bus.publish(topics.PLAN, job, plan(job, 2, worker_memory=192 * MIB), f"{job}.plan.2")

    async def relaunched() -> bool:
        pods = await pods_of(stub, job)
        worker = pods[f"{job}-worker-0"]
        assert worker.restarts >= 1 and worker.memory_bytes == 192 * MIB, worker
        return True

    await assert_eventually(relaunched, timeout=30)


async def test_cancel_removes_the_pods(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    _, stub, bus = harness
    job = new_job()
    await admit(bus, job, script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    await running(stub, job, f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0")
    cancelled = job_pb2.JobFinished(
        job_id=job, outcome=job_pb2.JOB_OUTCOME_CANCELLED, message="cancelled by user"
    )
    await bus.publish(topics.JOB_FINISHED, job, cancelled, f"{job}.finished")
    await running(stub, job)
    deleted = await at_least(nats_url, topics.POD_DELETED, job, 3)
    assert len(deleted) == 3


async def test_a_sigkilled_podwatcher_readopts_its_pods(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    podwatcher, stub, bus = harness
    job = new_job()
    await admit(bus, job, script_chief="finish-on-file", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    names = (f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0")
    before = await running(stub, job, *names)
    podwatcher.process.kill()
    podwatcher.process.start()
    await serving(stub)
    after = await running(stub, job, *names)
    assert {n: p.restarts for n, p in after.items()} == {n: p.restarts for n, p in before.items()}
    log = podwatcher.process.log_text()
    assert "pods re-adopted" in log
    # No duplicate: each pod was started once, and nothing was relaunched.
    started = await events(nats_url, topics.POD_STARTED, job)
    assert sorted(e.pod_name for e in started) == sorted(names)
    assert not await events(nats_url, topics.POD_FAILED, job)
    (podwatcher.state / "pods" / "jobs" / job / "finish").touch()
    await running(stub, job)
    starts = (podwatcher.state / "pods" / "jobs" / job / "starts.log").read_text().splitlines()
    assert len(starts) == 1, starts


async def test_a_pod_that_vanished_while_the_podwatcher_was_down_is_lost_and_relaunched(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    """The sweep after start-up: a pod that was running when the podwatcher died and is gone
    without a recorded end (its node lost it) fails as lost and is relaunched. Only such
    pods: those this run launches record their own ends."""
    podwatcher, stub, bus = harness
    job = new_job()
    await admit(bus, job, script_chief="finish-on-file", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    names = (f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0")
    await running(stub, job, *names)
    podwatcher.process.kill()
    pods = LocalPods(podwatcher.state / "pods")
    await pods.delete(f"{job}-worker-0", grace_seconds=2)
    shutil.rmtree(pods.pod_dir(f"{job}-worker-0"))  # gone, and its end with it
    await pods.close()
    podwatcher.process.start()
    await serving(stub)
    failures = await at_least(nats_url, topics.POD_FAILED, job, 1)
    assert [(f.pod_name, f.reason) for f in failures] == [
        (f"{job}-worker-0", pod_pb2.POD_FAILURE_REASON_ERROR)
    ]
    assert "lost: not running after the podwatcher restarted" in failures[0].message
    after = await running(stub, job, *names)
    assert after[f"{job}-worker-0"].restarts == 1
    assert {after[name].restarts for name in names[:2]} == {0}
    (podwatcher.state / "pods" / "jobs" / job / "finish").touch()
    await running(stub, job)


async def test_a_bad_virtual_node_spec_stops_start_up_naming_it(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    podwatcher = Podwatcher(
        nats_url, postgres_url, tmp_path, STRIDE_PODWATCHER_LOCAL_NODES="4x(cpu=two,memory=4Gi)"
    )
    podwatcher.process.start()
    assert podwatcher.process.process is not None
    code = podwatcher.process.process.wait(timeout=60)  # it stops by itself
    assert code != 0
    log = podwatcher.process.log_text()
    assert "local_nodes" in log.lower() and "two" in log, log[-2000:]


def chief_moving_plan(job_id: str) -> plan_pb2.ResourcePlan:
    """Plan v2: the chief needs more memory than its node has left (the three 256 MiB pods
    of plan v1 share node-0 of 2 GiB), so it moves to node-1."""
    moved = plan(job_id, 2)
    moved.roles[0].memory_bytes = 1792 * MIB
    return moved


async def command_for(nats_url: str, job_id: str, version: int, action: int) -> Any:
    async def probe() -> control_pb2.ControlCommand:
        commands = await events(nats_url, topics.CONTROL_COMMAND, job_id)
        mine = [c for c in commands if c.plan_version == version and c.action == action]
        assert mine, commands
        return mine[0]

    return await assert_eventually(probe, timeout=30)


async def test_a_moved_chief_hands_over_to_its_standby_pod(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    podwatcher, stub, bus = harness
    job = new_job()
    chief, moved, ps, w0 = (
        f"{job}-chief-0",
        f"{job}-chief-0-g1",
        f"{job}-ps-0",
        f"{job}-worker-0",
    )
    await admit(bus, job, script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    pods = await running(stub, job, chief, ps, w0)
    assert pods[chief].node == "node-0"
    await bus.publish(topics.PLAN, job, chief_moving_plan(job), f"{job}.plan.2")
    # The new chief pod starts first, on the other node, as a standby.
    pods = await running(stub, job, chief, moved, ps, w0)
    assert pods[moved].node == "node-1" and pods[moved].memory_bytes == 1792 * MIB

    def started_as_standby() -> bool:
        log = podwatcher.state / "pods" / "jobs" / job / "starts.log"
        starts = log.read_text().splitlines()
        assert [line.split()[:2] for line in starts] == [
            [chief, "standby=false"],
            [moved, "standby=true"],
        ], starts
        return True

    await assert_eventually(started_as_standby, timeout=20)
    # Then the old chief is told the new cluster, whose chief is the new pod.
    command = await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_RECONFIGURE)
    assert command.pod_name == chief
    new_chief = json.loads(command.cluster_json)["chief"]
    assert new_chief == [pods[moved].address], (new_chief, pods[moved].address)
    # The old chief checkpoints and hands over.
    handed = control_pb2.ControlAck(
        job_id=job,
        pod_name=chief,
        action=control_pb2.CONTROL_ACTION_RECONFIGURE,
        plan_version=2,
        ok=True,
        checkpoint_id="step-70",
        paused_seconds=0.25,
    )
    handed.acked_at.GetCurrentTime()
    await bus.publish(topics.CONTROL_ACK, job, handed, f"{job}.ack.2")
    # The standby is told to take over from that checkpoint, with the pause's start.
    resume = await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_RESUME)
    assert resume.pod_name == moved and resume.checkpoint_id == "step-70"
    assert json.loads(resume.cluster_json) == json.loads(command.cluster_json)
    began = resume.paused_at.ToMicroseconds() - handed.acked_at.ToMicroseconds()
    assert abs(began + 250_000) < 1_000, began
    # And the old chief goes.
    await running(stub, job, moved, ps, w0)

    async def applied() -> bool:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job))
        assert reply.plan.state == pb.PLAN_STATE_APPLIED, reply.plan
        return True

    await assert_eventually(applied, timeout=20)


async def test_a_chief_that_ends_before_handing_over_leaves_the_job_to_its_standby(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    podwatcher, stub, bus = harness
    job = new_job()
    chief, moved, ps, w0 = (
        f"{job}-chief-0",
        f"{job}-chief-0-g1",
        f"{job}-ps-0",
        f"{job}-worker-0",
    )
    await admit(bus, job, script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    await running(stub, job, chief, ps, w0)
    await bus.publish(topics.PLAN, job, chief_moving_plan(job), f"{job}.plan.2")
    await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_RECONFIGURE)
    # The old chief dies instead of answering.
    pids = json.loads((podwatcher.state / "pods" / "pods" / chief / "pids.json").read_text())
    os.kill(pids["trainer"], signal.SIGKILL)
    resume = await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_RESUME)
    assert resume.pod_name == moved and resume.checkpoint_id == ""  # the newest
    await running(stub, job, moved, ps, w0)

    async def applied() -> bool:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job))
        assert reply.plan.state == pb.PLAN_STATE_APPLIED, reply.plan
        assert "ended before it handed over" in reply.plan.message
        return True

    await assert_eventually(applied, timeout=20)
    # It was going anyway: deleted, not failed, and not relaunched.
    assert not [e for e in await events(nats_url, topics.POD_FAILED, job) if e.pod_name == chief]


async def test_a_plan_that_fits_only_once_another_job_ends_waits_for_room(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    _, stub, bus = harness
    first, second = new_job(), new_job()
    await admit(bus, first, script="run")
    await admit(bus, second, script="run")
    # The first job takes 1.5 GiB of each 2 GiB node; the second needs 1 GiB pods.
    big = plan(first, 1, workers=1, worker_memory=1536 * MIB)
    big.roles[1].memory_bytes = 1536 * MIB  # its PS too
    await bus.publish(topics.PLAN, first, big, f"{first}.plan.1")
    await running(stub, first, f"{first}-chief-0", f"{first}-ps-0", f"{first}-worker-0")
    wanted = plan(second, 1, worker_memory=1024 * MIB)
    await bus.publish(topics.PLAN, second, wanted, f"{second}.plan.1")

    async def waiting() -> bool:
        try:
            reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=second))
        except grpc.aio.AioRpcError as error:
            raise AssertionError(f"not recorded yet: {error.code()}") from None
        assert reply.plan.state == pb.PLAN_STATE_RECORDED, reply.plan
        assert reply.plan.message.startswith("waiting for room: no node has room"), reply.plan
        assert not reply.pods
        return True

    await assert_eventually(waiting, timeout=20)
    # The first job ends: its pods go, and the second job's start in the room they leave.
    cancelled = job_pb2.JobFinished(job_id=first, outcome=job_pb2.JOB_OUTCOME_CANCELLED)
    await bus.publish(topics.JOB_FINISHED, first, cancelled, f"{first}.finished")
    await running(stub, second, f"{second}-chief-0", f"{second}-ps-0", f"{second}-worker-0")

    async def applied() -> bool:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=second))
        assert reply.plan.state == pb.PLAN_STATE_APPLIED, reply.plan
        return True

    await assert_eventually(applied, timeout=20)


async def test_a_plan_no_node_could_ever_hold_fails_naming_the_pod(
    harness: tuple[Podwatcher, Stub, Bus],
) -> None:
    _, stub, bus = harness
    job = new_job()
    await admit(bus, job, script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1, worker_memory=3 * GIB), f"{job}.plan.1")

    async def failed() -> bool:
        try:
            reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job))
        except grpc.aio.AioRpcError as error:
            raise AssertionError(f"not recorded yet: {error.code()}") from None
        assert reply.plan.state == pb.PLAN_STATE_FAILED, reply.plan
        assert f"no node has room for pod {job}-worker-0 (0.5 cpu, 3.00 GiB)" in reply.plan.message
        return True

    await assert_eventually(failed, timeout=20)


async def test_a_chief_that_dies_during_a_move_comes_back_on_the_new_cluster(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    podwatcher, stub, bus = harness
    job = new_job()
    chief, ps, w0, w1 = (f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0", f"{job}-worker-1")
    await admit(bus, job, script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    await running(stub, job, chief, ps, w0)
    await bus.publish(topics.PLAN, job, plan(job, 2, workers=2), f"{job}.plan.2")
    command = await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_RECONFIGURE)
    # The chief dies instead of answering; relaunched, it starts on plan v2's cluster.
    pids = json.loads((podwatcher.state / "pods" / "pods" / chief / "pids.json").read_text())
    os.kill(pids["trainer"], signal.SIGKILL)

    async def moved() -> bool:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job))
        assert reply.plan.state == pb.PLAN_STATE_APPLIED, reply.plan
        assert reply.plan.message == "the chief restarted on the new cluster", reply.plan
        return True

    await assert_eventually(moved, timeout=30)

    def relaunched_on_the_new_cluster() -> bool:
        log = podwatcher.state / "pods" / "jobs" / job / "starts.log"
        starts = log.read_text().splitlines()
        assert len(starts) == 2, starts
        assert json.loads(starts[-1].split(" ", 2)[2]) == json.loads(command.cluster_json)
        return True

    await assert_eventually(relaunched_on_the_new_cluster, timeout=20)
    await running(stub, job, chief, ps, w0, w1)


async def inventories(nats_url: str) -> list[cluster_pb2.NodeInventory]:
    messages = await stream_messages(nats_url, topics.NODE_INVENTORY.subject("local"))
    return [cluster_pb2.NodeInventory.FromString(m.data) for m in messages]


async def test_a_drained_node_evicts_its_pods_which_come_back_elsewhere_and_admission_hears(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    _, stub, bus = harness

    async def published(count: int) -> list[cluster_pb2.NodeInventory]:
        found = await inventories(nats_url)
        assert len(found) >= count, found
        return found

    started = (await assert_eventually(lambda: published(1), timeout=20))[0]
    assert started.reason == "start" and started.cluster == "local"
    assert [(n.name, n.cpu, n.memory_bytes) for n in started.nodes] == [
        ("node-0", 2.0, 2 * GIB),
        ("node-1", 2.0, 2 * GIB),
    ]

    job = new_job()
    chief, ps, w0 = (f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0")
    await admit(bus, job, script_chief="finish-on-file", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    pods = await running(stub, job, chief, ps, w0)
    drained = pods[chief].node
    kept = "node-1" if drained == "node-0" else "node-0"
    on_it = sorted(name for name, pod in pods.items() if pod.node == drained)

    reply = await stub.DrainNode(pb.DrainNodeRequest(name=drained))
    assert sorted(reply.evicted_pods) == on_it

    async def moved() -> bool:
        now = await pods_of(stub, job)
        live = {n: p for n, p in now.items() if p.phase == pod_pb2.POD_PHASE_RUNNING}
        assert set(live) == {chief, ps, w0} and {p.node for p in live.values()} == {kept}, now
        return True

    await assert_eventually(moved, timeout=30)
    failures = await at_least(nats_url, topics.POD_FAILED, job, len(on_it))
    assert {f.pod_name for f in failures} == set(on_it)
    assert {f.reason for f in failures} == {pod_pb2.POD_FAILURE_REASON_EVICTED}
    assert all(f"node {drained} drained" in f.message for f in failures)
    listed = {n.name: n.drained for n in (await stub.ListNodes(pb.ListNodesRequest())).nodes}
    assert listed == {drained: True, kept: False}
    after = (await assert_eventually(lambda: published(2), timeout=20))[-1]
    assert after.reason == f"{drained} drained" and [n.name for n in after.nodes] == [kept]

    await stub.RestoreNode(pb.RestoreNodeRequest(name=drained))
    back = (await assert_eventually(lambda: published(3), timeout=20))[-1]
    assert back.reason == f"{drained} restored" and len(back.nodes) == 2

    # Bad input: a clear answer and nothing drained.
    for request, code, starts in (
        (pb.DrainNodeRequest(), grpc.StatusCode.INVALID_ARGUMENT, "name: is required"),
        (pb.DrainNodeRequest(name="node 0"), grpc.StatusCode.INVALID_ARGUMENT, "name: 'node 0'"),
        (pb.DrainNodeRequest(name="node-9"), grpc.StatusCode.NOT_FOUND, "no node 'node-9'"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.DrainNode(request)
        assert raised.value.code() == code
        assert str(raised.value.details()).startswith(starts), raised.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.RestoreNode(pb.RestoreNodeRequest(name="node-9"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert not any(n.drained for n in (await stub.ListNodes(pb.ListNodesRequest())).nodes)


def suspended(job_id: str, version: int) -> plan_pb2.ResourcePlan:
    """A plan with no pods (the optimizer's answer to a share of zero)."""
    message = plan(job_id, version)
    for role in message.roles:
        role.count = 0
    message.reason = "share: suspended: admission's share is zero (preempted)"
    return message


async def plan_state(stub: Stub, job_id: str, version: int, state: int) -> pb.RecordedPlan:
    async def probe() -> pb.RecordedPlan:
        reply = await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job_id))
        recorded: pb.RecordedPlan = reply.plan
        assert recorded.plan.version == version and recorded.state == state, recorded
        return recorded

    result: pb.RecordedPlan = await assert_eventually(probe, timeout=30)
    return result


async def test_a_plan_without_pods_checkpoints_first_then_removes_them_and_a_later_plan_resumes(
    harness: tuple[Podwatcher, Stub, Bus], nats_url: str
) -> None:
    podwatcher, stub, bus = harness
    job = new_job()
    chief, ps, w0 = (f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0")
    await admit(bus, job, script_chief="finish-on-file", script="run")
    await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
    await running(stub, job, chief, ps, w0)
    await plan_state(stub, job, 1, pb.PLAN_STATE_APPLIED)

    # Suspended: the chief is told to checkpoint (PAUSE); no pod goes before it answers.
    await bus.publish(topics.PLAN, job, suspended(job, 2), f"{job}.plan.2")
    pause = await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_PAUSE)
    assert pause.pod_name == chief and "suspends the job" in pause.reason
    suspending = await plan_state(stub, job, 2, pb.PLAN_STATE_APPLYING)
    assert "saves a checkpoint" in suspending.message
    assert set(await running(stub, job, chief, ps, w0)) == {chief, ps, w0}
    await bus.publish(
        topics.CONTROL_ACK,
        job,
        control_pb2.ControlAck(
            job_id=job,
            pod_name=chief,
            action=control_pb2.CONTROL_ACTION_PAUSE,
            plan_version=2,
            ok=True,
            checkpoint_id="ckpt-42",
        ),
        f"{job}.ack.pause.2",
    )
    done = await plan_state(stub, job, 2, pb.PLAN_STATE_APPLIED)
    assert done.message == "suspended after checkpoint ckpt-42"
    await running(stub, job)
    deleted = await at_least(nats_url, topics.POD_DELETED, job, 3)
    assert sorted(e.pod_name for e in deleted) == sorted([chief, ps, w0])
    assert await events(nats_url, topics.JOB_FINISHED, job) == []  # suspended, not ended

    # A plan with pods again: they start anew and the chief (not a standby) restores.
    await bus.publish(topics.PLAN, job, plan(job, 3), f"{job}.plan.3")
    await running(stub, job, chief, ps, w0)
    await plan_state(stub, job, 3, pb.PLAN_STATE_APPLIED)

    def restarted_as_chief() -> bool:
        # Running and applied come from the pod watcher; the trainer logs its start a moment
        # later (a CI run read the log before the second line was there).
        log = podwatcher.state / "pods" / "jobs" / job / "starts.log"
        starts = log.read_text().splitlines()
        assert len(starts) == 2 and all("standby=false" in line for line in starts), starts
        return True

    await assert_eventually(restarted_as_chief, timeout=20)
    (podwatcher.state / "pods" / "jobs" / job / "finish").touch()
    ends = await at_least(nats_url, topics.JOB_FINISHED, job, 1)
    assert ends[0].outcome == job_pb2.JOB_OUTCOME_SUCCEEDED


async def test_a_chief_that_never_answers_is_suspended_all_the_same_after_the_timeout(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    timeout = {"STRIDE_PODWATCHER_RECONFIGURE_TIMEOUT_SECONDS": "2"}
    async with running_podwatcher(nats_url, postgres_url, tmp_path, **timeout) as started:
        _, stub, bus = started
        job = new_job()
        await admit(bus, job, script="run")
        await bus.publish(topics.PLAN, job, plan(job, 1), f"{job}.plan.1")
        await running(stub, job, f"{job}-chief-0", f"{job}-ps-0", f"{job}-worker-0")
        await bus.publish(topics.PLAN, job, suspended(job, 2), f"{job}.plan.2")
        await command_for(nats_url, job, 2, control_pb2.CONTROL_ACTION_PAUSE)
        done = await plan_state(stub, job, 2, pb.PLAN_STATE_APPLIED)
        assert done.message.startswith("suspended without the chief's checkpoint"), done
        await running(stub, job)


# --- the pod sandbox (#37 finding 1) ---------------------------------------------------------


def _probes(log: Path) -> dict[str, str]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("probe "):
            found: dict[str, str] = json.loads(line.removeprefix("probe "))
            return found
    raise AssertionError(f"no probe line in {log} yet")


async def test_a_pods_code_reads_only_its_own_files(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """A local pod reads only its own files (#37 finding 1). Pods ran as the pod watcher's
    user (root): a PS's TensorFlow server, asked by anyone who reached it, read the admin's
    token, and any job's code could read the suite's keys, another job's token, or signal
    the services. Now job A's code (the scripted trainer's probes) reads its own token and
    writes its own folder, and is refused the suite's CA key, the admin's token, job B's
    token, ``/tmp``, the checkpoint cache's shared memory and the pod watcher's process.
    Whatever a TensorFlow server in the pod is asked to do runs in the same sandbox."""
    secrets = tmp_path / "state-tokens"
    secrets.mkdir(mode=0o700)
    admin_token = secrets / "admin.token"
    admin_token.write_text("the admin's token")
    ca_key = Path(os.environ["STRIDE_TLS_DIR"]) / "ca.key"
    shm = Path("/dev/shm") / f"stride-ckptcache-probe-{tmp_path.name}"
    shm.write_bytes(b"another job's checkpoint")
    outside = Path("/tmp") / f"stride-probe-{tmp_path.name}"
    job_a, job_b = new_job(), new_job()
    tokens = tmp_path / "pods" / "tokens"
    try:
        async with running_podwatcher(
            nats_url, postgres_url, tmp_path, STRIDE_PODWATCHER_LOCAL_SANDBOX="landlock"
        ) as (podwatcher, stub, bus):
            await admit(bus, job_b, script="run")
            await bus.publish(topics.PLAN, job_b, plan(job_b, 1), f"{job_b}.plan.1")
            await running(stub, job_b, f"{job_b}-chief-0", f"{job_b}-ps-0", f"{job_b}-worker-0")
            other_token = tokens / f"{job_b}-worker-0" / "token"
            assert other_token.exists()
            # B's PS, as a TensorFlow server serves: reachable from this test (the suite's
            # side), never from another job's pod.
            other_ps = (await pods_of(stub, job_b))[f"{job_b}-ps-0"].address
            host, _, port = other_ps.rpartition(":")

            async def serving() -> bool:
                _reader, writer = await asyncio.open_connection(host, int(port))
                writer.close()
                return True

            # The PS serves once TensorFlow is imported: over 10 s on a loaded runner.
            await assert_eventually(serving, timeout=60)
            assert podwatcher.process.process is not None
            pid = podwatcher.process.process.pid
            await admit(
                bus,
                job_a,
                script="run",
                probe_read=",".join(
                    (
                        *("$JOB_TOKEN", str(admin_token), str(ca_key), str(other_token)),
                        *(str(shm), f"/proc/{pid}/environ"),  # a checkpoint, its settings
                    )
                ),
                probe_write=",".join(["$POD_DIR/mine", str(outside), str(admin_token)]),
                probe_signal=str(pid),
                probe_connect=other_ps,
            )
            await bus.publish(topics.PLAN, job_a, plan(job_a, 1), f"{job_a}.plan.1")
            worker = f"{job_a}-worker-0"
            await running(stub, job_a, f"{job_a}-chief-0", f"{job_a}-ps-0", worker)
            log = tmp_path / "pods" / "pods" / worker / "trainer.log"
            found = await assert_eventually(lambda: _probes(log), timeout=20)
    finally:
        shm.unlink(missing_ok=True)

    own = tokens / worker / "token"
    assert found[f"read {own}"] == "ok"  # its own job token
    assert found[f"write {tmp_path / 'pods' / 'pods' / worker / 'mine'}"] == "ok"
    for refused in (
        f"read {admin_token}",
        f"read {ca_key}",
        f"read {other_token}",
        f"read {shm}",
        f"read /proc/{pid}/environ",
        f"write {outside}",
        f"write {admin_token}",
        f"signal {pid}",
    ):
        assert found[refused].startswith(("PermissionError", "OSError")), (refused, found)
    assert found[f"connect {other_ps}"].startswith("ConnectionRefusedError"), found
    assert admin_token.read_text() == "the admin's token"
    assert not outside.exists()
