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
  its change committed (concurrent calls share one transaction, group commit; commits are
  not fsynced: they survive a SIGKILL of the dispatcher, see
  ``DispatcherSettings.sync_commits``). Three ways to drive it:
  - "unary": one GetShard RPC per pair that also reports the previous shard done
    (``done_shard_id``), with the raw gRPC stub;
  - "session": the client library (``stride.shardclient.ShardClient``) as a worker uses it:
    the same combined call over its ShardSession stream, one call in flight;
  - "prefetch": the client library with the next shard leased ahead
    (``ShardClient.get_shard_async``, what ``ShardReader`` does while a shard trains): the
    call for shard n+1 is in flight while shard n is taken, so a worker holds at most two
    undone shards.

Clients run in separate processes (up to 4, threads inside), the same harness for both
systems; latency is per pair (get + report), pairs/s is the total over the window. The
systems take turns within each client count, so machine load affects both alike.
Goal (issue #5): >= 3x DLRover's pairs/s with p99 <= 1/3 of DLRover's.
"""

from __future__ import annotations

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
from pathlib import Path

import psycopg

from stride.runtime.embedded_nats import NatsServer
from stride.runtime.healthcheck import check
from stride.testing.channels import ensure_certificates, sync_channel
from stride.testing.processes import ServiceProcess

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "dispatcher_vs_dlrover.txt"
DLROVER_VENV = ROOT / "bench" / ".venv" / "dlrover-0.6.1"
DLROVER_PYTHON = DLROVER_VENV / "bin" / "python"
POSTGRES_URL = os.environ.get(
    "STRIDE_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
CLIENTS = (1, 8, 32)
SECONDS = float(os.environ.get("STRIDE_BENCH_SECONDS", "5"))
RECORDS, BATCH, SHARD_BATCHES, EPOCHS = 1_000_000, 100, 10, 1000

DRIVER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    system, address, job, threads, seconds = sys.argv[1:6]
    threads, seconds = int(threads), float(seconds)
    latencies, pairs, start = [], [0], threading.Barrier(threads + 1)
    lock = threading.Lock()

    if system == "dlrover":
        from dlrover.python.elastic_agent.master_client import GrpcMasterClient
        client = GrpcMasterClient(address, os.getpid(), "worker", timeout=10)

        def worker(number):
            local = []
            start.wait()
            end = time.perf_counter() + seconds
            while (now := time.perf_counter()) < end:
                ok, task = client.get_task(job)
                client.report_task_result(job, task.task_id, "")
                local.append(time.perf_counter() - now)
            with lock:
                latencies.extend(local)
    elif system.endswith("unary"):
        import grpc
        from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
        from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
        channel = sync_channel(address, "dispatcher")
        stub = pb_grpc.DispatcherServiceStub(channel)

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
                reply = stub.GetShard(pb.GetShardRequest(
                    worker=ref, done_shard_id=reply.shard.shard_id, done_lease=reply.lease))
                local.append(time.perf_counter() - now)
            with lock:
                latencies.extend(local)
    else:
        from stride.shardclient import ShardClient
        prefetch = system.endswith("prefetch")

        def worker(number):
            client = ShardClient(address, job, f"w{os.getpid()}-{number}")
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

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    start.wait()
    began, cpu = time.perf_counter(), time.process_time()
    for w in workers:
        w.join()
    print(json.dumps({"latencies": latencies, "elapsed": time.perf_counter() - began,
                      "cpu": time.process_time() - cpu}))
    """
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


def run_load(
    system: str, address: str, job: str, clients: int, driver: Path, server_pid: int
) -> dict[str, float]:
    processes = min(clients, 4)
    server_cpu = process_cpu(server_pid)
    python = str(DLROVER_PYTHON) if system == "dlrover" else sys.executable
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    running = [
        subprocess.Popen(
            [python, str(driver), system, address, job, str(clients // processes), str(SECONDS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        for _ in range(processes)
    ]
    latencies: list[float] = []
    elapsed = client_cpu = 0.0
    try:
        for process in running:
            out, _ = process.communicate(timeout=SECONDS * 20 + 60)
            if process.returncode != 0:
                raise RuntimeError(f"{system} driver failed ({process.returncode})")
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
    server_cpu = process_cpu(server_pid) - server_cpu
    latencies.sort()
    return {
        "server_us": 1e6 * server_cpu / len(latencies),
        "client_us": 1e6 * client_cpu / len(latencies),
        "pairs_per_second": len(latencies) / elapsed,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "pairs": float(len(latencies)),
    }


def bound(result: dict[str, float]) -> float:
    """Pairs/s the machine's cores allow at this CPU cost per pair (server + clients)."""
    return (os.cpu_count() or 1) * 1e6 / (result["server_us"] + result["client_us"])


def postgres_reachable() -> bool:
    try:
        with psycopg.connect(POSTGRES_URL, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def main() -> int:
    ensure_dlrover()
    workdir = Path(tempfile.mkdtemp(prefix="stride-bench-dispatcher-"))
    driver = workdir / "driver.py"
    driver.write_text(DRIVER)
    nats = NatsServer(workdir / "nats").start()
    services: list[ServiceProcess] = []
    dlrover: subprocess.Popen[bytes] | None = None
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    try:
        systems: dict[str, tuple[str, int]] = {}
        backends = {"sqlite": f"sqlite:///{workdir}/dispatcher.db"}
        if postgres_reachable():
            backends["postgresql"] = POSTGRES_URL
        for backend, url in backends.items():
            env = {
                "STRIDE_NATS_URL": nats.url,
                "STRIDE_DATABASE_URL": url,
                "STRIDE_LOG_LEVEL": "warning",
            }
            service = ServiceProcess("dispatcher", env, workdir / backend)
            (workdir / backend).mkdir()
            services.append(service.start())
            wait_serving(service.address, "stride.api.dispatcher.v1.DispatcherService")
            assert service.process is not None
            served = (service.address, service.process.pid)
            if backend == "sqlite":
                systems[f"stride-{backend}-unary"] = served
            systems[f"stride-{backend}-session"] = served
            systems[f"stride-{backend}-prefetch"] = served
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
        systems = {"dlrover": (f"127.0.0.1:{port}", dlrover.pid), **systems}

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
            "group-committed; survives SIGKILL, commits not fsynced); dlrover: in memory"
        )
        say()
        say(
            "# cpu us/pair: CPU time per pair of the server process and of the client "
            "processes (all threads); bound = pairs/s if both cores did nothing else"
        )
        say()
        header = f"{'clients':>7}  {'system':<26} {'pairs/s':>9} {'p50 ms':>8} {'p99 ms':>8}"
        header += f"  {'x pairs/s':>9} {'p99 / dlrover':>13}"
        header += f" {'server us':>10} {'client us':>10} {'bound/s':>8}"
        say(header)
        run = 0
        for clients in CLIENTS:
            measured: dict[str, dict[str, float]] = {}
            for system, (address, pid) in systems.items():
                run += 1
                job = f"bench{run}-{os.getpid()}"
                create_dataset(system, address, job)
                measured[system] = run_load(system, address, job, clients, driver, pid)
            base = measured["dlrover"]
            for system, result in measured.items():
                ratio = result["pairs_per_second"] / base["pairs_per_second"]
                p99 = result["p99_ms"] / base["p99_ms"]
                say(
                    f"{clients:>7}  {system:<26} {result['pairs_per_second']:>9.0f} "
                    f"{result['p50_ms']:>8.2f} {result['p99_ms']:>8.2f}  {ratio:>8.2f}x "
                    f"{p99:>12.2f}x {result['server_us']:>10.0f} {result['client_us']:>10.0f} "
                    f"{bound(result):>8.0f}"
                )
            say()
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
        shutil.rmtree(workdir, ignore_errors=True)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(
        "$ .venv/bin/python bench/dispatcher_vs_dlrover.py\n" + "\n".join(lines) + "\n"
    )
    return 0


if __name__ == "__main__":
    ensure_certificates()  # the services it starts serve mutual TLS
    sys.exit(main())
