"""The podwatcher on real NATS and a real database: accept plans, newest wins, bad input.

The plans here ask for more than this machine's single node has (a 4-core PS), so they are
recorded and then FAILED as unplaceable without starting a pod: these tests are about the
plan rules. Pods that really run are in ``test_podwatcher_pods.py``.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeAlias, cast

import grpc
import pytest
from nats.aio.msg import Msg
from sqlalchemy import select
from structlog.testing import capture_logs

from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.db.engine import Database
from stride.db.outbox import Outbox
from stride.events.v1 import job_pb2, plan_pb2
from stride.podwatcher.app import build
from stride.podwatcher.db.tables import outbox as outbox_table
from stride.podwatcher.db.tables import plans
from stride.podwatcher.domain.plans import Arrival
from stride.podwatcher.settings import PodWatcherSettings
from stride.podwatcher.usecases import PodWatcher
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

GIB = 1024**3
Stub: TypeAlias = "pb_grpc.PodWatcherServiceAsyncStub"  # the generated stub for an aio channel


def plan(job_id: str, version: int, workers: int = 2, cpu: float = 2.0) -> plan_pb2.ResourcePlan:
    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=version,
        reason=f"test plan {version}",
        algorithm="test/1",
        roles=[
            plan_pb2.RoleResources(role=plan_pb2.ROLE_PS, count=1, cpu=4.0, memory_bytes=8 * GIB),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_WORKER, count=workers, cpu=cpu, memory_bytes=4 * GIB
            ),
        ],
    )


@pytest.fixture
async def podwatcher(
    nats_url: str, database_url: str, tmp_path: Path
) -> AsyncIterator[ServiceHost]:
    settings = local_settings(
        PodWatcherSettings,
        nats_url=nats_url,
        database_url=database_url,
        local_state_dir=tmp_path / "pods",
        local_nodes="1x(cpu=2,memory=16Gi)",
    )
    async with running_service(build, settings) as host:
        yield host


@pytest.fixture
async def stub(podwatcher: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{podwatcher.server.port}", "podwatcher") as channel:
        yield pb_grpc.PodWatcherServiceStub(channel)


@pytest.fixture
async def bus(podwatcher: ServiceHost, nats_url: str) -> AsyncIterator[Bus]:
    """A producer's connection (the service has declared the streams by now)."""
    producer = await producer_bus(nats_url, name="test-producer")
    try:
        yield producer
    finally:
        await producer.close()


async def admit(bus: Bus, *job_ids: str) -> None:
    """Admission's event for each job: the podwatcher runs pods only for admitted jobs."""
    for job_id in job_ids:
        decision = job_pb2.AdmissionDecision(
            job_id=job_id,
            outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
            spec=job_pb2.JobSpec(name=job_id, user="tester"),
        )
        await bus.publish(topics.JOB_ADMITTED, job_id, decision, f"{job_id}.admitted")


async def job_pods(stub: Stub, job_id: str) -> pb.GetJobPodsResponse | None:
    try:
        return await stub.GetJobPods(pb.GetJobPodsRequest(job_id=job_id))
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def newest_version_becomes(stub: Stub, job_id: str, version: int) -> pb.GetJobPodsResponse:
    async def probe() -> pb.GetJobPodsResponse:
        reply = await job_pods(stub, job_id)
        assert reply is not None and reply.plan.plan.version == version, reply
        return reply

    return await assert_eventually(probe, message=f"{job_id} at version {version}")


async def processed_up_to_here(bus: Bus, stub: Stub, marker: str) -> None:
    """Publish a plan for a marker job and wait for it: the single, ordered consumer has
    then handled everything published before it (how to see that something was ignored)."""
    await admit(bus, marker)
    await bus.publish(topics.PLAN, marker, plan(marker, 1), f"{marker}.1")
    await newest_version_becomes(stub, marker, 1)


async def test_plans_are_recorded_and_the_newest_is_served(stub: Stub, bus: Bus) -> None:
    await admit(bus, "job-a")
    await bus.publish(topics.PLAN, "job-a", plan("job-a", 1), "job-a.plan.1")
    reply = await newest_version_becomes(stub, "job-a", 1)
    assert reply.plan.plan == plan("job-a", 1)
    assert reply.plan.HasField("recorded_at")

    async def failed() -> pb.GetJobPodsResponse:
        reply = await newest_version_becomes(stub, "job-a", 1)
        assert reply.plan.state == pb.PLAN_STATE_FAILED, reply.plan
        return reply

    reply = await assert_eventually(failed)
    assert "no node has room for pod job-a-ps-0 (4 cpu, 8.00 GiB)" in reply.plan.message
    assert list(reply.pods) == []

    await bus.publish(topics.PLAN, "job-a", plan("job-a", 2, workers=5), "job-a.plan.2")
    reply = await newest_version_becomes(stub, "job-a", 2)
    assert reply.plan.plan.roles[1].count == 5


