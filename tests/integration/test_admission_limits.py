"""Issue 37, findings 6 and 7, reproduced against the live admission service (real NATS,
PostgreSQL and SQLite, mutual TLS and user tokens) and shown to be stopped:

- one user's flood of submissions is throttled by the default rate per user, then by the
  default cap on their active jobs, while another user's submissions go through;
- an admin clamps a user below what they hold: their jobs stay, new ones are rejected;
- ``simulated: true`` and ``priority: high`` are refused a user unless an admin submits
  them or a quota grants them;
- a 3.9 MB SubmitJob is refused by gRPC before it is decoded, and admission's memory does
  not grow with many of them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import pytest

from stride.admission.app import build
from stride.admission.settings import SUBMIT_REQUEST_BYTES, AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.testing.channels import aio_channel, user_token
from stride.testing.eventually import assert_eventually
from stride.testing.health import SERVING, equals, health
from stride.testing.inprocess import local_settings, running_service
from stride.testing.processes import ServiceProcess
from stride.vocabulary.jobspec import MAX_SPEC_BYTES

pytestmark = pytest.mark.integration

Refused = tuple[grpc.StatusCode, str]
RETRY = re.compile(r"retry in (\d+\.\d{3}) s")


def request(**changes: Any) -> pb.SubmitJobRequest:
    """A best-effort job with no curve: admitted at once (the optimizer sizes it), so it
    stays active and counts against its user's cap. No user: the token's."""
    spec = job_pb2.JobSpec(
        name="ctr",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wd:main"),
        dataset=job_pb2.DatasetSpec(name="criteo", record_count=1_000_000),
        batch_size=512,
        termination=job_pb2.Termination(max_steps=1000),
        **changes,
    )
    return pb.SubmitJobRequest(spec=spec)


async def attempt(call: Awaitable[pb.SubmitJobResponse]) -> pb.Job | Refused:
    """The job a submission stored, or its refusal's code and message."""
    try:
        return (await call).job
    except grpc.aio.AioRpcError as error:
        return error.code(), str(error.details())


@contextlib.asynccontextmanager
async def as_user(
    address: str, user: str, admin: bool | None = None
) -> AsyncIterator[pb_grpc.AdmissionServiceAsyncStub]:
    async with aio_channel(address, "admission", token=user_token(user, admin=admin)) as channel:
        yield pb_grpc.AdmissionServiceStub(channel)


@pytest.fixture
async def admission(nats_url: str, database_url: str) -> AsyncIterator[str]:
    """Admission with its default limits (5 submissions a second per user, burst 20; 50
    active jobs a user)."""
    settings = local_settings(AdmissionSettings, nats_url=nats_url, database_url=database_url)
    assert (settings.submit_rate_per_second, settings.submit_rate_burst) == (5.0, 20)
    assert settings.default_max_active_jobs == 50
    async with running_service(build, settings) as host:
        yield f"127.0.0.1:{host.server.port}"


async def submit_honouring_retries(
    stub: pb_grpc.AdmissionServiceAsyncStub, **changes: Any
) -> pb.Job | Refused:
    """Submit until the answer is not a rate refusal, waiting as each refusal says (the
    server's own hint, which is what a well-behaved client does)."""
    while True:
        outcome = await attempt(stub.SubmitJob(request(**changes)))
        if isinstance(outcome, pb.Job) or not outcome[1].startswith("submission rate"):
            return outcome
        hint = RETRY.search(outcome[1])
        assert hint is not None, outcome
        await asyncio.sleep(float(hint.group(1)))


