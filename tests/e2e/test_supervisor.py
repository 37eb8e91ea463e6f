"""`stride up` supervises like a process manager: NATS and PostgreSQL come back, crash
loops back off.

Real processes only: the suite is started with `stride up` (embedded nats-server and
PostgreSQL),
broken from outside (SIGKILL, a bad setting for one service) and observed through the
suite state, health RPCs, `stride status` and /proc.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.bus.client import Bus
from stride.bus.permissions import ADMIN
from stride.cli.endpoints import SUITE, Phase, ProcessState, SuiteState, pid_alive
from stride.cli.restarts import SERVICE_RESTARTS
from stride.cli.supervisor import HEALTH_NAMES
from stride.runtime.healthcheck import check
from stride.runtime.tls import TLS_DIR_ENV
from stride.testing.eventually import assert_eventually
from stride.testing.processes import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]
CRASHING = "configdb"
"""The service broken on purpose: nothing on the submit path waits for it."""


stride = run_cli


def processes_of(state_dir: Path) -> list[int]:
    """Live processes started for this suite: each inherits STRIDE_STATE_DIR=<state_dir>."""
    marker = f"STRIDE_STATE_DIR={state_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def zombie_or_running(pid: int) -> str:
    """The /proc state letter of ``pid`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return ""


def read_state(state_dir: Path) -> SuiteState:
    state = SuiteState.read(state_dir)
    assert state is not None, "no suite state"
    return state


def healthy(state: SuiteState, services: list[str]) -> bool:
    return all(check(state.services[s], HEALTH_NAMES[s], 1.0)[0] for s in services)


@pytest.fixture
def suite_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for a suite in a temporary state directory; stops all of it afterwards."""
    state_dir = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(state_dir), "COLUMNS": "200"})
    # The session's certificates (`stride up` uses a given folder): this test's own health
    # checks then reach the suite's servers.
    env[TLS_DIR_ENV] = os.environ[TLS_DIR_ENV]
    try:
        yield env
    finally:
        if SuiteState.read(state_dir) is not None:
            stride("down", env=env)
        # Whatever survived a failed test: everything here was started by this test.
        for pid in processes_of(state_dir):
            os.kill(pid, signal.SIGKILL)


async def test_killed_embedded_nats_and_postgres_come_back_and_jobs_still_flow(
    suite_env: dict[str, str],
) -> None:
    state_dir = Path(suite_env["STRIDE_STATE_DIR"])
    up = stride("up", env=suite_env)
    assert up.returncode == 0, up.stdout + up.stderr
    before = read_state(state_dir)
    assert before.nats_process is not None and before.nats_process.phase is Phase.RUNNING
    old_pid = before.nats_process.pid
    # A job first, so the JetStream store holds messages that must survive the restart.
    first = stride("submit", str(ROOT / "examples" / "wide-deep.yaml"), "--wait", env=suite_env)
    assert first.returncode == 0, first.stdout + first.stderr
    streams_before = await stream_messages(before)
    assert sum(streams_before.values()) > 0, streams_before

    os.kill(old_pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def restarted() -> ProcessState | None:
        process = read_state(state_dir).nats_process
        assert process is not None
        return process if process.phase is Phase.RUNNING and process.pid != old_pid else None

    back = await assert_eventually(restarted, timeout=10, message="nats-server not restarted")
    restart_seconds = time.monotonic() - killed_at
    assert back is not None
    print(f"nats-server back after {restart_seconds:.2f}s (pid {old_pid} -> {back.pid})")
    assert zombie_or_running(old_pid) in ("", "X"), f"pid {old_pid} was not reaped"
    assert pid_alive(back.pid)
    after = read_state(state_dir)
    assert after.nats_url == before.nats_url  # same port: clients reconnect where they were
    streams_after = await stream_messages(after)
    for stream, count in streams_before.items():
        assert streams_after.get(stream, 0) >= count, (stream, streams_before, streams_after)

    await assert_eventually(
        lambda: healthy(after, list(SUITE)), timeout=30, message="services not healthy again"
    )
    print(f"every service healthy again {time.monotonic() - killed_at:.2f}s after the kill")
    # They reconnected by themselves: none of them had to be restarted.
    assert {s: p.restarts for s, p in read_state(state_dir).processes.items() if p.restarts} == {}

    # PostgreSQL, SIGKILLed (no checkpoint): started again on the same socket and data,
    # recovering from its write-ahead log; the first job is still there.
    postgres = after.postgres_process
    assert postgres is not None and postgres.phase is Phase.RUNNING
    old_postgres = postgres.pid
    os.kill(old_postgres, signal.SIGKILL)
    killed_at = time.monotonic()

    def postgres_back() -> ProcessState | None:
        process = read_state(state_dir).postgres_process
        assert process is not None
        running = process.phase is Phase.RUNNING and process.pid != old_postgres
        return process if running else None

    await assert_eventually(postgres_back, timeout=20, message="postgres not restarted")
    print(f"postgres back after {time.monotonic() - killed_at:.2f}s")
    assert zombie_or_running(old_postgres) in ("", "X"), f"pid {old_postgres} was not reaped"
    assert read_state(state_dir).database == after.database  # same socket, same database
    first_job = re.search(r"job-[0-9a-f]{12}", first.stdout)
    assert first_job is not None

    def listed() -> bool:
        status = stride("status", env=suite_env)
        return status.returncode == 0 and first_job.group(0) in status.stdout

    await assert_eventually(listed, timeout=30, message="the first job is not listed again")
    await assert_eventually(
        lambda: healthy(after, list(SUITE)), timeout=30, message="services not healthy again"
    )
    # `--new`: a new job must flow; the same spec again would be the first job (idempotent).
    submitted = stride(
        "submit", str(ROOT / "examples" / "wide-deep.yaml"), "--wait", "--new", env=suite_env
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    assert re.search(r"job-[0-9a-f]{12}", submitted.stdout)
    assert "plan v1" in submitted.stdout and "recorded" in submitted.stdout
    log = (state_dir / "supervisor.log").read_text()
    assert f"embedded NATS (pid {old_pid}) killed by SIGKILL" in log
    assert "embedded NATS started again" in log
    assert f"embedded PostgreSQL (pid {old_postgres}) killed by SIGKILL" in log
    assert "embedded PostgreSQL started again" in log

    down = stride("down", env=suite_env)
    assert down.returncode == 0, down.stderr
    assert processes_of(state_dir) == []


async def stream_messages(state: SuiteState) -> dict[str, int]:
    """Messages held by each JetStream stream, read as the bus administrator (the embedded
    NATS is locked down: only a certificate of the suite's CA gets in, and only the admin
    may list streams)."""
    bus = await Bus.connect(
        state.nats_url, "test-streams", 5, identity=ADMIN, environ={TLS_DIR_ENV: state.tls_dir}
    )
    try:
        infos = await bus.js.streams_info()
        return {info.config.name or "": info.state.messages for info in infos}
    finally:
        await bus.close()


async def test_a_crash_looping_service_backs_off_while_the_rest_of_the_suite_serves(
    suite_env: dict[str, str],
) -> None:
    state_dir = Path(suite_env["STRIDE_STATE_DIR"])
    # A setting only configdb reads, invalid: it exits with code 2 at every start.
    suite_env[f"STRIDE_{CRASHING.upper()}_SHUTDOWN_GRACE_SECONDS"] = "-1"
    started = time.monotonic()
    up = subprocess.Popen(
        [sys.executable, "-m", "stride.cli", "up"],
        env=suite_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Each restart as the supervisor recorded it: delay = its start - the exit before it.
        delays: dict[int, float] = {}
        pids: set[int] = set()

        def third_restart_seen() -> bool:
            state = SuiteState.read(state_dir)
            process = state.processes.get(CRASHING) if state else None
            if process is None:
                return False
            if process.pid:
                pids.add(process.pid)
            if process.phase is Phase.STARTING and process.last_exit_at is not None:
                delays[process.restarts] = process.started_at - process.last_exit_at
            return 3 in delays

        # Generous: each start of a Python service on a loaded CI machine takes seconds.
        await assert_eventually(third_restart_seen, timeout=120, interval=0.1)
        out, err = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
        up.communicate()  # reaped, and its pipes closed even when the test failed above
    print(f"restart delays {delays} ({time.monotonic() - started:.1f}s after `stride up`)")
    assert up.returncode == 0, out + err
    log_path = state_dir / "logs" / f"{CRASHING}.log"
    assert f"warning: {CRASHING} is crash-looping" in out, out
    assert str(log_path) in out and "SHUTDOWN_GRACE_SECONDS" in out, out

    # The delays grow as the policy says: 1 s, 2 s, 4 s, give or take a supervisor tick.
    assert sorted(delays) == [1, 2, 3], delays
    assert delays[1] < delays[2] < delays[3], delays
    for restart, delay in delays.items():
        expected = SERVICE_RESTARTS.delay(restart)
        assert expected - 0.1 <= delay <= expected + 1.5, (restart, delays)
    assert len(pids) >= 4, pids  # the first process and three restarts

    state = read_state(state_dir)
    assert state.ready and not state.error and pid_alive(state.supervisor_pid)
    others = [s for s in SUITE if s != CRASHING]
    assert healthy(state, others)
    assert all(state.processes[s].phase is Phase.RUNNING for s in others)

    # Down while it is backing off (after its fourth exit it waits 8 s).
    def backing_off() -> ProcessState | None:
        process = read_state(state_dir).processes[CRASHING]
        return process if process.phase is Phase.BACKING_OFF and process.restarts >= 4 else None

    waiting = await assert_eventually(backing_off, timeout=20, interval=0.1)
    assert waiting is not None
    assert waiting.last_exit_code == 2 and waiting.backoff_seconds == SERVICE_RESTARTS.delay(4)
    status = stride("status", env=suite_env)
    assert status.returncode == 0, status.stdout + status.stderr
    line = next((x for x in status.stdout.splitlines() if CRASHING in x), "")
    assert f"{CRASHING} is crash-looping: exited with code 2, restart 4 in" in line, status.stdout
    assert "back-off 8s" in line and str(log_path) in line, line
    assert "jobs" in status.stdout  # and the jobs table still comes from admission

    recorded = read_state(state_dir)
    children = pids | {p.pid for p in recorded.processes.values() if p.pid}
    for server in (recorded.nats_process, recorded.postgres_process):
        assert server is not None
        children.add(server.pid)
    stopping = time.monotonic()
    down = stride("down", env=suite_env)
    print(f"`stride down` while backing off took {time.monotonic() - stopping:.1f}s")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "suite stopped" in down.stdout
    # The supervisor reaps what it started; whoever adopted the supervisor reaps it.
    assert {
        p: zombie_or_running(p) for p in children if zombie_or_running(p) not in ("", "X")
    } == {}
    assert not pid_alive(recorded.supervisor_pid)
    assert processes_of(state_dir) == []
    assert SuiteState.read(state_dir) is None
    supervisor_log = (state_dir / "supervisor.log").read_text()
    assert supervisor_log.count(f"{CRASHING} exited with code 2") >= 4
    assert "suite stopped" in supervisor_log


async def test_up_fails_and_leaves_nothing_running_when_admission_crash_loops(
    suite_env: dict[str, str],
) -> None:
    state_dir = Path(suite_env["STRIDE_STATE_DIR"])
    # Without admission no job can be submitted: the suite is of no use, so `up` fails.
    suite_env["STRIDE_ADMISSION_SHUTDOWN_GRACE_SECONDS"] = "-1"
    up = stride("up", env=suite_env)
    assert up.returncode == 2, up.stdout + up.stderr
    assert "admission keeps crashing" in up.stderr, up.stderr
    assert str(state_dir / "logs" / "admission.log") in up.stderr, up.stderr
    assert "STRIDE_ADMISSION_SHUTDOWN_GRACE_SECONDS" in up.stderr, up.stderr
    assert processes_of(state_dir) == []
    failed = read_state(state_dir)  # kept, so the error can be read after the fact
    assert failed.error and not failed.ready and not pid_alive(failed.supervisor_pid)
    status = stride("status", env=suite_env)
    assert status.returncode == 2 and "no running suite" in status.stderr
    down = stride("down", env=suite_env)
    assert down.returncode == 0 and "no suite running" in down.stdout
    assert SuiteState.read(state_dir) is None


def test_up_insecure_on_sqlite_runs_plain_text_and_says_so(suite_env: dict[str, str]) -> None:
    """Plain text only when asked, with a warning; the CLI then follows the suite's choice.
    And the lightest setup: SQLite files instead of the embedded PostgreSQL."""
    state_dir = Path(suite_env["STRIDE_STATE_DIR"])
    up = stride("up", "--insecure", "--database", "sqlite", env=suite_env)
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"database: SQLite files in {state_dir / 'db'}" in up.stdout, up.stdout
    assert read_state(state_dir).postgres_process is None
    assert not (state_dir / "postgres").exists()
    assert "plain text without peer authentication" in up.stderr
    assert "gRPC: plain text (--insecure)" in up.stdout
    state = read_state(state_dir)
    assert state.insecure and not state.tls_dir
    with grpc.insecure_channel(state.services["admission"]) as plain:
        reply = health_pb2_grpc.HealthStub(plain).Check(
            health_pb2.HealthCheckRequest(service=HEALTH_NAMES["admission"]), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    without_env = {k: v for k, v in suite_env.items() if k != TLS_DIR_ENV}
    assert stride("status", env=without_env).returncode == 0
    assert (
        "plain text without peer authentication"
        in (state_dir / "logs" / "admission.log").read_text()
    )
