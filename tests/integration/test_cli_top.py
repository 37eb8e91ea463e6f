"""`stride top` against running services (admission, the optimizer and the dispatcher on
real NATS and PostgreSQL): a running job's row has its samples/s and ETA on the first frame,
from the step metrics its agents publish. How far a job that trains is comes from the
dispatcher's shards (training pods report no consumed count); a simulated job has no dataset
there and is as far as its step metrics count."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console

from stride.admission.app import build as build_admission
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as dispatcher_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.cli.running import Progress, frame
from stride.dispatcher.app import build as build_dispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import job_pb2, metrics_pb2, shard_pb2
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.settings import OptimizerSettings
from stride.runtime.tokens import TOKEN_ENV
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel, user_token
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

COLUMNS = (
    "job",
    "user",
    "state",
    "stage",
    "plan",
    "pods",
    "progress",
    "samples/s",
    "eta",
    "input",
)


@dataclass
class Suite:
    """The running services, as the CLI and the test reach them."""

    admission: admission_grpc.AdmissionServiceAsyncStub
    optimizer: optimizer_grpc.OptimizerServiceAsyncStub
    dispatcher: dispatcher_grpc.DispatcherServiceAsyncStub
    bus: Bus


@pytest.fixture
async def suite(
    nats_url: str, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Suite]:
    urls = {"nats_url": nats_url, "database_url": postgres_url}
    async with (
        running_service(build_admission, local_settings(AdmissionSettings, **urls)) as admission,
        running_service(build_optimizer, local_settings(OptimizerSettings, **urls)) as optimizer,
        running_service(build_dispatcher, local_settings(DispatcherSettings, **urls)) as dispatcher,
        aio_channel(f"127.0.0.1:{admission.server.port}", "admission") as to_admission,
        aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as to_optimizer,
        aio_channel(f"127.0.0.1:{dispatcher.server.port}", "dispatcher") as to_dispatcher,
    ):
        # Where `stride top` finds them (no pod watcher runs: its column stays "-").
        for name, host in (
            ("ADMISSION", admission),
            ("OPTIMIZER", optimizer),
            ("DISPATCHER", dispatcher),
        ):
            monkeypatch.setenv(f"STRIDE_{name}_ADDRESS", f"127.0.0.1:{host.server.port}")
        monkeypatch.delenv("STRIDE_PODWATCHER_ADDRESS", raising=False)
        monkeypatch.setenv(TOKEN_ENV, user_token())
        bus = await producer_bus(nats_url, name="test-agents")
        try:
            yield Suite(
                admission_grpc.AdmissionServiceStub(to_admission),
                optimizer_grpc.OptimizerServiceStub(to_optimizer),
                dispatcher_grpc.DispatcherServiceStub(to_dispatcher),
                bus,
            )
        finally:
            await bus.close()


def spec(name: str, records: int, simulated: bool = False) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=name,
        user="admin",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wide_deep:main"),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=records),
        batch_size=500,
        termination=job_pb2.Termination(max_epochs=2),
        simulated=simulated,
    )


async def submit(suite: Suite, job: job_pb2.JobSpec) -> str:
    reply = await suite.admission.SubmitJob(
        admission_pb.SubmitJobRequest(spec=job, request_id=job.name)
    )
    assert reply.job.state == admission_pb.JOB_STATE_ADMITTED, reply.job
    job_id = reply.job.job_id

    async def planned() -> optimizer_pb.GetPlanResponse:
        try:
            return await suite.optimizer.GetPlan(optimizer_pb.GetPlanRequest(job_id=job_id))
        except grpc.aio.AioRpcError as error:
            raise AssertionError(f"no plan yet: {error.code()}") from None

    await assert_eventually(planned)
    return job_id


async def report_steps(
    suite: Suite,
    job_id: str,
    rate: float,
    consumed: int,
    global_step: int = 20,
    queue: metrics_pb2.InputQueue | None = None,
) -> None:
    """One step window (20 steps) of the job's chief under plan 1, as its agent publishes
    it."""
    reported_at = Timestamp()
    reported_at.FromDatetime(datetime.now(UTC))
    metrics = metrics_pb2.StepMetrics(
        job_id=job_id,
        pod_name=f"{job_id}-chief-0",
        global_step=global_step,
        steps=20,
        step_seconds=500 / rate,
        samples_per_second=rate,
        samples_consumed=consumed,
        reported_at=reported_at,
        plan_version=1,
        input_queue=queue,
    )
    await suite.bus.publish(topics.STEP_METRICS, job_id, metrics, f"{job_id}.steps.{global_step}")

    async def applied() -> bool:
        reply = await suite.optimizer.GetPlan(optimizer_pb.GetPlanRequest(job_id=job_id))
        assert (reply.samples_per_second, reply.samples_consumed) == (rate, consumed), reply
        return True

    await assert_eventually(applied)


async def train_shards(suite: Suite, job_id: str, done: int) -> None:
    """The job's ``train`` dataset (20 shards of 5,000 records an epoch), with ``done``
    shards of the first epoch finished by one worker."""
    parameters = dispatcher_pb.DatasetParameters(
        record_count=100_000,
        batch_size=500,
        shard_batches=10,
        epochs=2,
        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
    )
    await suite.dispatcher.CreateDataset(
        dispatcher_pb.CreateDatasetRequest(job_id=job_id, dataset="train", parameters=parameters)
    )
    registered = await suite.dispatcher.RegisterWorker(
        dispatcher_pb.RegisterWorkerRequest(job_id=job_id, worker="worker-0")
    )
    worker = dispatcher_pb.WorkerRef(
        job_id=job_id, dataset="train", worker="worker-0", incarnation=registered.incarnation
    )
    leased = await suite.dispatcher.GetShard(
        dispatcher_pb.GetShardRequest(worker=worker, max_shards=done)
    )
    finished = [dispatcher_pb.ShardDone(shard_id=leased.shard.shard_id, lease=leased.lease)]
    finished += [
        dispatcher_pb.ShardDone(shard_id=s.shard.shard_id, lease=s.lease)
        for s in leased.more_shards
    ]
    assert len(finished) == done
    await suite.dispatcher.GetShard(
        dispatcher_pb.GetShardRequest(worker=worker, done_shards=finished)
    )


async def top_rows(state_dir: Path, progress: Progress) -> dict[str, dict[str, str]]:
    """One frame of `stride top` as a user sees it, by job: each row's cells by column."""
    shown = await asyncio.to_thread(frame, state_dir, progress, False)
    text = io.StringIO()
    Console(file=text, width=200, color_system=None).print(shown)
    rows = {}
    for line in text.getvalue().splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == len(COLUMNS) and cells[0].startswith("job-"):
            rows[cells[0]] = dict(zip(COLUMNS, cells, strict=True))
    return rows


