"""Benchmark: 1,000 simulated agents at 1 Hz for 10 minutes against the dispatcher and the
optimizer, with no false failure detection.

Run: ``.venv/bin/python bench/agents_load.py [--agents 1000] [--jobs 50] [--minutes 10]
[--database postgresql|sqlite]`` (writes ``bench/results/agents_load-<database>.txt``).

The suite is the one a user runs: ``stride up`` (embedded NATS locked down, mutual TLS,
tokens) on a fresh PostgreSQL database (or SQLite files). ``--jobs`` simulated jobs
are submitted through admission (no pods start), and each gets ``agents / jobs`` agents,
played in this process as the agent sidecar of a worker pod plays its part:

- its own job token, scoped to (job, pod, worker), signed with the pod watcher's key as the
  pod watcher signs the tokens it gives its pods, over mutual TLS as the ``agent`` identity;
- RegisterWorker, then on one ShardSession stream (as the agent's shard client calls the
  dispatcher) a first GetShard, then once a second: ReportProgress with the offset reached
  in its shard (the heartbeat that renews the shard's lease), or, when the shard is done,
  GetShard reporting it done and leasing the next; and a StepMetrics window on the bus
  (signed as the agent), which the optimizer (and the config DB) consume.

The job's chief creates its dataset (CreateDataset), as the trainer's chief does. Every agent
trains at about the same speed (100 records a second +-10 %, shards of 3,000 records), so
every worker is healthy: a lease that lapsed (``shard requeued`` with reason lease), a
straggler verdict, a revoked lease or an error answered to a heartbeat is a *false* failure
detection.

Reported: heartbeat latency (p50, p99, max, per call as the agent sees it); how late this
process's ticks ran (if the load generator itself could not keep 1 Hz, the latencies say
less); the false detections; the CPU of every server-side process per heartbeat.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import random
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from suite import (
    CpuMeter,
    percentile,
    record,
    spent,
    start_profiles,
    stream_messages,
    suite_arguments,
    suite_on_database,
    summarize_profile,
)

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.bus.permissions import ADMIN
from stride.bus.signing import JobPods
from stride.cli.endpoints import SuiteState
from stride.events.v1 import job_pb2, metrics_pb2, shard_pb2
from stride.runtime import tls
from stride.runtime.tokens import JOB_ISSUER, Signer, TokenSource

ROOT = Path(__file__).resolve().parents[1]
GC_THRESHOLDS = gc.get_threshold()
WARMUP_SECONDS = 30.0
DATASET = "train"
RECORDS_PER_SECOND = 100
SPEED_SPREAD = 0.1
"""Each agent's speed is drawn from +-10 % of :data:`RECORDS_PER_SECOND`: healthy (the
straggler rule flags a worker far below its peers' median)."""
BATCH, SHARD_BATCHES = 100, 30
"""A shard of 3,000 records: a worker finishes one every 30 s."""


def spec(index: int) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=f"agents-load-{index}",
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="bench.agents_load:none"),
        dataset=job_pb2.DatasetSpec(name=DATASET, record_count=10_000_000),
        batch_size=BATCH,
        termination=job_pb2.Termination(max_epochs=1),
        resource_kind=job_pb2.RESOURCE_KIND_CPU,
        simulated=True,
    )


def _stamp() -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.now(UTC))
    return stamp


