"""Restarting what the supervisor runs: back-off policies, and the embedded servers.

A service, the embedded nats-server and the embedded PostgreSQL all come back after they
exit, each after a back-off of its own that doubles while it keeps exiting; the servers come
back on the same port or socket and the same store, so clients reconnect to the address
they know and nothing stored is lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from stride.cli.endpoints import Phase, ProcessState, describe_exit
from stride.obs.secrets import redact
from stride.runtime.processes import file_size, log_tail


@dataclass(frozen=True)
class RestartPolicy:
    """Exponential back-off: ``initial_seconds`` doubling per exit in a row, up to a cap.

    The count of exits in a row starts again after a run of ``stable_after_seconds``: a
    process that crashes after running that long got past its start, so the crash is a new
    fault and deserves a quick restart.
    """

    initial_seconds: float
    max_seconds: float
    stable_after_seconds: float
    factor: float = 2.0

    def delay(self, exits_in_a_row: int) -> float:
        """Seconds to wait before starting again after the ``exits_in_a_row``-th exit (>= 1)."""
        if exits_in_a_row < 1:
            raise ValueError(f"exits_in_a_row must be at least 1, not {exits_in_a_row}")
        # min() before the power would overflow only after ~1000 exits; cap the exponent anyway.
        exponent = min(exits_in_a_row - 1, 64)
        return float(min(self.initial_seconds * self.factor**exponent, self.max_seconds))


SERVICE_RESTARTS = RestartPolicy(initial_seconds=1.0, max_seconds=30.0, stable_after_seconds=30.0)
"""Back-off for services: 1 s, 2 s, 4 s, ... 30 s; the count starts again after 30 s up.

1 s first, because a one-off crash (a lost race for a port or a SQLite lock) should cost the
user about the two seconds a Python service needs to start anyway. Doubling, so a
deterministic crash (a bad setting, a broken migration) quickly stops eating CPU: each
attempt costs one to two seconds of a core in imports. 30 s cap: a permanent loop then costs
under 5% of one core, and a fault that clears by itself (a port freed, disk space back) is
picked up within half a minute on a machine where someone is waiting; Kubernetes' 10 s to
5 min suits unattended clusters, not a local suite. 30 s up resets the count: every service
is healthy within about ten seconds of starting on two cores, so one that ran for 30 s got
past its start and its next crash is a new fault."""

NATS_RESTARTS = RestartPolicy(initial_seconds=0.5, max_seconds=10.0, stable_after_seconds=30.0)
"""Back-off for the embedded nats-server: 0.5 s, 1 s, 2 s, ... 10 s.

Faster and capped lower than services, because while NATS is down no service can do
anything, and nats-server is one Go binary that listens within about 50 ms, so a retry is
cheap. It still backs off, so a store that cannot be opened or a port someone else took does
not become a busy loop writing the same error to its log."""


POSTGRES_RESTARTS = RestartPolicy(initial_seconds=0.5, max_seconds=10.0, stable_after_seconds=30.0)
"""Back-off for the embedded PostgreSQL: as for NATS, because every service waits on it.

It starts in well under a second, recovery from the write-ahead log included; right after
a crash its old sessions may still hold its shared memory for a moment, and then it refuses
to start, which the first half-second retry gets past."""


class Backoff:
    """Counts exits in a row and turns each into a delay; pure (callers pass the times)."""

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.exits_in_a_row = 0

    def next_delay(self, uptime_seconds: float) -> float:
        """Record an exit after ``uptime_seconds`` of running; return the delay before a start."""
        if uptime_seconds >= self.policy.stable_after_seconds:
            self.exits_in_a_row = 0
        self.exits_in_a_row += 1
        return self.policy.delay(self.exits_in_a_row)


def log(message: str) -> None:
    """A line of the supervisor's log, with secrets redacted."""
    print(f"{time.strftime('%H:%M:%S')} supervisor: {redact(message)}", flush=True)