async def test_redelivered_plan_changes_nothing(stub: Stub, bus: Bus) -> None:
    await admit(bus, "job-d")
    await bus.publish(topics.PLAN, "job-d", plan("job-d", 1), "first")
    first = await newest_version_becomes(stub, "job-d", 1)
    # Distinct message ids get past JetStream's de-duplication, as a redelivery would.
    for attempt in range(3):
        await bus.publish(topics.PLAN, "job-d", plan("job-d", 1), f"again-{attempt}")
    await processed_up_to_here(bus, stub, "job-marker")
    again = await newest_version_becomes(stub, "job-d", 1)
    # The same plan, recorded once (its state may have moved on: it is unplaceable here).
    assert again.plan.plan == first.plan.plan
    assert again.plan.recorded_at == first.plan.recorded_at


async def test_stale_and_out_of_order_plans_are_ignored(stub: Stub, bus: Bus) -> None:
    await admit(bus, "job-o")
    await bus.publish(topics.PLAN, "job-o", plan("job-o", 3, workers=7), "o-3")
    await newest_version_becomes(stub, "job-o", 3)
    await bus.publish(topics.PLAN, "job-o", plan("job-o", 1, workers=1), "o-1")
    await bus.publish(topics.PLAN, "job-o", plan("job-o", 2, workers=2), "o-2")
    await processed_up_to_here(bus, stub, "job-marker")
    reply = await newest_version_becomes(stub, "job-o", 3)
    assert reply.plan.plan.roles[1].count == 7

    await bus.publish(topics.PLAN, "job-o", plan("job-o", 4, workers=4), "o-4")
    reply = await newest_version_becomes(stub, "job-o", 4)
    assert reply.plan.plan.roles[1].count == 4


def invalid_plans() -> list[tuple[str, bytes, dict[str, str]]]:
    """(subject, payload, headers): undecodable, wrong type, then plans that break a rule."""
    typed = {"Stride-Type": "stride.events.v1.ResourcePlan"}
    unspecified_role = plan("job-bad4", 1)
    unspecified_role.roles[0].role = plan_pb2.ROLE_UNSPECIFIED
    no_memory = plan("job-bad5", 1)
    no_memory.roles[1].memory_bytes = 0
    return [
        (topics.PLAN.subject("job-bad1"), b"not protobuf", {}),
        (
            topics.PLAN.subject("job-bad2"),
            b'{"job_id": "job-bad2"}',
            {"Stride-Type": "application/json"},
        ),
        (topics.PLAN.subject("job-bad3"), plan("job-bad3", 0).SerializeToString(), typed),
        (topics.PLAN.subject("job-bad4"), unspecified_role.SerializeToString(), typed),
        (topics.PLAN.subject("job-bad5"), no_memory.SerializeToString(), typed),
        (topics.PLAN.subject("job-bad6"), plan("job-bad6", 1, cpu=0.0).SerializeToString(), typed),
        (topics.PLAN.subject("job-good"), plan("job-good", 2, cpu=-1.0).SerializeToString(), typed),
    ]