class Tally:
    """What every agent saw."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.steady: list[float] = []
        """The latencies after the first :data:`WARMUP_SECONDS` (every agent starts at once)."""
        self.late: list[float] = []
        """How far behind its 1 Hz schedule each tick started (this process's own lag)."""
        self.errors: collections.Counter[str] = collections.Counter()
        self.revoked = 0
        self.straggler_answers = 0
        self.shards_done = 0
        self.heartbeats = 0
        self.metrics = 0


async def agent(
    stub: pb_grpc.DispatcherServiceAsyncStub,
    bus: Bus,
    job_id: str,
    index: int,
    token: str,
    start: float,
    end: float,
    tally: Tally,
) -> None:
    """One pod's agent: its calls go over one ShardSession stream, as the agent's shard
    client sends them (``stride.shardclient``)."""
    worker = f"{job_id}-worker-{index}"
    metadata = (("authorization", f"Bearer {token}"),)
    registered = await stub.RegisterWorker(
        pb.RegisterWorkerRequest(job_id=job_id, worker=worker), metadata=metadata, timeout=60
    )
    ref = pb.WorkerRef(
        job_id=job_id, dataset=DATASET, worker=worker, incarnation=registered.incarnation
    )
    # Without a request iterator: the call is written to and read from (grpc.aio).
    session = stub.ShardSession(metadata=metadata)  # type: ignore[call-arg]
    sequence = 0

    async def call(request: pb.ShardSessionRequest) -> pb.ShardSessionResponse:
        nonlocal sequence
        sequence += 1
        request.sequence = sequence
        await session.write(request)
        reply = await session.read()
        assert isinstance(reply, pb.ShardSessionResponse) and reply.sequence == sequence
        return reply

    grant = (await call(pb.ShardSessionRequest(get_shard=pb.GetShardRequest(worker=ref)))).get_shard
    offset = 0
    step = 0
    # Healthy workers differ a little in speed, so they do not all finish their shards in
    # the same second (with equal speeds, every 30 s all 1,000 asked for a shard at once).
    speed = round(RECORDS_PER_SECOND * random.uniform(1 - SPEED_SPREAD, 1 + SPEED_SPREAD))
    loop = asyncio.get_running_loop()
    tick = start + random.random()  # agents spread over the second, as pods are
    try:
        while tick < end:
            await asyncio.sleep(max(0.0, tick - loop.time()))
            tally.late.append(loop.time() - tick)
            tick += 1.0
            shard = grant.shard
            size = shard.end - shard.start
            offset = min(size, offset + speed)
            began = time.perf_counter()
            if size <= 0:  # no shard held (all leased, or the data ended): ask again
                request = pb.ShardSessionRequest(get_shard=pb.GetShardRequest(worker=ref))
            elif offset >= size:
                request = pb.ShardSessionRequest(
                    get_shard=pb.GetShardRequest(
                        worker=ref, done_shard_id=shard.shard_id, done_lease=grant.lease
                    )
                )
            else:
                request = pb.ShardSessionRequest(
                    progress=pb.ReportProgressRequest(
                        worker=ref, shard_id=shard.shard_id, offset=offset, lease=grant.lease
                    )
                )
            reply = await call(request)
            tally.latencies.append(time.perf_counter() - began)
            if loop.time() - start > WARMUP_SECONDS:
                tally.steady.append(tally.latencies[-1])
            if reply.HasField("error"):
                code = next(
                    (c for c in grpc.StatusCode if c.value[0] == reply.error.code),
                    grpc.StatusCode.UNKNOWN,
                )
                tally.errors[code.name] += 1
                if code is grpc.StatusCode.FAILED_PRECONDITION:
                    tally.revoked += 1
                continue
            tally.heartbeats += 1
            if reply.HasField("get_shard"):
                if size > 0:
                    tally.shards_done += 1
                grant = reply.get_shard
                tally.straggler_answers += grant.straggler
                offset = 0
            step += 10
            await bus.publish(
                topics.STEP_METRICS,
                job_id,
                metrics_pb2.StepMetrics(
                    job_id=job_id,
                    pod_name=worker,
                    global_step=step,
                    steps=10,
                    step_seconds=0.1,
                    samples_per_second=speed,
                    samples_consumed=offset,
                    reported_at=_stamp(),
                    plan_version=1,
                ),
                f"{worker}.steps.{step}",
            )
            tally.metrics += 1
    finally:
        await session.done_writing()


async def run(agents: int, jobs: int, minutes: float, database: str, profile: list[str]) -> int:
    per_job = agents // jobs
    if per_job * jobs != agents:
        print(f"--agents {agents} must be a multiple of --jobs {jobs}", file=sys.stderr)
        return 2
    random.seed(15)
    lines = [
        "# bench/agents_load.py",
        f"command: .venv/bin/python bench/agents_load.py --agents {agents} --jobs {jobs} "
        f"--minutes {minutes:g} --database {database}"
        + "".join(f" --profile {p}" for p in profile),
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
        f"suite: stride up (embedded NATS locked down, mutual TLS, tokens), database {database}",
        f"load: {jobs} simulated jobs x {per_job} agents ({RECORDS_PER_SECOND} records/s "
        f"+-{SPEED_SPREAD:.0%}), each once a second: a heartbeat to the "
        f"dispatcher (ReportProgress, or GetShard with the shard done every "
        f"{BATCH * SHARD_BATCHES // RECORDS_PER_SECOND} s) and a StepMetrics window on the bus",
    ]
    code = 1
    with suite_on_database(database, "agents-load") as (work, _, database_url):
        state_dir = work / "state"
        state = SuiteState.read(state_dir)
        assert state is not None
        environ = {tls.TLS_DIR_ENV: state.tls_dir}
        os.environ.update(environ)
        meter = CpuMeter(state_dir, postgres=bool(database_url))
        admin = TokenSource(path=Path(state.tokens_dir) / "admin.token")
        async with tls.aio_channel(
            state.services["admission"], server="admission", identity=ADMIN, token=admin
        ) as channel:
            admission = admission_grpc.AdmissionServiceStub(channel)
            job_ids = [
                (await admission.SubmitJob(admission_pb.SubmitJobRequest(spec=spec(n)))).job.job_id
                for n in range(jobs)
            ]
        signer = Signer(tls.load(JOB_ISSUER, environ))  # type: ignore[arg-type]
        tokens = {
            (job, n): signer.job_token(job, f"{job}-worker-{n}", "worker", ttl=3600 + minutes * 60)
            for job in job_ids
            for n in range(per_job)
        }
        # Each job's metrics signed as a pod of that job (its key, bound by its token), as
        # its agents sign them. One connection plays every pod: NATS gives a real pod's
        # agent a user for its own job only (stride.bus.callout), the administrator's user
        # may publish them all; consumers check the pods' signatures either way.
        bus = await Bus.connect(
            state.nats_url,
            name="bench-agents",
            identity=ADMIN,
            environ=environ,
            signer=JobPods(tls.load(JOB_ISSUER, environ)),  # type: ignore[arg-type]
        )
        reader = await Bus.connect(
            state.nats_url, name="bench-agents-reader", identity=ADMIN, environ=environ
        )
        tally = Tally()
        # A channel per job: a pod's agent has its own connection; 1,000 TLS connections
        # from one process would measure this process. Each call carries its pod's token.
        channels = [
            tls.aio_channel(state.services["dispatcher"], server="dispatcher", identity="agent")
            for _ in job_ids
        ]
        stubs = [pb_grpc.DispatcherServiceStub(c) for c in channels]
        for job, stub in zip(job_ids, stubs, strict=True):
            chief = (
                ("authorization", f"Bearer {signer.job_token(job, f'{job}-chief-0', 'chief')}"),
            )
            await stub.CreateDataset(
                pb.CreateDatasetRequest(
                    job_id=job,
                    dataset=DATASET,
                    parameters=pb.DatasetParameters(
                        record_count=10_000_000,
                        batch_size=BATCH,
                        shard_batches=SHARD_BATCHES,
                        epochs=1,
                        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
                    ),
                ),
                metadata=chief,
            )
        loop = asyncio.get_running_loop()
        start = loop.time() + 5.0
        end = start + minutes * 60
        profilers = start_profiles(state_dir, profile, work) if profile else []
        # This process's own garbage collections (a thousand streams' objects) stalled its
        # event loop for seconds, and every agent's reply waited behind them: the
        # latencies measured this process. Young collections only, while the agents run.
        gc.collect()
        gc.freeze()
        gc.set_threshold(50_000, 0, 0)
        before = meter.sample()
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(
            *(
                agent(stub, bus, job, n, tokens[(job, n)], start, end, tally)
                for job, stub in zip(job_ids, stubs, strict=True)
                for n in range(per_job)
            )
        )
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        gc.unfreeze()
        gc.set_threshold(*GC_THRESHOLDS)
        after = meter.sample()
        for profiler in profilers:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        for channel in channels:
            await channel.close(None)
        await bus.close()
        requeued = [
            shard_pb2.ShardProgress.FromString(data)
            for data in await stream_messages(reader, topics.SHARD_REQUEUED.pattern())
        ]
        stragglers = await stream_messages(reader, topics.STRAGGLER_DETECTED.pattern())
        await reader.close()
        used = spent(before, after)
        calls = max(1, len(tally.latencies))
        late = sorted(tally.late)
        p50, p99 = percentile(tally.latencies, 0.5), percentile(tally.latencies, 0.99)
        false_detections = len(requeued) + len(stragglers) + tally.revoked + tally.straggler_answers
        lines += [
            f"ran {wall:.0f} s: {tally.heartbeats:,} heartbeats answered "
            f"({tally.heartbeats / (minutes * 60):.0f}/s), "
            f"{tally.shards_done:,} shards done, {tally.metrics:,} step windows published",
            "",
            f"heartbeat latency: p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
            f"max {max(tally.latencies) * 1e3:.1f} ms; after the first {WARMUP_SECONDS:g} s "
            f"(every agent starts in the same second): "
            + (
                f"p50 {percentile(tally.steady, 0.5) * 1e3:.1f} ms, "
                f"p99 {percentile(tally.steady, 0.99) * 1e3:.1f} ms"
                if tally.steady
                else "none (the run was shorter)"
            ),
            f"this process's ticks started late by: p50 {percentile(late, 0.5) * 1e3:.1f} ms, "
            f"p99 {percentile(late, 0.99) * 1e3:.1f} ms (its CPU: {cpu / wall:.0%} of a core)",
            f"errors answered: {dict(tally.errors) or 'none'}",
            "",
            "false failure detections (every agent was healthy):",
            f"  shards requeued (lease lapsed or worker lost): {len(requeued)}",
            f"  straggler verdicts on the bus: {len(stragglers)}; "
            f"answered as straggler: {tally.straggler_answers}",
            f"  leases revoked under a live worker: {tally.revoked}",
            "",
            "CPU ms per 1,000 heartbeats (and their step windows)",
        ]
        for process in sorted(used, key=lambda n: -used[n]):
            lines.append(f"  {process:<18} {1e6 * used[process] / calls:10.1f}")
        lines.append(f"  {'all server-side':<18} {1e6 * sum(used.values()) / calls:10.1f}")
        lines.append(
            f"  (cores used on average: {sum(used.values()) / wall:.2f} of {os.cpu_count()})"
        )
        for service in profile:
            lines += ["", f"## profile of {service} under the load (py-spy, 200 Hz)"]
            lines += summarize_profile(work / f"{service}.txt")
        passed = false_detections == 0 and not tally.errors
        lines += ["", f"no false failure detection and no error: {'PASS' if passed else 'FAIL'}"]
        record(
            ROOT
            / "bench"
            / "results"
            / f"agents_load-{database}{'-profile' if profile else ''}.txt",
            lines,
        )
        code = 0 if passed else 1
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--minutes", type=float, default=10.0)
    suite_arguments(parser, "the agents run")
    args = parser.parse_args()
    return asyncio.run(run(args.agents, args.jobs, args.minutes, args.database, args.profile))


if __name__ == "__main__":
    sys.exit(main())
