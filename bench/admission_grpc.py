"""Benchmark: an admission decision through gRPC with 1,000 running jobs on 1,024 GPUs.

Run: ``.venv/bin/python bench/admission_grpc.py`` (NATS at ``STRIDE_NATS_URL``, default
127.0.0.1:4222; PostgreSQL at ``STRIDE_TEST_DATABASE_URL``; writes
``bench/results/admission_grpc.txt``).

Workload: the jobs of ``itp-ef/cluster04.csv`` in submission order (microsoft/
elasticflow-traces, MIT), each submitted as a GPU job whose declared profile is its A100
curve (pkusys/ElasticFlow tables, Apache-2.0, made concave as ``stride sim`` does) and
whose deadline is its trace deadline relative to submission. The admission service runs
in-process on real NATS and PostgreSQL with ``cluster_gpus=1024``. Jobs are submitted until
1,000 are active (admitted or queued); then the next 200 submissions are timed end to end
(SubmitJob: validate, store, decide, round, commit the decision, books and share events).

Reference, same run: the from-scratch decision (``admit_from_scratch``: Algorithm 1 re-run
over every admitted deadline job and the candidate, in deadline order) at each timed
submission, in-process (no gRPC, no storage): what re-planning from scratch costs for the
decision alone. (``admission_test``, which first re-derives the guaranteed set, falls back
to O(n^2) re-runs when the set as a whole no longer fits from scratch, and took minutes per
decision here.) Target: p99 at most 50 ms.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from suite import percentile, record

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.policy.elasticflow.admission import DeadlineJob, admit_from_scratch
from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.guarantees import SLOT_SECONDS, JobView
from stride.sim.traces import TraceJob, load_curves, load_deadline_trace
from stride.testing import SHARED_TRACES
from stride.testing.databases import create_database, drop_database
from stride.testing.inprocess import local_settings, running_service

ACTIVE = 1000
TIMED = 200
GPUS = 1024
RESULT = Path(__file__).parent / "results" / "admission_grpc.txt"


def job_spec(trace: TraceJob, curve: ScalingCurve, now: datetime) -> job_pb2.JobSpec:
    """The trace job as a user submits it: its A100 curve as a declared GPU profile."""
    points = [
        job_pb2.ProfilePoint(workers=size, steps_per_second=value)
        for size, value in zip(curve.sizes, curve.throughputs, strict=True)
    ]
    message = job_pb2.JobSpec(
        name="itp",
        user="bench",
        model=job_pb2.ModelReference(name=trace.model_name, entrypoint="bench.itp:main"),
        dataset=job_pb2.DatasetSpec(name="itp", record_count=10**9),
        batch_size=trace.batch_size,
        termination=job_pb2.Termination(max_steps=max(1, int(trace.iterations))),
        resource_kind=job_pb2.RESOURCE_KIND_GPU,
        simulated=True,
        profile=job_pb2.ScalingProfile(kind=job_pb2.RESOURCE_KIND_GPU, points=points),
    )
    assert trace.deadline is not None
    message.deadline.FromDatetime(now + timedelta(seconds=trace.deadline - trace.submission_time))
    return message


def job_view(job_id: str, curve: ScalingCurve, spec: job_pb2.JobSpec, now: float) -> JobView:
    steps = float(spec.termination.max_steps)
    deadline = spec.deadline.ToDatetime(tzinfo=UTC).timestamp()
    return JobView(job_id, curve, steps, deadline, now, 0, 0, 0.0, steps)


async def main() -> int:
    curves = load_curves(SHARED_TRACES / "throughputs_A100")
    jobs = load_deadline_trace(SHARED_TRACES / "itp-ef" / "cluster04.csv")
    database = create_database("stride_bench")
    settings = local_settings(
        AdmissionSettings,
        nats_url=os.environ.get("STRIDE_NATS_URL", "nats://127.0.0.1:4222"),
        database_url=database,
        cluster_gpus=GPUS,
    )
    latencies: list[float] = []
    reference: list[float] = []
    outcomes: dict[str, int] = {}
    by_state: dict[str, list[float]] = {}
    guaranteed: list[JobView] = []
    """The admitted deadline jobs, for the from-scratch reference."""
    index = 0
    try:
        async with (
            running_service(build, settings) as host,
            grpc.aio.insecure_channel(f"127.0.0.1:{host.server.port}") as channel,
        ):
            stub = pb_grpc.AdmissionServiceStub(channel)
            active = 0
            while active < ACTIVE + TIMED and index < len(jobs):
                trace = jobs[index]
                index += 1
                curve = curves.curve(trace)
                spec = job_spec(trace, curve, datetime.now(UTC))
                timed = active >= ACTIVE
                now = time.time()
                candidate = job_view(f"c{index}", curve, spec, now)
                if timed:
                    hard = [
                        DeadlineJob(j.job_id, j.curve, j.remaining_iterations, j.deadline)
                        for j in [*guaranteed, candidate]
                        if j.deadline is not None and j.deadline - now >= SLOT_SECONDS
                    ]
                    started = time.perf_counter()
                    admit_from_scratch(GPUS, now, SLOT_SECONDS, hard)
                    reference.append(time.perf_counter() - started)
                started = time.perf_counter()
                reply = await stub.SubmitJob(pb.SubmitJobRequest(spec=spec))
                elapsed = time.perf_counter() - started
                state = pb.JobState.Name(reply.job.state)
                outcomes[state] = outcomes.get(state, 0) + 1
                if reply.job.state in (pb.JOB_STATE_ADMITTED, pb.JOB_STATE_QUEUED):
                    active += 1
                    guaranteed.append(candidate)
                if timed:
                    latencies.append(elapsed)
                    by_state.setdefault(state, []).append(1000 * elapsed)
    finally:
        drop_database(database)
    ms = [1000 * value for value in latencies]
    ref = [1000 * value for value in reference]
    p99, ref_p99 = percentile(ms, 0.99), percentile(ref, 0.99)
    lines = [
        "# bench/admission_grpc.py",
        "command: .venv/bin/python bench/admission_grpc.py",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"workload: itp-ef/cluster04.csv in order, A100 curves as declared GPU profiles, "
        f"{GPUS} GPUs; {ACTIVE} active jobs, then {len(ms)} timed submissions",
        f"outcomes over all {index} submissions: {outcomes}",
        "SubmitJob through gRPC (store, decide, round, commit, events): "
        f"p50 {percentile(ms, 0.5):.1f} ms, p99 {p99:.1f} ms, max {max(ms):.1f} ms",
        "reference, from-scratch admission test alone (in-process): "
        f"p50 {percentile(ref, 0.5):.1f} ms, p99 {ref_p99:.1f} ms",
        "timed, by outcome: "
        + ", ".join(
            f"{state.removeprefix('JOB_STATE_').lower()} n={len(v)} p50 "
            f"{percentile(v, 0.5):.1f} ms p99 {percentile(v, 0.99):.1f} ms"
            for state, v in sorted(by_state.items())
        ),
        f"ratio p99 (gRPC end to end / from-scratch decision alone): {p99 / ref_p99:.2f}",
        f"target p99 <= 50 ms: {'PASS' if p99 <= 50 else 'FAIL'}",
    ]
    record(RESULT, lines)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
