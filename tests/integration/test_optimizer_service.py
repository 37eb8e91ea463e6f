"""The optimizer on real NATS and a real database: admitted jobs get exactly one plan 1."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.bus.signing import logical_message_id
from stride.db.engine import Database
from stride.db.outbox import Outbox
from stride.decisions import build_decisions
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.optimizer.app import SERVICE_NAME, build
from stride.optimizer.db.tables import outbox as outbox_table
from stride.optimizer.settings import OptimizerSettings
from stride.optimizer.usecases import Planning
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.processes import ServiceProcess
from stride.testing.streams import stream_messages

if TYPE_CHECKING:
    from stride.api.optimizer.v1.optimizer_service_pb2_grpc import (
        OptimizerServiceAsyncStub as Stub,
    )

pytestmark = pytest.mark.integration

_message_ids = itertools.count(1)


def optimizer_settings(nats_url: str, database_url: str) -> OptimizerSettings:
    return OptimizerSettings(
        nats_url=nats_url,
        database_url=database_url,
        grpc_port=0,
        grpc_host="127.0.0.1",
        health_interval_seconds=0.2,
        shutdown_grace_seconds=2,
    )


def admission(job_id: str, **spec_changes: int) -> job_pb2.AdmissionDecision:
    spec = job_pb2.JobSpec(
        name="wide-deep",
        user="alice",
        model=job_pb2.ModelReference(
            name="wide-and-deep", entrypoint="trainers.wide_deep:main", embedding_dim=8
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
        batch_size=spec_changes.get("batch_size", 512),
        termination=job_pb2.Termination(max_epochs=2),
    )
    return job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        policy="stride-guarantees/1",
        minimum_share=job_pb2.ResourceShare(workers=1, cpu=1.0, memory_bytes=2 * 1024**3),
        spec=spec,
    )


async def publish_admission(bus: Bus, decision: job_pb2.AdmissionDecision) -> None:
    # A fresh message id each time: JetStream would drop a repeated one, and these tests
    # want the optimizer itself to see the duplicate, as it would after a redelivery.
    await bus.publish(
        topics.JOB_ADMITTED,
        decision.job_id,
        decision,
        f"{decision.job_id}.test.{next(_message_ids)}",
    )


async def publish_finished(bus: Bus, job_id: str) -> None:
    event = job_pb2.JobFinished(job_id=job_id, outcome=job_pb2.JOB_OUTCOME_CANCELLED)
    await bus.publish(topics.JOB_FINISHED, job_id, event, f"{job_id}.test.{next(_message_ids)}")


async def at_least(nats_url: str, subject: str, count: int) -> list[Msg]:
    found = await stream_messages(nats_url, subject)
    assert len(found) >= count, f"{len(found)} messages on {subject}"
    return found


async def newest_plan(stub: Stub, job_id: str) -> pb.GetPlanResponse:
    try:
        return await stub.GetPlan(pb.GetPlanRequest(job_id=job_id))
    except grpc.aio.AioRpcError as error:
        raise AssertionError(f"no plan yet: {error.code()}") from None


async def listed_plans(stub: Stub, job_id: str) -> pb.ListPlansResponse:
    try:
        return await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))
    except grpc.aio.AioRpcError as error:
        raise AssertionError(f"job unknown yet: {error.code()}") from None


async def published_plans(nats_url: str, job_id: str, count: int = 1) -> list[Msg]:
    """The plan messages of a job, once at least ``count`` are on the stream."""

    async def probe() -> list[Msg]:
        found = await stream_messages(nats_url, topics.PLAN.subject(job_id))
        assert len(found) >= count, f"{len(found)} plan messages"
        return found

    return await assert_eventually(probe)


@pytest.fixture
async def optimizer(nats_url: str, database_url: str) -> AsyncIterator[ServiceHost]:
    async with running_service(build, optimizer_settings(nats_url, database_url)) as host:
        yield host


@pytest.fixture
async def stub(optimizer: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as channel:
        yield pb_grpc.OptimizerServiceStub(channel)


@pytest.fixture
async def bus(optimizer: ServiceHost, nats_url: str) -> AsyncIterator[Bus]:
    connected = await producer_bus(nats_url, name="test-producer")
    try:
        yield connected
    finally:
        await connected.close()


async def test_admitted_job_gets_one_cold_start_plan_in_the_same_trace(
    stub: Stub, bus: Bus, nats_url: str, spans: InMemorySpanExporter
) -> None:
    job_id = "job-happy"
    with trace.get_tracer("test").start_as_current_span("admit in test") as root:
        await publish_admission(bus, admission(job_id))
    trace_id = root.get_span_context().trace_id

    reply = await assert_eventually(lambda: newest_plan(stub, job_id))
    assert reply.stage == optimization_pb2.JOB_STAGE_COLD_START
    plan = reply.plan
    assert (plan.job_id, plan.version, plan.reason, plan.algorithm) == (
        job_id,
        1,
        "cold start",
        "cold-start-plan/1",
    )
    roles = {r.role: (r.count, r.cpu) for r in plan.roles}
    assert roles == {
        plan_pb2.ROLE_CHIEF: (1, 1.0),
        plan_pb2.ROLE_PS: (2, 4.0),
        plan_pb2.ROLE_WORKER: (1, 8.0),
    }
    assert [
        p.version for p in (await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))).plans
    ] == [1]
    events = (
        await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id=job_id))
    ).events
    assert [(e.event_id, e.root_cause, e.stage) for e in events] == [
        (
            f"{job_id}.admitted",
            optimization_pb2.ROOT_CAUSE_COLD_START,
            optimization_pb2.JOB_STAGE_COLD_START,
        )
    ]

    (message,) = await published_plans(nats_url, job_id)
    assert message.headers is not None
    assert logical_message_id(message.headers["Nats-Msg-Id"]) == f"{job_id}.plan.1"
    assert message.headers["Stride-Type"] == "stride.events.v1.ResourcePlan"
    assert plan_pb2.ResourcePlan.FromString(message.data) == plan

    def traced() -> bool:
        finished = {span.name: span for span in spans.get_finished_spans()}
        consume = finished.get(f"consume {topics.JOB_ADMITTED.subject(job_id)}")
        publish = finished.get(f"publish {topics.PLAN.subject(job_id)}")
        assert consume is not None and publish is not None, sorted(finished)
        assert consume.context is not None and publish.context is not None
        assert consume.context.trace_id == trace_id
        assert publish.context.trace_id == trace_id
        return True

    await assert_eventually(traced)


async def test_duplicate_admissions_make_exactly_one_plan(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    job_id = "job-dup"
    for _ in range(3):
        await publish_admission(bus, admission(job_id))
    # The consumer handles messages in stream order: once the marker job has its plan,
    # every duplicate before it was handled too.
    await publish_admission(bus, admission("job-marker"))
    await published_plans(nats_url, "job-marker")

    assert [
        p.version for p in (await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))).plans
    ] == [1]
    events = await stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id=job_id))
    assert len(events.events) == 1
    assert len(await published_plans(nats_url, job_id)) == 1


async def test_finished_job_moves_to_finished_and_keeps_its_plans(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    job_id = "job-ends"
    await publish_admission(bus, admission(job_id))
    await assert_eventually(lambda: newest_plan(stub, job_id))
    await publish_finished(bus, job_id)
    await publish_finished(bus, job_id)

    async def finished() -> pb.GetPlanResponse:
        reply = await newest_plan(stub, job_id)
        assert reply.stage == optimization_pb2.JOB_STAGE_FINISHED
        return reply

    reply = await assert_eventually(finished)
    assert reply.plan.version == 1
    assert len(await published_plans(nats_url, job_id)) == 1


async def test_admission_arriving_after_the_end_starts_nothing(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    job_id = "job-late"
    await publish_finished(bus, job_id)
    # Known (as finished) but without plans.
    await assert_eventually(lambda: listed_plans(stub, job_id))
    await publish_admission(bus, admission(job_id))
    await publish_admission(bus, admission("job-marker"))
    await published_plans(nats_url, "job-marker")

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetPlan(pb.GetPlanRequest(job_id=job_id))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert "has no plan" in (raised.value.details() or "")
    assert (await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))).plans == []
    assert await stream_messages(nats_url, topics.PLAN.subject(job_id)) == []


async def test_bad_and_unknown_job_ids_over_grpc(stub: Stub) -> None:
    cases = [
        ("", grpc.StatusCode.INVALID_ARGUMENT, "job_id: is required"),
        ("job.with.dots", grpc.StatusCode.INVALID_ARGUMENT, "job_id: 'job.with.dots' must be"),
        ("job-missing", grpc.StatusCode.NOT_FOUND, "job 'job-missing' not found"),
    ]
    for job_id, code, detail in cases:
        calls: list[Awaitable[object]] = [
            stub.GetPlan(pb.GetPlanRequest(job_id=job_id)),
            stub.ListPlans(pb.ListPlansRequest(job_id=job_id)),
            stub.ListOptimizationEvents(pb.ListOptimizationEventsRequest(job_id=job_id)),
        ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call
            assert raised.value.code() == code
            assert (raised.value.details() or "").startswith(detail)


def server_spans(spans: InMemorySpanExporter, method: str) -> list[ReadableSpan]:
    name = f"/stride.api.optimizer.v1.OptimizerService/{method}"
    return [span for span in spans.get_finished_spans() if span.name == name]


async def test_a_refused_call_is_an_error_span_without_a_stack_and_a_crash_has_one(
    stub: Stub, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetPlan(pb.GetPlanRequest(job_id="job.with.dots"))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    [refused] = await assert_eventually(lambda: _one(server_spans(spans, "GetPlan")))
    # The server's fault or not, per OpenTelemetry's gRPC conventions: a client's bad
    # argument leaves the server span's status unset, with the code as an attribute.
    assert refused.status.status_code == StatusCode.UNSET
    assert (refused.attributes or {})["rpc.grpc.status_code"] == 3
    # The code and message say what happened; a formatted stack per refusal is what the
    # instrumentation would add, twice, by default.
    assert [event.name for event in refused.events] == []

    async def broken(self: Planning, job_id: str) -> object:
        raise RuntimeError("the store is on fire")

    monkeypatch.setattr(Planning, "newest_plan", broken)
    spans.clear()
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetPlan(pb.GetPlanRequest(job_id="job-any"))
    assert raised.value.code() == grpc.StatusCode.INTERNAL
    [crashed] = await assert_eventually(lambda: _one(server_spans(spans, "GetPlan")))
    assert crashed.status.status_code == StatusCode.ERROR
    [event] = crashed.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "RuntimeError"
    assert "the store is on fire" in str((event.attributes or {})["exception.message"])


def _one(found: list[ReadableSpan]) -> list[ReadableSpan]:
    assert len(found) == 1, f"{len(found)} spans"
    return found


async def test_malformed_messages_are_dead_lettered_and_do_not_block(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    # A producer's bugs (signed by the right producer: publish_raw signs as it).
    await bus.publish_raw(topics.JOB_ADMITTED.subject("job-raw"), b"not protobuf", "raw-1", {})
    await bus.publish_raw(
        topics.JOB_ADMITTED.subject("job-json"),
        b'{"job_id": "job-json"}',
        "json-1",
        {"Stride-Type": "stride.events.v1.AdmissionDecision"},
    )
    await bus.publish_raw(topics.JOB_FINISHED.subject("job-raw"), b"not protobuf", "raw-2", {})
    await publish_admission(bus, admission("job-bad-spec", batch_size=0))
    wrong_subject = admission("job-other")
    await bus.publish(topics.JOB_ADMITTED, "job-elsewhere", wrong_subject, "wrong-subject-1")
    await publish_admission(bus, admission("job-good"))

    await assert_eventually(lambda: newest_plan(stub, "job-good"))
    dead = await assert_eventually(
        lambda: at_least(nats_url, topics.dead_letter_subject("optimizer-admitted"), 4)
    )
    reasons = {
        m.headers["Stride-Original-Subject"]: m.headers["Stride-Dead-Letter-Reason"]
        for m in dead
        if m.headers
    }
    assert "undecodable" in reasons[topics.JOB_ADMITTED.subject("job-raw")]
    assert "spec.batch_size" in reasons[topics.JOB_ADMITTED.subject("job-bad-spec")]
    assert "does not match subject" in reasons[topics.JOB_ADMITTED.subject("job-elsewhere")]
    assert topics.JOB_ADMITTED.subject("job-json") in reasons
    await assert_eventually(
        lambda: at_least(nats_url, topics.dead_letter_subject("optimizer-finished"), 1)
    )
    for job_id in ("job-raw", "job-bad-spec", "job-other", "job-elsewhere"):
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_exactly_one_plan_across_crash_and_restarts(nats_url: str, database_url: str) -> None:
    """A commit whose ack and relay never happened (a crash right after the commit), then
    restarts and redeliveries: each job ends with one plan 1 in the database and on the stream."""
    settings = optimizer_settings(nats_url, database_url)
    # First run: migrate, declare streams, and handle one admission normally.
    async with running_service(build, settings) as host:
        bus = await producer_bus(nats_url, name="test-producer")
        await publish_admission(bus, admission("job-before"))
        await published_plans(nats_url, "job-before")
        async with aio_channel(f"127.0.0.1:{host.server.port}", "optimizer") as channel:
            await assert_eventually(
                lambda: newest_plan(pb_grpc.OptimizerServiceStub(channel), "job-before")
            )

    # While the service is down: an admission arrives, and the state a crash leaves behind
    # after the commit (outbox row written, message not acked, plan not relayed) is made by
    # running the use case directly against the service's database.
    decision = admission("job-crash")
    await publish_admission(bus, decision)
    database = Database(database_url, "optimizer")
    try:
        adjust = build_decisions({}, None).adjust
        await Planning(database, Outbox(outbox_table), adjust).admitted(decision)
    finally:
        await database.dispose()
    assert await stream_messages(nats_url, topics.PLAN.subject("job-crash")) == []

    # Restart: the redelivered admission changes nothing, the relay publishes the plan once.
    async with running_service(build, settings) as host:
        await publish_admission(bus, admission("job-before"))  # a late duplicate, too
        await publish_admission(bus, admission("job-marker"))
        await published_plans(nats_url, "job-marker")
        async with aio_channel(f"127.0.0.1:{host.server.port}", "optimizer") as channel:
            stub = pb_grpc.OptimizerServiceStub(channel)
            for job_id in ("job-before", "job-crash"):
                plans = (await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))).plans
                assert [p.version for p in plans] == [1]
                assert len(await published_plans(nats_url, job_id)) == 1
        info = await bus.js.consumer_info(topics.JOBS.name, "optimizer-admitted")
        assert info.num_pending == 0 and info.num_ack_pending == 0
    await bus.close()


async def wait_until_serving(address: str) -> None:
    async def serving() -> bool:
        async with aio_channel(address, "optimizer") as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1
                )
            except grpc.aio.AioRpcError as error:
                raise AssertionError(f"not serving yet: {error.code()}") from None
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    await assert_eventually(serving, timeout=30)


async def test_sigkill_at_any_point_leaves_exactly_one_plan(
    nats_url: str, postgres_url: str, tmp_path: Path
) -> None:
    """The real process is SIGKILLed while admissions stream in (some handled, one likely
    mid-transaction, some not fetched yet) and restarted: each job ends with one plan 1, once.

    PostgreSQL only, to keep the module fast: the in-process crash test above covers both
    databases, and this one adds the real process and the real kill.
    """
    process = ServiceProcess(
        "optimizer",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": postgres_url,
            "STRIDE_OPTIMIZER_HEALTH_INTERVAL_SECONDS": "0.2",
            # A message in flight to the killed process comes back after this long.
            "STRIDE_OPTIMIZER_ACK_WAIT_SECONDS": "1",
        },
        tmp_path,
    ).start()
    bus: Bus | None = None
    try:
        await wait_until_serving(process.address)
        bus = await producer_bus(nats_url, name="test-producer")
        jobs = [f"job-killed-{number}" for number in range(6)]
        for job_id in jobs[:3]:
            await publish_admission(bus, admission(job_id))
        await assert_eventually(lambda: at_least(nats_url, topics.PLAN.subject(jobs[0]), 1))
        for job_id in jobs[3:]:
            await publish_admission(bus, admission(job_id))
        process.kill()
        process.start()
        await wait_until_serving(process.address)
        async with aio_channel(process.address, "optimizer") as channel:
            stub = pb_grpc.OptimizerServiceStub(channel)
            for job_id in jobs:
                await assert_eventually(functools.partial(newest_plan, stub, job_id))
                plans = (await stub.ListPlans(pb.ListPlansRequest(job_id=job_id))).plans
                assert [p.version for p in plans] == [1]
        messages = await assert_eventually(
            lambda: at_least(nats_url, topics.PLANS.subjects[0], len(jobs))
        )
        ids = sorted(logical_message_id(m.headers["Nats-Msg-Id"]) for m in messages if m.headers)
        assert ids == sorted(f"{job_id}.plan.1" for job_id in jobs)
        assert process.terminate() == 0, process.log_text()[-2000:]
    finally:
        if bus is not None:
            await bus.close()
        process.kill()


async def test_admissions_of_a_batch_are_stored_together_and_a_bad_one_fails_alone(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetched batch of admissions is stored in one transaction (a transaction per job
    was much of the optimizer's work under a stream of submissions); a job already planned
    in it is left as it is, and one that cannot be planned fails alone with its own error
    while the others get their plan 1, exactly as each would alone."""
    import sqlalchemy as sa

    from stride.db.migrations import upgrade
    from stride.optimizer.app import MIGRATIONS
    from stride.runtime.errors import InvalidArgument, NotFound

    upgrade(database_url, "optimizer", MIGRATIONS)
    database = Database(database_url, "optimizer")
    commits: list[int] = []
    sa.event.listen(database.engine.sync_engine, "commit", lambda _c: commits.append(1))
    try:
        planning = Planning(database, Outbox(outbox_table), build_decisions({}, None).adjust)
        await planning.admitted(admission("job-known"))
        before = len(commits)
        no_spec = admission("job-no-spec")
        no_spec.ClearField("spec")
        batch = [admission(f"job-b{n}") for n in range(4)]
        inserts: Counter[str] = Counter()

        def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            words = statement.split(None, 3)
            if words[:2] == ["INSERT", "INTO"]:
                inserts[words[2].replace('"', "").rsplit(".", 1)[-1]] += 1  # (schema.)table

        sa.event.listen(database.engine.sync_engine, "before_cursor_execute", count)
        outcomes = await planning.admitted_all(
            [batch[0], admission("job-known"), batch[1], no_spec, batch[2], batch[3]]
        )
        sa.event.remove(database.engine.sync_engine, "before_cursor_execute", count)
        assert [type(o).__name__ if o else None for o in outcomes] == [
            None, None, None, "InvalidArgument", None, None,
        ]  # fmt: skip
        assert isinstance(outcomes[3], InvalidArgument) and "spec" in str(outcomes[3])
        assert len(commits) == before + 1  # five jobs, one transaction
        # Four new jobs, one statement per table (not one per job).
        tables = ["administrators", "optimization_events", "plans", "observations", "outbox"]
        assert {table: inserts[table] for table in tables} == dict.fromkeys(tables, 1), inserts
        assert [p.version for p in await planning.plans("job-known")] == [1]
        for decision in batch:
            assert [p.version for p in await planning.plans(decision.job_id)] == [1]
        with pytest.raises(NotFound):
            await planning.plans("job-no-spec")
        # Each new plan 1 waits in the outbox to be published, queued with the batch.
        async with database.sessions() as session:
            queued = set((await session.execute(sa.select(outbox_table.c.subject))).scalars())
        for decision in batch:
            assert topics.PLAN.subject(decision.job_id) in queued, queued
        # Each plan 1 is the one that job gets alone (same spec, same cold start).
        alone = await planning.plans("job-known")
        for decision in batch:
            (plan,) = await planning.plans(decision.job_id)
            assert list(plan.roles) == list(alone[0].roles)

        # One that fails only when stored rolls the batch back; each is then stored alone.
        store = planning._store_firsts

        async def failing(session: Any, firsts: Any) -> Any:
            if any(first.job_id == "job-c1" for first in firsts):
                raise RuntimeError("disk full")
            return await store(session, firsts)

        monkeypatch.setattr(planning, "_store_firsts", failing)
        later = [admission(f"job-c{n}") for n in range(3)]
        outcomes = await planning.admitted_all(later)
        assert [str(o) if o else None for o in outcomes] == [None, "disk full", None]
        assert [p.version for p in await planning.plans("job-c0")] == [1]
        assert [p.version for p in await planning.plans("job-c2")] == [1]
        with pytest.raises(NotFound):
            await planning.plans("job-c1")
    finally:
        await database.dispose()
