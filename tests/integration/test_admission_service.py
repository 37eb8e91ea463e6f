"""Admission on real NATS and a real database: submit, decide, publish, bad input."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import event
from sqlalchemy.engine import Engine

from stride.admission.adapters.outbound import repository
from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.db.engine import Database
from stride.events.v1 import job_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration


def valid_spec(**changes: object) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec(
        name="wide-deep",
        user="alice",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wide_deep:main"),
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


@pytest.fixture
async def admission(nats_url: str, database_url: str) -> AsyncIterator[ServiceHost]:
    settings = local_settings(AdmissionSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build, settings) as host:
        yield host


@pytest.fixture
async def stub(admission: ServiceHost) -> AsyncIterator[pb_grpc.AdmissionServiceAsyncStub]:
    async with aio_channel(f"127.0.0.1:{admission.server.port}", "admission") as channel:
        yield pb_grpc.AdmissionServiceStub(channel)


async def test_submit_stores_decides_and_publishes(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    reply = await stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(), request_id="r-1"))
    job = reply.job
    assert job.job_id.startswith("job-")
    assert job.state == pb.JOB_STATE_ADMITTED
    assert job.decision.outcome == job_pb2.ADMISSION_OUTCOME_ADMITTED
    assert job.decision.policy == "stride-guarantees/1"

    submitted = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_SUBMITTED.subject(job.job_id))
    )
    admitted = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_ADMITTED.subject(job.job_id))
    )
    assert len(submitted) == 1 and len(admitted) == 1
    event = job_pb2.AdmissionDecision.FromString(admitted[0].data)
    assert event.job_id == job.job_id and event.spec.dataset.record_count == 100_000
    assert (admitted[0].headers or {})["Stride-Type"] == "stride.events.v1.AdmissionDecision"
    assert "traceparent" in (admitted[0].headers or {})

    again = await stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(), request_id="r-1"))
    assert again.job.job_id == job.job_id
    fetched = await stub.GetJob(pb.GetJobRequest(job_id=job.job_id))
    assert fetched.job.spec == valid_spec()
    listed = await stub.ListJobs(pb.ListJobsRequest(user="alice"))
    assert [j.job_id for j in listed.jobs] == [job.job_id]


async def test_a_job_left_submitted_is_decided_on_the_next_start(
    nats_url: str, database_url: str
) -> None:
    """A job stored but not decided (by a version that stored first and crashed before
    deciding) is decided when admission starts, with its decision event."""
    settings = local_settings(AdmissionSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build, settings):
        pass  # the schema exists
    job_id = f"job-{uuid.uuid4().hex[:12]}"
    database = Database(database_url, settings.service_name)
    try:
        async with database.transaction() as session:
            await repository.insert_jobs(
                session, [repository.job_row(job_id, None, valid_spec(), datetime.now(UTC))]
            )
    finally:
        await database.dispose()
    async with (
        running_service(build, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        stub = pb_grpc.AdmissionServiceStub(channel)
        job = (await stub.GetJob(pb.GetJobRequest(job_id=job_id))).job
        assert job.state == pb.JOB_STATE_ADMITTED, job
        assert job.decision.outcome == job_pb2.ADMISSION_OUTCOME_ADMITTED
        admitted = await assert_eventually(
            lambda: stream_messages(nats_url, topics.JOB_ADMITTED.subject(job_id))
        )
        assert len(admitted) == 1


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (valid_spec(batch_size=-4), "spec.batch_size"),
        (valid_spec(dataset=job_pb2.DatasetSpec(name="d")), "spec.dataset.record_count"),
        (valid_spec(user="a/b"), "spec.user"),
        (valid_spec(termination=job_pb2.Termination()), "spec.termination"),
        (valid_spec(termination=job_pb2.Termination(max_steps=-1)), "spec.termination.max_steps"),
        (
            valid_spec(model=job_pb2.ModelReference(name="m", image="i", entrypoint="a:b")),
            "spec.model",
        ),
    ],
)
async def test_invalid_spec_is_rejected_and_nothing_is_stored(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str, spec: job_pb2.JobSpec, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.SubmitJob(pb.SubmitJobRequest(spec=spec))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (raised.value.details() or "").startswith(f"{field}:")
    assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == []
    assert await stream_messages(nats_url, topics.JOBS.subjects[0]) == []


async def test_deadline_in_the_past_is_rejected(stub: pb_grpc.AdmissionServiceAsyncStub) -> None:
    spec = valid_spec()
    spec.deadline.FromDatetime(datetime.now(UTC) - timedelta(minutes=1))
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.SubmitJob(pb.SubmitJobRequest(spec=spec))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.deadline" in (raised.value.details() or "")


async def test_unknown_job_is_not_found(stub: pb_grpc.AdmissionServiceAsyncStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetJob(pb.GetJobRequest(job_id="job-missing"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_cancel_publishes_finished_once(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec()))).job
    cancelled = (await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id))).job
    assert cancelled.state == pb.JOB_STATE_CANCELLED
    await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id))
    finished = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_FINISHED.subject(job.job_id))
    )
    assert len(finished) == 1


async def test_a_request_id_names_one_spec_and_retries_race_to_one_job(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    # Concurrent retries of one submission (a client that timed out and tried again while
    # the first call was still running) end in one job.
    replies = await asyncio.gather(
        *(
            stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(), request_id="r-race"))
            for _ in range(6)
        )
    )
    assert len({reply.job.job_id for reply in replies}) == 1
    # The same key with another spec is refused, not answered with the first job.
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.SubmitJob(
            pb.SubmitJobRequest(spec=valid_spec(batch_size=256), request_id="r-race")
        )
    assert raised.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "another spec" in (raised.value.details() or "")
    listed = await stub.ListJobs(pb.ListJobsRequest(user="alice"))
    assert len(listed.jobs) == 1
    submitted = await stream_messages(nats_url, topics.JOB_SUBMITTED.pattern())
    assert len(submitted) == 1


async def test_concurrent_submissions_are_stored_together_and_a_bad_one_fails_alone(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    """Submissions that arrive together are decided in turn and stored in shared
    transactions (group commit). Retries of an earlier job and a reused request id among
    them make a shared transaction fail; each job is then stored alone, so those get what
    they would have got alone and every other job is stored once."""
    first = await stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(), request_id="r-dup"))
    calls = [
        stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(name=f"j{n}"), request_id=f"r-{n}"))
        for n in range(24)
    ]
    calls.insert(5, stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(), request_id="r-dup")))
    calls.insert(17, stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(), request_id="r-dup")))
    reused = stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(name="other"), request_id="r-dup"))
    calls.insert(11, reused)
    replies = await asyncio.gather(*calls, return_exceptions=True)

    refused = replies.pop(11)
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert refused.code() == grpc.StatusCode.ALREADY_EXISTS
    retried = [replies.pop(17), replies.pop(5)]  # (the second one moved up by the pop above)
    assert all(isinstance(r, pb.SubmitJobResponse) for r in [*retried, *replies]), replies
    assert {r.job.job_id for r in retried} == {first.job.job_id}  # type: ignore[union-attr]
    new = {r.job.job_id: r.job for r in replies}  # type: ignore[union-attr]
    assert len(new) == 24 and first.job.job_id not in new
    for job in new.values():
        assert job.state == pb.JOB_STATE_ADMITTED and job.decision.job_id == job.job_id
        got = await stub.GetJob(pb.GetJobRequest(job_id=job.job_id))
        assert got.job.spec == job.spec and got.job.decision == job.decision

    listed = await stub.ListJobs(pb.ListJobsRequest(user="alice"))
    assert len(listed.jobs) == 25
    submitted = await assert_eventually(
        lambda: _at_least(stream_messages(nats_url, topics.JOB_SUBMITTED.pattern()), 25)
    )
    admitted = await assert_eventually(
        lambda: _at_least(stream_messages(nats_url, topics.JOB_ADMITTED.pattern()), 25)
    )
    assert sorted(m.subject for m in submitted) == sorted(
        topics.JOB_SUBMITTED.subject(job_id) for job_id in [first.job.job_id, *new]
    )
    assert len(admitted) == 25


async def test_a_group_commit_writes_each_table_once_for_the_batch(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    """Jobs stored together are written with one statement per table for the batch (the
    jobs, their decisions, their events), not one per job; the events keep the order they
    would have had job by job."""
    inserts: Counter[str] = Counter()

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        words = statement.split(None, 3)
        if words[:2] == ["INSERT", "INTO"]:
            inserts[words[2].replace('"', "").rsplit(".", 1)[-1]] += 1  # (schema.)table

    event.listen(Engine, "before_cursor_execute", count)
    try:
        replies = await asyncio.gather(
            *(stub.SubmitJob(pb.SubmitJobRequest(spec=valid_spec(name=f"g{n}"))) for n in range(32))
        )
    finally:
        event.remove(Engine, "before_cursor_execute", count)
    assert all(r.job.state == pb.JOB_STATE_ADMITTED for r in replies)
    # As many transactions as statements per table; fewer than the jobs (they were batched).
    assert inserts["jobs"] == inserts["decisions"] == inserts["outbox"], inserts
    assert 1 <= inserts["jobs"] < 32, inserts
    messages = await assert_eventually(
        lambda: _at_least(stream_messages(nats_url, topics.JOBS.subjects[0]), 64)
    )
    for reply in replies:
        job_id = reply.job.job_id
        mine = [m.subject for m in messages if job_id in m.subject.split(".")]
        assert mine == [topics.JOB_SUBMITTED.subject(job_id), topics.JOB_ADMITTED.subject(job_id)]


async def _at_least(messages: Awaitable[list[Any]], count: int) -> list[Any]:
    found = await messages
    assert len(found) >= count, f"{len(found)} of {count}"
    return found


async def test_a_retry_gets_its_job_back_after_its_deadline_passed(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    soon = Timestamp()
    soon.FromDatetime(datetime.now(UTC) + timedelta(seconds=2))
    spec = valid_spec(deadline=soon)
    first = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec, request_id="r-late"))
    await asyncio.sleep(2.5)
    again = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec, request_id="r-late"))
    assert again.job.job_id == first.job.job_id