async def test_invalid_plans_are_dead_lettered_and_later_ones_processed(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    await admit(bus, "job-good")
    await bus.publish(topics.PLAN, "job-good", plan("job-good", 1), "good-1")
    await newest_version_becomes(stub, "job-good", 1)
    bad = invalid_plans()
    for index, (subject, payload, headers) in enumerate(bad):
        await bus.publish_raw(subject, payload, f"bad-{index}", headers)  # signed as optimizer
    await bus.publish(topics.PLAN, "job-good", plan("job-good", 3), "good-3")
    await newest_version_becomes(stub, "job-good", 3)

    async def parked() -> list[Msg]:
        dead = await stream_messages(nats_url, topics.dead_letter_subject("podwatcher-plans"))
        assert len(dead) == len(bad), dead
        return dead

    dead = await assert_eventually(parked)
    assert [((m.headers or {})["Stride-Original-Subject"], m.data) for m in dead] == [
        (subject, payload) for subject, payload, _ in bad
    ]
    reasons = [(m.headers or {})["Stride-Dead-Letter-Reason"] for m in dead]
    assert "version: must be at least 1" in reasons[2]
    assert "roles[0].role" in reasons[3]
    assert "roles[1].memory_bytes" in reasons[4]
    assert "roles[1].cpu" in reasons[5]
    for index in range(1, 7):
        assert await job_pods(stub, f"job-bad{index}") is None


async def test_nodes_are_the_virtual_nodes_with_their_enforcement(stub: Stub) -> None:
    reply = await stub.ListNodes(pb.ListNodesRequest())
    assert [(n.name, n.cpu, n.memory_bytes) for n in reply.nodes] == [("node-0", 2.0, 16 * GIB)]
    assert reply.nodes[0].enforcement in ("cgroup-v1", "cgroup-v2", "rlimit")


async def expect_error(call: Awaitable[object], code: grpc.StatusCode, starts: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == code
    assert str(raised.value.details()).startswith(starts), raised.value.details()


async def test_bad_requests(stub: Stub) -> None:
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    await expect_error(stub.GetJobPods(pb.GetJobPodsRequest()), invalid, "job_id:")
    await expect_error(stub.GetJobPods(pb.GetJobPodsRequest(job_id="job-none")), missing, "no plan")


async def test_a_plan_for_a_job_never_admitted_is_dead_lettered(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    await bus.publish(topics.PLAN, "job-ghost", plan("job-ghost", 1), "ghost-1")

    async def parked() -> Msg:
        dead = await stream_messages(nats_url, topics.dead_letter_subject("podwatcher-plans"))
        ghosts = [
            m
            for m in dead
            if (m.headers or {}).get("Stride-Original-Subject", "").endswith("job-ghost")
        ]
        assert ghosts, dead
        return ghosts[0]

    # Admission's event may trail the plan, so the plan is retried a few times first.
    ghost = await assert_eventually(parked, timeout=30)
    assert "no admitted job 'job-ghost'" in (ghost.headers or {})["Stride-Dead-Letter-Reason"]
    assert await job_pods(stub, "job-ghost") is None


async def test_a_simulated_job_gets_its_plans_recorded_and_no_pods(stub: Stub, bus: Bus) -> None:
    """`stride loadgen` plays a simulated job's agents: its plans are applied to nothing."""
    decision = job_pb2.AdmissionDecision(
        job_id="job-sim",
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        spec=job_pb2.JobSpec(name="job-sim", user="loadgen", simulated=True),
    )
    await bus.publish(topics.JOB_ADMITTED, "job-sim", decision, "job-sim.admitted")
    # A plan this node could host (1 PS of 1 cpu, 1 worker): a real job would get pods.
    small = plan("job-sim", 1, workers=1, cpu=0.5)
    small.roles[0].cpu = 1.0
    small.roles[0].memory_bytes = GIB
    await bus.publish(topics.PLAN, "job-sim", small, "job-sim.plan.1")

    async def applied(version: int) -> pb.GetJobPodsResponse:
        reply = await newest_version_becomes(stub, "job-sim", version)
        assert reply.plan.state == pb.PLAN_STATE_APPLIED, reply.plan
        return reply

    for version in (1, 2):
        if version == 2:
            bigger = plan("job-sim", 2, workers=3)
            await bus.publish(topics.PLAN, "job-sim", bigger, "job-sim.plan.2")
        reply = await assert_eventually(functools.partial(applied, version))
        assert "simulated job: no pods" in reply.plan.message
        assert list(reply.pods) == []


async def test_admissions_that_come_together_are_stored_and_a_bad_one_fails_alone(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    """Admissions published together are fetched and stored as a batch; one without its
    spec is dead-lettered with the reason, the others are admitted (their plans apply)."""
    jobs = [f"job-batch{n}" for n in range(6)]
    bad = job_pb2.AdmissionDecision(job_id="job-nospec", outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED)
    await admit(bus, *jobs[:3])
    await bus.publish(topics.JOB_ADMITTED, "job-nospec", bad, "job-nospec.admitted")
    await admit(bus, *jobs[3:], jobs[0])  # the first one's again: stored once
    for job_id in jobs:
        await bus.publish(topics.PLAN, job_id, plan(job_id, 1, workers=0), f"{job_id}.plan.1")
    for job_id in jobs:
        await newest_version_becomes(stub, job_id, 1)

    async def parked() -> str:
        dead = await stream_messages(nats_url, topics.dead_letter_subject("podwatcher-admitted"))
        reasons = [(m.headers or {})["Stride-Dead-Letter-Reason"] for m in dead]
        assert len(reasons) == 1, reasons
        return reasons[0]

    reason = await assert_eventually(parked, timeout=20)
    assert "spec" in reason and "must carry its spec" in reason, reason
    assert await job_pods(stub, "job-nospec") is None


async def test_plans_that_come_together_are_judged_in_order_and_a_bad_one_fails_alone(
    stub: Stub, bus: Bus, nats_url: str, database_url: str
) -> None:
    """Plans published back to back are fetched and recorded as a batch: each is judged
    against the plans before it, in the batch too (a newer one recorded, an older or
    repeated one ignored), and an invalid one is dead-lettered alone."""
    jobs = [f"job-together{n}" for n in range(3)]
    await admit(bus, *jobs)
    for job_id in jobs:  # admitted, so no plan below waits for its job
        await bus.publish(topics.PLAN, job_id, plan(job_id, 1), f"{job_id}.plan.1")
        await newest_version_becomes(stub, job_id, 1)
    sent = [
        (jobs[0], 3),
        (jobs[0], 2),  # older than the 3 just before it
        (jobs[0], 3),  # the same again
        (jobs[1], 0),  # invalid
        (jobs[2], 2),
        (jobs[0], 4),
        (jobs[2], 1),  # older than what is stored
    ]
    for number, (job_id, version) in enumerate(sent):
        await bus.publish(topics.PLAN, job_id, plan(job_id, version), f"{job_id}.again.{number}")
    await newest_version_becomes(stub, jobs[0], 4)
    await newest_version_becomes(stub, jobs[2], 2)

    async def parked() -> list[Msg]:
        dead = await stream_messages(nats_url, topics.dead_letter_subject("podwatcher-plans"))
        ours = [
            m
            for m in dead
            if (m.headers or {}).get("Stride-Original-Subject", "").endswith(jobs[1])
        ]
        assert ours, dead
        return ours

    [invalid] = await assert_eventually(parked, timeout=20)
    assert "version" in (invalid.headers or {})["Stride-Dead-Letter-Reason"]
    database = Database(database_url, "podwatcher")
    try:
        async with database.sessions() as session:
            rows = (
                await session.execute(
                    select(plans.c.job_id, plans.c.version)
                    .where(plans.c.job_id.in_(jobs))
                    .order_by(plans.c.job_id, plans.c.recorded_at, plans.c.version)
                )
            ).all()
    finally:
        await database.dispose()
    assert [tuple(row) for row in rows] == [
        (jobs[0], 1),
        (jobs[0], 3),
        (jobs[0], 4),
        (jobs[1], 1),
        (jobs[2], 1),
        (jobs[2], 2),
    ]


async def test_a_batch_of_plans_is_judged_in_order_in_one_transaction(
    podwatcher: ServiceHost, database_url: str
) -> None:
    """The use case itself, on the service's database: what each plan of a batch comes to,
    judged against the batch's earlier plans as much as against what is stored, stored in
    one transaction (no fallback to one plan at a time)."""
    database = Database(database_url, "podwatcher")
    watcher = PodWatcher(database, Outbox(outbox_table), cast(Any, None), cast(Any, None))
    jobs = [f"job-usecase{n}" for n in range(2)]
    try:
        simulated = [
            job_pb2.AdmissionDecision(
                job_id=job_id,
                outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
                spec=job_pb2.JobSpec(name=job_id, user="tester", simulated=True),
            )
            for job_id in jobs
        ]
        assert await watcher.admitted_all([*simulated, simulated[0]]) == [None, None, None]
        sent = [
            (jobs[0], 1),
            (jobs[0], 3),
            (jobs[0], 2),
            (jobs[0], 3),
            (jobs[1], 0),
            ("job-usecase-ghost", 1),
            (jobs[1], 2),
            (jobs[1], 1),
        ]
        with capture_logs() as logged:
            outcomes = await watcher.receive_all([plan(job_id, v) for job_id, v in sent])
        assert not [e for e in logged if "one at a time" in e["event"]], logged
        described = [o if isinstance(o, Arrival) else type(o).__name__ for o in outcomes]
        assert described == [
            Arrival.NEWER,
            Arrival.NEWER,
            Arrival.STALE,
            Arrival.DUPLICATE,
            "InvalidArgument",
            "JobNotAdmitted",
            Arrival.NEWER,
            Arrival.STALE,
        ]
        async with database.sessions() as session:
            rows = (
                await session.execute(
                    select(plans.c.job_id, plans.c.version, plans.c.state)
                    .where(plans.c.job_id.in_(jobs))
                    .order_by(plans.c.job_id, plans.c.version)
                )
            ).all()
        assert [tuple(row) for row in rows] == [
            (jobs[0], 1, "APPLIED"),
            (jobs[0], 3, "APPLIED"),
            (jobs[1], 2, "APPLIED"),
        ]
    finally:
        await database.dispose()
