"""Quotas of users and teams on the live admission service (real NATS, PostgreSQL and
SQLite, through gRPC and the CLI): from the quotas file and the admin API, each with a
hand-counted case, and bad input that changes nothing."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.runtime.errors import StartupError
from stride.testing.channels import aio_channel
from stride.testing.inprocess import local_settings, running_service

pytestmark = pytest.mark.integration

QUOTAS = """
quotas:
  - scope: team:ranking
    members: [alice, bob]
    max_active_jobs: 3
  - scope: user:carol
    max_submissions: 2
    window_seconds: 3600
"""


def spec(user: str, name: str = "ctr") -> job_pb2.JobSpec:
    """A best-effort job with no curve: admitted (sized by the optimizer), so it stays
    active and counts against its user's and team's quotas."""
    return job_pb2.JobSpec(
        name=name,
        user=user,
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wd:main"),
        dataset=job_pb2.DatasetSpec(name="criteo", record_count=1_000_000),
        batch_size=512,
        termination=job_pb2.Termination(max_steps=1000),
        simulated=True,
    )


def settings(nats_url: str, database_url: str, quotas: Path | None) -> AdmissionSettings:
    return local_settings(
        AdmissionSettings, nats_url=nats_url, database_url=database_url, quotas_file=quotas
    )


@pytest.fixture
def quotas_file(tmp_path: Path) -> Path:
    path = tmp_path / "quotas.yaml"
    path.write_text(QUOTAS)
    return path


@pytest.fixture
async def stub(
    nats_url: str, database_url: str, quotas_file: Path
) -> AsyncIterator[pb_grpc.AdmissionServiceAsyncStub]:
    async with (
        running_service(build, settings(nats_url, database_url, quotas_file)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        yield pb_grpc.AdmissionServiceStub(channel)


async def submit(stub: pb_grpc.AdmissionServiceAsyncStub, user: str) -> pb.Job:
    return (await stub.SubmitJob(pb.SubmitJobRequest(spec=spec(user)))).job


async def test_a_team_quota_counts_every_member_and_frees_with_an_end(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    # team:ranking allows 3 active jobs among alice and bob; dave is not in it.
    first = await submit(stub, "alice")
    await submit(stub, "bob")
    await submit(stub, "alice")
    assert {first.state} == {pb.JOB_STATE_ADMITTED}
    fourth = await submit(stub, "bob")
    assert fourth.state == pb.JOB_STATE_REJECTED
    assert fourth.decision.reason.startswith(
        "over the quota of team:ranking: 4 active (admitted or queued) jobs would exceed the "
        "quota of 3"
    ), fourth.decision.reason
    assert (await submit(stub, "dave")).state == pb.JOB_STATE_ADMITTED
    status = (await stub.GetQuota(pb.GetQuotaRequest(scope="team:ranking"))).status
    assert status.use.active_jobs == 3 and status.quota.source == "config"
    # One ends: the team may run another.
    await stub.CancelJob(pb.CancelJobRequest(job_id=first.job_id))
    assert (await submit(stub, "bob")).state == pb.JOB_STATE_ADMITTED


async def test_a_submission_quota_counts_a_window_and_the_api_wins_over_the_file(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    # user:carol: 2 submissions an hour. The third is refused, and refusals count too.
    assert (await submit(stub, "carol")).state == pb.JOB_STATE_ADMITTED
    assert (await submit(stub, "carol")).state == pb.JOB_STATE_ADMITTED
    third = await submit(stub, "carol")
    assert third.state == pb.JOB_STATE_REJECTED
    assert "3 submissions within 3600 s exceed the quota of 2" in third.decision.reason
    # The admin raises it through the API; the file's quota is replaced.
    raised = await stub.SetQuota(
        pb.SetQuotaRequest(quota=pb.Quota(scope="user:carol", max_submissions=10))
    )
    assert raised.status.quota.source == "api" and raised.status.use.submissions == 3
    assert raised.status.quota.window_seconds == 86400  # 0: one day
    assert (await submit(stub, "carol")).state == pb.JOB_STATE_ADMITTED
    listed = (await stub.ListQuotas(pb.ListQuotasRequest())).quotas
    assert [(q.quota.scope, q.quota.source) for q in listed] == [
        ("team:ranking", "config"),
        ("user:carol", "api"),
    ]
    await stub.DeleteQuota(pb.DeleteQuotaRequest(scope="user:carol"))
    with pytest.raises(grpc.aio.AioRpcError) as raised_error:
        await stub.GetQuota(pb.GetQuotaRequest(scope="user:carol"))
    assert raised_error.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_quota_set_through_the_api_outlives_a_restart_over_the_file(
    nats_url: str, database_url: str, quotas_file: Path
) -> None:
    for round_ in range(2):
        async with (
            running_service(build, settings(nats_url, database_url, quotas_file)) as host,
            aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
        ):
            stub = pb_grpc.AdmissionServiceStub(channel)
            if round_ == 0:
                await stub.SetQuota(
                    pb.SetQuotaRequest(
                        quota=pb.Quota(
                            scope="team:ranking",
                            members=["alice"],
                            max_active_jobs=9,
                            max_priority=job_pb2.PRIORITY_HIGH,
                            allow_simulated=True,
                        )
                    )
                )
            else:
                kept = (await stub.GetQuota(pb.GetQuotaRequest(scope="team:ranking"))).status
                assert kept.quota.max_active_jobs == 9 and kept.quota.source == "api"
                assert list(kept.quota.members) == ["alice"]
                assert kept.quota.max_priority == job_pb2.PRIORITY_HIGH
                assert kept.quota.allow_simulated


BAD_QUOTAS = [
    (pb.Quota(scope="alice", max_active_jobs=1), "INVALID_ARGUMENT", "quota.scope: 'alice'"),
    (pb.Quota(scope="user:al ice", max_active_jobs=1), "INVALID_ARGUMENT", "quota.scope"),
    (pb.Quota(scope="user:alice"), "INVALID_ARGUMENT", "quota: sets no limit and grants nothing"),
    (
        pb.Quota(scope="user:alice", max_priority=job_pb2.PRIORITY_LOW),
        "INVALID_ARGUMENT",
        "quota.max_priority: 'low' cannot be granted: give high",
    ),
    (
        pb.Quota(scope="user:alice", max_priority=9),  # type: ignore[arg-type]
        "INVALID_ARGUMENT",
        "quota.max_priority: '9' cannot be granted",
    ),
    (
        pb.Quota(scope="team:x", max_active_jobs=1),
        "INVALID_ARGUMENT",
        "quota.members: a team needs at least one member",
    ),
    (
        pb.Quota(scope="user:alice", max_active_jobs=1, members=["bob"]),
        "INVALID_ARGUMENT",
        "quota.members: only a team has members",
    ),
    (
        pb.Quota(scope="user:alice", max_active_jobs=-1),
        "INVALID_ARGUMENT",
        "quota.max_active_jobs",
    ),
    (
        pb.Quota(scope="user:alice", max_active_jobs=1, window_seconds=float("nan")),
        "INVALID_ARGUMENT",
        "quota.window_seconds",
    ),
    (
        pb.Quota(scope="user:alice", max_active_jobs=1, source="config"),
        "INVALID_ARGUMENT",
        "quota.source",
    ),
]


async def test_bad_quotas_are_refused_naming_the_field(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    for quota, code, starts in BAD_QUOTAS:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.SetQuota(pb.SetQuotaRequest(quota=quota))
        assert raised.value.code().name == code, quota
        assert str(raised.value.details()).startswith(starts), raised.value.details()
    listed = (await stub.ListQuotas(pb.ListQuotasRequest())).quotas
    assert [q.quota.scope for q in listed] == ["team:ranking", "user:carol"]  # unchanged


async def test_a_quota_below_current_use_is_set_its_jobs_stay_and_new_ones_are_rejected(
    stub: pb_grpc.AdmissionServiceAsyncStub,
) -> None:
    """Issue 37, finding 6: an admin clamps a user who holds more than the new quota (it
    was refused as 'below current use', leaving the admin no way to)."""
    held = [await submit(stub, "erin") for _ in range(3)]
    clamped = await stub.SetQuota(
        pb.SetQuotaRequest(quota=pb.Quota(scope="user:erin", max_active_jobs=1))
    )
    assert clamped.status.quota.max_active_jobs == 1 and clamped.status.use.active_jobs == 3
    for job in held:  # what runs keeps running
        kept = (await stub.GetJob(pb.GetJobRequest(job_id=job.job_id))).job
        assert kept.state == pb.JOB_STATE_ADMITTED, kept
    refused = await submit(stub, "erin")
    assert refused.state == pb.JOB_STATE_REJECTED
    assert refused.decision.reason.startswith(
        "over the quota of user:erin: 4 active (admitted or queued) jobs would exceed the "
        "quota of 1"
    ), refused.decision.reason
    # A team's quota, too; its members' jobs stay.
    await submit(stub, "alice")
    await submit(stub, "bob")
    team = await stub.SetQuota(
        pb.SetQuotaRequest(
            quota=pb.Quota(scope="team:ranking", members=["alice", "bob"], max_active_jobs=1)
        )
    )
    assert team.status.use.active_jobs == 2
    assert (await submit(stub, "bob")).state == pb.JOB_STATE_REJECTED
    # Once the use falls below the quota, a job is admitted again.
    for job in held:
        await stub.CancelJob(pb.CancelJobRequest(job_id=job.job_id))
    assert (await submit(stub, "erin")).state == pb.JOB_STATE_ADMITTED


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "quotas:\n  - {scope: user:a, max_jobs: 1}\n",
            "quotas_file.quotas[0].max_jobs: unknown key",
        ),
        ("quotas:\n  - {scope: team:t, max_active_jobs: 1}\n", "quotas[0].members: a team needs"),
        ("quotas: [\n", "quotas_file"),
        (
            "quotas:\n  - {scope: user:a, max_active_jobs: 1}\n"
            "  - {scope: user:a, max_submissions: 1}\n",
            "quotas_file.quotas[1].scope: 'user:a' is given twice",
        ),
    ],
)
async def test_a_bad_quotas_file_stops_start_up_naming_the_entry(
    nats_url: str, database_url: str, tmp_path: Path, text: str, words: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(StartupError) as raised:
        async with running_service(build, settings(nats_url, database_url, path)):
            pass
    assert words in str(raised.value), raised.value


async def test_stride_quota_as_a_user_runs_it(
    nats_url: str, database_url: str, quotas_file: Path
) -> None:
    async with running_service(build, settings(nats_url, database_url, quotas_file)) as host:
        env = {
            **os.environ,
            "STRIDE_ADMISSION_ADDRESS": f"127.0.0.1:{host.server.port}",
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }

        async def cli(*args: str) -> tuple[int, str, str]:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "stride.cli",
                "quota",
                *args,
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await process.communicate()
            return int(process.returncode or 0), out.decode(), err.decode()

        code, out, err = await cli("set", "user:erin", "--max-active-jobs", "2")
        assert code == 0 and "user:erin" in out and "0 of 2" in out, (out, err)
        code, out, err = await cli(
            "set", "user:frank", "--max-priority", "high", "--allow-simulated"
        )
        assert code == 0 and "high, simulated" in out, (out, err)
        code, out, err = await cli("set", "user:frank", "--max-priority", "urgent")
        assert code == 2 and "--max-priority: 'urgent' is not a priority" in err, err
        code, out, err = await cli()
        assert code == 0 and "team:ranking" in out and "alice, bob" in out, (out, err)
        code, out, err = await cli("set", "erin", "--max-active-jobs", "2")
        assert code == 2 and "quota.scope: 'erin' is not user:<name> or team:<name>" in err, err
