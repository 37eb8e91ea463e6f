"""Benchmark: what a dispatcher does for its other callers while one GetShard cuts a huge
epoch (#15: "one GetShard that cuts a 1M-shard epoch blocks the dispatcher, health checks
included, for 9 s").

Run: ``.venv/bin/python bench/dispatcher_epoch_cut.py [shards]`` (default 1,000,000;
writes ``bench/results/dispatcher_epoch_cut.txt``).

The real dispatcher process (``python -m stride.dispatcher``, mTLS) on SQLite (the embedded
default) and, where it answers, PostgreSQL. A dataset of ``shards`` one-record shards is
created; a first GetShard cuts epoch 0 (every shard written, durably, before it answers).
Meanwhile another client asks for health and for another job's dataset state every 20 ms.

Reported per backend: how long the cutting GetShard took; each other call's latency during
the cut (p50, p99, max) against the same call on the idle dispatcher just before (the
reference: what it costs when nothing else runs). The ratio is max during / p50 idle.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from suite import percentile, record

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.events.v1 import shard_pb2
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.healthcheck import check
from stride.testing.channels import ensure_certificates, sync_channel
from stride.testing.databases import create_database, drop_database, test_database_server
from stride.testing.processes import ServiceProcess

RESULT = Path(__file__).parent / "results" / "dispatcher_epoch_cut.txt"
SERVICE = "stride.api.dispatcher.v1.DispatcherService"
PROBE_EVERY = 0.02


def probe(stub: pb_grpc.DispatcherServiceStub, address: str) -> tuple[float, float]:
    """One round of what other callers ask: health, then another job's dataset state;
    the latency of each."""
    started = time.perf_counter()
    serving, status = check(address, SERVICE, timeout=30)
    assert serving, status
    healthy = time.perf_counter()
    stub.GetDatasetState(pb.GetDatasetStateRequest(job_id="job-other", dataset="d"), timeout=30)
    return healthy - started, time.perf_counter() - healthy


def run(backend: str, url: str, shards: int, workdir: Path, nats_url: str) -> list[str]:
    env = {"STRIDE_NATS_URL": nats_url, "STRIDE_DATABASE_URL": url, "STRIDE_LOG_LEVEL": "warning"}
    (workdir / backend).mkdir()
    service = ServiceProcess("dispatcher", env, workdir / backend).start()
    try:
        deadline = time.monotonic() + 60
        while not check(service.address, SERVICE, timeout=2)[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(service.log_text()[-2000:])
            time.sleep(0.2)
        with sync_channel(service.address, "dispatcher") as channel:
            stub = pb_grpc.DispatcherServiceStub(channel)
            for job, count in (("job-other", 10), ("job-big", shards)):
                stub.CreateDataset(
                    pb.CreateDatasetRequest(
                        job_id=job,
                        dataset="d",
                        parameters=pb.DatasetParameters(
                            record_count=count,
                            batch_size=1,
                            shard_batches=1,
                            epochs=1,
                            kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
                        ),
                    )
                )
            incarnation = stub.RegisterWorker(
                pb.RegisterWorkerRequest(job_id="job-big", worker="w-0")
            ).incarnation
            idle = [probe(stub, service.address) for _ in range(50)]
            during: list[tuple[float, float]] = []
            done = threading.Event()

            def keep_probing() -> None:
                while not done.is_set():
                    during.append(probe(stub, service.address))
                    time.sleep(PROBE_EVERY)

            prober = threading.Thread(target=keep_probing)
            prober.start()
            started = time.perf_counter()
            reply = stub.GetShard(
                pb.GetShardRequest(
                    worker=pb.WorkerRef(
                        job_id="job-big", dataset="d", worker="w-0", incarnation=incarnation
                    )
                ),
                timeout=600,
            )
            cut = time.perf_counter() - started
            done.set()
            prober.join()
            assert reply.HasField("shard"), reply
    finally:
        service.terminate()
    lines = [f"## {backend}: {shards:,} shards", f"GetShard that cut the epoch: {cut:.2f} s"]
    for index, call in enumerate(("health check", "another job's GetDatasetState")):
        ms_idle = [1000 * pair[index] for pair in idle]
        ms_during = [1000 * pair[index] for pair in during]
        worst = max(ms_during) if ms_during else float("nan")
        lines += [
            f"{call}, idle (reference): p50 {percentile(ms_idle, 0.5):.1f} ms, "
            f"p99 {percentile(ms_idle, 0.99):.1f} ms",
            f"{call}, during the cut (n={len(ms_during)}): "
            f"p50 {percentile(ms_during, 0.5):.1f} ms, "
            f"p99 {percentile(ms_during, 0.99):.1f} ms, max {worst:.1f} ms",
            f"{call}, ratio max during / p50 idle: {worst / percentile(ms_idle, 0.5):.1f}",
        ]
    return lines


def main(shards: int) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="stride-epoch-cut-"))
    nats = NatsServer(workdir / "nats").start()
    lines = [
        "# bench/dispatcher_epoch_cut.py",
        f"command: .venv/bin/python bench/dispatcher_epoch_cut.py {shards}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
    ]
    try:
        # PostgreSQL at STRIDE_TEST_DATABASE_URL, else an embedded one for the run.
        with test_database_server():
            backends = {
                "sqlite": f"sqlite:///{workdir}/dispatcher.db",
                "postgresql": create_database("stride_bench_epoch_cut"),
            }
            try:
                for backend, url in backends.items():
                    lines += run(backend, url, shards, workdir, nats.url)
            finally:
                drop_database(backends["postgresql"])
    finally:
        nats.stop()
    record(RESULT, lines)
    return 0


if __name__ == "__main__":
    ensure_certificates()  # the dispatcher serves mutual TLS
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000))
