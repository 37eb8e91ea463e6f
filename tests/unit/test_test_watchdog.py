"""The hang watchdog of the test plugin (stride.testing.watchdog), run as pytest runs it:
an inner pytest in a subprocess, with the plugin loaded from its entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stride.testing.watchdog import EXIT_CODE, GRACE_ENV

HUNG = """
import signal
import time

import pytest


@pytest.mark.timeout(1)
def test_unreachable_by_the_timeout():
    # SIGALRM blocked: pytest-timeout's signal cannot stop this test.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(120)
"""

SLOW = """
import time

import pytest


@pytest.mark.timeout(1)
def test_stopped_by_the_timeout():
    time.sleep(120)
"""


def inner_pytest(
    tmp_path: Path, source: str, grace: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    (tmp_path / "test_inner.py").write_text(source)
    began = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env={**os.environ, GRACE_ENV: grace},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    return run, time.monotonic() - began


def test_a_test_the_timeout_cannot_stop_ends_its_process_naming_it_with_its_stacks(
    tmp_path: Path,
) -> None:
    run, took = inner_pytest(tmp_path, HUNG, "2")
    assert run.returncode == EXIT_CODE, (run.returncode, run.stdout, run.stderr)
    assert "stride test watchdog: test_inner.py::test_unreachable_by_the_timeout" in run.stderr
    # The hung thread's stack, where it is stuck.
    assert "in test_unreachable_by_the_timeout" in run.stderr, run.stderr
    assert took < 60, took


def test_a_test_the_timeout_stops_fails_as_usual(tmp_path: Path) -> None:
    run, _ = inner_pytest(tmp_path, SLOW, "2")
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert "Timeout" in run.stdout + run.stderr
    assert "watchdog" not in run.stderr


def test_a_bad_grace_is_named(tmp_path: Path) -> None:
    run, _ = inner_pytest(tmp_path, SLOW, "soon")
    assert run.returncode == 4, (run.stdout, run.stderr)
    assert f"{GRACE_ENV}='soon': not a number of seconds" in run.stderr
