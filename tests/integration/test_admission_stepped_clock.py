"""The stepped replay clock (``replay_stepped``): admission's time moves only through
``ReplayClockService.Advance``, on NATS and a real database, through gRPC.

The cluster is 8 CPU units; the job profile is the one of ``test_admission_guarantees``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.testing.channels import aio_channel
from stride.testing.inprocess import local_settings, running_service

from .test_admission_guarantees import spec, submit

pytestmark = pytest.mark.integration

ORIGIN = 6_000_000 * 300.0
"""A slot boundary in 2027: the stepped clock starts there, far from the wall clock."""


def settings(nats_url: str, database_url: str, **changes: object) -> AdmissionSettings:
    values: dict[str, object] = {
        "nats_url": nats_url,
        "database_url": database_url,
        "cluster_cpu": 8.0,
        "cluster_memory_gib": 32.0,
        "replay_stepped": True,
        "replay_origin": ORIGIN,
    }
    return local_settings(AdmissionSettings, **{**values, **changes})


def at(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.fromtimestamp(ORIGIN + seconds, UTC))
    return stamp


@pytest.fixture
async def channel(nats_url: str, database_url: str) -> AsyncIterator[grpc.aio.Channel]:
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
    ):
        yield opened


async def test_decisions_happen_at_the_stepped_time_and_the_clock_never_goes_back(
    channel: grpc.aio.Channel,
) -> None:
    clock = pb_grpc.ReplayClockServiceStub(channel)
    stub = pb_grpc.AdmissionServiceStub(channel)
    moved = await clock.Advance(pb.AdvanceRequest(to=at(1_000)))
    assert moved.now == at(1_000) and moved.rounds == 0
    # A deadline an hour after the stepped clock: years before the wall clock's "now", yet
    # in the future for admission, which lives on the replay's time.
    origin = datetime.fromtimestamp(ORIGIN, UTC)
    job = await submit(stub, spec(20_000, origin + timedelta(seconds=1_000 + 3_600)))
    assert job.state == pb.JOB_STATE_ADMITTED, job.decision.reason
    assert job.decision.decided_at == at(1_000)
    assert job.share.decided_at == at(1_000)

    with pytest.raises(grpc.aio.AioRpcError) as backwards:
        await clock.Advance(pb.AdvanceRequest(to=at(999)))
    assert backwards.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "to:" in (backwards.value.details() or "")
    assert "before the clock" in (backwards.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as unset:
        await clock.Advance(pb.AdvanceRequest())
    assert unset.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (unset.value.details() or "").startswith("to:")
    # Refused calls changed nothing: the clock is where it was.
    again = await clock.Advance(pb.AdvanceRequest(to=at(1_000)))
    assert again.now == at(1_000)

    # A submission whose deadline the stepped clock has passed is refused as in real time.
    await clock.Advance(pb.AdvanceRequest(to=at(10_000)))
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await submit(stub, spec(1_000, origin + timedelta(seconds=9_000)))
    assert late.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.deadline" in (late.value.details() or "")


async def test_a_restarted_service_resumes_its_stepped_clock_from_its_books(
    nats_url: str, database_url: str
) -> None:
    origin = datetime.fromtimestamp(ORIGIN, UTC)
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
    ):
        await pb_grpc.ReplayClockServiceStub(opened).Advance(pb.AdvanceRequest(to=at(600)))
        job = await submit(
            pb_grpc.AdmissionServiceStub(opened), spec(50_000, origin + timedelta(hours=3))
        )
        assert job.share.units > 0
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
    ):
        clock = pb_grpc.ReplayClockServiceStub(opened)
        # The books stopped at 600 s: the clock may not be moved back before them.
        with pytest.raises(grpc.aio.AioRpcError) as backwards:
            await clock.Advance(pb.AdvanceRequest(to=at(300)))
        assert backwards.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        kept = await pb_grpc.AdmissionServiceStub(opened).GetJob(
            pb.GetJobRequest(job_id=job.job_id)
        )
        assert kept.job.share.units == job.share.units


async def test_a_service_on_the_wall_clock_does_not_serve_the_clock(
    nats_url: str, database_url: str
) -> None:
    wall = settings(nats_url, database_url, replay_stepped=False, replay_origin=None)
    async with (
        running_service(build, wall) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await pb_grpc.ReplayClockServiceStub(opened).Advance(pb.AdvanceRequest(to=at(1)))
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"grpc_host": "0.0.0.0"}, "loopback only"),
        ({"replay_origin": None}, "set replay_origin"),
        ({"replay_speedup": 10.0}, "no replay_speedup"),
    ],
)
def test_a_stepped_clock_is_refused_off_loopback_or_half_configured(
    changes: dict[str, object], named: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        settings("nats://127.0.0.1:1", "sqlite:///unused.db", **changes)
    assert named in str(refused.value) and "replay_stepped" in str(refused.value)


def whole(name: str, priority: int) -> job_pb2.JobSpec:
    """A best-effort job that runs only on all 8 units (6 workers and 2 PS)."""
    message = spec(10_000_000, name=name, priority=priority)
    del message.profile.points[:3]
    return message


async def test_aging_lets_a_low_job_preempt_a_normal_one_which_is_told_and_requeued(
    channel: grpc.aio.Channel, nats_url: str
) -> None:
    """Hand-computed with the rule of ``stride.policy.elasticflow.priorities``: a low job
    behind a normal one that holds the whole cluster is promoted to normal after 300 s of
    waiting (an equal does not preempt), to high after 600 s, and then preempts it; the
    normal job is told, goes back to the queue and ages in turn: the low job runs as low
    again (KOD2: a started job competes with its own weight), so after 300 s the normal
    one, promoted to high, takes the cluster back. Jobs that cannot run together take turns,
    each in proportion to its priority."""
    clock = pb_grpc.ReplayClockServiceStub(channel)
    stub = pb_grpc.AdmissionServiceStub(channel)
    normal = await submit(stub, whole(name="normal", priority=job_pb2.PRIORITY_NORMAL))
    assert normal.state == pb.JOB_STATE_ADMITTED and normal.share.units == 8
    moved = await clock.Advance(pb.AdvanceRequest(to=at(100), inclusive=True))
    low = await submit(stub, whole(name="low", priority=job_pb2.PRIORITY_LOW))
    assert low.state == pb.JOB_STATE_QUEUED and low.share.units == 0
    # Admission asks to be woken when the low job is promoted: 300 s after it came.
    moved = await clock.Advance(pb.AdvanceRequest(to=at(100), inclusive=True))
    assert moved.next_round == at(400)
    moved = await clock.Advance(pb.AdvanceRequest(to=at(450), inclusive=True))
    assert moved.rounds == 1 and moved.next_round == at(700)

    async def job(job_id: str) -> pb.Job:
        return (await stub.GetJob(pb.GetJobRequest(job_id=job_id))).job

    assert (await job(low.job_id)).state == pb.JOB_STATE_QUEUED  # normal now: no preemption
    moved = await clock.Advance(pb.AdvanceRequest(to=at(700), inclusive=True))
    assert moved.rounds == 1
    preempted, running = await job(normal.job_id), await job(low.job_id)
    assert preempted.share.units == 0 and running.share.units == 8
    assert preempted.state == pb.JOB_STATE_QUEUED
    assert preempted.decision.outcome == job_pb2.ADMISSION_OUTCOME_QUEUED
    assert preempted.decision.reason.startswith(
        f"preempted for higher-priority jobs ({low.job_id}); class normal"
    ), preempted.decision.reason
    assert "resumes from its newest checkpoint" in preempted.decision.reason
    assert preempted.share.reason.startswith("preempted for higher-priority jobs")
    assert running.state == pb.JOB_STATE_ADMITTED
    assert running.decision.reason.startswith("capacity freed")
    # The preempted job ages from 700 s: high at 1,000 s, above the low job that runs as low.
    assert moved.next_round == at(1_000)
    await clock.Advance(pb.AdvanceRequest(to=at(1_000), inclusive=True))
    back, out = await job(normal.job_id), await job(low.job_id)
    assert back.share.units == 8 and back.state == pb.JOB_STATE_ADMITTED
    assert out.share.units == 0 and out.state == pb.JOB_STATE_QUEUED


@pytest.mark.parametrize("into_slot", [80.0, 95.0, 110.0])
async def test_the_deadline_a_refusal_names_is_admitted_when_resubmitted_within_a_minute(
    channel: grpc.aio.Channel, into_slot: float
) -> None:
    """200,000 steps take 5,000 s on the whole cluster: 16 slots and the rest of the current
    one, when that rest is long enough (about 200 s here). Refused a moment in, the job is
    told a deadline; resubmitted with it 59 s later, it is admitted, though the current
    slot's rest no longer holds what it held at the refusal (the deadline is worked out as
    of a minute later; adding a minute to the deadline instead gave the job no more slots)."""
    clock = pb_grpc.ReplayClockServiceStub(channel)
    stub = pb_grpc.AdmissionServiceStub(channel)
    origin = datetime.fromtimestamp(ORIGIN, UTC)
    await clock.Advance(pb.AdvanceRequest(to=at(into_slot)))
    refused = await submit(stub, spec(200_000, origin + timedelta(seconds=into_slot + 3_600)))
    assert refused.state == pb.JOB_STATE_REJECTED
    named = refused.decision.earliest_deadline.ToDatetime(tzinfo=UTC)
    await clock.Advance(pb.AdvanceRequest(to=at(into_slot + 59)))
    again = await submit(stub, spec(200_000, named))
    assert again.state == pb.JOB_STATE_ADMITTED, again.decision.reason