@pytest.mark.timeout(180)
async def test_a_flood_is_throttled_by_rate_then_by_the_cap_and_another_user_is_not(
    admission: str,
) -> None:
    async with (
        as_user(admission, "alice") as alice,
        as_user(admission, "bob") as bob,
        as_user(admission, "admin") as admin,
    ):

        async def bob_steadily() -> list[pb.Job | Refused]:
            outcomes = []
            for _ in range(5):
                outcomes.append(await attempt(bob.SubmitJob(request())))
            return outcomes

        began = time.monotonic()
        flood, bobs = await asyncio.gather(
            asyncio.gather(*(attempt(alice.SubmitJob(request())) for _ in range(200))),
            bob_steadily(),
        )
        elapsed = time.monotonic() - began
        stored = [o for o in flood if isinstance(o, pb.Job)]
        refused = [o for o in flood if not isinstance(o, pb.Job)]
        # The burst, and what the rate refilled meanwhile; the rest refused, nothing stored.
        assert 20 <= len(stored) <= 20 + 5 * elapsed + 1, (len(stored), elapsed)
        for code, details in refused:
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert details.startswith(
                "submission rate: user 'alice' submits more than 5 jobs a second (burst 20"
            ), details
            assert RETRY.search(details), details
        assert all(isinstance(o, pb.Job) and o.spec.user == "bob" for o in bobs), bobs
        listed = (await admin.ListJobs(pb.ListJobsRequest(user="alice", page_size=1000))).jobs
        assert len(listed) == len(stored)

        # Alice keeps on at the rate allowed: the cap of 50 active jobs stops her there.
        held = len(stored)
        while True:
            outcome = await submit_honouring_retries(alice)
            if not isinstance(outcome, pb.Job):
                break
            held += 1
        code, details = outcome
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert held == 50
        assert details.startswith(
            "max_active_jobs: user 'alice' holds 50 active (admitted or queued) jobs, at the "
            "default limit of 50 a user (STRIDE_ADMISSION_DEFAULT_MAX_ACTIVE_JOBS)"
        ), details
        # Bob is held to neither; an admin (a replay, on alice's behalf) is not either.
        assert isinstance(await attempt(bob.SubmitJob(request())), pb.Job)
        on_behalf = request()
        on_behalf.spec.user = "alice"
        assert isinstance(await attempt(admin.SubmitJob(on_behalf)), pb.Job)
        # Two of alice's jobs end (51 active, with the admin's): she may submit one again.
        listed = (await admin.ListJobs(pb.ListJobsRequest(user="alice", page_size=1000))).jobs
        for job in listed[:2]:
            await admin.CancelJob(pb.CancelJobRequest(job_id=job.job_id))
        assert isinstance(await submit_honouring_retries(alice), pb.Job)


async def test_an_admin_clamps_a_user_below_what_they_hold(admission: str) -> None:
    async with as_user(admission, "alice") as alice, as_user(admission, "admin") as admin:
        held = [await attempt(alice.SubmitJob(request())) for _ in range(4)]
        assert all(isinstance(job, pb.Job) for job in held)
        clamped = await admin.SetQuota(
            pb.SetQuotaRequest(quota=pb.Quota(scope="user:alice", max_active_jobs=3))
        )
        assert clamped.status.use.active_jobs == 4
        for job in held:
            assert isinstance(job, pb.Job)
            kept = (await admin.GetJob(pb.GetJobRequest(job_id=job.job_id))).job
            assert kept.state == pb.JOB_STATE_ADMITTED
        refused = await attempt(alice.SubmitJob(request()))
        assert isinstance(refused, pb.Job) and refused.state == pb.JOB_STATE_REJECTED
        assert refused.decision.reason.startswith(
            "over the quota of user:alice: 5 active (admitted or queued) jobs would exceed the "
            "quota of 3"
        ), refused.decision.reason


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        (
            {"simulated": True},
            "spec.simulated: user 'alice' may not submit simulated jobs (they hold a share of "
            "the cluster and run no pods): an admin may, or a user whose quota sets "
            "allow_simulated",
        ),
        (
            {"priority": job_pb2.PRIORITY_HIGH},
            "spec.priority: high is above user 'alice''s class (normal): an admin may submit "
            "it, or a user whose quota sets max_priority high",
        ),
    ],
    ids=["simulated", "priority-high"],
)
async def test_fields_that_grant_power_need_an_admin_or_a_granting_quota(
    admission: str, changes: dict[str, Any], refusal: str
) -> None:
    async with (
        as_user(admission, "alice") as alice,
        as_user(admission, "bob") as bob,
        as_user(admission, "admin") as admin,
    ):
        outcome = await attempt(alice.SubmitJob(request(**changes)))
        assert not isinstance(outcome, pb.Job), outcome
        assert outcome[0] == grpc.StatusCode.PERMISSION_DENIED, outcome
        assert outcome[1].startswith(refusal), outcome
        assert not (await admin.ListJobs(pb.ListJobsRequest(user="alice"))).jobs  # none stored
        # Every user may ask for normal and low; an admin may set either field.
        for priority in (job_pb2.PRIORITY_LOW, job_pb2.PRIORITY_NORMAL):
            assert isinstance(await attempt(alice.SubmitJob(request(priority=priority))), pb.Job)
        for_alice = request(**changes)
        for_alice.spec.user = "alice"
        assert isinstance(await attempt(admin.SubmitJob(for_alice)), pb.Job)

        # A quota grants it: a user's own, or a team's to its members.
        def grant(scope: str, *members: str) -> pb.SetQuotaRequest:
            quota = pb.Quota(
                scope=scope,
                members=members,
                max_priority=job_pb2.PRIORITY_HIGH,
                allow_simulated=True,
            )
            return pb.SetQuotaRequest(quota=quota)

        set_ = await admin.SetQuota(grant("user:alice"))
        assert set_.status.quota.max_priority == job_pb2.PRIORITY_HIGH
        assert set_.status.quota.allow_simulated
        job = await attempt(alice.SubmitJob(request(**changes)))
        assert isinstance(job, pb.Job) and job.spec.user == "alice", job
        assert not isinstance(await attempt(bob.SubmitJob(request(**changes))), pb.Job)
        await admin.SetQuota(grant("team:ml", "bob"))
        assert isinstance(await attempt(bob.SubmitJob(request(**changes))), pb.Job)
        # The user reads what their quota grants.
        mine = (await bob.GetQuota(pb.GetQuotaRequest(scope="team:ml"))).status.quota
        assert mine.allow_simulated and mine.max_priority == job_pb2.PRIORITY_HIGH


