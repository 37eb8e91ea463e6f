"""Admission guarantees deadlines for real: on NATS and a real database, through gRPC.

The cluster is 8 CPU units (8 cores, 32 GiB; a unit is 1 core and 4 GiB). The job's
declared profile runs 1 worker + 1 PS (3 units with the chief) at 21 steps/s up to 5
workers + 2 PS (8 units) at 40 steps/s, so every number below can be worked out by hand.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from nats.aio.msg import Msg

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.signing import logical_message_id
from stride.events.v1 import cluster_pb2, job_pb2
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

GIB = 1024**3
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "imported"


def profile() -> job_pb2.ScalingProfile:
    return job_pb2.ScalingProfile(
        kind=job_pb2.RESOURCE_KIND_CPU,
        worker_cpu=1.0,
        worker_memory_bytes=2 * GIB,
        ps_cpu=1.0,
        ps_memory_bytes=2 * GIB,
        points=[
            # With the chief (1 core, 2 GiB) every size holds: cores dominate, so a size's
            # units are workers + PS + 1.
            job_pb2.ProfilePoint(workers=1, ps=1, steps_per_second=21.0),  # 3 units
            job_pb2.ProfilePoint(workers=2, ps=1, steps_per_second=26.0),  # 4 units
            job_pb2.ProfilePoint(workers=4, ps=1, steps_per_second=34.0),  # 6 units
            job_pb2.ProfilePoint(workers=5, ps=2, steps_per_second=40.0),  # 8 units
        ],
    )


def spec(steps: int, deadline: datetime | None = None, **changes: object) -> job_pb2.JobSpec:
    message = job_pb2.JobSpec(
        name="ctr",
        user="alice",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wd:main"),
        dataset=job_pb2.DatasetSpec(name="criteo", record_count=1_000_000),
        batch_size=512,
        termination=job_pb2.Termination(max_steps=steps),
        profile=profile(),
        simulated=True,
    )
    if deadline is not None:
        message.deadline.FromDatetime(deadline)
    for key, value in changes.items():
        if isinstance(value, Message):
            getattr(message, key).CopyFrom(value)
        else:
            setattr(message, key, value)
    return message


async def slot_safe_now(margin: float = 45.0) -> datetime:
    """Now, at least ``margin`` seconds before the end of the current 300 s slot (waiting
    for the next slot if need be): a deadline worked out from it on the slot grid then
    holds when the job is decided a moment later, even on a loaded machine (a boundary
    passing in between would hand the hog a whole slot of slack)."""
    now = datetime.now(UTC)
    left = 300 - now.timestamp() % 300
    if left < margin:
        await asyncio.sleep(left + 0.05)
        now = datetime.now(UTC)
    return now


def hog_deadline(now: datetime) -> datetime:
    """A deadline for 200,000 steps (5,000 s on all 8 units) with the least slack the slot
    grid allows: the 17th slot end after the current 300 s slot's (5,100 to 5,400 s away),
    after the 20 s pause, plus the minute a refusal adds."""
    first = (now.timestamp() // 300 + 1) * 300 - now.timestamp()
    return now + timedelta(seconds=first + 17 * 300 + 20 + 60)


def tight_hog(now: datetime) -> job_pb2.JobSpec:
    """A job that needs all 8 units until :func:`hog_deadline` but for a minute, at any
    phase of the slot: 200,000 steps leave it the rest of the current slot as slack too
    (80 to 380 s), in which a small job may be squeezed beside it."""
    first = (now.timestamp() // 300 + 1) * 300 - now.timestamp()
    steps = int(40 * (first + 17 * 300 - 20 - 60))  # 40 steps/s on 8 units, after the pause
    return spec(steps, hog_deadline(now))


def settings(nats_url: str, database_url: str) -> AdmissionSettings:
    return local_settings(
        AdmissionSettings,
        nats_url=nats_url,
        database_url=database_url,
        cluster_cpu=8.0,
        cluster_memory_gib=32.0,
    )


@pytest.fixture
async def stub(
    nats_url: str, database_url: str
) -> AsyncIterator[pb_grpc.AdmissionServiceAsyncStub]:
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        yield pb_grpc.AdmissionServiceStub(channel)


async def submit(stub: pb_grpc.AdmissionServiceAsyncStub, message: job_pb2.JobSpec) -> pb.Job:
    return (await stub.SubmitJob(pb.SubmitJobRequest(spec=message))).job


async def test_an_impossible_deadline_is_refused_with_one_that_works(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    # 200,000 steps at most 40 steps/s take 5,000 s: an hour cannot do it, alone or not.
    now = await slot_safe_now()
    refused = await submit(stub, spec(200_000, now + timedelta(hours=1)))
    assert refused.state == pb.JOB_STATE_REJECTED
    decision = refused.decision
    assert decision.outcome == job_pb2.ADMISSION_OUTCOME_REJECTED
    assert decision.curve_source == "profile"
    assert "could guarantee by +1h" in decision.reason, decision.reason
    assert decision.HasField("earliest_deadline")
    earliest = decision.earliest_deadline.ToDatetime(tzinfo=UTC)
    # 5,000 s of work at 8 units, counted from a minute later (a resubmission's time): the
    # rest of that 300 s slot of the grid, then whole slots to the first slot end at least
    # 5,000 s away (5,000 to 5,300 s), after the 20 s pause.
    later = now.timestamp() + 60
    first = (later // 300 + 1) * 300 - later
    whole = -(-(5000 - first) // 300)  # whole slots after the first, rounded up
    expected = 60 + first + whole * 300 + 20
    assert abs((earliest - now).total_seconds() - expected) < 30, (earliest - now, expected)
    assert not refused.HasField("share")
    rejected = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_REJECTED.subject(refused.job_id))
    )
    assert job_pb2.AdmissionDecision.FromString(rejected[0].data).HasField("earliest_deadline")
    assert await stream_messages(nats_url, topics.JOB_SHARE.subject(refused.job_id)) == []

    # The deadline it named is admitted, with the whole cluster as its share.
    admitted = await submit(stub, spec(200_000, earliest))
    assert admitted.state == pb.JOB_STATE_ADMITTED, admitted.decision.reason
    assert admitted.decision.outcome == job_pb2.ADMISSION_OUTCOME_ADMITTED
    assert admitted.decision.guaranteed_finish.ToDatetime(tzinfo=UTC) <= earliest
    assert admitted.share.units == 8 and admitted.share.guaranteed
    assert admitted.share.share.cpu == 8.0 and admitted.share.share.workers == 5
    assert admitted.share.minimum.cpu == 8.0  # it needs every unit in its first slot
    shares = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_SHARE.subject(admitted.job_id))
    )
    assert job_pb2.JobShare.FromString(shares[-1].data).units == 8
    # The decision's event carries that same share (the optimizer's plan 1 fits it whichever
    # of the two it reads first).
    decided = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_ADMITTED.subject(admitted.job_id))
    )
    carried = job_pb2.AdmissionDecision.FromString(decided[0].data).share
    assert carried == job_pb2.JobShare.FromString(shares[0].data) and carried.version == 1


async def test_a_deadline_no_curve_knows_is_refused_and_says_what_to_declare(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    message = spec(1000, datetime.now(UTC) + timedelta(hours=2))
    message.ClearField("profile")
    job = await submit(stub, message)
    assert job.state == pb.JOB_STATE_REJECTED
    assert "no scaling curve" in job.decision.reason and "profile:" in job.decision.reason
    message.soft_deadline = True
    soft = await submit(stub, message)
    assert soft.decision.outcome == job_pb2.ADMISSION_OUTCOME_SOFT
    assert soft.state == pb.JOB_STATE_ADMITTED and not soft.HasField("share")


async def test_a_guaranteed_job_keeps_its_reservation_and_the_rest_waits_then_runs(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    now = await slot_safe_now()
    # Needs all 8 units but for a minute until its deadline (about 1 h 30 min), so a
    # best-effort job arriving next gets nothing until it ends.
    hog = await submit(stub, tight_hog(now))
    assert hog.state == pb.JOB_STATE_ADMITTED and hog.share.units == 8
    waiting = await submit(stub, spec(1000))
    assert waiting.state == pb.JOB_STATE_QUEUED
    assert waiting.decision.outcome == job_pb2.ADMISSION_OUTCOME_QUEUED
    assert "waits for spare capacity" in waiting.decision.reason
    assert waiting.share.units == 0 and not waiting.share.guaranteed
    # A second deadline job cannot squeeze in beside the guaranteed one: refused, and the
    # deadline it names lies after the hog's reservation.
    second = await submit(stub, spec(20_000, now + timedelta(hours=1)))
    assert second.state == pb.JOB_STATE_REJECTED
    assert second.decision.earliest_deadline.ToDatetime(tzinfo=UTC) > now + timedelta(hours=1)

    await stub.CancelJob(pb.CancelJobRequest(job_id=hog.job_id))
    started = await stub.GetJob(pb.GetJobRequest(job_id=waiting.job_id))
    assert started.job.state == pb.JOB_STATE_ADMITTED
    assert started.job.share.units == 8 and "cancelled" in started.job.share.reason
    assert started.job.decision.outcome == job_pb2.ADMISSION_OUTCOME_ADMITTED
    assert "capacity freed" in started.job.decision.reason
    decisions = await assert_eventually(
        lambda: stream_messages(nats_url, topics.JOB_ADMITTED.subject(waiting.job_id))
    )
    assert len(decisions) == 1
    assert decisions[0].headers is not None
    assert logical_message_id(decisions[0].headers["Nats-Msg-Id"]) == f"{waiting.job_id}.decision.2"
    # Admitted off the queue, it carries the share that admitted it.
    carried = job_pb2.AdmissionDecision.FromString(decisions[0].data).share
    assert carried.units == 8 and carried.version == started.job.share.version


async def test_a_finished_job_frees_its_share_for_the_queue(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    now = await slot_safe_now()
    first = await submit(stub, spec(200_000, hog_deadline(now)))
    second = await submit(stub, spec(50_000))
    assert first.share.units == 8 and second.state == pb.JOB_STATE_QUEUED
    bus = await producer_bus(nats_url, "test-finisher")
    try:
        await bus.publish(
            topics.JOB_FINISHED,
            first.job_id,
            job_pb2.JobFinished(job_id=first.job_id, outcome=job_pb2.JOB_OUTCOME_SUCCEEDED),
            f"{first.job_id}.finished",
        )

        async def second_runs() -> pb.Job:
            job = (await stub.GetJob(pb.GetJobRequest(job_id=second.job_id))).job
            assert job.state == pb.JOB_STATE_ADMITTED and job.share.units == 8
            return job

        await assert_eventually(second_runs)
    finally:
        await bus.close()
    done = (await stub.GetJob(pb.GetJobRequest(job_id=first.job_id))).job
    assert done.state == pb.JOB_STATE_SUCCEEDED


async def test_shares_are_rebuilt_from_storage_after_a_restart(
    nats_url: str, database_url: str
) -> None:
    now = await slot_safe_now()
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        stub = pb_grpc.AdmissionServiceStub(channel)
        hog = await submit(stub, tight_hog(now))
        assert hog.share.units == 8
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        stub = pb_grpc.AdmissionServiceStub(channel)
        # Were the pool empty, 20,000 steps in an hour would fit easily.
        second = await submit(stub, spec(20_000, now + timedelta(hours=1)))
        assert second.state == pb.JOB_STATE_REJECTED, second.decision.reason
        kept = (await stub.GetJob(pb.GetJobRequest(job_id=hog.job_id))).job
        assert kept.share.units == 8 and kept.share.version == 1


def _bad_profiles() -> list[tuple[str, str, job_pb2.ScalingProfile]]:
    no_points, swapped, no_cores, no_ps = profile(), profile(), profile(), profile()
    del no_points.points[:]
    swapped.points[0].workers, swapped.points[1].workers = 2, 1
    no_cores.worker_cpu = 0.0
    no_ps.points[0].ps = 0
    return [
        ("spec.profile.points", "at least one point", no_points),
        ("spec.profile.points[1].workers", "increasing workers", swapped),
        ("spec.profile.worker_cpu", "cores", no_cores),
        ("spec.profile.points[0].ps", "parameter servers", no_ps),
    ]


async def test_a_bad_profile_is_refused_naming_the_field_and_nothing_is_stored(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    for field, problem, bad in _bad_profiles():
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await submit(stub, spec(1000, profile=bad))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = raised.value.details() or ""
        assert field in details and problem in details, details
    assert (await stub.ListJobs(pb.ListJobsRequest())).jobs == []


SPEC_YAML = """\
name: ctr
user: alice
model: {name: wide-and-deep, entrypoint: "trainers.wd:main"}
dataset: {name: criteo, record_count: 1000000}
batch_size: 512
termination: {max_steps: 200000}
deadline: +1h
simulated: true
profile:
  kind: cpu
  worker_cpu: 1
  worker_memory_bytes: 2Gi
  ps_cpu: 1
  ps_memory_bytes: 2Gi
  points:
    - {workers: 1, ps: 1, steps_per_second: 21}
    - {workers: 5, ps: 2, steps_per_second: 40}
