"""Configdb on real NATS and a real database: record jobs, plans and outcomes; find similar."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

import grpc
import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from stride.api.configdb.v1 import configdb_service_pb2 as pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.configdb.app import build
from stride.configdb.settings import ConfigDbSettings
from stride.events.v1 import job_pb2, metrics_pb2, plan_pb2, pod_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

GIB = 1024**3
Stub: TypeAlias = "pb_grpc.ConfigDbServiceAsyncStub"  # the generated stub for an aio channel
SUCCEEDED = job_pb2.JOB_OUTCOME_SUCCEEDED


def valid_spec(**changes: object) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec(
        name="wide-deep",
        user="alice",
        model=job_pb2.ModelReference(
            name="wide-and-deep",
            entrypoint="trainers.wide_deep:main",
            family="dlrm",
            embedding_dim=16,
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
        batch_size=512,
        termination=job_pb2.Termination(max_epochs=2),
    )
    for key, value in changes.items():
        if isinstance(value, Message):
            getattr(spec, key).CopyFrom(value)
        else:
            setattr(spec, key, value)
    return spec


def stamp(moment: datetime) -> Timestamp:
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def submitted(
    job_id: str, spec: job_pb2.JobSpec | None = None, at: datetime | None = None
) -> job_pb2.JobSubmitted:
    return job_pb2.JobSubmitted(
        job_id=job_id, spec=spec or valid_spec(), submitted_at=stamp(at or datetime.now(UTC))
    )


def plan(job_id: str, version: int, workers: int = 2) -> plan_pb2.ResourcePlan:
    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=version,
        reason="cold start" if version == 1 else "optimize",
        algorithm="test/1",
        roles=[
            plan_pb2.RoleResources(role=plan_pb2.ROLE_PS, count=1, cpu=4.0, memory_bytes=8 * GIB),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_WORKER, count=workers, cpu=2.0, memory_bytes=4 * GIB
            ),
        ],
    )


def finished(job_id: str, outcome: job_pb2.JobOutcome.ValueType = SUCCEEDED) -> job_pb2.JobFinished:
    return job_pb2.JobFinished(job_id=job_id, outcome=outcome, finished_at=stamp(datetime.now(UTC)))


@pytest.fixture
async def configdb(nats_url: str, database_url: str) -> AsyncIterator[ServiceHost]:
    settings = local_settings(ConfigDbSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build, settings) as host:
        yield host


@pytest.fixture
async def stub(configdb: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{configdb.server.port}", "configdb") as channel:
        yield pb_grpc.ConfigDbServiceStub(channel)


@pytest.fixture
async def bus(configdb: ServiceHost, nats_url: str) -> AsyncIterator[Bus]:
    """A producer's connection (the service has declared the streams by now)."""
    producer = await producer_bus(nats_url, name="test-producer")
    try:
        yield producer
    finally:
        await producer.close()


async def record_of(stub: Stub, job_id: str) -> pb.JobRecord | None:
    try:
        return (await stub.GetJobRecord(pb.GetJobRecordRequest(job_id=job_id))).record
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def record_when(
    stub: Stub, job_id: str, ready: Callable[[pb.JobRecord], bool] = lambda _: True
) -> pb.JobRecord:
    """The job's record once ``ready`` holds for it."""

    async def probe() -> pb.JobRecord:
        record = await record_of(stub, job_id)
        assert record is not None and ready(record), record
        return record

    return await assert_eventually(probe, message=f"record of {job_id}")


async def finished_job(
    bus: Bus,
    stub: Stub,
    job_id: str,
    spec: job_pb2.JobSpec,
    outcome: job_pb2.JobOutcome.ValueType = SUCCEEDED,
    plans: int = 1,
) -> None:
    """Publish a whole job's history and wait until configdb has all of it."""
    await bus.publish(topics.JOB_SUBMITTED, job_id, submitted(job_id, spec), f"{job_id}.submitted")
    for version in range(1, plans + 1):
        await bus.publish(topics.PLAN, job_id, plan(job_id, version), f"{job_id}.plan.{version}")
    await bus.publish(topics.JOB_FINISHED, job_id, finished(job_id, outcome), f"{job_id}.finished")
    await record_when(
        stub,
        job_id,
        lambda r: r.HasField("spec") and len(r.plans) == plans and r.outcome == outcome,
    )


