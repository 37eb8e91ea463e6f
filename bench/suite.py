"""What the benchmarks that run a real suite share: ``stride up``/``down`` in a private
state directory, and the percentile they report."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any


def stride(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the ``stride`` CLI of this checkout."""
    return subprocess.run(
        [sys.executable, "-m", "stride.cli", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@contextlib.contextmanager
def running_suite(
    *up_args: str, settings: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """A suite started with ``stride up`` (embedded NATS and PostgreSQL) in a fresh state
    directory, with ``settings`` as extra environment; yields its endpoints, then stops it
    and removes the directory."""
    state = Path(tempfile.mkdtemp(prefix="stride-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(state), "STRIDE_LOG_LEVEL": "WARNING", **(settings or {})})
    up = stride("up", *up_args, env=env)
    if up.returncode != 0:
        raise RuntimeError(f"stride up failed:\n{up.stdout}{up.stderr}")
    try:
        yield {**json.loads((state / "endpoints.json").read_text()), "state_dir": str(state)}
    finally:
        stride("down", env=env)
        shutil.rmtree(state, ignore_errors=True)


TICKS = os.sysconf("SC_CLK_TCK")
QUIET_CPU_FRACTION = 0.15
"""The suite is quiet when all its processes together use less than this much of one core
over a second (idle, its timers and health checks take about a tenth)."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (all threads), 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def postgres_pids() -> list[int]:
    """Every PostgreSQL server process on the machine (the bench's server is otherwise
    idle while it runs; its backends come and go, so they are listed at each sample)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
    return pids


def postgres_cpu(postmaster: int | None = None) -> float:
    """CPU seconds a PostgreSQL server has used so far, its exited processes included:
    every live server process, plus what each postmaster's reaped children used (the kernel
    adds a child's time to its parent's cutime and cstime when the parent waits for it). A
    sum over the live processes alone goes down when a backend exits. ``postmaster``: that
    server only (its postmaster's pid); every server on the machine by default."""
    pids = postgres_pids()
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent = int(fields[1])
        if postmaster is not None and postmaster not in (pid, parent):
            continue
        total += (int(fields[11]) + int(fields[12])) / TICKS
        if parent not in pids:  # a postmaster (its parent is not PostgreSQL)
            total += (int(fields[13]) + int(fields[14])) / TICKS
    return total


class CpuMeter:
    """CPU seconds of the suite's processes, by process name."""

    def __init__(self, state_dir: Path, postgres: bool) -> None:
        from stride.cli.endpoints import SuiteState

        state = SuiteState.read(state_dir)
        assert state is not None
        self.pids = {name: process.pid for name, process in state.processes.items()}
        if state.nats_process is not None:
            self.pids["nats-server"] = state.nats_process.pid
        self.pids["supervisor"] = state.supervisor_pid
        self.postgres = postgres

    def sample(self) -> dict[str, float]:
        taken = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        if self.postgres:
            taken["postgresql"] = postgres_cpu()
        return taken

    async def quiet(self, timeout: float, done: Callable[[], bool] = lambda: True) -> float:
        """Wait until ``done()`` and the suite uses less than :data:`QUIET_CPU_FRACTION` of
        a core over a second; returns the seconds waited."""
        start = time.monotonic()
        before = sum(self.sample().values())
        while time.monotonic() - start < timeout:
            await asyncio.sleep(1.0)
            now = sum(self.sample().values())
            if now - before < QUIET_CPU_FRACTION and done():
                break
            before = now
        return time.monotonic() - start

    async def idle_rate(self, seconds: float = 5.0) -> float:
        """CPU seconds per second the quiet suite spends (health checks, timers)."""
        before = sum(self.sample().values())
        await asyncio.sleep(seconds)
        return (sum(self.sample().values()) - before) / seconds


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process spent between two samples."""
    return {name: after[name] - before.get(name, 0.0) for name in after}


def start_profiles(
    state_dir: Path, services: list[str], folder: Path
) -> list[subprocess.Popen[bytes]]:
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path="/tmp/pyspy/bin")
    if py_spy is None:
        raise SystemExit(
            "--profile needs py-spy: python3 -m pip install --target /tmp/pyspy py-spy"
        )
    from stride.cli.endpoints import SuiteState

    state = SuiteState.read(state_dir)
    assert state is not None
    env = {**os.environ, "PYTHONPATH": "/tmp/pyspy"}
    return [
        subprocess.Popen(
            [
                py_spy,
                "record",
                "--pid",
                str(state.processes[name].pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(folder / f"{name}.txt"),
                "--nonblocking",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in services
    ]


def summarize_profile(path: Path, top: int = 15) -> list[str]:
    """The functions with the most samples: own time (the frame on top of the stack) and
    inclusive (anywhere in it), from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [
            frame.split(" (")[0] + " " + frame.rsplit("/", 1)[-1].rstrip(")")
            for frame in stack.split(";")
            if frame
        ]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"  {total} samples; own time:"]
    lines += [f"    {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    lines.append("  inclusive (Stride's code and the libraries it calls):")
    lines += [
        f"    {100 * n / total:5.1f}%  {name}"
        for name, n in inclusive.most_common(4 * top)
        if "asyncio" not in name and "runpy" not in name and "<module>" not in name
    ][:top]
    return lines


@contextlib.contextmanager
def suite_on_database(
    database: str, prefix: str, before_up: Callable[[str], None] | None = None
) -> Iterator[tuple[Path, dict[str, str], str]]:
    """``stride up`` in a fresh state folder (``<work>/state``) on a fresh database of the
    PostgreSQL at ``STRIDE_TEST_DATABASE_URL``, else of an embedded one of the run's own
    (``database`` "postgresql"), or on SQLite files; yields (work folder, the CLI's
    environment, the database URL or ""), then stops the suite, drops the database and
    removes the folder. ``before_up`` gets the database URL before any service connects."""
    from stride.testing.databases import create_database, drop_database, test_database_server

    work = Path(tempfile.mkdtemp(prefix=f"stride-{prefix}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(work / "state"), "STRIDE_LOG_LEVEL": "WARNING"})
    database_url = ""
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        if database == "postgresql":
            cleanup.enter_context(test_database_server())
            database_url = create_database(f"stride_bench_{prefix.replace('-', '_')}")
            cleanup.callback(drop_database, database_url)
            env["STRIDE_DATABASE_URL"] = database_url
            if before_up is not None:
                before_up(database_url)
        up_args = ("--database", "sqlite") if database == "sqlite" else ()
        cleanup.callback(stride, "down", env=env)
        up = stride("up", *up_args, env=env)
        if up.returncode != 0:
            raise RuntimeError(f"stride up failed:\n{up.stdout}{up.stderr}")
        yield work, env, database_url


@contextlib.contextmanager
def bench_servers() -> Iterator[None]:
    """NATS (``STRIDE_NATS_URL``'s, else an embedded one named there) and PostgreSQL
    (``STRIDE_TEST_DATABASE_URL``'s, else an embedded one) for a benchmark that starts its
    services itself; both stopped after."""
    from stride.runtime.embedded_nats import NatsServer
    from stride.testing.databases import test_database_server

    nats = None if os.environ.get("STRIDE_NATS_URL") else NatsServer().start()
    if nats is not None:
        os.environ["STRIDE_NATS_URL"] = nats.url
    try:
        with test_database_server():
            yield
    finally:
        if nats is not None:
            nats.stop()


def suite_arguments(parser: Any, profiled: str) -> None:
    """The options every suite benchmark takes: the database and the services to profile."""
    parser.add_argument("--database", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="SERVICE",
        help=f"py-spy this service while {profiled} (repeatable; costs CPU)",
    )


async def stream_messages(bus: Any, subject: str) -> list[bytes]:
    """Every message on ``subject`` in its stream, oldest first (an ordered consumer)."""
    found: list[bytes] = []
    subscription = await bus.js.subscribe(subject, ordered_consumer=True)
    try:
        while True:
            try:
                message = await subscription.next_msg(timeout=2.0)
            except Exception:  # nats' TimeoutError: nothing more
                return found
            found.append(message.data)
    finally:
        await subscription.unsubscribe()


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def record(path: Path, lines: list[str]) -> None:
    """Print a benchmark's report and keep it under ``bench/results/``."""
    text = "\n".join(lines) + "\n"
    print(text)
    path.write_text(text)