"""


async def stride_cli(address: str, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "stride.cli",
        *args,
        env={**os.environ, "STRIDE_ADMISSION_ADDRESS": address, "NO_COLOR": "1", "COLUMNS": "250"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_stride_submit_refuses_and_one_command_resubmits_with_the_named_deadline(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    """As a user: the refusal names a deadline; `--deadline` with it is admitted, and
    `stride status` shows the share and the guarantee."""
    path = tmp_path / "job.yaml"
    path.write_text(SPEC_YAML)
    async with running_service(build, settings(nats_url, database_url)) as host:
        address = f"127.0.0.1:{host.server.port}"
        code, out, err = await stride_cli(address, "submit", str(path))
        assert code == 3, (out, err)
        assert "rejected" in out and "could guarantee by +1h" in out, out
        hint = next(line for line in out.splitlines() if line.startswith("to run it"))
        named = hint.split("--deadline ")[1].strip()
        code, out, err = await stride_cli(address, "submit", str(path), "--deadline", named)
        assert code == 0, (out, err)
        assert "admitted" in out and "guaranteed under the model" in out, out
        job_id = out.split()[0]
        code, out, err = await stride_cli(address, "status", job_id)
        assert "8 CPU units (8 cores, 32 GiB, 5 workers)" in out, (out, err)
        assert "deadline guaranteed under the model: 8 cores reserved now" in out, out


async def test_stride_submit_takes_an_elasticjob_and_a_tfjob_as_they_are(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    """As a user: a DLRover ElasticJob is submitted with one warning per ignored resource
    and runs; a kind Stride does not read is refused before anything is stored."""
    examples = EXAMPLES
    unknown = tmp_path / "pytorch.yaml"
    unknown.write_text("apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {name: x}\n")
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        address = f"127.0.0.1:{host.server.port}"
        code, out, err = await stride_cli(
            address, "submit", str(examples / "elasticjob-deepctr.yaml")
        )
        assert code == 0, (out, err)
        warned = [line for line in out.splitlines() if line.startswith("warning: ElasticJob")]
        assert len(warned) == 8, out
        assert "warning: ElasticJob spec.replicaSpecs.worker.autoScale: ignored" in out
        assert "admitted" in out, out
        job_id = next(line for line in out.splitlines() if line.startswith("job-")).split()[0]
        stub = pb_grpc.AdmissionServiceStub(channel)
        job = (await stub.GetJob(pb.GetJobRequest(job_id=job_id))).job
        assert job.spec.name == "deepctr-auto-scaling" and job.spec.user == "alice"
        assert job.spec.priority == job_pb2.PRIORITY_HIGH
        code, out, err = await stride_cli(address, "submit", str(unknown))
        assert code == 2 and "kind: unknown kind 'PyTorchJob'" in err, (out, err)
        listed = (await stub.ListJobs(pb.ListJobsRequest())).jobs
        assert [j.job_id for j in listed] == [job_id]


def inventory(units: int, at: datetime, reason: str) -> cluster_pb2.NodeInventory:
    """``units`` nodes of one core and 4 GiB each (one CPU unit apiece)."""
    message = cluster_pb2.NodeInventory(
        cluster="local",
        nodes=[
            cluster_pb2.ClusterNode(name=f"node-{n}", cpu=1.0, memory_bytes=4 * GIB)
            for n in range(units)
        ],
        reason=reason,
    )
    message.observed_at.FromDatetime(at)
    return message


async def test_a_node_loss_withdraws_a_guarantee_and_says_why_and_nodes_back_restore_it(
    nats_url: str, database_url: str
) -> None:
    now = await slot_safe_now()
    bus = await producer_bus(nats_url, "test-podwatcher")
    try:
        async with (
            running_service(build, settings(nats_url, database_url)) as host,
            aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
        ):
            stub = pb_grpc.AdmissionServiceStub(channel)
            # 200,000 steps at 40 steps/s need all 8 units for 5,000 s of its 5,100.
            hog = await submit(stub, spec(200_000, hog_deadline(now)))
            assert hog.share.guaranteed and hog.share.units == 8

            async def published(units: int, at: datetime, reason: str, n: int) -> None:
                message = inventory(units, at, reason)
                await bus.publish(topics.NODE_INVENTORY, "local", message, f"local.nodes.{n}")

            async def job() -> pb.Job:
                return (await stub.GetJob(pb.GetJobRequest(job_id=hog.job_id))).job

            # Half the nodes drained: 4 units cannot finish it in time.
            await published(4, datetime.now(UTC), "node-4 to node-7 drained", 1)

            async def withdrawn() -> pb.Job:
                current = await job()
                # 4 units run the profile's 4-unit size (2 workers + 1 PS and the chief).
                assert not current.share.guaranteed and current.share.units == 4
                assert current.decision.outcome == job_pb2.ADMISSION_OUTCOME_SOFT
                return current

            told = await assert_eventually(withdrawn)
            assert told.state == pb.JOB_STATE_ADMITTED  # it runs on, best effort
            assert told.decision.reason.startswith(
                "guarantee withdrawn: capacity 8 -> 4 CPU units (node-4 to node-7 drained)"
            ), told.decision.reason
            decisions = await assert_eventually(
                lambda: _at_least(
                    2, stream_messages(nats_url, topics.JOB_ADMITTED.subject(hog.job_id))
                )
            )
            second = job_pb2.AdmissionDecision.FromString(decisions[1].data)
            assert second.outcome == job_pb2.ADMISSION_OUTCOME_SOFT
            assert "guarantee withdrawn" in second.reason

            # A late inventory from before the drain changes nothing.
            await published(8, now - timedelta(minutes=1), "start", 2)
            # A bad one goes to the dead letters, and changes nothing either.
            bad = inventory(8, datetime.now(UTC), "twins")
            bad.nodes[1].name = "node-0"
            await bus.publish(topics.NODE_INVENTORY, "local", bad, "local.nodes.3")
            dead = await assert_eventually(
                lambda: _at_least(
                    1, stream_messages(nats_url, topics.dead_letter_subject("admission-inventory"))
                )
            )
            why = (dead[0].headers or {})["Stride-Dead-Letter-Reason"]
            assert "nodes[1].name" in why and "listed twice" in why, why
            still = await job()
            assert not still.share.guaranteed and still.share.units == 4

            # The nodes come back in time: guaranteed again, and told so.
            await published(8, datetime.now(UTC), "node-4 to node-7 restored", 4)

            async def restored() -> pb.Job:
                current = await job()
                assert current.share.guaranteed and current.share.units == 8
                assert current.decision.outcome == job_pb2.ADMISSION_OUTCOME_ADMITTED
                return current

            back = await assert_eventually(restored)
            assert back.decision.reason.startswith("guaranteed again: capacity 4 -> 8 CPU units")

            # Drained again, then admission restarts: it plans on the stored inventory, not
            # on its settings' 8 units.
            await published(4, datetime.now(UTC), "node-4 to node-7 drained", 5)
            await assert_eventually(withdrawn)
        async with (
            running_service(build, settings(nats_url, database_url)) as host,
            aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
        ):
            stub = pb_grpc.AdmissionServiceStub(channel)
            # 8 units could run 100,000 steps in 2,500 s; 4 units (26 steps/s: 3,846 s)
            # cannot by +1h.
            late = await submit(stub, spec(100_000, datetime.now(UTC) + timedelta(hours=1)))
            assert late.state == pb.JOB_STATE_REJECTED, late.decision.reason
            kept = (await stub.GetJob(pb.GetJobRequest(job_id=hog.job_id))).job
            assert kept.share.units == 4 and not kept.share.guaranteed
    finally:
        await bus.close()


async def _at_least(count: int, messages: Awaitable[list[Msg]]) -> list[Msg]:
    found = await messages
    assert len(found) >= count, f"{len(found)} messages, expected {count}"
    return found


async def test_units_no_curve_can_use_are_lent_as_headroom_until_a_job_needs_them(
    stub: pb_grpc.AdmissionServiceAsyncStub, nats_url: str
) -> None:
    small = spec(10_000_000)
    del small.profile.points[2:]  # at most 2 workers + 1 PS: 4 units with the chief
    first = await submit(stub, small)
    assert first.share.units == 4 and first.share.headroom_units == 4
    # Its share (what the optimizer plans within) is the whole cluster while it is alone.
    assert first.share.share.cpu == 8.0 and first.share.share.memory_bytes == 32 * GIB
    second = await submit(stub, small)
    assert second.share.units == 4 and second.share.headroom_units == 0
    # The first job's headroom went back the moment the second needed it: share v2.
    now = (await stub.GetJob(pb.GetJobRequest(job_id=first.job_id))).job
    assert now.share.version == 2 and now.share.units == 4
    assert now.share.headroom_units == 0 and now.share.share.cpu == 4.0
    shares = await assert_eventually(
        lambda: _at_least(2, stream_messages(nats_url, topics.JOB_SHARE.subject(first.job_id)))
    )
    assert job_pb2.JobShare.FromString(shares[-1].data).share.cpu == 4.0