async def test_job_history_is_recorded_and_served(stub: Stub, bus: Bus) -> None:
    submitted_at = datetime.now(UTC) - timedelta(minutes=5)
    await bus.publish(
        topics.JOB_SUBMITTED, "job-a", submitted("job-a", at=submitted_at), "job-a.submitted"
    )
    await bus.publish(topics.PLAN, "job-a", plan("job-a", 1), "job-a.plan.1")
    await bus.publish(topics.PLAN, "job-a", plan("job-a", 2, workers=4), "job-a.plan.2")

    record = await record_when(stub, "job-a", lambda r: r.HasField("spec") and len(r.plans) == 2)
    assert record.spec == valid_spec()
    assert list(record.plans) == [plan("job-a", 1), plan("job-a", 2, workers=4)]
    assert record.outcome == job_pb2.JOB_OUTCOME_UNSPECIFIED
    assert not record.HasField("finished_at")
    assert record.recorded_at.ToDatetime(tzinfo=UTC) == submitted_at

    await bus.publish(topics.JOB_FINISHED, "job-a", finished("job-a"), "job-a.finished")
    record = await record_when(stub, "job-a", lambda r: r.HasField("finished_at"))
    assert record.outcome == SUCCEEDED

    listed = await stub.ListJobRecords(pb.ListJobRecordsRequest())
    assert [r.job_id for r in listed.records] == ["job-a"]
    similar = await stub.FindSimilarJobs(pb.FindSimilarJobsRequest(spec=valid_spec(), k=3))
    assert [(j.record.job_id, j.similarity) for j in similar.jobs] == [("job-a", 1.0)]
    assert len(similar.jobs[0].record.plans) == 2


async def test_records_are_listed_newest_first(stub: Stub, bus: Bus) -> None:
    now = datetime.now(UTC)
    for index, job_id in enumerate(["job-old", "job-new", "job-mid"]):
        at = now - timedelta(minutes={"job-old": 30, "job-new": 1, "job-mid": 10}[job_id])
        await bus.publish(topics.JOB_SUBMITTED, job_id, submitted(job_id, at=at), str(index))
    await record_when(stub, "job-mid")
    listed = await stub.ListJobRecords(pb.ListJobRecordsRequest())
    assert [r.job_id for r in listed.records] == ["job-new", "job-mid", "job-old"]
    one = await stub.ListJobRecords(pb.ListJobRecordsRequest(page_size=1))
    assert [r.job_id for r in one.records] == ["job-new"]


async def test_redelivered_and_duplicate_events_change_nothing(stub: Stub, bus: Bus) -> None:
    # Distinct message ids get past JetStream's de-duplication, as a redelivery would.
    for attempt in range(3):
        await bus.publish(topics.JOB_SUBMITTED, "job-d", submitted("job-d"), f"sub-{attempt}")
        await bus.publish(topics.PLAN, "job-d", plan("job-d", 1), f"plan-{attempt}")
        await bus.publish(topics.JOB_FINISHED, "job-d", finished("job-d"), f"fin-{attempt}")
    # A later, different outcome does not overwrite the first one.
    await bus.publish(
        topics.JOB_FINISHED, "job-d", finished("job-d", job_pb2.JOB_OUTCOME_FAILED), "fin-late"
    )
    await bus.publish(topics.PLAN, "job-d", plan("job-d", 2), "plan-v2")

    record = await record_when(
        stub, "job-d", lambda r: r.HasField("finished_at") and len(r.plans) == 2
    )
    assert [p.version for p in record.plans] == [1, 2]
    assert record.outcome == SUCCEEDED
    assert record.spec == valid_spec()
    listed = await stub.ListJobRecords(pb.ListJobRecordsRequest())
    assert [r.job_id for r in listed.records] == ["job-d"]


