"""The test run brings its own PostgreSQL and takes it away, however the run ends.

Each case runs a real, nested pytest (with the ``stride`` plugin, as ``make test`` does) on
a small test file, with no ``STRIDE_TEST_DATABASE_URL`` and a temporary folder of its own,
then looks at what is left: the embedded server's process and its folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stride.cli.endpoints import pid_alive
from stride.testing.databases import FOLDER_PREFIX, TEST_DATABASE_ENV

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TESTS = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    from sqlalchemy import create_engine, make_url, text


    RECORD = Path(os.environ["RECORD"])

    def test_a_database_of_its_own(postgres_url):
        engine = create_engine(make_url(postgres_url).set(drivername="postgresql+psycopg"))
        with engine.connect() as connection:
            backend = connection.execute(text("SELECT pg_backend_pid()")).scalar()
            # The session's process, a child of the server's (the postmaster), while open.
            stat = Path(f"/proc/{backend}/stat").read_text().rpartition(")")[2].split()
        engine.dispose()
        RECORD.write_text(stat[1])
        if os.environ.get("THEN") == "fail":
            assert False, "failing on purpose"
        if os.environ.get("THEN") == "hang":
            time.sleep(600)
    """
)


@pytest.fixture
def temporary() -> Iterator[Path]:
    """The nested run's temporary folder: short, so its server's socket fits in it."""
    folder = Path(tempfile.mkdtemp(prefix="nested-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _nested(
    tmp_path: Path, temporary: Path, then: str, *options: str
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the nested run; returns it and the file its test records the server in."""
    (tmp_path / "test_nested.py").write_text(TESTS)
    record = tmp_path / "record"
    record.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != TEST_DATABASE_ENV}
    env.update({"TMPDIR": str(temporary), "RECORD": str(record), "THEN": then})
    with (tmp_path / "nested.log").open("ab") as log:
        run = subprocess.Popen(
            [
                sys.executable,
                "-c",
                AS_FROM_A_TERMINAL,
                str(tmp_path / "test_nested.py"),
                "-q",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                str(tmp_path),
                *options,
            ],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return run, record


AS_FROM_A_TERMINAL = textwrap.dedent(
    """
    import signal, sys
    import pytest

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    sys.exit(pytest.main(sys.argv[1:]))
    """
)
"""``pytest`` with ctrl-c as a terminal gives it. A process inherits an ignored or blocked
signal across exec, and the test process's SIGINT may be either after the tests before it
on the same worker: twice in one day a full run's nested run slept through the ctrl-c (its
600 s) and failed the test."""


def _recorded(record: Path, run: subprocess.Popen[bytes]) -> int:
    """The postmaster's pid, once the nested test recorded it."""
    deadline = time.monotonic() + 60
    while not record.exists() or not record.read_text():
        assert run.poll() is None or record.exists(), f"the nested run ended ({run.returncode})"
        assert time.monotonic() < deadline, "the nested test never ran"
        time.sleep(0.1)
    return int(record.read_text().split()[0])


def _left(temporary: Path) -> list[Path]:
    return sorted(temporary.glob(f"{FOLDER_PREFIX}*"))


@pytest.mark.parametrize(
    ("then", "options", "code"),
    [
        ("pass", [], 0),
        ("fail", [], 1),
        ("pass", ["-n", "2"], 0),  # one server for the run, made before the workers start
    ],
    ids=["passed", "failed", "xdist"],
)
def test_the_run_stops_its_server_and_removes_its_folder(
    tmp_path: Path, temporary: Path, then: str, options: list[str], code: int
) -> None:
    run, record = _nested(tmp_path, temporary, then, *options)
    assert run.wait(90) == code
    postmaster = _recorded(record, run)
    assert not pid_alive(postmaster)
    assert _left(temporary) == []


@pytest.mark.parametrize("interrupt", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_stops_its_server_and_removes_its_folder(
    tmp_path: Path, temporary: Path, interrupt: signal.Signals
) -> None:
    run, record = _nested(tmp_path, temporary, "hang")
    try:
        postmaster = _recorded(record, run)
        assert pid_alive(postmaster) and len(_left(temporary)) == 1
        run.send_signal(interrupt)
        assert run.wait(60) != 0
    finally:
        if run.poll() is None:  # failed: end it, or it outlives the test and its server too
            run.kill()
            run.wait(10)
    assert not pid_alive(postmaster)
    assert _left(temporary) == []


def test_a_killed_run_leaves_no_server_and_the_next_run_removes_its_folder(
    tmp_path: Path, temporary: Path
) -> None:
    run, record = _nested(tmp_path, temporary, "hang")
    postmaster = _recorded(record, run)
    run.kill()
    run.wait()
    # The kernel stopped the server with its starter (setpriv --pdeathsig).
    deadline = time.monotonic() + 30
    while pid_alive(postmaster):
        assert time.monotonic() < deadline, f"postgres {postmaster} outlived the killed run"
        time.sleep(0.1)
    assert len(_left(temporary)) == 1  # nobody was left to remove it...
    again, record = _nested(tmp_path, temporary, "pass")
    assert again.wait(90) == 0
    assert _left(temporary) == []  # ...until the next run
