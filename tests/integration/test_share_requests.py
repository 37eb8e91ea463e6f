"""The optimizer asks admission for share, and admission answers (issue 39), on real NATS,
PostgreSQL and gRPC, with both services running.

The cluster is 16 cores and 32 GiB: 16 CPU units of 1 core and 2 GiB. Three simulated
jobs declare the profile of :mod:`test_admission_guarantees` (3 to 8 units), and the
optimizer's cold start gives each a chief of 1 core and 2 GiB, a PS of 4 GiB and a worker
of 4 GiB: 10 GiB, more memory than a share of 4 units holds, so plan 1 of such a job is
itself asked of admission. Once the three plans run, 30 of the 32 GiB are held. A worker's
OOM kill makes the optimizer double the worker's memory (DLRover-RM sec. 5.3): 14 GiB,
beyond the smallest job's share, so it asks admission, which has no room until another job
ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from sqlalchemy import create_engine, text

from stride.admission.app import build as build_admission
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.db.engine import schema_for
from stride.events.v1 import job_pb2, plan_pb2, pod_pb2
from stride.optimizer.app import build as build_optimizer
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

from .test_admission_guarantees import spec
from .test_optimizer_stages import settings as optimizer_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GIB = 1024**3


@dataclass
class Suite:
    admission: Any
    optimizer: Any
    bus: Bus
    nats_url: str
    database_url: str
    admission_port: int


@pytest.fixture
async def suite(nats_url: str, postgres_url: str) -> AsyncIterator[Suite]:
    admission_values = local_settings(
        AdmissionSettings,
        nats_url=nats_url,
        database_url=postgres_url,
        capacity_source="settings",
        cluster_cpu=16.0,
        cluster_memory_gib=32.0,
    )
    async with running_service(build_admission, admission_values) as admission_host:
        port = admission_host.server.port
        values = optimizer_settings(
            nats_url, postgres_url, admission_address=f"127.0.0.1:{port}", enforce_shares=True
        )
        async with (
            running_service(build_optimizer, values) as optimizer_host,
            aio_channel(f"127.0.0.1:{port}", "admission") as channel,
            aio_channel(f"127.0.0.1:{optimizer_host.server.port}", "optimizer") as plans,
        ):
            bus = await producer_bus(nats_url, name="test-podwatcher")
            try:
                yield Suite(
                    pb_grpc.AdmissionServiceStub(channel),
                    optimizer_grpc.OptimizerServiceStub(plans),
                    bus,
                    nats_url,
                    postgres_url,
                    port,
                )
            finally:
                await bus.close()


async def newest_plan(suite: Suite, job_id: str, at_least: int = 1) -> plan_pb2.ResourcePlan:
    async def probe() -> plan_pb2.ResourcePlan:
        found = await stream_messages(suite.nats_url, topics.PLAN.subject(job_id))
        assert len(found) >= at_least, f"{len(found)} plans of {job_id}"
        return plan_pb2.ResourcePlan.FromString(found[-1].data)

    return await assert_eventually(probe, timeout=30)


def admission_rows(suite: Suite, table: str) -> dict[str, dict[str, Any]]:
    """Admission's rows of ``table`` by job (read from its schema, as an operator would)."""
    schema = schema_for(suite.database_url, "admission")
    engine = create_engine(suite.database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            rows = connection.execute(text(f'SELECT * FROM "{schema}".{table}'))
            return {row.job_id: dict(row._mapping) for row in rows}
    finally:
        engine.dispose()


def totals(plan: plan_pb2.ResourcePlan) -> tuple[float, float]:
    cpu = sum(role.count * role.cpu for role in plan.roles)
    return cpu, sum(role.count * role.memory_bytes for role in plan.roles) / GIB


def worker_memory(plan: plan_pb2.ResourcePlan) -> int:
    return next(r.memory_bytes for r in plan.roles if r.role == plan_pb2.ROLE_WORKER)


async def jobs_filling_the_cluster(suite: Suite, count: int) -> list[str]:
    """Submit ``count`` jobs and wait until their plans run (10 GiB each), admission has
    recorded what each holds, and no request is left queued."""
    jobs = [
        (await suite.admission.SubmitJob(pb.SubmitJobRequest(spec=spec(10**9)))).job.job_id
        for _ in range(count)
    ]

    async def settled() -> bool:
        held = admission_rows(suite, "holdings")
        for job_id in jobs:
            plan = await newest_plan(suite, job_id)
            assert totals(plan)[1] == 10.0, (job_id, totals(plan))
            assert job_id in held and held[job_id]["plan_version"] == plan.version, held
        queued = [
            r for r in admission_rows(suite, "share_requests").values() if r["state"] == "queued"
        ]
        assert not queued, queued
        return True

    await assert_eventually(settled, timeout=40)
    return jobs


async def smallest_share(suite: Suite, jobs: list[str]) -> str:
    """The job whose share holds the least memory."""
    shares = {
        job_id: (await suite.admission.GetJob(pb.GetJobRequest(job_id=job_id))).job.share
        for job_id in jobs
    }
    return min(jobs, key=lambda job_id: (shares[job_id].share.memory_bytes, job_id))


async def oom_kill(
    suite: Suite, job_id: str, role: plan_pb2.Role.ValueType = plan_pb2.ROLE_WORKER
) -> None:
    name = "worker" if role == plan_pb2.ROLE_WORKER else "ps"
    event = pod_pb2.PodEvent(
        job_id=job_id,
        pod_name=f"{job_id}-{name}-0",
        role=role,
        index=0,
        phase=pod_pb2.POD_PHASE_FAILED,
        reason=pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
    )
    await suite.bus.publish(topics.POD_FAILED, job_id, event, f"{job_id}.oom.{name}")


async def finish(suite: Suite, job_id: str) -> None:
    end = job_pb2.JobFinished(job_id=job_id, outcome=job_pb2.JOB_OUTCOME_SUCCEEDED, message="done")
    await suite.bus.publish(topics.JOB_FINISHED, job_id, end, f"{job_id}.finished")


async def explained(suite: Suite, job_id: str) -> list[str]:
    reply = await suite.optimizer.ListOptimizationEvents(
        optimizer_pb.ListOptimizationEventsRequest(job_id=job_id)
    )
    return [event.detail for event in reply.events]


async def test_a_held_oom_fix_waits_for_memory_and_is_granted_when_another_job_finishes(
    suite: Suite,
) -> None:
    jobs = await jobs_filling_the_cluster(suite, 3)
    job = await smallest_share(suite, jobs)
    before = await newest_plan(suite, job)
    share = (await suite.admission.GetJob(pb.GetJobRequest(job_id=job))).job.share
    assert share.share.memory_bytes < 14 * GIB, share  # the fix is beyond it
    await oom_kill(suite, job)

    # No room (2 GiB free): admission queues the fix, and the optimizer suspends the job
    # (no pods, so its worker is not killed again into a failure) rather than relaunching
    # it as it was.
    suspended = await newest_plan(suite, job, before.version + 1)
    assert totals(suspended) == (0.0, 0.0), suspended
    assert "waits for memory" in suspended.reason and "queued" in suspended.reason
    request = admission_rows(suite, "share_requests")[job]
    assert request["state"] == "queued" and "GiB are free" in request["reason"], request
    assert request["request"]["safety"] is True
    assert request["request"]["wanted_memory_gib"] == 14.0  # 2 + 4 + 8: the chief counted
    assert any("waits for memory" in detail for detail in await explained(suite, job))

    # Another job ends: admission grants the queued fix and raises the share; the job
    # resumes with its worker's memory doubled.
    await finish(suite, next(other for other in jobs if other != job))
    resumed = await newest_plan(suite, job, suspended.version + 1)
    assert worker_memory(resumed) == 2 * worker_memory(before), resumed
    assert "resumed with its OOM fix" in resumed.reason, resumed.reason
    assert totals(resumed)[1] == 14.0
    granted = admission_rows(suite, "share_requests")[job]
    assert granted["state"] == "granted" and "granted when" in granted["reason"], granted
    shown = (await suite.admission.GetJob(pb.GetJobRequest(job_id=job))).job
    assert shown.share.granted.memory_bytes == 14 * GIB
    assert shown.share.share.memory_bytes >= 14 * GIB


@pytest.fixture
async def optimizer_identity(suite: Suite) -> AsyncIterator[Any]:
    """Admission's API as the optimizer calls it: its own certificate, no user token."""
    async with aio_channel(
        f"127.0.0.1:{suite.admission_port}", "admission", identity="optimizer", token=None
    ) as channel:
        yield pb_grpc.AdmissionServiceStub(channel)


def growth(
    job_id: str,
    version: int,
    cpu: float,
    memory_gib: float,
    held: tuple[float, float] = (8.0, 10.0),
) -> pb.RequestShareRequest:
    return pb.RequestShareRequest(
        job_id=job_id,
        plan_version=version,
        held=job_pb2.ResourceShare(cpu=held[0], memory_bytes=int(held[1] * GIB)),
        wanted=job_pb2.ResourceShare(cpu=cpu, memory_bytes=int(memory_gib * GIB)),
        throughput_now=100.0,
        throughput_wanted=180.0,
        remaining_samples=10**7,
        pause_seconds=5.0,
        cause="model: faster",
    )


async def test_a_growth_is_queued_while_the_cluster_is_full_and_refused_beyond_it(
    suite: Suite, optimizer_identity: Any
) -> None:
    jobs = await jobs_filling_the_cluster(suite, 3)
    job = await smallest_share(suite, jobs)
    other = next(o for o in jobs if o != job)
    held = totals(await newest_plan(suite, job))
    version = (await newest_plan(suite, job)).version

    cpu, memory = held
    full = await optimizer_identity.RequestShare(growth(job, version, cpu, memory + 4, held))
    assert not full.granted and full.queued
    assert "queued" in full.reason and "2 GiB are free" in full.reason, full.reason
    assert admission_rows(suite, "share_requests")[job]["state"] == "queued"

    # Beyond the whole cluster: refused for good, not queued.
    huge = await optimizer_identity.RequestShare(growth(job, version, cpu, 64.0, held))
    assert not huge.granted and not huge.queued
    assert "more than the cluster's 16 cores and 32 GiB" in huge.reason, huge.reason

    # Queued again, then granted by the settlement when another job ends.
    await optimizer_identity.RequestShare(growth(job, version, cpu, memory + 4, held))
    await finish(suite, other)

    async def granted() -> bool:
        row = admission_rows(suite, "share_requests")[job]
        assert row["state"] == "granted", row
        shown = (await suite.admission.GetJob(pb.GetJobRequest(job_id=job))).job
        assert shown.share.granted.memory_bytes == (memory + 4) * GIB, shown.share
        assert shown.share.share.memory_bytes >= (memory + 4) * GIB
        return True

    await assert_eventually(granted, timeout=30)


async def test_share_requests_come_from_the_optimizer_only_and_bad_ones_are_named(
    suite: Suite, optimizer_identity: Any
) -> None:
    job = (await jobs_filling_the_cluster(suite, 1))[0]
    before = admission_rows(suite, "share_requests")
    # An admin's token is not the optimizer's identity.
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await suite.admission.RequestShare(growth(job, 1, 12.0, 10.0))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    cases = {
        "wanted.cpu": growth(job, 1, -1.0, 10.0),
        "plan_version": growth(job, -1, 12.0, 10.0),
        "job_id": growth("bad id!", 1, 12.0, 10.0),
        "throughput_wanted": pb.RequestShareRequest(
            job_id=job,
            plan_version=1,
            held=job_pb2.ResourceShare(cpu=1.0),
            wanted=job_pb2.ResourceShare(cpu=2.0),
            throughput_wanted=float("nan"),
        ),
    }
    for field, message in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await optimizer_identity.RequestShare(message)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field in (bad.value.details() or ""), (field, bad.value.details())
    missing = growth(job, 1, 12.0, 10.0)
    missing.ClearField("wanted")
    with pytest.raises(grpc.aio.AioRpcError) as absent:
        await optimizer_identity.RequestShare(missing)
    assert "wanted" in (absent.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await optimizer_identity.RequestShare(growth("job-nobody", 1, 12.0, 10.0))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    # Nothing was half-written by the refused calls.
    assert admission_rows(suite, "share_requests") == before
