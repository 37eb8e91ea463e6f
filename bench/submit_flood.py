"""Benchmark: one user floods admission with 1,000 submissions while others submit at a
steady rate; the steady users' SubmitJob latency during the flood beside its quiet latency
(issue 37, finding 6).

Run: ``.venv/bin/python bench/submit_flood.py [--flood 1000] [--flood-rate 40]
[--steady-users 2] [--steady-rate 4] [--seconds 25] [--without-limits]`` (NATS at
``STRIDE_NATS_URL``, else an embedded one; PostgreSQL at ``STRIDE_TEST_DATABASE_URL``, else
an embedded one; writes ``bench/results/submit_flood.txt``).

Admission runs as its own process (``python -m stride.admission``, as deployed) with mutual
TLS and user tokens, on real NATS and PostgreSQL, with its default limits (5 submissions a
second per user, burst 20; 50 active jobs a user). This process is every client, each user
on a channel of their own with their own token:

- quiet: the steady users (``bob``, ``carol``, ...) each submit ``--steady-rate`` jobs a
  second for ``--seconds``, alone; each job is cancelled once answered (untimed), as jobs
  end, so the steady users stay under their cap;
- flood: the same, while ``alice`` sends ``--flood`` submissions at ``--flood-rate`` a
  second, open loop (each sent on time whatever the answers; the finding's flood was 1,000
  in 25 s) and never honouring a refusal's retry hint.

Reported: the steady users' SubmitJob p50/p99 in each phase and the ratio of the p99s
(goal: the flood's within 20 % of the quiet one), alice's outcomes (stored, refused by the
rate, refused by the cap). ``--without-limits`` adds a round with the limits off (rate and
cap 0: what admission did before issue 37), as the reference of what the flood did then.
Jobs are best effort without a curve: admitted at once, no share to plan, so what is timed
is the submission path (validate, limits, store, decide, commit, events).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from suite import bench_servers, percentile, record

from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.testing.channels import aio_channel, ensure_certificates, user_token
from stride.testing.databases import create_database, drop_database
from stride.testing.eventually import assert_eventually
from stride.testing.health import SERVING, equals, health
from stride.testing.processes import ServiceProcess

RESULT = Path(__file__).parent / "results" / "submit_flood.txt"
SERVICE = "stride.api.admission.v1.AdmissionService"
GOAL = 1.20


def request() -> pb.SubmitJobRequest:
    """A best-effort job without a curve (its user: the token's)."""
    return pb.SubmitJobRequest(
        spec=job_pb2.JobSpec(
            name="ctr",
            model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wd:main"),
            dataset=job_pb2.DatasetSpec(name="criteo", record_count=1_000_000),
            batch_size=512,
            termination=job_pb2.Termination(max_steps=1000),
        )
    )


async def steady(
    stub: pb_grpc.AdmissionServiceAsyncStub, rate: float, seconds: float, offset: float
) -> list[float]:
    """Submit ``rate`` jobs a second for ``seconds`` (each on its tick, ``offset`` into the
    period), cancelling each once answered; the SubmitJob latencies in ms."""
    latencies: list[float] = []
    began = time.perf_counter()
    count = int(rate * seconds)
    for index in range(count):
        due = began + (index + offset) / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        started = time.perf_counter()
        reply = await stub.SubmitJob(request(), timeout=30)
        latencies.append(1000 * (time.perf_counter() - started))
        await stub.CancelJob(pb.CancelJobRequest(job_id=reply.job.job_id), timeout=30)
    return latencies


async def flood(
    stub: pb_grpc.AdmissionServiceAsyncStub, count: int, rate: float
) -> collections.Counter[str]:
    """Send ``count`` submissions at ``rate`` a second, open loop; their outcomes."""
    outcomes: collections.Counter[str] = collections.Counter()

    async def one() -> None:
        try:
            await stub.SubmitJob(request(), timeout=30)
            outcomes["stored"] += 1
        except grpc.aio.AioRpcError as error:
            details = error.details() or ""
            kind = details.split(":", 1)[0] if ":" in details else details[:40]
            outcomes[f"{error.code().name} ({kind})"] += 1

    tasks = []
    began = time.perf_counter()
    for index in range(count):
        await asyncio.sleep(max(0.0, began + index / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    return outcomes


async def phase(
    address: str, users: list[str], args: argparse.Namespace, flooding: bool
) -> tuple[list[float], collections.Counter[str], float]:
    """One phase: the steady users, and alice's flood if ``flooding``."""
    async with UserChannels(address, [*users, "alice"]) as stubs:
        gc.collect()
        began = time.perf_counter()
        work: list[Any] = [
            steady(stubs[user], args.steady_rate, args.seconds, index / len(users))
            for index, user in enumerate(users)
        ]
        if flooding:
            work.append(flood(stubs["alice"], args.flood, args.flood_rate))
        results = await asyncio.gather(*work)
        wall = time.perf_counter() - began
    latencies = [value for result in results[: len(users)] for value in result]
    outcomes = results[-1] if flooding else collections.Counter()
    return latencies, outcomes, wall


class UserChannels:
    """A channel per user, each with the user's token; yields their stubs by user."""

    def __init__(self, address: str, users: list[str]) -> None:
        self.channels = {
            user: aio_channel(address, "admission", token=user_token(user)) for user in users
        }

    async def __aenter__(self) -> dict[str, pb_grpc.AdmissionServiceAsyncStub]:
        stubs = {user: pb_grpc.AdmissionServiceStub(ch) for user, ch in self.channels.items()}
        # One call each first: connections and TLS handshakes are not part of the measure.
        await asyncio.gather(*(stub.ListJobs(pb.ListJobsRequest()) for stub in stubs.values()))
        return stubs

    async def __aexit__(self, *exc: object) -> None:
        for channel in self.channels.values():
            await channel.close(None)


async def round_(args: argparse.Namespace, limits: bool) -> list[str]:
    """Quiet, then flood, on a fresh admission process and database."""
    database = create_database("stride_bench")
    logs = Path(tempfile.mkdtemp(prefix="stride-bench-"))
    env = {
        "STRIDE_NATS_URL": os.environ["STRIDE_NATS_URL"],
        "STRIDE_ADMISSION_DATABASE_URL": database,
        "STRIDE_ADMISSION_LOG_LEVEL": "WARNING",
    }
    if not limits:
        env["STRIDE_ADMISSION_SUBMIT_RATE_PER_SECOND"] = "0"
        env["STRIDE_ADMISSION_DEFAULT_MAX_ACTIVE_JOBS"] = "0"
    service = ServiceProcess("admission", env, logs)
    users = ["bob", "carol", "dave", "erin"][: args.steady_users]
    try:
        service.start()
        await assert_eventually(
            lambda: equals(health(service.port, SERVICE), SERVING), timeout=60, interval=0.2
        )
        quiet, _, _ = await phase(service.address, users, args, flooding=False)
        flooded, outcomes, wall = await phase(service.address, users, args, flooding=True)
    finally:
        if service.terminate() != 0:
            print(service.log_text()[-4000:], file=sys.stderr)
        drop_database(database)
    quiet_p99, flood_p99 = percentile(quiet, 0.99), percentile(flooded, 0.99)
    ratio = flood_p99 / quiet_p99
    title = "default limits" if limits else "limits off (before issue 37: the reference)"
    lines = [
        f"## {title}",
        f"alice's flood: {args.flood} submissions at {args.flood_rate:g}/s; outcomes "
        f"{dict(sorted(outcomes.items()))}; the flood phase took {wall:.1f} s",
        f"steady users' SubmitJob ({len(users)} users x {args.steady_rate:g}/s, "
        f"n={len(quiet)} quiet, n={len(flooded)} during the flood):",
        f"  quiet:  p50 {percentile(quiet, 0.5):.1f} ms, p99 {quiet_p99:.1f} ms, "
        f"max {max(quiet):.1f} ms",
        f"  flood:  p50 {percentile(flooded, 0.5):.1f} ms, p99 {flood_p99:.1f} ms, "
        f"max {max(flooded):.1f} ms",
        f"ratio p99 (during the flood / quiet): {ratio:.2f}",
    ]
    if limits:
        lines.append(f"goal p99 within 20 %: {'PASS' if ratio <= GOAL else 'FAIL'}")
    return lines


async def main(args: argparse.Namespace) -> int:
    command = " ".join(
        [
            ".venv/bin/python bench/submit_flood.py",
            f"--flood {args.flood} --flood-rate {args.flood_rate:g}",
            f"--steady-users {args.steady_users} --steady-rate {args.steady_rate:g}",
            f"--seconds {args.seconds:g}",
            *(["--without-limits"] if args.without_limits else []),
        ]
    )
    lines = [
        "# bench/submit_flood.py",
        f"command: {command}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
        "service: python -m stride.admission (mutual TLS, user tokens), NATS, PostgreSQL",
    ]
    lines += await round_(args, limits=True)
    if args.without_limits:
        lines += await round_(args, limits=False)
    record(RESULT, lines)
    return 0


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=1000, help="alice's submissions")
    parser.add_argument("--flood-rate", type=float, default=40.0, help="alice's per second")
    parser.add_argument("--steady-users", type=int, default=2, choices=range(1, 5))
    parser.add_argument("--steady-rate", type=float, default=4.0, help="each, per second")
    parser.add_argument("--seconds", type=float, default=25.0, help="each phase's length")
    parser.add_argument("--without-limits", action="store_true", help="add the reference")
    return parser.parse_args()


if __name__ == "__main__":
    chosen = arguments()
    ensure_certificates()  # the service it starts serves mutual TLS; the users have tokens
    with bench_servers():
        code = asyncio.run(main(chosen))
    sys.exit(code)