class EmbeddedProcess(Protocol):
    """An embedded server the supervisor runs: :class:`~stride.runtime.embedded_nats.
    NatsServer` or :class:`~stride.runtime.embedded_postgres.EmbeddedPostgres`."""

    log_path: Path

    @property
    def pid(self) -> int:
        """Its process id; 0 before the first start."""
        ...

    def start(self, timeout: float) -> object:
        """Start it (again, on the same address and store) and wait until it serves;
        raises RuntimeError, leaving no process, if it does not within ``timeout``."""
        ...

    def poll(self) -> int | None:
        """Its exit code once it exited (reaping it), else None."""
        ...

    def stop(self) -> None:
        """Stop it gracefully."""
        ...


@dataclass
class SupervisedServer:
    """An embedded server (NATS, PostgreSQL) kept running: started again after it died, with
    back-off, on the same address and store, and its life recorded for `stride status`."""

    name: str
    """How the log names it: "embedded NATS"."""
    server: EmbeddedProcess
    policy: RestartPolicy
    start_timeout: float
    where: str
    """Where it serves, for the log: its URL."""
    comeback: str
    """What a restart keeps, for the log ("same JetStream store; ...")."""
    state: ProcessState | None = None
    backoff: Backoff = field(init=False)
    started_monotonic: float = 0.0
    next_start_monotonic: float | None = None
    log_offset: int = 0

    def __post_init__(self) -> None:
        self.backoff = Backoff(self.policy)

    @property
    def running(self) -> bool:
        """True while its process runs (it served once started)."""
        return self.state is not None and self.state.phase is Phase.RUNNING

    def start(self) -> ProcessState:
        """The first start; raises RuntimeError (nothing left running) if it fails."""
        self.log_offset = file_size(self.server.log_path)
        self.server.start(self.start_timeout)
        self.started_monotonic = time.monotonic()
        self.state = ProcessState(
            phase=Phase.RUNNING,
            pid=self.server.pid,
            log_path=str(self.server.log_path),
            started_at=time.time(),
        )
        return self.state

    def tend(self) -> bool:
        """Observe it and take at most one step; True if its state changed."""
        if self.state is None:
            return False
        if self.next_start_monotonic is None:
            return self._observe(self.state)
        if time.monotonic() < self.next_start_monotonic:
            return False
        return self._start_again(self.state)

    def _observe(self, state: ProcessState) -> bool:
        """Notice its exit (reaping it, so no zombie stays) and schedule its next start."""
        code = self.server.poll()
        if code is None:
            return False
        uptime = time.monotonic() - self.started_monotonic
        self._exited(f"{self.name} (pid {state.pid}) {describe_exit(code)}", code, uptime)
        return True

    def _start_again(self, state: ProcessState) -> bool:
        self.log_offset = file_size(self.server.log_path)
        try:
            self.server.start(self.start_timeout)
        except RuntimeError as error:
            self._exited(f"{self.name} did not start again: {error}", None, 0.0)
            return True
        self.started_monotonic = time.monotonic()
        self.next_start_monotonic = None
        state.phase = Phase.RUNNING
        state.pid = self.server.pid
        state.started_at = time.time()
        state.next_start_at = None
        log(f"{self.name} started again at {self.where} (pid {self.server.pid}), {self.comeback}")
        return True

    def _exited(self, what: str, code: int | None, uptime: float) -> None:
        assert self.state is not None
        delay = self.backoff.next_delay(uptime)
        self.next_start_monotonic = time.monotonic() + delay
        state = self.state
        state.phase = Phase.BACKING_OFF
        state.pid = 0
        state.restarts = self.backoff.exits_in_a_row
        if code is not None:
            state.last_exit_code = code
        state.last_exit_at = time.time()
        state.last_output = log_tail(self.server.log_path, self.log_offset)
        state.backoff_seconds = delay
        state.next_start_at = state.last_exit_at + delay
        log(f"{what}; starting it again at {self.where} in {delay:g}s")
