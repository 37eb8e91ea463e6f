"""NATS locked down as the embedded suite runs it (stride.bus.permissions): a real
nats-server with mutual TLS and one user per identity, its permissions derived from the bus
contract. Each identity can do its own work and nothing else."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import nats
import nkeys
import pytest
import yaml
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from stride.bus import callout, permissions, topics
from stride.bus.client import Bus, Delivery, flush_in_order
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.runtime import certs, tls
from stride.runtime.embedded_nats import NatsServer, free_port, nats_server_binary
from stride.runtime.errors import StartupError
from stride.testing.eventually import assert_eventually
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
        callout_issuer=callout.public_key_of(folder / callout.SEED_NAME),
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
        await flush_in_order(podwatcher.nc)
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
            if b"slow" in payload:
                await asyncio.sleep(3.5)
            return b"answer:" + payload

        await executor.answer_requests(topics.EXECUTOR_RUN, answer)
        subject = topics.EXECUTOR_RUN.subject("nsga2")

        async def asked() -> Msg:
            # The subscription is flushed, yet a loaded CI machine once answered this very
            # first request "no responders" (the optimizer's pool client asks again then,
            # stride.decisions); what this test is about is who may ask and answer.
            try:
                return await optimizer.nc.request(subject, b"x", timeout=5)
            except nats.errors.NoRespondersError as error:
                raise AssertionError("no responders yet") from error

        reply = await assert_eventually(asked, timeout=10)
        assert reply.data == b"answer:x"
        # A long run: its progress messages and then its answer all reach the optimizer
        # (``allow_responses: true`` alone lets one message through: the first progress).
        slow = optimization_pb2.AlgorithmRequest(request_id="slow")
        answered = await optimizer.request(topics.EXECUTOR_RUN, "nsga2", slow, 10, silence=2.0)
        assert answered == b"answer:" + slow.SerializeToString()
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
        # Without the callout issuer's seed, or with a malformed issuer: named, no file.
        (tmp_path / "bare").mkdir()
        no_seed = run_cli("bus", "config", "--tls-dir", str(tmp_path / "bare"), env=env)
        assert no_seed.returncode != 0 and "nats-callout.nk" in no_seed.stderr
        bad_issuer = run_cli(
            "bus", "config", "--callout-issuer", "UABC", "--out", str(tmp_path / "x.conf"), env=env
        )
        assert bad_issuer.returncode != 0 and "not an account public nkey" in bad_issuer.stderr
        assert not (tmp_path / "x.conf").exists()
        no_key = run_cli("bus", "init", "--nats-url", own.url, "--tls-dir", str(tmp_path), env=env)
        assert no_key.returncode == 2 and "no certificate for 'cli'" in no_key.stderr, no_key
    finally:
        own.stop()
    unreachable = run_cli("bus", "init", "--nats-url", own.url, env=env, timeout=60)
    assert unreachable.returncode == 2 and "cannot connect to NATS" in unreachable.stderr


REPO_ROOT = Path(__file__).resolve().parents[3]


class _Container:
    """Runs a compose service's command here: its volume paths mapped to folders of the
    test, the `nats` host to this machine's NATS on a free port."""

    def __init__(self, tmp_path: Path, nats_port: int) -> None:
        tls_folder = tmp_path / "tls"
        self.paths = {
            "/etc/nats/stride": tls_folder,
            "/etc/stride/tls": tls_folder,
            "/tls": tls_folder,
            "/ca": tmp_path / "ca",
            "/data": tmp_path / "data",
        }
        self.nats_port = nats_port

    def arg(self, value: object) -> str:
        text = str(value).replace("nats:4222", f"127.0.0.1:{self.nats_port}")
        for inside in sorted(self.paths, key=len, reverse=True):
            if text == inside or text.startswith(inside + "/"):
                return str(self.paths[inside]) + text[len(inside) :]
        return text

    def command(self, service: Mapping[str, object]) -> list[str]:
        command = [self.arg(part) for part in service["command"]]  # type: ignore[attr-defined]
        if "--owner" in command and os.geteuid() != 0:  # only root hands files over
            at = command.index("--owner")
            del command[at : at + 2]
        return [sys.executable if part == "python" else part for part in command]

    def environment(self, service: Mapping[str, object]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
        given = service.get("environment") or {}
        env.update({key: self.arg(value) for key, value in given.items()})  # type: ignore[attr-defined]
        return env

    def run(self, service: Mapping[str, object]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(service),
            env=self.environment(service),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


async def test_composes_one_shots_lock_its_nats_down(tmp_path: Path) -> None:
    """compose.yaml's `certs`, `nats-config`, `nats` and `bus-init`, each run with the
    command and environment compose gives it (volumes mapped to folders here): the server
    takes the generated configuration, the streams are declared by the administrator, and
    the servers' URL reaches it as their identity: admission may publish `admitted`, the
    optimizer may not, and a client without a certificate is refused."""
    services = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"]
    (tmp_path / "ca").mkdir()
    (tmp_path / "data").mkdir()
    container = _Container(tmp_path, free_port())
    for one_shot in ("certs", "nats-config"):
        done = container.run(services[one_shot])
        assert done.returncode == 0, (one_shot, done.stderr)
    assert os.stat(container.arg("/tls/nats.conf")).st_mode & 0o077 == 0
    command = container.command(services["nats"])
    command[command.index("-m") + 1] = str(free_port())  # the monitoring port, free here
    log = (tmp_path / "nats.log").open("wb")
    server = subprocess.Popen(
        [nats_server_binary(), *command, "-a", "127.0.0.1", "-p", str(container.nats_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = container.arg(services["admission"]["environment"]["STRIDE_NATS_URL"])
        declared = container.run(services["bus-init"])
        assert declared.returncode == 0, (declared.stderr, (tmp_path / "nats.log").read_text())
        assert f"streams declared on {url}" in declared.stdout
        environ = container.environment(services["admission"])
        admission = await Bus.connect(url, "admission", 10, identity="admission", environ=environ)
        optimizer = await Bus.connect(url, "optimizer", 10, identity="optimizer", environ=environ)
        try:
            subject = topics.JOB_ADMITTED.subject(JOB)
            with pytest.raises(NatsTimeoutError):
                await optimizer.js.publish(subject, _admitted().SerializeToString(), timeout=1)
            acked = await admission.publish(topics.JOB_ADMITTED, JOB, _admitted(), "m-compose")
            assert acked.stream == topics.JOBS.name and acked.seq == 1
        finally:
            await admission.close()
            await optimizer.close()
        with pytest.raises((nats.errors.NoServersError, OSError, asyncio.TimeoutError)):
            await asyncio.wait_for(nats.connect(url, max_reconnect_attempts=0), timeout=5)
    finally:
        server.terminate()
        server.wait(10)
        log.close()


async def test_lockdown_commands_name_what_is_wrong(tmp_path: Path) -> None:
    """`python -m stride.bus.lockdown`, as compose and Helm run it, on bad input."""

    def lockdown(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
        done = subprocess.run(
            [sys.executable, "-m", "stride.bus.lockdown", *args],
            env={**base, **(env or {})},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return done.returncode, done.stderr

    out = str(tmp_path / "nats.conf")
    assert lockdown("config", "--out", out) == (
        2,
        "error: no certificate folder: pass --tls-dir, set STRIDE_TLS_DIR, or give --cert, "
        "--key and --ca\n",
    )
    code, error = lockdown("config", "--tls-dir", str(tmp_path), "--out", out)
    assert code == 2 and f"{tmp_path} holds no ca.crt: run `stride certs init" in error
    code, error = lockdown(
        "config", "--tls-dir", str(_folder()), "--out", str(tmp_path / "missing" / "n.conf")
    )
    assert code == 2 and "No such file or directory" in error
    assert not (tmp_path / "nats.conf").exists()
    code, error = lockdown("init", "--url", f"tls://127.0.0.1:{free_port()}", "--timeout", "2")
    assert code == 2 and "no TLS material for 'cli'" in error
    code, error = lockdown(
        "init",
        "--url",
        f"tls://127.0.0.1:{free_port()}",
        "--timeout",
        "2",
        "--tls-dir",
        str(_folder()),
    )
    assert code == 2 and "cannot connect to NATS at tls://127.0.0.1:" in error
    code, error = lockdown("config", "--tls-dir", str(_folder()), "--out", out, "--owner", "x")
    assert code == 2 and "'x' is not UID:GID" in error


def _as_secret(folder: Path, identity: str, into: Path) -> Path:
    """``identity``'s certificate laid out as its kubernetes.io/tls Secret mounts it."""
    into.mkdir(parents=True)
    for source, name in ((f"{identity}.crt", "tls.crt"), (f"{identity}.key", "tls.key")):
        (into / name).write_bytes((folder / source).read_bytes())
    (into / "ca.crt").write_bytes((folder / "ca.crt").read_bytes())
    return into


async def test_the_charts_lockdown_and_bus_init_job_work_on_a_real_nats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Helm chart's ConfigMap, included in a nats-server's configuration with the nats
    Secret where the chart says to mount it, and its bus-init Job's command and environment
    (the cli Secret mounted): the streams get declared and each identity keeps to its
    topics."""
    import helm_python as helm

    with helm.Chart.load(REPO_ROOT / "deploy" / "helm" / "stride") as chart:
        files = chart.render({}, name="stride", namespace="ml")
    manifests = [
        doc
        for path, text in files.items()
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    config = next(m for m in manifests if m["metadata"]["name"] == "stride-nats-lockdown")
    job = next(m for m in manifests if m["metadata"]["name"] == "stride-bus-init-1")
    folder = _folder()
    nats_tls = _as_secret(folder, "nats", tmp_path / "nats-tls")
    cli_tls = _as_secret(folder, "cli", tmp_path / "cli-tls")
    text = config["data"]["stride-lockdown.conf"].replace("/etc/nats/stride-tls", str(nats_tls))
    port = free_port()
    # As NOTES says: NATS gets the callout issuer from the nats-callout Secret's `issuer`.
    monkeypatch.setenv(callout.ISSUER_ENV, callout.public_key_of(folder / callout.SEED_NAME))
    # ... and its system user (revoked tokens' sessions are ended with it) from `system-user`.
    system_seed = (folder / certs.SYSTEM_SEED_NAME).read_bytes().strip()
    monkeypatch.setenv(
        permissions.SYSTEM_USER_ENV, nkeys.from_seed(system_seed).public_key.decode()
    )
    server = NatsServer(tmp_path / "nats", port=port, locked=text).start()
    try:
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
        for item in container["env"]:
            env[item["name"]] = item["value"].replace("/etc/stride/tls", str(cli_tls))
        command = [
            sys.executable if part == "python" else part.replace("nats:4222", f"127.0.0.1:{port}")
            for part in container["command"]
        ]
        declared = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert declared.returncode == 0, declared.stderr
        admission = await _bus(server, "admission")
        optimizer = await _bus(server, "optimizer")
        try:
            await admission.ensure_streams()  # declared, and only read by a service
            subject = topics.JOB_ADMITTED.subject(JOB)
            with pytest.raises(NatsTimeoutError):
                await optimizer.js.publish(subject, _admitted().SerializeToString(), timeout=1)
            acked = await admission.publish(topics.JOB_ADMITTED, JOB, _admitted(), "m-helm")
            assert acked.stream == topics.JOBS.name
        finally:
            await admission.close()
            await optimizer.close()
    finally:
        server.stop()
