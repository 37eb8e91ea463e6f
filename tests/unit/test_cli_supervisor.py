"""The supervisor's pure parts: restart back-off, the recorded suite state, log tails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stride.cli.endpoints import (
    CRASH_LOOP_EXITS,
    DatabaseKind,
    Phase,
    ProcessState,
    SuiteState,
    describe_exit,
    pid_alive,
)
from stride.cli.restarts import (
    NATS_RESTARTS,
    POSTGRES_RESTARTS,
    SERVICE_RESTARTS,
    Backoff,
    RestartPolicy,
)
from stride.cli.supervisor import Supervisor
from stride.runtime.processes import log_tail
from stride.testing.eventually import assert_eventually

pytestmark = pytest.mark.timeout(10)


def test_service_delays_double_from_one_second_up_to_the_cap() -> None:
    assert [SERVICE_RESTARTS.delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]
    assert SERVICE_RESTARTS.delay(10_000) == 30  # no overflow after days of crashing


def test_nats_restarts_sooner_and_caps_lower_than_services() -> None:
    assert [NATS_RESTARTS.delay(n) for n in range(1, 7)] == [0.5, 1, 2, 4, 8, 10]
    assert NATS_RESTARTS.delay(1) < SERVICE_RESTARTS.delay(1)
    assert NATS_RESTARTS.max_seconds < SERVICE_RESTARTS.max_seconds


def test_the_embedded_postgres_restarts_as_soon_as_nats_does() -> None:
    """Every service waits on it; a retry costs a fraction of a second."""
    assert [POSTGRES_RESTARTS.delay(n) for n in range(1, 7)] == [0.5, 1, 2, 4, 8, 10]


def test_a_delay_needs_an_exit() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SERVICE_RESTARTS.delay(0)


def test_quick_exits_in_a_row_back_off_further_each_time() -> None:
    backoff = Backoff(SERVICE_RESTARTS)
    assert [backoff.next_delay(uptime_seconds=1.5) for _ in range(4)] == [1, 2, 4, 8]
    assert backoff.exits_in_a_row == 4


def test_a_stable_run_starts_the_count_again() -> None:
    backoff = Backoff(RestartPolicy(initial_seconds=1, max_seconds=30, stable_after_seconds=30))
    for _ in range(5):
        backoff.next_delay(uptime_seconds=2)
    assert backoff.next_delay(uptime_seconds=29.9) == 30  # not quite stable: still capped
    assert backoff.next_delay(uptime_seconds=30) == 1  # ran long enough: a fresh fault
    assert backoff.exits_in_a_row == 1
    assert backoff.next_delay(uptime_seconds=0.5) == 2


def crashed(restarts: int, phase: Phase = Phase.BACKING_OFF) -> ProcessState:
    return ProcessState(
        phase=phase,
        pid=0 if phase is Phase.BACKING_OFF else 42,
        log_path="/state/logs/configdb.log",
        started_at=100.0,
        restarts=restarts,
        last_exit_code=2,
        last_exit_at=101.5,
        last_output=["stride.configdb: invalid settings: X"],
        backoff_seconds=SERVICE_RESTARTS.delay(restarts),
        next_start_at=101.5 + SERVICE_RESTARTS.delay(restarts),
    )


def test_a_process_crash_loops_after_three_exits_in_a_row_until_it_runs() -> None:
    assert CRASH_LOOP_EXITS == 3
    assert not crashed(2).crash_looping
    assert crashed(3).crash_looping
    assert crashed(3, Phase.STARTING).crash_looping
    assert not crashed(3, Phase.RUNNING).crash_looping


def test_the_problem_line_names_the_exit_the_next_try_and_the_log() -> None:
    line = crashed(4).problem("configdb", now=103.5)
    assert line == (
        "configdb is crash-looping: exited with code 2, restart 4 in 6.0s "
        "(back-off 8s, doubling); log /state/logs/configdb.log"
    )
    assert crashed(1).problem("configdb", now=101.5).startswith("configdb is restarting:")
    starting = crashed(3, Phase.STARTING).problem("configdb", now=103)
    assert "restart 3 is starting" in starting and "exited with code 2" in starting
    assert crashed(3, Phase.RUNNING).problem("configdb", now=200) == ""
    never_healthy = ProcessState(Phase.STARTING, 42, "/l.log", started_at=100.0)
    assert never_healthy.problem("optimizer", now=195) == (
        "optimizer is starting (not healthy after 95s); log /l.log"
    )


def test_exits_by_signal_are_named() -> None:
    assert describe_exit(2) == "exited with code 2"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(None) == "has not exited"


def test_the_suite_state_round_trips_and_lists_only_what_is_not_running(tmp_path: Path) -> None:
    state = SuiteState(
        supervisor_pid=1,
        nats_url="nats://127.0.0.1:4222",
        embedded_nats=True,
        database="sqlite",
        services={"admission": "127.0.0.1:1", "configdb": "127.0.0.1:2"},
        ready=True,
        nats_process=ProcessState(Phase.RUNNING, 7, "/n.log", started_at=1.0, restarts=1),
        postgres_process=crashed(1),
        database_data="/state/postgres/data",
        processes={
            "admission": ProcessState(Phase.RUNNING, 8, "/a.log", started_at=1.0),
            "configdb": crashed(5),
        },
    )
    state.write(tmp_path)
    assert list(tmp_path.iterdir()) == [tmp_path / "endpoints.json"]  # no temporary left
    read = SuiteState.read(tmp_path)
    assert read == state
    assert read is not None and read.processes["configdb"].phase is Phase.BACKING_OFF
    assert read.postgres_process is not None and read.postgres_process.phase is Phase.BACKING_OFF
    problems = read.problems(now=102)
    assert [p for _, p in problems] == [state.postgres_process, state.processes["configdb"]]
    assert problems[0][0].startswith("postgres (embedded) is restarting: exited with code 2")


def test_fields_from_a_newer_supervisor_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "endpoints.json").write_text(
        '{"supervisor_pid": 1, "nats_url": "", "embedded_nats": false, "database": "x",'
        ' "newer": 1, "processes": {"admission": {"phase": "running", "pid": 3,'
        ' "log_path": "/a.log", "started_at": 1.0, "newer": 2}}}'
    )
    read = SuiteState.read(tmp_path)
    assert read is not None and read.processes["admission"].phase is Phase.RUNNING
    assert SuiteState.read(tmp_path / "nowhere") is None


def test_the_log_tail_is_what_the_latest_run_printed(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("old 1\nold 2\nold 3\n")
    offset = log.stat().st_size
    assert log_tail(log, since=offset) == ["old 1", "old 2", "old 3"]  # this run printed nothing
    with log.open("a") as appending:
        appending.write("new 1\n\n" + "x" * 500 + "\n")
    assert log_tail(log, since=offset) == ["new 1", "x" * 297 + "..."]
    assert log_tail(tmp_path / "missing.log") == []


async def test_a_zombie_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Exited but not yet waited for: /proc shows it as a zombie, kill(0) still succeeds.
        await assert_eventually(lambda: not pid_alive(child.pid), timeout=5)
        os.kill(child.pid, 0)  # and yet the pid exists
    finally:
        child.wait()
    assert not pid_alive(child.pid)


@pytest.mark.parametrize("database", list(DatabaseKind))
def test_a_server_named_by_the_environment_wins_unless_sqlite_was_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database: DatabaseKind
) -> None:
    """STRIDE_DATABASE_URL names the user's own server; `--database sqlite` beside it is a
    contradiction, refused before anything starts."""
    monkeypatch.setenv("STRIDE_DATABASE_URL", "postgresql://stride:secret@db.example:5432/s")
    supervisor = Supervisor(tmp_path, database=database)
    error = supervisor._start_database()
    assert supervisor.postgres is None and not list(tmp_path.iterdir())  # nothing started
    if database is DatabaseKind.SQLITE:
        assert error == (
            "--database sqlite, but STRIDE_DATABASE_URL names a server: unset one of them"
        )
        return
    assert error == ""
    assert supervisor.state.database.endswith("db.example:5432/s (STRIDE_DATABASE_URL)")
    assert supervisor.database_url == ""  # the services read the variable themselves


def test_sqlite_is_a_file_per_service_in_the_state_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STRIDE_DATABASE_URL", raising=False)
    supervisor = Supervisor(tmp_path, database=DatabaseKind.SQLITE)
    assert supervisor._start_database() == ""
    assert supervisor.state.database == f"SQLite files in {tmp_path / 'db'}"
    assert supervisor.postgres is None
    env = supervisor._environment("admission", "nats://x", 1, {"configdb": 2})
    assert env["STRIDE_ADMISSION_DATABASE_URL"] == f"sqlite:///{tmp_path / 'db'}/admission.db"
