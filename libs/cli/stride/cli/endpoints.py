"""Where the services of a running suite are, and how each is doing, as `stride up` records it.

An explicit ``STRIDE_<SERVICE>_ADDRESS`` always wins (a remote or compose deployment);
otherwise the CLI reads ``endpoints.json`` in the state directory. The supervisor rewrites
that file (atomically) whenever a process it runs changes phase, so `stride status` can say
which service is crash-looping, why, and when it will be tried again, without asking the
supervisor anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

SUITE = ("admission", "optimizer", "executor", "configdb", "dispatcher", "ckptcache", "podwatcher")
"""Services `stride up` runs. The agent is not among them: it runs inside training pods."""

CORE = ("admission",)
"""Services without which the suite is useless (with NATS): `stride up` fails if these are not
up. Admission takes every job; the others add plans, history and data, and a user can still
submit and inspect jobs while one of them is being restarted."""

CRASH_LOOP_EXITS = 3
"""Exits in a row without staying up after which a process counts as crash-looping. One exit
can be a transient fault (a lost port race, a locked SQLite file) and a second can be the same
fault not yet cleared one second later; a third in a row is a loop, and `stride up` stops
waiting for that service (about eight seconds in, not the full ready timeout)."""

STATE_FILE = "endpoints.json"


class DatabaseKind(StrEnum):
    """What `stride up` stores the services' data in when no ``STRIDE_DATABASE_URL`` names
    a server (``stride up --database``)."""

    POSTGRES = "postgres"
    """The embedded PostgreSQL 18, in ``<state>/postgres``: the production database."""
    SQLITE = "sqlite"
    """A SQLite file per service in ``<state>/db``: the lightest setup."""


class Phase(StrEnum):
    """Where a supervised process is in its life."""

    STARTING = "starting"
    """Its process runs but has not reported SERVING since it was (re)started."""
    RUNNING = "running"
    """Its process runs and has been healthy since it was (re)started."""
    BACKING_OFF = "backing off"
    """It exited; the supervisor starts it again at ``next_start_at``."""


@dataclass
class ProcessState:
    """What the supervisor last observed of one process it runs (a service or nats-server)."""

    phase: Phase
    pid: int
    """The running process; 0 while it is backing off."""
    log_path: str
    started_at: float
    """Unix time of the latest start."""
    restarts: int = 0
    """Exits in a row without staying up; the supervisor resets it after a stable run."""
    last_exit_code: int | None = None
    """Exit code of the latest exit, negative for a signal (``-9`` is SIGKILL)."""
    last_exit_at: float | None = None
    """Unix time the supervisor saw the latest exit."""
    last_output: list[str] = field(default_factory=list)
    """The last lines its log held when it exited."""
    backoff_seconds: float = 0.0
    """The delay chosen after the latest exit."""
    next_start_at: float | None = None
    """Unix time of the next start while backing off."""

    @property
    def crash_looping(self) -> bool:
        """True if it exited ``CRASH_LOOP_EXITS`` times in a row and is not running now."""
        return self.phase is not Phase.RUNNING and self.restarts >= CRASH_LOOP_EXITS

    def problem(self, name: str, now: float) -> str:
        """One line saying what is wrong with it, or "" while it runs healthily."""
        if self.phase is Phase.RUNNING:
            return ""
        if self.restarts == 0:
            since = max(0.0, now - self.started_at)
            return f"{name} is starting (not healthy after {since:.0f}s); log {self.log_path}"
        kind = "crash-looping" if self.crash_looping else "restarting"
        exit_text = describe_exit(self.last_exit_code)
        if self.phase is Phase.BACKING_OFF and self.next_start_at is not None:
            wait = max(0.0, self.next_start_at - now)
            plan = (
                f"restart {self.restarts} in {wait:.1f}s "
                f"(back-off {self.backoff_seconds:g}s, doubling)"
            )
        else:
            plan = f"restart {self.restarts} is starting"
        return f"{name} is {kind}: {exit_text}, {plan}; log {self.log_path}"


def describe_exit(code: int | None) -> str:
    """``exited with code 2`` or ``killed by SIGKILL``."""
    if code is None:
        return "has not exited"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


@dataclass
class SuiteState:
    """What `stride up` wrote about the suite it runs."""

    supervisor_pid: int
    nats_url: str
    embedded_nats: bool
    database: str
    """What the services store their data in, for people: "embedded PostgreSQL 18 at ..."."""
    database_data: str = ""
    """The folder the suite's own database keeps its data in; "" for a server of the user's."""
    services: dict[str, str] = field(default_factory=dict)
    """gRPC address of each service."""
    ready: bool = False
    """True once NATS and the core services are up; it stays true while others restart."""
    error: str = ""
    """Why the suite did not start; the supervisor then stops everything."""
    nats_process: ProcessState | None = None
    """The embedded nats-server; None when NATS is external."""
    postgres_process: ProcessState | None = None
    """The embedded PostgreSQL; None on SQLite or a server of the user's."""
    processes: dict[str, ProcessState] = field(default_factory=dict)
    """Each service's process."""
    tls_dir: str = ""
    """The folder of the certificates the services and clients use (mutual TLS)."""
    insecure: bool = False
    """True when the suite runs gRPC in plain text (``stride up --insecure``)."""
    tokens_dir: str = ""
    """Where `stride up` wrote the admin's and the demo user's tokens (empty: none)."""

    def problems(self, now: float | None = None) -> list[tuple[str, ProcessState]]:
        """(line, process) for every supervised process that is not running healthily."""
        moment = time.time() if now is None else now
        named: list[tuple[str, ProcessState]] = []
        if self.nats_process is not None:
            named.append(("nats (embedded)", self.nats_process))
        if self.postgres_process is not None:
            named.append(("postgres (embedded)", self.postgres_process))
        named.extend(self.processes.items())
        return [(line, p) for name, p in named if (line := p.problem(name, moment))]

    def write(self, state_dir: Path) -> None:
        """Write atomically, so a reader never sees half a file."""
        target = state_dir / STATE_FILE
        # A name per writer, so a stale temporary from a killed writer is never half-reused.
        temporary = target.with_name(f"{STATE_FILE}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(asdict(self), indent=2))
        temporary.replace(target)

    @classmethod
    def read(cls, state_dir: Path) -> SuiteState | None:
        """The recorded state, or None if no suite was started there."""
        try:
            data = json.loads((state_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SuiteState:
        """Rebuild from ``asdict`` output; fields this version does not know are ignored."""
        state = cls(**_known_fields(cls, data))
        if isinstance(state.nats_process, dict):
            state.nats_process = _process_state(state.nats_process)
        if isinstance(state.postgres_process, dict):
            state.postgres_process = _process_state(state.postgres_process)
        state.processes = {
            name: _process_state(value) if isinstance(value, dict) else value
            for name, value in state.processes.items()
        }
        return state


def _known_fields(cls: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    # A newer supervisor may write fields an older CLI does not have; reading must not fail.
    names = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in names}


def _process_state(data: dict[str, Any]) -> ProcessState:
    state = ProcessState(**_known_fields(ProcessState, data))
    state.phase = Phase(state.phase)
    return state


class NoSuite(RuntimeError):
    """No address is configured and no suite is running."""


def address(service: str, state_dir: Path) -> str:
    """host:port of ``service``'s gRPC API."""
    configured = os.environ.get(f"STRIDE_{service.upper()}_ADDRESS")
    if configured:
        return configured
    state = SuiteState.read(state_dir)
    if state is None or not state.ready or service not in state.services:
        raise NoSuite(
            f"no running suite in {state_dir}: run `stride up`, "
            f"or set STRIDE_{service.upper()}_ADDRESS=host:port"
        )
    return state.services[service]


def pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # kill(0) succeeds on a zombie; /proc says whether it still runs (Linux; elsewhere assume so).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"
