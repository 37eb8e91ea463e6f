"""Benchmark: another job's GetShard while one job starts a 1,000,000-shard epoch (issue 37,
finding 5: "the epoch cut took 25 s; meanwhile a health check took 17 s, B's GetShard 24 s").

Run: ``.venv/bin/python bench/dispatcher_epoch_cut.py [shards] [--code DIR]`` (default
1,000,000 shards; writes ``bench/results/dispatcher_epoch_cut.txt``, keeping its
"before this change" section). ``--code DIR`` runs the dispatcher from another copy of its
package (``DIR/stride/dispatcher``, put first on the service's PYTHONPATH), to measure an
older version with the same driver; its report is printed, not recorded.

The real dispatcher process (``python -m stride.dispatcher``, mTLS) on SQLite (the embedded
default) and PostgreSQL (``STRIDE_TEST_DATABASE_URL``'s server, else an embedded one). Job B
(``job-other``) has a dataset whose epoch is already cut; its worker asks for one shard
every 10 ms, reporting the last one done in the same call (unary calls), while a prober asks
for health every 20 ms. Each call is timed from the moment it was due, so a stall counts
once for every call it held up.

1. Reference: B's GetShard and the health check for a few seconds with nothing else running.
2. During the cut: job A creates a dataset of ``shards`` one-record shards, shuffled, as an
   index list (what the trainer creates, at its largest), and its worker asks for 64 shards
   (this call starts epoch 0), then keeps asking for 64 more, reporting the last 64 done,
   every 20 ms for a few seconds. B's calls from A's first request until then are the sample.

Reported: B's calls due while A's first call ran (the cut: the epoch is counted as
started, its shuffled order computed in a worker process and its first rows written), and
those due after it, while A keeps taking shards (the epoch's rows are written a batch at a
time as A's TODO rows run out; B shares the commit path with A's calls). The goal (issue 37):
B's p99 at most 50 ms and at most twice its reference p99; each window is judged.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import grpc
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
BEFORE = "## before this change"
REFERENCE_SECONDS = 4.0
"""How long B's reference sample runs."""
AFTER_CUT_SECONDS = 4.0
"""How long A keeps taking shards after its first call returned (the sample's tail)."""
A_PACE = 0.02
"""A's worker asks for its next 64 shards every 20 ms (3,200 shards/s)."""
B_EVERY = 0.01
"""B's worker asks for a shard every 10 ms; the prober for health every 20 ms."""
GOAL_MS = 50.0
GOAL_RATIO = 2.0


def dataset(
    records: int, kind: shard_pb2.ShardingKind.ValueType, shuffle: bool
) -> pb.DatasetParameters:
    return pb.DatasetParameters(
        record_count=records,
        batch_size=1,
        shard_batches=1,
        epochs=1,
        shuffle=shuffle,
        seed=37,
        kind=kind,
    )


class Worker:
    """One worker of one job: GetShard with the previous shards reported done."""

    def __init__(self, stub: pb_grpc.DispatcherServiceStub, job: str, name: str) -> None:
        self.stub = stub
        self.job = job
        self.name = name
        self.incarnation = stub.RegisterWorker(
            pb.RegisterWorkerRequest(job_id=job, worker=name)
        ).incarnation
        self.held: list[tuple[int, int]] = []

    def next(self, count: int = 1) -> float:
        """One call; its latency in seconds."""
        request = pb.GetShardRequest(
            worker=pb.WorkerRef(
                job_id=self.job, dataset="d", worker=self.name, incarnation=self.incarnation
            ),
            max_shards=count,
            done_shards=[pb.ShardDone(shard_id=s, lease=lease) for s, lease in self.held],
        )
        started = time.perf_counter()
        reply = self.stub.GetShard(request, timeout=600)
        elapsed = time.perf_counter() - started
        assert reply.HasField("shard"), reply
        self.held = [(reply.shard.shard_id, reply.lease)] + [
            (item.shard.shard_id, item.lease) for item in reply.more_shards
        ]
        return elapsed