async def test_a_running_jobs_row_has_its_samples_per_second_and_eta_from_step_metrics(
    suite: Suite, tmp_path: Path
) -> None:
    training = await submit(suite, spec("trains", records=100_000))
    simulated = await submit(suite, spec("simulated", records=1_000_000, simulated=True))

    # Planned, nothing measured yet: no throughput, so no ETA either.
    before = await top_rows(tmp_path, Progress())
    assert before[simulated]["samples/s"] == "-" and before[simulated]["eta"] == "-"
    assert before[simulated]["plan"] == "v1"

    # A training job: 4 of 20 shards of its first of 2 epochs done, 250 samples/s measured.
    await train_shards(suite, training, done=4)
    await report_steps(suite, training, rate=250.0, consumed=0)
    # A simulated job: its metrics count 240,000 of its 2 x 1,000,000 samples, at 400/s.
    await report_steps(suite, simulated, rate=400.0, consumed=240_000)

    rows = await top_rows(tmp_path, Progress())  # the first frame: no earlier one to diff
    assert {k: rows[training][k] for k in ("state", "plan", "progress", "samples/s", "eta")} == {
        "state": "admitted",
        "plan": "v1",
        "progress": "10% (epoch 1/2)",
        "samples/s": "250",
        "eta": "12m00s",  # (200,000 - 20,000) / 250 s
    }
    assert {k: rows[simulated][k] for k in ("progress", "samples/s", "eta")} == {
        "progress": "12%",
        "samples/s": "400",
        "eta": "1h13m",  # (2,000,000 - 240,000) / 400 = 4,400 s
    }

    # The newest window's throughput: the open window's rate, weighted by its steps.
    await report_steps(suite, simulated, rate=400.0, consumed=300_000, global_step=40)
    later = await top_rows(tmp_path, Progress())
    assert (later[simulated]["progress"], later[simulated]["eta"]) == ("15%", "1h10m")


async def test_a_job_read_by_steps_shows_its_progress_and_its_input_queue(
    suite: Suite, tmp_path: Path
) -> None:
    """GoldMiner's data-worker mode: the dispatcher's consumed step says how far the job is,
    and the chief's input queue (who makes its mini-batches, how long it waited for them)
    is in its row."""
    job_id = await submit(suite, spec("stepped", records=100_000))
    parameters = dispatcher_pb.DatasetParameters(
        record_count=100_000,
        batch_size=500,
        shard_batches=10,
        epochs=2,
        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
    )
    await suite.dispatcher.CreateDataset(
        dispatcher_pb.CreateDatasetRequest(job_id=job_id, dataset="train", parameters=parameters)
    )
    await suite.dispatcher.FetchBatches(
        dispatcher_pb.FetchBatchesRequest(
            job_id=job_id, dataset="train", data_worker="dw-0", max_batches=50
        )
    )
    await suite.dispatcher.ReportConsumed(
        dispatcher_pb.ReportConsumedRequest(job_id=job_id, dataset="train", step_id=39)
    )
    queue = metrics_pb2.InputQueue(
        data_workers=2, enqueue_rate=9.5, dequeue_rate=10.0, wait_share=0.1, queue_length=12
    )
    await report_steps(suite, job_id, rate=250.0, consumed=0, queue=queue)
    row = (await top_rows(tmp_path, Progress()))[job_id]
    # 40 of 200 steps (2 epochs of 100): 20,000 of 200,000 samples.
    assert row["progress"] == "10% (epoch 1/2)", row
    assert row["input"] == "2 data workers, waited 10%, 12 ready", row
    plan = await suite.optimizer.GetPlan(optimizer_pb.GetPlanRequest(job_id=job_id))
    assert plan.input_queue == queue
