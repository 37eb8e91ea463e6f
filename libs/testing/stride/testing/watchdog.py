"""A last resort against a test run that never ends.

pytest-timeout (``timeout`` in pyproject.toml) fails a test that runs too long by raising in
its main thread from a SIGALRM handler. A thread blocked where that signal cannot reach it
(the signal blocked, a C call that does not return to Python, a fixture that hangs while
tearing down after the timeout fired) keeps the test process waiting forever, and with it
``pytest -n`` and CI, which then report nothing but a killed job.

The watchdog is a daemon thread that knows the test running now and its limit: the test's
timeout plus :data:`GRACE_SECONDS` (``STRIDE_TEST_HANG_GRACE_SECONDS``). Past it, it prints
which test hung and every thread's stack, then ends the process with :data:`EXIT_CODE`;
under ``pytest -n``, xdist reports the crash against that test and starts a new worker, so
the run goes on and says where it stuck. A run with ``--timeout 0`` (a debugger) has none.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

import pytest

GRACE_SECONDS = 90.0
"""How long past its timeout a test may still run (its timeout failure's teardown)."""
GRACE_ENV = "STRIDE_TEST_HANG_GRACE_SECONDS"
EXIT_CODE = 70
"""The process's exit status when the watchdog ends it (EX_SOFTWARE)."""
_POLL_SECONDS = 1.0


def timeout_of(item: pytest.Item) -> float:
    """The item's pytest-timeout limit: its ``timeout`` marker, else the option or ini value
    (0: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    return float(item.config.getini("timeout") or 0)


class Watchdog:
    """Ends this process, naming the test and printing every stack, when the test running
    now outlives its deadline."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace_seconds = grace_seconds
        # The stream the run's report goes to, kept now: while a test runs, pytest captures
        # file descriptor 2, and what is written there dies with the process.
        self._stderr = os.dup(sys.stderr.fileno())
        self._lock = threading.Lock()
        self._current: tuple[str, float] | None = None
        threading.Thread(target=self._watch, name="stride-test-watchdog", daemon=True).start()

    def begin(self, nodeid: str, timeout: float) -> None:
        """``nodeid`` starts; it has ``timeout`` seconds (0: no limit) plus the grace."""
        deadline = time.monotonic() + timeout + self.grace_seconds if timeout > 0 else None
        with self._lock:
            self._current = None if deadline is None else (nodeid, deadline)

    def end(self) -> None:
        """The test ended (passed, failed or skipped): nothing is watched until the next."""
        with self._lock:
            self._current = None

    def _watch(self) -> None:
        while True:
            time.sleep(_POLL_SECONDS)
            with self._lock:
                current = self._current
            if current is not None and time.monotonic() > current[1]:
                self._end_process(current[0])

    def _end_process(self, nodeid: str) -> None:
        said = (
            f"\nstride test watchdog: {nodeid} is still running {self.grace_seconds:g}s past "
            "its timeout, where the timeout could not stop it; every thread's stack follows, "
            f"then this test process exits with {EXIT_CODE}\n"
        )
        os.write(self._stderr, said.encode())
        faulthandler.dump_traceback(file=self._stderr, all_threads=True)
        os._exit(EXIT_CODE)


def grace_from_environment() -> float:
    """:data:`GRACE_SECONDS`, or the positive number ``STRIDE_TEST_HANG_GRACE_SECONDS`` sets."""
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return GRACE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{GRACE_ENV}={raw!r}: not a number of seconds") from None
    if not value > 0:
        raise pytest.UsageError(f"{GRACE_ENV}={raw!r}: must be a positive number of seconds")
    return value
