"""Benchmark: an admission decision through gRPC with 1,000 active jobs on 1,024 GPUs, and
the same on 1,024 CPU units.

Run: ``.venv/bin/python bench/admission_grpc.py [gpu|cpu ...]`` (NATS at
``STRIDE_NATS_URL``, else an embedded one; PostgreSQL at ``STRIDE_TEST_DATABASE_URL``, else
an embedded one; writes ``bench/results/admission_grpc.txt``).

Workload: the jobs of ``itp-ef/cluster04.csv`` in submission order (microsoft/
elasticflow-traces, MIT), each with its A100 curve (pkusys/ElasticFlow tables, Apache-2.0,
made concave as ``stride sim`` does) as a declared profile and its trace deadline relative
to submission, as a *soft* deadline: guaranteed when admission can, else run best effort.
So every job stays active (admitted or queued) and the cluster fills to 1,000 active jobs
whatever the guarantees allow; then the next 200 submissions are timed end to end
(SubmitJob: validate, store, decide, round, commit the decision, books and share events).

- ``gpu``: GPU jobs on ``cluster_gpus=1024`` (the curve's sizes are GPUs).
- ``cpu``: the same curves as PS/worker jobs on 1,024 CPU units (1 core and 2 GiB; a size of
  ``n`` is ``n`` workers and ``max(1, n // 8)`` PS of a core and 2 GiB, and the chief).

The client collects its own garbage between timed calls, never inside one (its collections
took up to 25 ms, and were the p99 of the end-to-end time until 11-27).

The admission service runs as its own process (``python -m stride.admission``, as
deployed) on real NATS and PostgreSQL; this process is the client. (Until 11-26 it ran in
the client's process and event loop, where the reference below and the client's own work
held the loop between requests and delayed the service's background work into the next
timed request.)

Reference, same run: the from-scratch decision (``admit_from_scratch``: Algorithm 1 re-run
over every guaranteed job and the candidate, in deadline order) at each timed submission,
in-process (no gRPC, no storage): what re-planning from scratch costs for the decision
alone. Target: p99 at most 50 ms.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from suite import bench_servers, percentile, record

from stride.admission.domain.policy import CHIEF
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.policy.elasticflow.admission import DeadlineJob, admit_from_scratch
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import SLOT_SECONDS
from stride.policy.elasticflow.units import CpuUnit, profile_curve
from stride.sim.traces import TraceJob, load_curves, load_deadline_trace
from stride.testing import SHARED_TRACES
from stride.testing.channels import aio_channel, ensure_certificates
from stride.testing.databases import create_database, drop_database
from stride.testing.eventually import assert_eventually
from stride.testing.health import SERVING, equals, health
from stride.testing.processes import ServiceProcess

ACTIVE = 1000
TIMED = 200
CAPACITY = 1024
GIB = 1024**3
RESULT = Path(__file__).parent / "results" / "admission_grpc.txt"
SERVICE = "stride.api.admission.v1.AdmissionService"


def job_spec(trace: TraceJob, curve: ScalingCurve, now: datetime, kind: str) -> job_pb2.JobSpec:
    """The trace job as a user submits it: its curve as a declared profile, its deadline
    soft (guaranteed if admission can, else best effort)."""
    if kind == "gpu":
        profile = job_pb2.ScalingProfile(
            kind=job_pb2.RESOURCE_KIND_GPU,
            points=[
                job_pb2.ProfilePoint(workers=size, steps_per_second=value)
                for size, value in zip(curve.sizes, curve.throughputs, strict=True)
            ],
        )
    else:
        profile = job_pb2.ScalingProfile(
            kind=job_pb2.RESOURCE_KIND_CPU,
            worker_cpu=1.0,
            worker_memory_bytes=2 * GIB,
            ps_cpu=1.0,
            ps_memory_bytes=2 * GIB,
            points=[
                job_pb2.ProfilePoint(workers=size, ps=max(1, size // 8), steps_per_second=value)
                for size, value in zip(curve.sizes, curve.throughputs, strict=True)
            ],
        )
    message = job_pb2.JobSpec(
        name="itp",
        user="bench",
        model=job_pb2.ModelReference(name=trace.model_name, entrypoint="bench.itp:main"),
        dataset=job_pb2.DatasetSpec(name="itp", record_count=10**9),
        batch_size=trace.batch_size,
        termination=job_pb2.Termination(max_steps=max(1, int(trace.iterations))),
        resource_kind=profile.kind,
        simulated=True,
        profile=profile,
        soft_deadline=True,
    )
    assert trace.deadline is not None
    message.deadline.FromDatetime(now + timedelta(seconds=trace.deadline - trace.submission_time))
    return message


def unit_curve(spec: job_pb2.JobSpec) -> ScalingCurve:
    """A CPU job's curve in CPU units, as admission counts it (the chief included)."""
    profile = spec.profile
    return profile_curve(
        [(p.workers, p.ps, p.steps_per_second) for p in profile.points],
        (profile.worker_cpu, profile.worker_memory_bytes),
        (profile.ps_cpu, profile.ps_memory_bytes),
        CpuUnit(1.0, 2 * GIB),
        fixed=CHIEF,
    ).curve


