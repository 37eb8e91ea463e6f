"""A job that declares no profile is planned on what similar finished jobs measured: the
config DB (real, fed over the bus as the services feed it) and admission, on real NATS and a
real database, through gRPC.

The past job ran plan v1 (1 PS of 4 cores and 8 GiB, 2 workers of 2 cores and 4 GiB: 8
cores, 16 GiB, so 8 CPU units of 1 core and 4 GiB) at 2,560 samples/s, and plan v2 (4
workers: 12 cores, 24 GiB, 12 units) at 3,584 samples/s; at a batch of 512 that is 5 and 7
steps/s. The admission cluster is 32 units.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from stride.admission.app import build as build_admission
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.api.configdb.v1 import configdb_service_pb2 as configdb_pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as configdb_grpc
from stride.bus import topics
from stride.configdb.app import build as build_configdb
from stride.configdb.settings import ConfigDbSettings
from stride.events.v1 import job_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service

from .test_configdb_service import finished, plan, steps, submitted, valid_spec

pytestmark = pytest.mark.integration


def admission_settings(nats_url: str, database_url: str, configdb: str) -> AdmissionSettings:
    return local_settings(
        AdmissionSettings,
        nats_url=nats_url,
        database_url=database_url,
        cluster_cpu=32.0,
        cluster_memory_gib=128.0,
        configdb_address=configdb,
    )


@pytest.fixture
async def configdb(nats_url: str, postgres_url: str) -> AsyncIterator[ServiceHost]:
    settings = local_settings(ConfigDbSettings, nats_url=nats_url, database_url=postgres_url)
    async with running_service(build_configdb, settings) as host:
        yield host


async def past_job(nats_url: str, configdb: ServiceHost) -> None:
    """A finished job like the new one, measured under two plans."""
    bus = await producer_bus(nats_url, name="test-history")
    job = "job-past"
    chief = f"{job}-chief-0"
    try:
        await bus.publish(topics.JOB_SUBMITTED, job, submitted(job), f"{job}.sub")
        await bus.publish(topics.PLAN, job, plan(job, 1, workers=2), f"{job}.plan.1")
        await bus.publish(topics.PLAN, job, plan(job, 2, workers=4), f"{job}.plan.2")
        await bus.publish(
            topics.STEP_METRICS, job, steps(job, chief, 1, 100, 100, 0.2, 2560.0), "w1"
        )
        await bus.publish(
            topics.STEP_METRICS, job, steps(job, chief, 2, 200, 100, 0.14, 3584.0), "w2"
        )
        await bus.publish(topics.JOB_FINISHED, job, finished(job), f"{job}.finished")
    finally:
        await bus.close()
    async with aio_channel(f"127.0.0.1:{configdb.server.port}", "configdb") as channel:
        stub = configdb_grpc.ConfigDbServiceStub(channel)

        async def recorded() -> bool:
            found = await stub.FindSimilarJobs(
                configdb_pb.FindSimilarJobsRequest(spec=valid_spec(), k=3)
            )
            assert found.jobs and len(found.jobs[0].record.profiles) == 2, found
            return True

        await assert_eventually(recorded, timeout=20)


def new_job(deadline: datetime | None = None) -> job_pb2.JobSpec:
    """The past job's model, no profile: 10,000 steps."""
    spec = valid_spec()
    spec.termination.Clear()
    spec.termination.max_steps = 10_000
    spec.simulated = True
    if deadline is not None:
        spec.deadline.FromDatetime(deadline)
    return spec


async def test_a_job_without_a_profile_is_planned_on_similar_jobs_measurements(
    nats_url: str, postgres_url: str, configdb: ServiceHost
) -> None:
    await past_job(nats_url, configdb)
    address = f"127.0.0.1:{configdb.server.port}"
    settings = admission_settings(nats_url, postgres_url, address)
    deadline = datetime.now(UTC) + timedelta(hours=2)
    async with (
        running_service(build_admission, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        stub = pb_grpc.AdmissionServiceStub(channel)
        job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=new_job(deadline)))).job
        assert job.state == pb.JOB_STATE_ADMITTED, job.decision.reason
        assert job.decision.curve_source == "history"
        assert "curve from the history: 1 similar finished job: job-past" in job.decision.reason
        # Its curve's largest size is the past job's plan v2: 12 units (4 workers + 1 PS).
        assert job.share.units == 12 and job.share.share.workers == 4
    # Restarted, admission plans the job on the same curve, from its books (not the config
    # DB, which could have changed).
    async with (
        running_service(build_admission, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        stub = pb_grpc.AdmissionServiceStub(channel)
        kept = (await stub.GetJob(pb.GetJobRequest(job_id=job.job_id))).job
        assert kept.share.units == 12
        # A second such job shares the cluster with it: 12 + 12 of the 32 units, both on
        # the history's curve.
        second = (await stub.SubmitJob(pb.SubmitJobRequest(spec=new_job()))).job
        assert second.share.units == 12 and second.decision.curve_source == "history"


async def test_without_the_config_db_the_job_is_decided_without_a_curve(
    nats_url: str, postgres_url: str
) -> None:
    # Nothing listens there: the call fails at once, and the submission still gets its
    # answer (a deadline needs a curve: refused, saying what to declare).
    settings = admission_settings(nats_url, postgres_url, "127.0.0.1:1")
    async with (
        running_service(build_admission, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as channel,
    ):
        stub = pb_grpc.AdmissionServiceStub(channel)
        deadline = datetime.now(UTC) + timedelta(hours=2)
        job = (await stub.SubmitJob(pb.SubmitJobRequest(spec=new_job(deadline)))).job
        assert job.state == pb.JOB_STATE_REJECTED
        assert "no scaling curve" in job.decision.reason and "profile:" in job.decision.reason
