"""Services run as real processes (``python -m stride.<service>``), for end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from stride.runtime.embedded_nats import free_port
from stride.runtime.tls import SERVICE_IDENTITIES

SERVICES = SERVICE_IDENTITIES
"""Every service, in start order."""


class ServiceProcess:
    """One service process with its own log file; restartable after a kill."""

    def __init__(self, service: str, env: Mapping[str, str], log_dir: Path) -> None:
        self.service = service
        self.port = free_port()
        self.env = {
            **os.environ,
            **env,
            f"STRIDE_{service.upper()}_GRPC_PORT": str(self.port),
            f"STRIDE_{service.upper()}_GRPC_HOST": "127.0.0.1",
        }
        self.log_path = log_dir / f"{service}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """host:port of its gRPC server."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> ServiceProcess:
        """Start (or restart) the process, appending to its log."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", f"stride.{self.service}"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait; returns the exit code (SIGKILL if it overstays ``timeout``)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)

    def log_text(self) -> str:
        """Everything it logged so far."""
        return self.log_path.read_text() if self.log_path.exists() else ""


def run_cli(
    *args: str, env: Mapping[str, str], timeout: float = 150.0
) -> subprocess.CompletedProcess[str]:
    """Run ``stride <args>`` as a user would, in its own process, and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "stride.cli", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
