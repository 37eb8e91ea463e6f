"""`stride up` / `stride down` on a machine with nothing configured: embedded NATS, the
embedded PostgreSQL, and a small job that trains to the end through every live service, as
a user runs it; the jobs are still there after `stride down` and `stride up`."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.cli.endpoints import SuiteState, pid_alive
from stride.runtime.checkpoint_memory import default_shm_dir
from stride.runtime.tls import IDENTITIES
from stride.testing.processes import run_cli

from .test_supervisor import processes_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
ROOT = Path(__file__).resolve().parents[2]


stride = run_cli


def profiled_eventually(probe: Callable[[], str], timeout: float = 30.0) -> str:
    """``probe()`` once it stops failing: configdb hears the last metrics a moment later."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


@pytest.fixture
def leaves_nothing(tmp_path: Path) -> Iterator[None]:
    """Ends whatever a failed (or timed-out) run of the test left of its suites: a suite
    that outlives its test loads every test after it."""
    yield
    for pid in processes_of(tmp_path / "state"):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.usefixtures("leaves_nothing")
def test_up_submit_status_down_with_the_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"})

    not_up = stride("status", env=env)
    assert not_up.returncode == 2
    assert "no running suite" in not_up.stderr and "stride up" in not_up.stderr

    # A state folder anyone could read, as a user may have made it.
    (tmp_path / "state").mkdir(mode=0o755)
    up = stride("up", "--executors", "2", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    # The suite's state is its user's alone: the folder 0700, what it made 0600 / 0700.
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    made = [*(tmp_path / "state" / "postgres").iterdir(), *(tmp_path / "state" / "logs").iterdir()]
    assert made and all(path.stat().st_mode & 0o077 == 0 for path in made), [
        (path.name, oct(path.stat().st_mode)) for path in made
    ]
    state = SuiteState.read(tmp_path / "state")
    assert state is not None and state.ready and state.embedded_nats
    # Mutual TLS by default: certificates made in the state folder, every key its user's
    # alone, and a client without a certificate gets nothing from any service.
    assert state.tls_dir == str(tmp_path / "state" / "tls") and not state.insecure
    assert "gRPC: mutual TLS" in up.stdout
    keys = sorted((tmp_path / "state" / "tls").glob("*.key"))
    assert len(keys) == len(IDENTITIES) + 1, keys  # and the CA's
    assert all(key.stat().st_mode & 0o077 == 0 for key in keys)
    for service in ("admission", "dispatcher", "ckptcache"):
        with (
            grpc.insecure_channel(state.services[service]) as plain,
            pytest.raises(grpc.RpcError) as refused,
        ):
            health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, service
    # The production database by default: the embedded PostgreSQL 18, data in the state.
    data = tmp_path / "state" / "postgres" / "data"
    assert state.database.startswith("embedded PostgreSQL 18 at postgresql://"), state.database
    assert "database: embedded PostgreSQL 18 at" in up.stdout, up.stdout
    assert f"data: {data} (kept by `stride down`)" in up.stdout, up.stdout
    assert state.postgres_process is not None and (data / "PG_VERSION").read_text() == "18\n"
    # Two replicas of the executor pool, each its own process and log.
    assert {"executor", "executor-2"} <= set(state.services)
    assert state.processes["executor"].pid != state.processes["executor-2"].pid
    assert (tmp_path / "state" / "logs" / "executor-2.log").exists()
    try:
        again = stride("up", env=env)
        assert again.returncode == 2 and "already running" in again.stderr

        submitted = stride("submit", str(ROOT / "examples" / "wide-deep.yaml"), "--wait", env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = re.search(r"job-[0-9a-f]{12}", submitted.stdout)
        assert job_id is not None
        assert "plan v1" in submitted.stdout and "recorded" in submitted.stdout

        listed = stride("status", env=env)
        assert job_id.group(0) in listed.stdout and "admitted" in listed.stdout
        # Users: the CLI is the suite's admin by default (`stride up` made the token); the
        # demo user sees none of the admin's jobs and cannot cancel them; a minted token
        # names its user, whose jobs are theirs.
        tokens = tmp_path / "state" / "tokens"
        assert f"tokens: admin {tokens / 'admin.token'}" in up.stdout, up.stdout
        assert all(path.stat().st_mode & 0o077 == 0 for path in tokens.iterdir())
        demo = {**env, "STRIDE_TOKEN_FILE": str(tokens / "demo.token")}
        as_demo = stride("status", env=demo)
        assert as_demo.returncode == 0 and job_id.group(0) not in as_demo.stdout, as_demo
        not_theirs = stride("cancel", job_id.group(0), env=demo)
        assert not_theirs.returncode == 2, not_theirs
        assert "another user's job" in not_theirs.stderr, not_theirs
        minted = stride("token", "create", "carol", env=env)
        assert minted.returncode == 0, minted.stderr
        carol = {**env, "STRIDE_TOKEN": minted.stdout.strip()}
        theirs = stride("submit", str(ROOT / "examples" / "wide-deep.yaml"), env=carol)
        assert theirs.returncode == 0, theirs.stderr
        carol_job = re.search(r"job-[0-9a-f]{12}", theirs.stdout)
        assert carol_job is not None, theirs.stdout
        assert job_id.group(0) not in stride("status", env=carol).stdout
        # Carol cancels her own job (a user acts on their own jobs), which also frees the
        # machine for the small job below.
        assert stride("cancel", carol_job.group(0), env=carol).returncode == 0
        # The admin revokes Carol's token (by the token, as a file would do too): every
        # server refuses it; only an admin may; a token minted afterwards works.
        assert minted.stderr.strip().startswith("token id "), minted.stderr
        by_demo = stride("token", "revoke", "--user", "carol", env=demo)
        assert by_demo.returncode == 2 and "an admin's user token" in by_demo.stderr, by_demo
        neither = stride("token", "revoke", env=env)
        assert neither.returncode == 2 and "exactly one of TOKEN" in neither.stderr, neither
        missing = stride("token", "revoke", str(tmp_path / "none.token"), env=env)
        assert missing.returncode == 2 and "nor a file holding one" in missing.stderr, missing
        revoked = stride("token", "revoke", minted.stdout.strip(), "--reason", "left", env=env)
        assert revoked.returncode == 0, revoked.stderr
        assert f"revoked token {minted.stderr.split()[-1]}" in revoked.stdout, revoked.stdout
        for _ in range(50):
            turned_away = stride("status", env=carol)
            if turned_away.returncode == 2:
                break
            time.sleep(0.1)
        assert "revoked" in turned_away.stderr and "ask for a new one" in turned_away.stderr, (
            turned_away
        )
        again = stride("token", "create", "carol", env=env)
        assert stride("status", env={**env, "STRIDE_TOKEN": again.stdout.strip()}).returncode == 0
        forged = stride("status", env={**env, "STRIDE_TOKEN": "not.a.token"})
        assert forged.returncode == 2 and "not a JWT" in forged.stderr, forged
        assert stride("cancel", job_id.group(0), env=env).returncode == 0

        # A small job, end to end: admitted, planned, pods started, trained, succeeded, and
        # configdb holds what it measured under its plan.
        small = tmp_path / "small.yaml"
        text, records = re.subn(
            r"record_count: \d+",
            "record_count: 20000",
            (ROOT / "examples" / "wide-deep.yaml").read_text(),
        )
        text, epochs = re.subn(r"max_epochs: \d+", "max_epochs: 1", text)
        text, names = re.subn(r"name: wide-deep-ctr", "name: wide-deep-small", text)
        # The example's size changes with the demo; the job here must stay small.
        assert (records, epochs, names) == (1, 1, 1), (records, epochs, names)
        small.write_text(text)
        submitted = stride("submit", str(small), "--wait", env=env)
        assert submitted.returncode == 0, submitted.stderr
        small_job = re.search(r"job-[0-9a-f]{12}", submitted.stdout)
        assert small_job is not None
        # The running jobs with the optimizer's stage of each (the job has its plan v1; it
        # may already have finished, then it is no longer listed).
        top = stride("top", "--once", env={**env, "COLUMNS": "200"})
        assert top.returncode == 0, top.stderr
        assert "stride top" in top.stdout
        if small_job.group(0) in top.stdout:
            assert re.search(r"(cold_start|sampling|steady|optimizing) \(\d+ windows\)", top.stdout)
        waited = stride("wait", small_job.group(0), "--timeout", "300", env=env, timeout=330)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert "succeeded" in waited.stdout

        def profiled() -> str:
            status = stride("status", small_job.group(0), env=env)
            assert "measured (runtime profile)" in status.stdout, status.stdout
            return status.stdout

        shown = profiled_eventually(profiled)
        # The plan's throughput and step time, and each role's usage (rich draws the table).
        first = next(line for line in shown.splitlines() if line.lstrip("│ ").startswith("v1 "))
        assert re.search(r"[\d,]+ .* \d+ ms .* chief", first), shown
        # Why the plan was chosen, from the optimizer's record.
        explained = stride("explain", small_job.group(0), env=env)
        assert explained.returncode == 0, explained.stderr
        assert "plan v1" in explained.stdout
        assert "stage: cold_start; root cause: cold_start; by cold-start-plan/1" in (
            explained.stdout
        )
        unknown = stride("explain", "job-000000000000", env=env)
        assert unknown.returncode != 0 and "not found" in unknown.stderr, unknown
    finally:
        down = stride("down", env=env)
    assert down.returncode == 0, down.stderr
    assert "suite stopped" in down.stdout
    assert not pid_alive(state.supervisor_pid)
    assert SuiteState.read(tmp_path / "state") is None
    supervisor_log = (tmp_path / "state" / "supervisor.log").read_text()
    assert "suite stopped" in supervisor_log and "restarting" not in supervisor_log
    assert not pid_alive(state.postgres_process.pid)
    # Nothing of the checkpoint cache is left in shared memory (RAM).
    assert not default_shm_dir(tmp_path / "state" / "checkpoints").exists()

    # The data survives: the next `stride up` finds every job where it was.
    again = stride("up", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    try:
        listed = stride("status", env=env)
        assert listed.returncode == 0, listed.stderr
        for job in (job_id.group(0), small_job.group(0)):
            assert job in listed.stdout, listed.stdout
        assert "succeeded" in stride("status", small_job.group(0), env=env).stdout
    finally:
        assert stride("down", env=env).returncode == 0
