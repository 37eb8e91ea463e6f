"""A service's health follows its dependencies, its outbox survives a NATS outage, and it
shuts down in order on SIGTERM."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import nats
import pytest
from grpc_health.v1 import health_pb2

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.events.v1 import job_pb2
from stride.runtime.embedded_nats import NatsServer, free_port
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.health import equals, health
from stride.testing.inprocess import running_service
from stride.testing.processes import ServiceProcess

pytestmark = pytest.mark.integration
SERVICE = "stride.api.admission.v1.AdmissionService"


def spec() -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="j",
        user="u",
        model=job_pb2.ModelReference(name="m", image="img:1"),
        dataset=job_pb2.DatasetSpec(name="d", record_count=1000),
        batch_size=10,
        termination=job_pb2.Termination(max_steps=100),
    )


async def count_job_events(url: str) -> int:
    """Messages on the jobs stream (a submitted and an admitted event per job)."""
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(topics.JOBS.name)
        return int(info.state.messages)
    finally:
        await nc.close()


async def test_health_follows_nats_and_the_outbox_catches_up(tmp_path: Path) -> None:
    server = NatsServer(store_dir=tmp_path / "nats").start()
    settings = AdmissionSettings(
        nats_url=server.url,
        database_url=f"sqlite:///{tmp_path / 'a.db'}",
        grpc_port=0,
        grpc_host="127.0.0.1",
        health_interval_seconds=0.1,
    )
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    try:
        async with running_service(build, settings) as host:
            port = host.server.port
            await assert_eventually(lambda: equals(health(port, SERVICE), serving))
            server.kill()
            await assert_eventually(lambda: equals(health(port, SERVICE), not_serving), timeout=10)
            assert await health(port, "", "admission") == serving  # liveness: the process is fine

            async with aio_channel(f"127.0.0.1:{port}", "admission") as channel:
                reply = await pb_grpc.AdmissionServiceStub(channel).SubmitJob(
                    pb.SubmitJobRequest(spec=spec())
                )
            assert reply.job.state == pb.JOB_STATE_ADMITTED  # stored; events wait in the outbox

            server = NatsServer(store_dir=tmp_path / "nats", port=server.port).start()
            await assert_eventually(lambda: equals(health(port, SERVICE), serving), timeout=20)
            await assert_eventually(lambda: equals(count_job_events(server.url), 2), timeout=20)
    finally:
        server.stop()


async def test_metrics_logs_and_sigterm(nats_url: str, tmp_path: Path) -> None:
    metrics_port = free_port()
    process = ServiceProcess(
        "admission",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": f"sqlite:///{tmp_path / 'a.db'}",
            "STRIDE_ADMISSION_METRICS_PORT": str(metrics_port),
        },
        tmp_path,
    ).start()
    try:
        await assert_eventually(
            lambda: equals(health(process.port, SERVICE), health_pb2.HealthCheckResponse.SERVING),
            timeout=30,
            interval=0.2,
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as page:
            assert "process_cpu_seconds_total" in page.read().decode()
        lines = [
            json.loads(line) for line in process.log_text().splitlines() if line.startswith("{")
        ]
        started_line = next(line for line in lines if line["event"] == "service started")
        assert started_line["service"] == "admission" and started_line["level"] == "info"

        started = time.monotonic()
        assert process.process is not None
        process.process.send_signal(signal.SIGTERM)
        assert process.process.wait(20) == 0
        assert time.monotonic() - started < 10
        log = process.log_text()
        assert log.index('"shutting down"') < log.index('"stopped"')
    finally:
        process.kill()