class Sample:
    """Latencies (ms) of one kind of call, and the calls that failed (by status code)."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.dues: list[float] = []
        """When each call was due (``time.perf_counter()``), beside its latency."""
        self.failures: Counter[str] = Counter()

    def between(self, start: float, end: float) -> Sample:
        """The calls due in ``[start, end)`` (failures are not split)."""
        part = Sample()
        for due, latency in zip(self.dues, self.latencies, strict=True):
            if start <= due < end:
                part.latencies.append(latency)
                part.dues.append(due)
        part.failures = self.failures
        return part

    def describe_failures(self) -> str:
        return ", ".join(f"{code} x{count}" for code, count in self.failures.items()) or "none"


def sample_until(stop: threading.Event, call: Callable[[], object], every: float) -> Sample:
    """Latencies of ``call`` made every ``every`` seconds until ``stop``, each timed from the
    moment it was due: a call held up for 30 s counts as the 3,000 calls at 10 ms that could
    not be made meanwhile, not as one slow sample (no coordinated omission). A failed call
    counts as late as it took to fail."""
    sample = Sample()
    due = time.perf_counter()
    while not stop.is_set():
        try:
            call()
        except grpc.RpcError as error:
            sample.failures[error.code().name] += 1
        except NotServing as error:
            sample.failures[str(error)] += 1
        finished = time.perf_counter()
        while due <= finished:
            sample.latencies.append(1000 * (finished - due))
            sample.dues.append(due)
            due += every
        time.sleep(max(0.0, due - time.perf_counter()))
    return sample


def stop_after(seconds: float, stop: threading.Event | None = None) -> threading.Event:
    """``stop`` (or a new event), set ``seconds`` from now."""
    event = stop or threading.Event()
    threading.Timer(seconds, event.set).start()
    return event


class NotServing(Exception):
    """A health check that did not answer SERVING."""


def health(address: str) -> float:
    started = time.perf_counter()
    serving, status = check(address, SERVICE, timeout=30)
    if not serving:
        raise NotServing(status)
    return time.perf_counter() - started


def in_background(
    stop: threading.Event, call: Callable[[], object], every: float
) -> Callable[[], Sample]:
    """Start sampling ``call`` on a thread; the returned function joins it and gives the sample."""
    out: list[Sample] = []
    thread = threading.Thread(target=lambda: out.append(sample_until(stop, call, every)))
    thread.start()

    def result() -> Sample:
        thread.join()
        return out[0]

    return result


def describe(name: str, reference: Sample, during: Sample, label: str) -> list[str]:
    lines = []
    for which, sample in (("reference", reference), (label, during)):
        values = sample.latencies
        lines.append(
            f"{name}, {which} (n={len(values)}): p50 {percentile(values, 0.5):.1f} ms, "
            f"p99 {percentile(values, 0.99):.1f} ms, max {max(values):.1f} ms; "
            f"failed: {sample.describe_failures()}"
        )
    ratio = percentile(during.latencies, 0.99) / percentile(reference.latencies, 0.99)
    return [*lines, f"{name}, ratio p99 {label} / p99 reference: {ratio:.2f}"]


def goal(name: str, reference: Sample, during: Sample) -> str:
    p99 = percentile(during.latencies, 0.99)
    ratio = p99 / percentile(reference.latencies, 0.99)
    met = p99 <= GOAL_MS and ratio <= GOAL_RATIO and not during.failures
    return f"goal {name} (B's p99 <= {GOAL_MS:.0f} ms and <= {GOAL_RATIO:g}x reference): " + (
        "met" if met else "NOT met"
    )


def measure(stub: pb_grpc.DispatcherServiceStub, address: str, shards: int) -> list[str]:
    stub.CreateDataset(
        pb.CreateDatasetRequest(
            job_id="job-other",
            dataset="d",
            parameters=dataset(100_000, shard_pb2.SHARDING_KIND_INDEX_RANGE, False),
        )
    )
    other = Worker(stub, "job-other", "b-0")
    for _ in range(50):  # B's epoch is cut, connections and caches warm
        other.next()
    stop = threading.Event()
    probes = in_background(stop, lambda: health(address), 2 * B_EVERY)
    reference = sample_until(stop_after(REFERENCE_SECONDS, stop), other.next, B_EVERY)
    reference_health = probes()

    stub.CreateDataset(
        pb.CreateDatasetRequest(
            job_id="job-big",
            dataset="d",
            parameters=dataset(shards, shard_pb2.SHARDING_KIND_INDEX_LIST, True),
        )
    )
    big = Worker(stub, "job-big", "a-0")
    stop = threading.Event()
    probes = in_background(stop, lambda: health(address), 2 * B_EVERY)
    others = in_background(stop, other.next, B_EVERY)
    time.sleep(0.2)
    started = time.perf_counter()
    try:
        cut = f"{big.next(64) * 1000:.1f} ms"
    except grpc.RpcError as error:
        cut = f"failed {error.code().name} ({error.details()})"
    cut_end = time.perf_counter()
    after = sample_until(stop_after(AFTER_CUT_SECONDS), lambda: big.next(64), A_PACE)
    stop.set()
    b_calls, probed = others(), probes()
    during, writing = b_calls.between(started, cut_end), b_calls.between(cut_end, 1e18)
    health_during = probed.between(started, cut_end)
    health_writing = probed.between(cut_end, 1e18)
    return [
        f"A's GetShard that started the epoch (64 shards): {cut}",
        f"A's next calls (64 shards each, every {A_PACE * 1000:.0f} ms, n={len(after.latencies)}):"
        f" p50 {percentile(after.latencies, 0.5):.1f} ms, "
        f"p99 {percentile(after.latencies, 0.99):.1f} ms, max {max(after.latencies):.1f} ms; "
        f"failed: {after.describe_failures()}",
        *describe("B's GetShard", reference, during, "during the cut"),
        *describe("health check", reference_health, health_during, "during the cut"),
        goal("during the cut", reference, during),
        *describe("B's GetShard", reference, writing, "after it, under A's calls"),
        *describe("health check", reference_health, health_writing, "after it, under A's calls"),
        goal("after it, under A's calls", reference, writing),
    ]


def run(backend: str, url: str, shards: int, workdir: Path, nats_url: str, code: str) -> list[str]:
    env = {"STRIDE_NATS_URL": nats_url, "STRIDE_DATABASE_URL": url, "STRIDE_LOG_LEVEL": "warning"}
    if code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")]))
    (workdir / backend).mkdir()
    service = ServiceProcess("dispatcher", env, workdir / backend).start()
    try:
        deadline = time.monotonic() + 60
        while not check(service.address, SERVICE, timeout=2)[0]:
            if time.monotonic() > deadline:
                raise RuntimeError(service.log_text()[-2000:])
            time.sleep(0.2)
        with sync_channel(service.address, "dispatcher") as channel:
            lines = measure(pb_grpc.DispatcherServiceStub(channel), service.address, shards)
    finally:
        service.terminate()
    return [f"## {backend}: {shards:,} shards", *lines]


def kept_section() -> list[str]:
    """The recorded "before this change" section, kept across runs."""
    if not RESULT.exists():
        return []
    text = RESULT.read_text()
    start = text.find(BEFORE)
    return ["", *text[start:].rstrip("\n").splitlines()] if start >= 0 else []


def main(shards: int, code: str) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="stride-epoch-cut-"))
    nats = NatsServer(workdir / "nats").start()
    arguments = f" {shards}" + (f" --code {code}" if code else "")
    lines = [
        "# bench/dispatcher_epoch_cut.py",
        f"command: .venv/bin/python bench/dispatcher_epoch_cut.py{arguments}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
    ]
    try:
        with test_database_server():
            backends = {
                "sqlite": f"sqlite:///{workdir}/dispatcher.db",
                "postgresql": create_database("stride_bench_epoch_cut"),
            }
            try:
                for backend, url in backends.items():
                    lines += run(backend, url, shards, workdir, nats.url, code)
            finally:
                drop_database(backends["postgresql"])
    finally:
        nats.stop()
    if code:
        print("\n".join(lines))
    else:
        record(RESULT, lines + kept_section())
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", type=int, nargs="?", default=1_000_000)
    parser.add_argument("--code", default="", help="run the dispatcher from this copy")
    options = parser.parse_args()
    ensure_certificates()  # the dispatcher serves mutual TLS
    sys.exit(main(options.shards, options.code))
