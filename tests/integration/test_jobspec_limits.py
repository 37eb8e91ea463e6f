"""What the probe found, on admission and the optimizer sharing a real NATS: a spec over the
size limit and ``embedding_dim: -7`` are refused at submit, so neither strands a job nor
jams the outbox, and the job submitted right after them is admitted and planned."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from stride.admission.app import build as build_admission
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.bus import topics
from stride.events.v1 import job_pb2
from stride.optimizer.app import ADMITTED_DURABLE
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.settings import OptimizerSettings
from stride.runtime.lifecycle import ServiceHost
from stride.testing.channels import aio_channel
from stride.testing.databases import create_database, drop_database
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import dead_letters, stream_messages

pytestmark = pytest.mark.integration

TWO_MIB = 2 * 1024 * 1024
EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "wide-deep.yaml").read_text()


def valid_spec(name: str = "after-the-big-one") -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=name,
        user="alice",
        model=job_pb2.ModelReference(
            name="wide-and-deep", entrypoint="trainers.wide_deep:main", embedding_dim=16
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
        batch_size=512,
        hyperparameters={"learning_rate": "0.001"},
        termination=job_pb2.Termination(max_epochs=2),
    )


@pytest.fixture
def optimizer_database(postgres_url: str) -> Iterator[str]:
    """The optimizer's own database beside admission's (each service owns its storage)."""
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture
async def services(
    nats_url: str, postgres_url: str, optimizer_database: str
) -> AsyncIterator[tuple[ServiceHost, ServiceHost]]:
    admission_settings = local_settings(
        AdmissionSettings, nats_url=nats_url, database_url=postgres_url
    )
    optimizer_settings = local_settings(
        OptimizerSettings, nats_url=nats_url, database_url=optimizer_database
    )
    async with (
        running_service(build_admission, admission_settings) as admission,
        running_service(build_optimizer, optimizer_settings) as optimizer,
    ):
        yield admission, optimizer


async def test_an_oversized_spec_is_refused_and_the_next_job_is_admitted_and_planned(
    services: tuple[ServiceHost, ServiceHost], nats_url: str, tmp_path: Path
) -> None:
    admission, optimizer = services
    # Over the spec's limit but inside SubmitJob's transport limit (the spec's plus a small
    # envelope): refused by the spec rule, naming it.
    big = valid_spec("too-big")
    big.hyperparameters["blob"] = "x" * (260 * 1024)
    huge = valid_spec("far-too-big")
    huge.hyperparameters["blob"] = "x" * TWO_MIB
    async with aio_channel(f"127.0.0.1:{admission.server.port}", "admission") as channel:
        stub = admission_grpc.AdmissionServiceStub(channel)
        # Over the transport limit: gRPC refuses it before anything decodes it.
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.SubmitJob(admission_pb.SubmitJobRequest(spec=huge))
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.SubmitJob(admission_pb.SubmitJobRequest(spec=big))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert raised.value.details() == (
            f"spec: {big.ByteSize():,} bytes is over the 262,144-byte limit for a job spec"
        )

        job = (await stub.SubmitJob(admission_pb.SubmitJobRequest(spec=valid_spec()))).job
        assert job.state == admission_pb.JOB_STATE_ADMITTED
        assert [j.job_id for j in (await stub.ListJobs(admission_pb.ListJobsRequest())).jobs] == [
            job.job_id
        ]

    async with aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as channel:
        planner = optimizer_grpc.OptimizerServiceStub(channel)

        async def plan_v1() -> optimizer_pb.GetPlanResponse:
            try:
                reply = await planner.GetPlan(optimizer_pb.GetPlanRequest(job_id=job.job_id))
            except grpc.aio.AioRpcError as error:
                raise AssertionError(f"no plan yet: {error.code()}") from None
            assert reply.plan.version == 1
            return reply

        await assert_eventually(plan_v1, timeout=30)
    # The big spec never reached the bus: the only job facts are the admitted job's.
    subjects = {m.subject for m in await stream_messages(nats_url, topics.JOBS.subjects[0])}
    assert subjects == {
        topics.JOB_SUBMITTED.subject(job.job_id),
        topics.JOB_ADMITTED.subject(job.job_id),
    }

    # The CLI refuses the same spec before sending it, naming the same limit.
    spec_file = tmp_path / "big.yaml"
    spec_file.write_text(EXAMPLE.replace("optimizer: adam", "blob: " + "x" * TWO_MIB))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env["STRIDE_ADMISSION_ADDRESS"] = f"127.0.0.1:{admission.server.port}"
    env["STRIDE_TLS_DIR"] = os.environ["STRIDE_TLS_DIR"]
    result = subprocess.run(
        [sys.executable, "-m", "stride.cli", "submit", str(spec_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: {spec_file}: spec: ")
    assert line.endswith("bytes is over the 262,144-byte limit for a job spec")


async def test_a_negative_embedding_dim_is_refused_at_submit_not_dead_lettered(
    services: tuple[ServiceHost, ServiceHost], nats_url: str
) -> None:
    admission, _ = services
    spec = valid_spec("negative-embedding")
    spec.model.embedding_dim = -7
    async with aio_channel(f"127.0.0.1:{admission.server.port}", "admission") as channel:
        stub = admission_grpc.AdmissionServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.SubmitJob(admission_pb.SubmitJobRequest(spec=spec))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (raised.value.details() or "").startswith("spec.model.embedding_dim: ")
        assert (await stub.ListJobs(admission_pb.ListJobsRequest())).jobs == []
    assert await stream_messages(nats_url, topics.JOBS.subjects[0]) == []
    assert await dead_letters(nats_url, ADMITTED_DURABLE) == []


async def test_a_record_count_the_dispatcher_would_refuse_is_refused_at_submit(
    services: tuple[ServiceHost, ServiceHost], nats_url: str
) -> None:
    """Finding 7 of issue 37: ``record_count: 4000000`` was admitted, and the job failed at
    start when its trainer's index-list dataset was refused by the shard dispatcher."""
    admission, _ = services
    spec = valid_spec("four-million")
    spec.dataset.record_count = 4_000_000
    async with aio_channel(f"127.0.0.1:{admission.server.port}", "admission") as channel:
        stub = admission_grpc.AdmissionServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.SubmitJob(admission_pb.SubmitJobRequest(spec=spec))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = raised.value.details() or ""
        assert details.startswith("spec.dataset.record_count: 4,000,000 records is over the ")
        assert "limit of 2,000,000 (MAX_LIST_RECORDS)" in details
        assert (await stub.ListJobs(admission_pb.ListJobsRequest())).jobs == []
        # A simulated job creates no dataset: its size is only a number to plan with.
        spec.simulated = True
        job = (await stub.SubmitJob(admission_pb.SubmitJobRequest(spec=spec))).job
        assert job.state == admission_pb.JOB_STATE_ADMITTED
    subjects = {m.subject for m in await stream_messages(nats_url, topics.JOBS.subjects[0])}
    assert subjects == {
        topics.JOB_SUBMITTED.subject(job.job_id),
        topics.JOB_ADMITTED.subject(job.job_id),
    }