async def test_plans_and_finish_before_submitted_are_kept(stub: Stub, bus: Bus) -> None:
    await bus.publish(topics.PLAN, "job-o", plan("job-o", 2, workers=3), "job-o.plan.2")
    await bus.publish(topics.PLAN, "job-o", plan("job-o", 1), "job-o.plan.1")
    await bus.publish(topics.JOB_FINISHED, "job-o", finished("job-o"), "job-o.finished")

    record = await record_when(
        stub, "job-o", lambda r: len(r.plans) == 2 and r.HasField("finished_at")
    )
    assert not record.HasField("spec")
    # A placeholder has no features, so it is no warm-start candidate yet.
    similar = await stub.FindSimilarJobs(pb.FindSimilarJobsRequest(spec=valid_spec(), k=5))
    assert list(similar.jobs) == []

    await bus.publish(topics.JOB_SUBMITTED, "job-o", submitted("job-o"), "job-o.submitted")
    record = await record_when(stub, "job-o", lambda r: r.HasField("spec"))
    assert [p.version for p in record.plans] == [1, 2]
    assert record.outcome == SUCCEEDED
    similar = await stub.FindSimilarJobs(pb.FindSimilarJobsRequest(spec=valid_spec(), k=5))
    assert [j.record.job_id for j in similar.jobs] == ["job-o"]


async def test_similar_jobs_are_ranked_among_succeeded_jobs_only(stub: Stub, bus: Bus) -> None:
    spec = valid_spec()
    await finished_job(bus, stub, "job-same", spec)
    await finished_job(bus, stub, "job-bigger-batch", valid_spec(batch_size=2048))
    other_model = job_pb2.ModelReference(
        name="deepfm", entrypoint="trainers.deepfm:main", family="dlrm", embedding_dim=16
    )
    await finished_job(bus, stub, "job-other-model", valid_spec(model=other_model))
    await finished_job(bus, stub, "job-failed", spec, outcome=job_pb2.JOB_OUTCOME_FAILED)
    await finished_job(bus, stub, "job-no-plan", spec, plans=0)
    await bus.publish(topics.JOB_SUBMITTED, "job-running", submitted("job-running"), "run-s")
    await bus.publish(topics.PLAN, "job-running", plan("job-running", 1), "run-p")
    await record_when(stub, "job-running", lambda r: len(r.plans) == 1 and r.HasField("spec"))

    similar = await stub.FindSimilarJobs(pb.FindSimilarJobsRequest(spec=spec, k=10))
    ranked = [(j.record.job_id, j.similarity) for j in similar.jobs]
    assert [job_id for job_id, _ in ranked] == ["job-same", "job-bigger-batch", "job-other-model"]
    assert ranked[0][1] == 1.0
    assert 1.0 > ranked[1][1] > ranked[2][1] > 0.0

    top = await stub.FindSimilarJobs(pb.FindSimilarJobsRequest(spec=spec, k=1))
    assert [j.record.job_id for j in top.jobs] == ["job-same"]