def peak_memory_bytes(pid: int) -> int:
    """A process's peak resident memory (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


BIG = 3_900_000
CONCURRENT = 40


@pytest.mark.timeout(180)
async def test_a_huge_submission_is_refused_before_it_is_decoded(
    nats_url: str, database_url: str, tmp_path: Path
) -> None:
    """Finding 7: 100 concurrent 3.9 MB SubmitJobs grew admission to 834 MiB, gRPC's 4 MiB
    default taking each whole before the spec's 256 KiB rule could refuse it. Admission
    runs as its own process here, so its memory is its own."""
    process = ServiceProcess(
        "admission",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_ADMISSION_DATABASE_URL": database_url,
            "STRIDE_ADMISSION_LOG_LEVEL": "WARNING",
        },
        tmp_path,
    ).start()
    try:
        service = "stride.api.admission.v1.AdmissionService"
        await assert_eventually(
            lambda: equals(health(process.port, service), SERVING), timeout=60, interval=0.2
        )
        assert process.process is not None
        pid = process.process.pid
        async with aio_channel(process.address, "admission") as channel:
            stub = pb_grpc.AdmissionServiceStub(channel)
            assert isinstance(await attempt(stub.SubmitJob(request())), pb.Job)  # warmed up
            before = peak_memory_bytes(pid)
            big = request()
            big.spec.hyperparameters["blob"] = "x" * BIG
            payload = big.SerializeToString()
            raw = channel.unary_unary(
                f"/{service}/SubmitJob", None, pb.SubmitJobResponse.FromString
            )
            outcomes = await asyncio.gather(*(attempt(raw(payload)) for _ in range(CONCURRENT)))
            for outcome in outcomes:
                assert outcome == (
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    "SERVER: Received message larger than max "
                    f"({len(payload)} vs. {SUBMIT_REQUEST_BYTES})",
                ), outcome
            # Held whole (as at gRPC's 4 MiB default: its peak grew 140-160 MiB here), the
            # requests take CONCURRENT x 3.9 MB = 156 MB. Refused at the limit with HTTP/2's
            # windows grown by bandwidth probing, 25-45 MiB; with the default windows a
            # small-request server keeps (grpc_server.SMALL_REQUESTS_BYTES), a few MiB.
            grown = peak_memory_bytes(pid) - before
            assert grown < 16 * 2**20, f"admission's peak grew {grown / 2**20:.0f} MiB"
            # A spec just over its own limit is still read, and refused naming it.
            over = request()
            over.spec.user = "admin"  # as the server fills it in, so the size is the same
            over.spec.hyperparameters["blob"] = "x" * MAX_SPEC_BYTES
            refused = await attempt(stub.SubmitJob(over))
            assert refused == (
                grpc.StatusCode.INVALID_ARGUMENT,
                f"spec: {over.spec.ByteSize():,} bytes is over the 262,144-byte limit for a "
                "job spec",
            ), refused
            assert isinstance(await attempt(stub.SubmitJob(request())), pb.Job)
            listed = (await stub.ListJobs(pb.ListJobsRequest())).jobs
            assert len(listed) == 2  # nothing of the refused ones was stored
    finally:
        if process.terminate() != 0:
            print(process.log_text()[-4000:])