async def phase(kind: str) -> list[str]:
    """Fill one admission service to ACTIVE jobs, then time TIMED submissions."""
    curves = load_curves(SHARED_TRACES / "throughputs_A100")
    jobs = load_deadline_trace(SHARED_TRACES / "itp-ef" / "cluster04.csv")
    database = create_database("stride_bench")
    capacity = (
        {"STRIDE_ADMISSION_CLUSTER_GPUS": str(CAPACITY)}
        if kind == "gpu"
        else {
            "STRIDE_ADMISSION_CLUSTER_CPU": str(float(CAPACITY)),
            "STRIDE_ADMISSION_CLUSTER_MEMORY_GIB": str(2.0 * CAPACITY),
        }
    )
    logs = Path(tempfile.mkdtemp(prefix="stride-bench-"))
    service = ServiceProcess(
        "admission",
        {
            "STRIDE_NATS_URL": os.environ["STRIDE_NATS_URL"],
            "STRIDE_ADMISSION_DATABASE_URL": database,
            "STRIDE_ADMISSION_LOG_LEVEL": "WARNING",
            **capacity,
        },
        logs,
    )
    latencies: list[float] = []
    reference: list[float] = []
    outcomes: dict[str, int] = {}
    by_state: dict[str, list[float]] = {}
    guaranteed: list[DeadlineJob] = []
    """The guaranteed deadline jobs, for the from-scratch reference."""
    index = 0
    started_all = time.perf_counter()
    try:
        service.start()
        await assert_eventually(
            lambda: equals(health(service.port, SERVICE), SERVING), timeout=60, interval=0.2
        )
        async with aio_channel(service.address, "admission") as channel:
            stub = pb_grpc.AdmissionServiceStub(channel)
            active = 0
            while active < ACTIVE + TIMED and index < len(jobs):
                trace = jobs[index]
                index += 1
                curve = curves.curve(trace)
                spec = job_spec(trace, curve, datetime.now(UTC), kind)
                timed = active >= ACTIVE
                now = time.time()
                deadline = spec.deadline.ToDatetime(tzinfo=UTC).timestamp()
                planned = curve if kind == "gpu" else unit_curve(spec)
                candidate = DeadlineJob(f"c{index}", planned, float(trace.iterations), deadline)
                if timed:
                    hard = [
                        job
                        for job in [*guaranteed, candidate]
                        if job.deadline is not None and job.deadline - now >= SLOT_SECONDS
                    ]
                    started = time.perf_counter()
                    admit_from_scratch(CAPACITY, now, SLOT_SECONDS, hard)
                    reference.append(time.perf_counter() - started)
                if timed:
                    # The client's own full collections (its traces and reference jobs are
                    # a few hundred thousand objects) must not land inside a timed call:
                    # collected here, outside the window, and none run inside it.
                    gc.collect()
                    gc.disable()
                started = time.perf_counter()
                reply = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec))
                elapsed = time.perf_counter() - started
                gc.enable()
                outcome = job_pb2.AdmissionOutcome.Name(reply.job.decision.outcome)
                outcome = outcome.removeprefix("ADMISSION_OUTCOME_").lower()
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if reply.job.state in (pb.JOB_STATE_ADMITTED, pb.JOB_STATE_QUEUED):
                    active += 1
                if reply.job.share.guaranteed:
                    guaranteed.append(candidate)
                if timed:
                    latencies.append(elapsed)
                    by_state.setdefault(outcome, []).append(1000 * elapsed)
    finally:
        if service.terminate() != 0:
            print(service.log_text()[-4000:], file=sys.stderr)
        drop_database(database)
    ms = [1000 * value for value in latencies]
    ref = [1000 * value for value in reference]
    if not ms:
        return [f"{kind}: the trace ended before {ACTIVE} jobs were active ({outcomes})"]
    p99, ref_p99 = percentile(ms, 0.99), percentile(ref, 0.99)
    unit = "GPUs" if kind == "gpu" else "CPU units"
    return [
        f"## {kind}: {CAPACITY} {unit}, {ACTIVE} active jobs, then {len(ms)} timed submissions",
        f"outcomes over all {index} submissions: {outcomes} "
        f"({time.perf_counter() - started_all:.0f} s in all)",
        "SubmitJob through gRPC (store, decide, round, commit, events): "
        f"p50 {percentile(ms, 0.5):.1f} ms, p99 {p99:.1f} ms, max {max(ms):.1f} ms",
        "reference, from-scratch admission test alone (in-process): "
        f"p50 {percentile(ref, 0.5):.1f} ms, p99 {ref_p99:.1f} ms",
        "timed, by outcome: "
        + ", ".join(
            f"{state} n={len(v)} p50 {percentile(v, 0.5):.1f} ms p99 {percentile(v, 0.99):.1f} ms"
            for state, v in sorted(by_state.items())
        ),
        f"ratio p99 (gRPC end to end / from-scratch decision alone): {p99 / ref_p99:.2f}",
        f"target p99 <= 50 ms: {'PASS' if p99 <= 50 else 'FAIL'}",
    ]


async def main(kinds: list[str]) -> int:
    lines = [
        "# bench/admission_grpc.py",
        f"command: .venv/bin/python bench/admission_grpc.py {' '.join(kinds)}".rstrip(),
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        "workload: itp-ef/cluster04.csv in order, A100 curves as declared profiles, trace "
        "deadlines soft (guaranteed if possible, else best effort)",
    ]
    for kind in kinds:
        lines += await phase(kind)
    record(RESULT, lines)
    return 0


if __name__ == "__main__":
    ensure_certificates()  # the services it starts serve mutual TLS
    chosen = sys.argv[1:] or ["gpu", "cpu"]
    unknown = [kind for kind in chosen if kind not in ("gpu", "cpu")]
    if unknown:
        sys.exit(f"unknown phase {unknown[0]!r}: use gpu, cpu or both")
    with bench_servers():
        code = asyncio.run(main(chosen))
    sys.exit(code)