async def test_conflicting_plan_version_is_dead_lettered(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    await bus.publish(topics.PLAN, "job-c", plan("job-c", 1, workers=2), "c-1")
    await record_when(stub, "job-c", lambda r: len(r.plans) == 1)
    await bus.publish(topics.PLAN, "job-c", plan("job-c", 1, workers=9), "c-1-other")
    dead = await assert_eventually(
        lambda: stream_messages(nats_url, topics.dead_letter_subject("configdb-plans"))
    )
    reason = dead[0].headers["Stride-Dead-Letter-Reason"] if dead[0].headers else ""
    assert "already recorded with different contents" in reason
    record = await record_when(stub, "job-c")
    assert [p.roles[1].count for p in record.plans] == [2]


async def test_a_batch_of_job_events_is_stored_together_and_a_bad_one_fails_alone(
    nats_url: str, database_url: str
) -> None:
    """Events that wait while configdb is down are fetched as one batch and stored in one
    transaction of a few statements; a conflicting plan and a submission without a spec
    among them fail alone (dead-lettered with their reasons), a repeated plan is stored
    once, and every other event is stored, with no fallback to one event at a time."""
    settings = local_settings(ConfigDbSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build, settings):
        pass  # its streams and consumers exist
    producer = await producer_bus(nats_url, name="test-producer")
    jobs = [f"job-batch{n}" for n in range(12)]
    try:
        for job_id in jobs:
            await producer.publish(topics.JOB_SUBMITTED, job_id, submitted(job_id), f"{job_id}.s")
            await producer.publish(topics.PLAN, job_id, plan(job_id, 1), f"{job_id}.p1")
        await producer.publish(topics.PLAN, jobs[5], plan(jobs[5], 1), "repeated")
        conflicting = plan(jobs[3], 1, workers=9)
        await producer.publish(topics.PLAN, jobs[3], conflicting, "conflicting")
        no_spec = job_pb2.JobSubmitted(job_id="job-batch-nospec")
        await producer.publish(topics.JOB_SUBMITTED, "job-batch-nospec", no_spec, "no-spec")
    finally:
        await producer.close()

    async with (
        running_service(build, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "configdb") as channel,
    ):
        stub = pb_grpc.ConfigDbServiceStub(channel)
        with capture_logs() as logged:
            for job_id in jobs:
                record = await record_when(
                    stub, job_id, lambda r: r.HasField("spec") and len(r.plans) == 1
                )
                assert [p.roles[1].count for p in record.plans] == [2]
        fallbacks = [entry for entry in logged if "one event at a time" in entry["event"]]
        assert fallbacks == [], fallbacks
        dead_plans = await assert_eventually(
            lambda: stream_messages(nats_url, topics.dead_letter_subject("configdb-plans"))
        )
        dead_submissions = await assert_eventually(
            lambda: stream_messages(nats_url, topics.dead_letter_subject("configdb-submitted"))
        )
        assert len(dead_plans) == 1 and len(dead_submissions) == 1
        plan_reason = (dead_plans[0].headers or {})["Stride-Dead-Letter-Reason"]
        assert "already recorded with different contents" in plan_reason
        submitted_reason = (dead_submissions[0].headers or {})["Stride-Dead-Letter-Reason"]
        assert "spec" in submitted_reason
        assert await record_of(stub, "job-batch-nospec") is None


MALFORMED: list[tuple[str, str, bytes, dict[str, str]]] = [
    # (subject, durable, payload, headers): undecodable, wrong type, and invalid content.
    (topics.JOB_SUBMITTED.subject("job-bad1"), "configdb-submitted", b"not protobuf", {}),
    (
        topics.PLAN.subject("job-bad2"),
        "configdb-plans",
        b'{"job_id": "job-bad2", "version": 1}',
        {"Stride-Type": "application/json"},
    ),
    (
        topics.PLAN.subject("job-bad3"),
        "configdb-plans",
        plan_pb2.ResourcePlan(job_id="job-bad3", version=0).SerializeToString(),
        {"Stride-Type": "stride.events.v1.ResourcePlan"},
    ),
    (
        topics.JOB_FINISHED.subject("job-bad4"),
        "configdb-finished",
        job_pb2.JobFinished(job_id="job-bad4").SerializeToString(),
        {"Stride-Type": "stride.events.v1.JobFinished"},
    ),
    (
        topics.JOB_SUBMITTED.subject("job-bad5"),
        "configdb-submitted",
        job_pb2.JobSubmitted(job_id="job-bad5").SerializeToString(),
        {"Stride-Type": "stride.events.v1.JobSubmitted"},
    ),
]


async def test_malformed_messages_are_dead_lettered_and_later_ones_processed(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    for index, (subject, _, payload, headers) in enumerate(MALFORMED):
        await bus.js.publish(subject, payload, headers={**headers, "Nats-Msg-Id": f"bad-{index}"})
    await bus.publish(topics.JOB_SUBMITTED, "job-good", submitted("job-good"), "good-sub")
    await bus.publish(topics.PLAN, "job-good", plan("job-good", 1), "good-plan")
    await bus.publish(topics.JOB_FINISHED, "job-good", finished("job-good"), "good-fin")

    await record_when(
        stub,
        "job-good",
        lambda r: r.HasField("spec") and len(r.plans) == 1 and r.HasField("finished_at"),
    )
    for durable in ("configdb-submitted", "configdb-plans", "configdb-finished"):
        expected = [(subject, payload) for subject, d, payload, _ in MALFORMED if d == durable]

        async def parked(durable: str = durable, count: int = len(expected)) -> list[Msg]:
            dead = await stream_messages(nats_url, topics.dead_letter_subject(durable))
            assert len(dead) == count, dead
            return dead

        dead = await assert_eventually(parked)
        assert [((m.headers or {})["Stride-Original-Subject"], m.data) for m in dead] == expected
    for index in range(1, 6):
        assert await record_of(stub, f"job-bad{index}") is None


async def expect_invalid(call: Awaitable[object], field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert str(raised.value.details()).startswith(f"{field}:"), raised.value.details()


async def test_bad_requests_name_the_field(stub: Stub) -> None:
    await expect_invalid(stub.GetJobRecord(pb.GetJobRecordRequest()), "job_id")
    await expect_invalid(stub.GetJobRecord(pb.GetJobRecordRequest(job_id="x" * 65)), "job_id")
    for size in (-1, 1001):
        listing = pb.ListJobRecordsRequest(page_size=size)
        await expect_invalid(stub.ListJobRecords(listing), "page_size")
    for k in (0, 101, -5):
        request = pb.FindSimilarJobsRequest(spec=valid_spec(), k=k)
        await expect_invalid(stub.FindSimilarJobs(request), "k")
    await expect_invalid(stub.FindSimilarJobs(pb.FindSimilarJobsRequest(k=3)), "spec")
    no_features = pb.FindSimilarJobsRequest(spec=job_pb2.JobSpec(name="x", user="u"), k=3)
    await expect_invalid(stub.FindSimilarJobs(no_features), "spec")
    negative = pb.FindSimilarJobsRequest(spec=valid_spec(batch_size=-1), k=3)
    await expect_invalid(stub.FindSimilarJobs(negative), "spec.batch_size")

    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetJobRecord(pb.GetJobRecordRequest(job_id="job-missing"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert (await stub.ListJobRecords(pb.ListJobRecordsRequest(page_size=0))).records == []


def steps(
    job_id: str, pod: str, version: int, global_step: int, count: int, seconds: float, rate: float
) -> metrics_pb2.StepMetrics:
    return metrics_pb2.StepMetrics(
        job_id=job_id,
        pod_name=pod,
        plan_version=version,
        global_step=global_step,
        steps=count,
        step_seconds=seconds,
        samples_per_second=rate,
        reported_at=stamp(datetime.now(UTC)),
    )


def used(
    job_id: str, pod: str, role: int, version: int, cpu: float, memory: int, at: datetime
) -> pod_pb2.UsageSample:
    return pod_pb2.UsageSample(
        job_id=job_id,
        pod_name=pod,
        role=role,  # type: ignore[arg-type]
        plan_version=version,
        cpu_used=cpu,
        memory_used_bytes=memory,
        cpu_limit=1.0,
        memory_limit_bytes=GIB,
        sampled_at=stamp(at),
    )


async def test_the_runtime_profile_is_built_from_step_windows_and_usage(
    stub: Stub, bus: Bus, nats_url: str
) -> None:
    job = "job-profiled"
    await bus.publish(topics.JOB_SUBMITTED, job, submitted(job), f"{job}.sub")
    for version in (1, 2):
        await bus.publish(topics.PLAN, job, plan(job, version), f"{job}.plan.{version}")
    chief = f"{job}-chief-0"
    windows = [
        # v1: 1000 samples in 1 s, then 9000 in 3 s: 2500/s over 40 steps of 0.1 s.
        steps(job, chief, 1, 10, 10, 0.1, 1000.0),
        steps(job, chief, 1, 40, 30, 0.1, 3000.0),
        # v2, after a move that repeated steps 31-40 from its checkpoint: measured anew.
        steps(job, chief, 2, 40, 10, 0.05, 4000.0),
    ]
    for index, window in enumerate(windows):
        await bus.publish(topics.STEP_METRICS, job, window, f"w{index}")
    # A redelivery under another message id (the de-duplication window passed) counts once.
    await bus.publish(topics.STEP_METRICS, job, windows[0], "w0-again")
    start, later = datetime.now(UTC), timedelta(seconds=10)
    samples = [
        used(job, f"{job}-ps-0", plan_pb2.ROLE_PS, 1, 0.2, 300 << 20, start),
        used(job, f"{job}-ps-0", plan_pb2.ROLE_PS, 1, 0.6, 500 << 20, start + timedelta(seconds=5)),
        used(job, f"{job}-worker-0", plan_pb2.ROLE_WORKER, 1, 0.9, 200 << 20, start),
        used(job, f"{job}-worker-1", plan_pb2.ROLE_WORKER, 2, 0.7, 250 << 20, start),
        used(job, f"{job}-worker-0", plan_pb2.ROLE_WORKER, 2, 0.5, 210 << 20, start + later),
    ]
    for index, sample in enumerate(samples):
        await bus.publish(topics.POD_USAGE, job, sample, f"u{index}")
    await bus.publish(topics.POD_USAGE, job, samples[1], "u1-again")
    # Measurements that cannot be ones go to the dead-letter stream and count for nothing.
    await bus.publish(topics.STEP_METRICS, job, steps(job, chief, 1, 50, 0, 0.1, 1.0), "bad-w")
    bad_sample = used(job, f"{job}-ps-0", plan_pb2.ROLE_PS, 1, -1.0, 0, start)
    await bus.publish(topics.POD_USAGE, job, bad_sample, "bad-u")

    def complete(record: pb.JobRecord) -> bool:
        counts = (
            [p.windows for p in record.profiles],
            sum(u.samples for p in record.profiles for u in p.roles),
        )
        assert counts == ([2, 1], 5), counts
        return True

    record = await record_when(stub, job, complete)
    first, second = record.profiles
    assert first.plan_version == 1 and first.steps == 40
    assert first.samples_per_second == pytest.approx(2500.0)
    assert first.step_seconds == pytest.approx(0.1)
    ps, workers = first.roles
    assert ps.role == plan_pb2.ROLE_PS and (ps.pods, ps.samples) == (1, 2)
    assert ps.cpu_used_mean == pytest.approx(0.4) and ps.cpu_used_max == pytest.approx(0.6)
    assert ps.memory_used_max_bytes == 500 << 20 and ps.memory_limit_bytes == GIB
    assert workers.role == plan_pb2.ROLE_WORKER and workers.pods == 1
    assert second.samples_per_second == pytest.approx(4000.0)
    assert [(u.role, u.pods, u.samples) for u in second.roles] == [(plan_pb2.ROLE_WORKER, 2, 2)]
    assert second.roles[0].cpu_used_mean == pytest.approx(0.6)
    for durable in ("configdb-step-metrics", "configdb-usage"):

        async def parked(durable: str = durable) -> list[Msg]:
            dead = await stream_messages(nats_url, topics.dead_letter_subject(durable))
            assert len(dead) == 1, dead
            return dead

        await assert_eventually(parked)
    # The profile is the job's, recorded beside its outcome.
    await bus.publish(topics.JOB_FINISHED, job, finished(job), f"{job}.fin")
    record = await record_when(stub, job, lambda r: r.HasField("finished_at"))
    assert len(record.profiles) == 2
