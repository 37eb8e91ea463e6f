"""The embedded PostgreSQL: a real PostgreSQL 18 from the wheel, made, started, crashed,
started again, and never outliving the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from stride.cli.endpoints import pid_alive
from stride.runtime.embedded_postgres import EmbeddedPostgres, PostgresError
from stride.testing.eventually import assert_eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A durable embedded server in the test's folder, as `stride up` runs it."""
    postgres = EmbeddedPostgres(tmp_path / "pg")
    try:
        yield postgres.start()
    finally:
        postgres.stop()


def _value(url: str, query: str) -> object:
    with psycopg.connect(url, autocommit=True) as connection:
        row = connection.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_a_fresh_folder_becomes_a_postgresql_18_on_a_private_socket(
    server: EmbeddedPostgres,
) -> None:
    assert server.version == "18"
    assert str(_value(server.url(), "SHOW server_version")).startswith("18.")
    # No TCP listener: the socket alone, its owner's alone.
    assert _value(server.url(), "SHOW listen_addresses") == ""
    assert _value(server.url(), "SHOW unix_socket_permissions") == "0700"
    assert server.socket_dir == server.root
    assert (server.data).stat().st_mode & 0o077 == 0
    # Durable, as `stride up` runs it; a test server is not.
    assert _value(server.url(), "SHOW fsync") == "on"
    server.ensure_database("stride")
    server.ensure_database("stride")  # twice is the same
    assert _value(server.url("stride"), "SELECT current_database()") == "stride"
    # Files stay the starting user's, even where the server ran in a user namespace.
    assert (server.data / "PG_VERSION").stat().st_uid == os.geteuid()


def test_a_killed_server_starts_again_with_everything_it_committed(
    server: EmbeddedPostgres,
) -> None:
    url = server.url()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("CREATE TABLE kept (n int)")
        connection.execute("INSERT INTO kept VALUES (1), (2), (3)")
    old = server.pid
    server.kill()  # SIGKILL, no checkpoint: recovery replays the write-ahead log
    assert server.poll() == -signal.SIGKILL
    server.start()
    assert server.pid != old and server.url() == url  # the same socket: clients find it
    assert _value(url, "SELECT sum(n) FROM kept") == 6


def test_a_stopped_server_keeps_its_data_for_the_next_start(tmp_path: Path) -> None:
    first = EmbeddedPostgres(tmp_path / "pg").start()
    first.ensure_database("stride")
    with psycopg.connect(first.url("stride"), autocommit=True) as connection:
        connection.execute("CREATE TABLE kept AS SELECT 42 AS answer")
    first.stop()
    assert not pid_alive(first.pid)
    second = EmbeddedPostgres(tmp_path / "pg").start()
    try:
        assert _value(second.url("stride"), "SELECT answer FROM kept") == 42
    finally:
        second.stop()


def test_a_server_left_running_on_the_folder_is_stopped_before_a_new_start(
    tmp_path: Path,
) -> None:
    """A supervisor killed without ``setpriv`` left its server: the next start ends it."""
    orphan = EmbeddedPostgres(tmp_path / "pg").start()
    successor = EmbeddedPostgres(tmp_path / "pg")
    try:
        successor.start()
        assert not pid_alive(orphan.pid) and orphan.poll() is not None
        assert _value(successor.url(), "SELECT 1") == 1
    finally:
        successor.stop()
        orphan.stop()


def test_a_long_folder_gets_a_short_socket_folder_removed_at_stop(tmp_path: Path) -> None:
    root = tmp_path / ("deep-" * 20) / "pg"
    server = EmbeddedPostgres(root, durable=False).start()
    socket_dir = server.socket_dir
    try:
        assert socket_dir is not None and socket_dir != root
        assert len(str(socket_dir / ".s.PGSQL.5432")) < 100
        assert _value(server.url(), "SHOW fsync") == "off"
    finally:
        server.stop()
    assert socket_dir is not None and not socket_dir.exists()


def test_an_interrupted_first_start_leaves_no_half_made_data_folder(tmp_path: Path) -> None:
    root = tmp_path / "pg"
    (root / "data.initdb").mkdir(parents=True)
    (root / "data.initdb" / "half").write_text("an initdb killed half way")
    server = EmbeddedPostgres(root, durable=False).start()
    try:
        assert not (root / "data.initdb").exists() and server.version == "18"
    finally:
        server.stop()


def test_a_folder_of_another_major_version_is_refused_naming_the_problem(
    tmp_path: Path,
) -> None:
    made = EmbeddedPostgres(tmp_path / "pg", durable=False).start()
    made.stop()
    (made.data / "PG_VERSION").write_text("15\n")  # as PostgreSQL 15 would have made it
    server = EmbeddedPostgres(tmp_path / "pg")
    with pytest.raises(PostgresError, match="PostgreSQL exited") as refused:
        server.start(timeout=30)
    assert "initialized by PostgreSQL version 15" in str(refused.value), refused.value
    assert server.poll() is not None  # nothing left running
    assert (made.data / "PG_VERSION").read_text() == "15\n"  # and the user's files untouched


async def test_the_server_never_outlives_the_process_that_started_it(tmp_path: Path) -> None:
    """SIGKILL of its starter (a supervisor, a test run): the kernel stops the server."""
    starter = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from stride.runtime.embedded_postgres import EmbeddedPostgres
                server = EmbeddedPostgres(Path({str(tmp_path / "pg")!r}), durable=False).start()
                print(server.pid, flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        assert pid_alive(pid)
        started = time.monotonic()
        starter.kill()
        starter.wait()
        await assert_eventually(lambda: not pid_alive(pid), timeout=30, message="still running")
        print(f"the server ended {time.monotonic() - started:.2f}s after its starter was killed")
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if starter.stdout is not None:
            starter.stdout.close()
