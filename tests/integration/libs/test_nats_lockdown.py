"""NATS locked down as the embedded suite runs it (stride.bus.permissions): a real
nats-server with mutual TLS and one user per identity, its permissions derived from the bus
contract. Each identity can do its own work and nothing else."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path

import nats
import pytest
from nats.errors import TimeoutError as NatsTimeoutError

from stride.bus import permissions, topics
from stride.bus.client import Bus, Delivery
from stride.events.v1 import job_pb2, plan_pb2
from stride.runtime import certs, tls
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.errors import StartupError
from stride.testing.processes import run_cli

pytestmark = pytest.mark.asyncio

JOB = "job-locked000001"


def _folder() -> Path:
    return Path(os.environ[tls.TLS_DIR_ENV])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    folder = _folder()
    locked = permissions.server_config(
        cert_file=str(folder / "nats.crt"),
        key_file=str(folder / "nats.key"),
        ca_file=str(folder / "ca.crt"),
        identities=tls.IDENTITIES,
    )
    nats_server = NatsServer(tmp_path / "nats", locked=locked).start()
    try:
        yield nats_server
    finally:
        nats_server.stop()


async def _bus(server: NatsServer, identity: str) -> Bus:
    return await Bus.connect(server.url, f"test-{identity}", 10, identity=identity)


async def _admin(server: NatsServer) -> Bus:
    """The bus administrator: declares the streams, may read everything."""
    bus = await _bus(server, permissions.ADMIN)
    await bus.ensure_streams()
    return bus


def _admitted() -> job_pb2.AdmissionDecision:
    return job_pb2.AdmissionDecision(job_id=JOB, outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED)


async def _in_stream(admin: Bus, subject: str) -> bool:
    try:
        await admin.js.get_last_msg(topics.JOBS.name, subject)
    except nats.js.errors.NotFoundError:
        return False
    return True


async def test_a_producer_publishes_its_topic_and_no_one_else_can(server: NatsServer) -> None:
    admin = await _admin(server)
    admission = await _bus(server, "admission")
    optimizer = await _bus(server, "optimizer")
    try:
        # Services only read the streams the administrator declared: no API beyond that.
        await admission.ensure_streams()
        subject = topics.JOB_ADMITTED.subject(JOB)
        # The optimizer may not publish `admitted` (only admission may): NATS drops it.
        with pytest.raises(NatsTimeoutError):
            await optimizer.js.publish(subject, _admitted().SerializeToString(), timeout=1)
        assert not await _in_stream(admin, subject)
        acked = await admission.publish(topics.JOB_ADMITTED, JOB, _admitted(), "m-1")
        assert acked.stream == topics.JOBS.name
        assert await _in_stream(admin, subject)
        # A plan must come from the optimizer: admission's is dropped.
        plan = plan_pb2.ResourcePlan(job_id=JOB, version=99)
        with pytest.raises(NatsTimeoutError):
            await admission.js.publish(
                topics.PLAN.subject(JOB), plan.SerializeToString(), timeout=1
            )
        await optimizer.publish(topics.PLAN, JOB, plan, "p-1")
    finally:
        for bus in (admin, admission, optimizer):
            await bus.close()


async def test_a_service_runs_its_own_consumer_and_cannot_touch_anothers(
    server: NatsServer,
) -> None:
    admin = await _admin(server)
    admission = await _bus(server, "admission")
    optimizer = await _bus(server, "optimizer")
    podwatcher = await _bus(server, "podwatcher")
    stop = asyncio.Event()
    seen: list[str] = []

    async def handle(message: job_pb2.AdmissionDecision, _delivery: Delivery) -> None:
        seen.append(message.job_id)

    consuming = asyncio.create_task(
        optimizer.consume(
            topics.JOB_ADMITTED, durable="optimizer-admitted", handler=handle, stop=stop
        )
    )
    try:
        await admission.publish(topics.JOB_ADMITTED, JOB, _admitted(), "m-2")
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        assert seen == [JOB]  # created, pulled, handled and acked through its own API subjects
        info = await admin.js.consumer_info(topics.JOBS.name, "optimizer-admitted")
        assert info.num_ack_pending == 0
        # The podwatcher may not delete the optimizer's consumer, nor a stream, nor make a
        # consumer under another service's name.
        impatient = podwatcher.nc.jetstream(timeout=1)
        with pytest.raises(NatsTimeoutError):
            await impatient.delete_consumer(topics.JOBS.name, "optimizer-admitted")
        with pytest.raises(NatsTimeoutError):
            await impatient.delete_stream(topics.JOBS.name)
        with pytest.raises(NatsTimeoutError):
            await impatient.pull_subscribe(
                topics.JOB_ADMITTED.pattern(), durable="optimizer-spy", stream=topics.JOBS.name
            )
        await admin.js.consumer_info(topics.JOBS.name, "optimizer-admitted")  # still there
        # Nor read events with a plain subscription to the stream's subjects.
        errors: list[Exception] = []

        async def on_error(error: Exception) -> None:
            errors.append(error)

        podwatcher.nc._error_cb = on_error
        await podwatcher.nc.subscribe(topics.JOB_ADMITTED.pattern())
        await podwatcher.nc.flush()
        await asyncio.sleep(0.2)
        denied = "permissions violation for subscription"
        assert any(denied in str(error).lower() for error in errors), errors
    finally:
        stop.set()
        await consuming
        for bus in (admin, admission, optimizer, podwatcher):
            await bus.close()


async def test_only_the_optimizer_asks_the_executor_and_only_the_executor_answers(
    server: NatsServer,
) -> None:
    executor = await _bus(server, "executor")
    optimizer = await _bus(server, "optimizer")
    podwatcher = await _bus(server, "podwatcher")
    try:

        async def answer(payload: bytes, _headers: Mapping[str, str]) -> bytes:
            return b"answer:" + payload

        await executor.answer_requests(topics.EXECUTOR_RUN, answer)
        subject = topics.EXECUTOR_RUN.subject("nsga2")
        reply = await optimizer.nc.request(subject, b"x", timeout=5)
        assert reply.data == b"answer:x"
        with pytest.raises(NatsTimeoutError):
            await podwatcher.nc.request(subject, b"x", timeout=1)
    finally:
        for bus in (executor, optimizer, podwatcher):
            await bus.close()


async def test_a_service_cannot_declare_streams_and_says_who_does(
    server: NatsServer,
) -> None:
    admission = await _bus(server, "admission")
    try:
        with pytest.raises(StartupError, match="stride bus init"):
            await admission.ensure_streams((topics.JOBS,))
    finally:
        await admission.close()


async def test_clients_without_a_certificate_of_the_ca_are_refused(
    server: NatsServer, tmp_path: Path
) -> None:
    with pytest.raises((nats.errors.NoServersError, ssl.SSLError, OSError, asyncio.TimeoutError)):
        await asyncio.wait_for(
            nats.connect(server.url.replace("tls://", "nats://"), max_reconnect_attempts=0),
            timeout=5,
        )
    other = tmp_path / "other-ca"
    certs.init(other, identities=("admission",))
    foreign = tls.load("admission", {tls.TLS_DIR_ENV: str(other)})
    assert foreign is not None
    context = tls.ssl_client_context(foreign)
    context.load_verify_locations(cadata=(_folder() / "ca.crt").read_text())
    with pytest.raises((nats.errors.NoServersError, ssl.SSLError, OSError, asyncio.TimeoutError)):
        await asyncio.wait_for(
            nats.connect(server.url, tls=context, max_reconnect_attempts=0), timeout=5
        )


async def test_an_operator_locks_their_own_nats_with_the_cli(tmp_path: Path) -> None:
    """`stride bus config` writes the server's lock-down configuration; `stride bus init`
    declares the streams as the bus administrator; bad input is named."""
    folder = _folder()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env[tls.TLS_DIR_ENV] = str(folder)
    conf = tmp_path / "stride-nats.conf"
    written = run_cli("bus", "config", "--out", str(conf), env=env)
    assert written.returncode == 0, written.stderr
    assert conf.stat().st_mode & 0o077 == 0
    assert f'"cert_file": "{folder / "nats.crt"}"' in conf.read_text()
    own = NatsServer(tmp_path / "nats", locked=conf.read_text()).start()
    try:
        declared = run_cli("bus", "init", "--nats-url", own.url, env=env)
        assert declared.returncode == 0, declared.stderr
        assert f"streams declared on {own.url}" in declared.stdout
        admission = await _bus(own, "admission")
        try:
            await admission.ensure_streams()  # present and as declared: read-only
            info = await admission.js.stream_info(topics.JOBS.name)
            assert info.config.subjects == list(topics.JOBS.subjects)
        finally:
            await admission.close()
        no_key = run_cli("bus", "init", "--nats-url", own.url, "--tls-dir", str(tmp_path), env=env)
        assert no_key.returncode == 2 and "no certificate for 'cli'" in no_key.stderr, no_key
    finally:
        own.stop()
    unreachable = run_cli("bus", "init", "--nats-url", own.url, env=env, timeout=60)
    assert unreachable.returncode == 2 and "cannot connect to NATS" in unreachable.stderr
