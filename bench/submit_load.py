"""Benchmark: 1,000 job submissions from 16 concurrent clients against the whole suite.

Run: ``.venv/bin/python bench/submit_load.py [--jobs 1000] [--clients 16]
[--database postgresql|sqlite] [--profile SERVICE ...]`` (writes
``bench/results/submit_load-<database>.txt``; with ``--profile``, ``-profile`` is added to
the name).

The suite is the one a user runs: ``stride up`` (embedded NATS locked down, mutual TLS,
tokens) in a fresh state folder, on a fresh database of the PostgreSQL at
``STRIDE_TEST_DATABASE_URL`` (else an embedded one of the run's own) or on SQLite files. The
jobs are ``stride loadgen --env dlrm``'s seeded population, submitted as that command
submits them (simulated: no pods start, so what is measured is the services' work, not
TensorFlow's), each with a request id, by ``--clients`` clients that each keep one SubmitJob
in flight on a connection of their own (one process, asyncio).

Measured:
- jobs/s: submissions answered over the wall time from the first sent to the last answered;
- latency of each SubmitJob (p50, p99, max);
- CPU per job: the CPU time (user + system, from ``/proc``) of every server-side process
  (each service, the embedded nats-server, the supervisor, and the PostgreSQL server's
  processes) while the submissions ran, and again once the suite was quiet after them
  (plans made, books written), divided by the jobs;
- with ``--profile``: py-spy samples of the named services during the submissions, the
  functions that took the most samples (own time and inclusive). py-spy costs CPU, so a
  profiled run's rates are not the unprofiled one's; keep them apart.
- with ``--pause``: the named services are stopped (SIGSTOP) while the submissions run
  and resumed after (SIGCONT), so the rates are the submission path's alone, without the
  work that follows each submission (the optimizer's first plan, the pod watcher's pods)
  on the same cores. A diagnostic of where the cores go, recorded apart
  (``-paused``); its rates are not the suite's.

Goal (issue #15): at least 100 jobs/s and p99 at most 300 ms on this machine. Reference,
same run: the client's own CPU per job (what the 16 clients cost the 2 shared cores).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.engine import make_url
from suite import (
    CpuMeter,
    percentile,
    record,
    spent,
    start_profiles,
    suite_arguments,
    suite_on_database,
    summarize_profile,
)

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.bus.permissions import ADMIN
from stride.cli.endpoints import SuiteState
from stride.cli.loadgen import job_spec
from stride.events.v1 import plan_pb2
from stride.runtime import tls
from stride.runtime.tokens import TokenSource
from stride.sim.dlrm import generate_jobs, load_straggler_covs
from stride.testing import SHARED_TRACES
from stride.testing.databases import admin_url, test_server_log

ROOT = Path(__file__).resolve().parents[1]


def table_work(url: str) -> dict[str, collections.Counter[str]]:
    """Per service (schema): index and sequential scans, rows inserted, updated and
    deleted, from PostgreSQL's table statistics; and the database's commits."""
    import psycopg

    work: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("SELECT pg_stat_clear_snapshot()")
        rows = connection.execute(
            "SELECT schemaname, coalesce(seq_scan, 0) + coalesce(idx_scan, 0), n_tup_ins,"
            " n_tup_upd, n_tup_del FROM pg_stat_user_tables"
        ).fetchall()
        for schema, scans, inserted, updated, deleted in rows:
            work[schema].update(scans=scans, inserted=inserted, updated=updated, deleted=deleted)
        commits = connection.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        work["(database)"]["commits"] = commits[0] if commits else 0
    return work


STATEMENT = re.compile(r"LOG:  (?:statement|execute [^:]*): ")
"""A statement in the log: simple protocol (BEGIN, COMMIT) or extended (parameters)."""


def postgres_log() -> Path:
    """Where the run's embedded PostgreSQL writes its log (``--statements`` reads it)."""
    log = test_server_log()
    if log is None:
        raise SystemExit(
            "--statements reads the log of the run's embedded PostgreSQL: "
            "unset STRIDE_TEST_DATABASE_URL"
        )
    return log


def statement_counts(log_from: int, database: str) -> dict[str, collections.Counter[str]]:
    """Per service, the statements its connections sent (``log_statement = all`` on the
    bench's database), by kind. A connection is the service whose schema it names first."""
    by_pid: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    owner: dict[str, str] = {}
    with postgres_log().open(errors="replace") as log:
        log.seek(log_from)
        for line in log:
            found = STATEMENT.search(line)
            if f"@{database} " not in line or found is None:
                continue
            pid = line.split("[", 1)[1].split("]", 1)[0]
            statement = line[found.end() :].strip()
            by_pid[pid][statement.split(None, 1)[0].upper()] += 1
            if pid not in owner and (found := re.search(r"\b([a-z]+)\.[a-z_]+\b", statement)):
                owner[pid] = found.group(1)
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for pid, kinds in by_pid.items():
        counts[owner.get(pid, "(unknown)")].update(kinds)
    return counts


class PlanCount:
    """Jobs with at least one plan, as the optimizer publishes them."""

    def __init__(self) -> None:
        self.jobs: set[str] = set()

    def plan(self, job_id: str, plan: plan_pb2.ResourcePlan) -> None:
        self.jobs.add(job_id)


async def submit_all(
    state: SuiteState, specs: list[admission_pb.SubmitJobRequest], clients: int
) -> tuple[list[float], collections.Counter[str], float, float]:
    """Submit every request from ``clients`` concurrent clients; returns the latencies,
    the outcomes, the wall seconds and this process's CPU seconds."""
    token = TokenSource(path=Path(state.tokens_dir) / "admin.token")
    queue: asyncio.Queue[admission_pb.SubmitJobRequest] = asyncio.Queue()
    for request in specs:
        queue.put_nowait(request)
    latencies: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()
    channels = [
        tls.aio_channel(
            state.services["admission"], server="admission", identity=ADMIN, token=token
        )
        for _ in range(clients)
    ]
    stubs = [admission_grpc.AdmissionServiceStub(channel) for channel in channels]
    # One call each first: connections and TLS handshakes are not part of the measure.
    await asyncio.gather(*(stub.ListJobs(admission_pb.ListJobsRequest()) for stub in stubs))

    async def client(stub: admission_grpc.AdmissionServiceAsyncStub) -> None:
        while not queue.empty():
            request = queue.get_nowait()
            began = time.perf_counter()
            reply = await stub.SubmitJob(request, timeout=60)
            latencies.append(time.perf_counter() - began)
            outcomes[admission_pb.JobState.Name(reply.job.state)] += 1

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client(stub) for stub in stubs))
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    for channel in channels:
        await channel.close(None)
    return latencies, outcomes, wall, cpu


def _set_log_statement(url: str, value: str) -> None:
    import psycopg

    name = make_url(url).database
    with psycopg.connect(
        admin_url().set(drivername="postgresql").render_as_string(hide_password=False),
        autocommit=True,
    ) as c:
        c.execute(f'ALTER DATABASE "{name}" SET log_statement = {value!r}')


async def run(
    jobs: int,
    clients: int,
    database: str,
    profile: list[str],
    statements: bool,
    summary: dict[str, Any],
    pause: list[str] | None = None,
) -> int:
    """One round on a fresh suite; its report is recorded, its key figures go in
    ``summary``."""
    population = generate_jobs(
        jobs,
        np.random.default_rng(7),
        load_straggler_covs(SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"),
    )
    requests = [
        admission_pb.SubmitJobRequest(
            spec=job_spec(index, spec, "submit-load", user=""), request_id=f"submit-load-{index}"
        )
        for index, spec in enumerate(population)
    ]
    pause = pause or []
    name = f"submit_load-{database}{'-profile' if profile else ''}{'-paused' if pause else ''}"
    lines = [
        "# bench/submit_load.py",
        f"command: .venv/bin/python bench/submit_load.py --jobs {jobs} --clients {clients} "
        f"--database {database}"
        + "".join(f" --profile {p}" for p in profile)
        + "".join(f" --pause {p}" for p in pause)
        + (" --statements" if statements else ""),
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start",
        f"suite: stride up (embedded NATS locked down, mutual TLS, tokens), database {database}",
        f"workload: {jobs} jobs of stride loadgen --env dlrm's population (seed 7), simulated, "
        f"{clients} clients with one SubmitJob in flight each",
    ]
    code = 1
    summary.clear()
    # Logging every statement is a setting of new sessions: made before the services connect.
    before_up = (lambda url: _set_log_statement(url, "all")) if statements else None
    with suite_on_database(database, "submit-load", before_up) as (work, _, database_url):
        state_dir = work / "state"
        state = SuiteState.read(state_dir)
        assert state is not None
        os.environ[tls.TLS_DIR_ENV] = state.tls_dir
        meter = CpuMeter(state_dir, postgres=bool(database_url))
        settled = await meter.quiet(120.0)
        idle = await meter.idle_rate()
        bus = await Bus.connect(
            state.nats_url,
            name="bench-submit-load",
            identity=ADMIN,
            environ={tls.TLS_DIR_ENV: state.tls_dir},
        )
        planned = PlanCount()
        subscription = await bus.watch(topics.PLAN, planned.plan)
        profilers = start_profiles(state_dir, profile, work) if profile else []
        log_from = postgres_log().stat().st_size if statements else 0
        tables_before = table_work(database_url) if database_url else {}
        before = meter.sample()
        paused = [state.processes[service].pid for service in pause]
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        try:
            latencies, outcomes, wall, client_cpu = await submit_all(state, requests, clients)
        finally:
            for pid in paused:
                os.kill(pid, signal.SIGCONT)
        during = meter.sample()
        for profiler in profilers:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=60)
        waited = await meter.quiet(300.0, lambda: len(planned.jobs) >= jobs)
        after = meter.sample()
        await asyncio.sleep(1.0)  # statistics reach the views within PGSTAT's flush delay
        tables_after = table_work(database_url) if database_url else {}
        if statements:
            counted = statement_counts(log_from, make_url(database_url).database or "")
        await subscription.unsubscribe()
        await bus.close()
        rate = len(latencies) / wall
        p50, p99 = percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3
        spent_during, spent_all = spent(before, during), spent(before, after)
        lines += [
            f"suite settled {settled:.0f} s after start; submissions took {wall:.1f} s; "
            f"quiet {waited:.0f} s after the last answer (every job planned); idle, the "
            f"suite uses {1e3 * idle:.0f} ms of CPU a second",
            f"outcomes: {dict(outcomes)}; jobs with a plan on the bus: {len(planned.jobs)}",
            "",
            f"jobs/s: {rate:.1f}",
            f"SubmitJob latency: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
            f"max {max(latencies) * 1e3:.1f} ms",
            "",
            "CPU ms per job      while submitting   until quiet",
        ]
        for process in sorted(spent_all, key=lambda n: -spent_all[n]):
            lines.append(
                f"  {process:<18} {1e3 * spent_during[process] / jobs:10.2f} "
                f"{1e3 * spent_all[process] / jobs:13.2f}"
            )
        lines.append(
            f"  {'all server-side':<18} {1e3 * sum(spent_during.values()) / jobs:10.2f} "
            f"{1e3 * sum(spent_all.values()) / jobs:13.2f}"
        )
        if tables_after:
            lines += ["", "PostgreSQL work per job until quiet (table statistics, by service)"]
            lines.append("  service         scans  inserted  updated  deleted  commits")
            for schema in sorted(tables_after):
                done = tables_after[schema].copy()
                done.subtract(tables_before.get(schema, collections.Counter()))
                lines.append(
                    f"  {schema:<14} {done['scans'] / jobs:6.1f} {done['inserted'] / jobs:9.1f} "
                    f"{done['updated'] / jobs:8.1f} {done['deleted'] / jobs:8.1f} "
                    f"{done['commits'] / jobs:8.1f}"
                )
        if statements:
            kinds = ["BEGIN", "COMMIT", "ROLLBACK", "SELECT", "INSERT", "UPDATE", "DELETE"]
            lines += ["", "statements per job until quiet (log_statement = all; --statements)"]
            lines.append("  service       " + "".join(f"{kind:>9}" for kind in kinds) + "    all")
            for service in sorted(counted):
                row = counted[service]
                lines.append(
                    f"  {service:<13} "
                    + "".join(f"{row[kind] / jobs:9.1f}" for kind in kinds)
                    + f"{sum(row.values()) / jobs:7.1f}"
                )
        lines.append(
            f"reference, the clients (this process): {1e3 * client_cpu / jobs:.2f} ms per job"
        )
        for service in profile:
            lines += ["", f"## profile of {service} while submitting (py-spy, 200 Hz)"]
            lines += summarize_profile(work / f"{service}.txt")
        passed = rate >= 100 and p99 <= 300
        lines += ["", f"goal >= 100 jobs/s and p99 <= 300 ms: {'PASS' if passed else 'FAIL'}"]
        if pause:
            lines.append(
                f"(paused while submitting: {', '.join(pause)}; the submission path alone, "
                "not the suite's rates)"
            )
        if profile:
            lines.append(
                "(profiled run: py-spy's sampling costs CPU; rates are the unprofiled run's)"
            )
        record(ROOT / "bench" / "results" / f"{name}.txt", lines)
        code = 0 if passed or profile or pause else 1
        summary.update(
            rate=rate, p99=p99, cpu=1e3 * sum(spent_during.values()) / jobs, path=f"{name}.txt"
        )
        if profile:  # the raw stacks, for a closer look
            kept = Path(tempfile.gettempdir()) / "stride-submit-load-profiles"
            kept.mkdir(exist_ok=True)
            for service in profile:
                with contextlib.suppress(OSError):
                    shutil.copy(work / f"{service}.txt", kept / f"{service}.txt")
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    suite_arguments(parser, "the submissions run")
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat on a fresh suite; report each and the median"
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="count each service's SQL statements (PostgreSQL's log_statement, read from the "
        "embedded server's log; the logging costs the server CPU)",
    )
    parser.add_argument(
        "--pause",
        action="append",
        default=[],
        choices=["optimizer", "podwatcher", "executor", "dispatcher", "ckptcache"],
        help="stop this service while the submissions run, resumed after (repeatable; a "
        "diagnostic: the submission path without the work that follows it)",
    )
    args = parser.parse_args()
    if args.statements and args.database != "postgresql":
        parser.error("--statements needs --database postgresql")
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    rounds: list[dict[str, Any]] = []
    code = 0
    for _ in range(args.rounds):
        summary: dict[str, Any] = {}
        code = max(
            code,
            asyncio.run(
                run(
                    args.jobs,
                    args.clients,
                    args.database,
                    args.profile,
                    args.statements,
                    summary,
                    args.pause,
                )
            ),
        )
        if not summary:
            return code
        rounds.append(summary)
    if args.rounds > 1:
        lines = [
            "",
            f"## {args.rounds} rounds (a fresh suite each; the report above is the last)",
            *(
                f"  round {n + 1}: {r['rate']:.1f} jobs/s, p99 {r['p99']:.1f} ms, "
                f"{r['cpu']:.1f} ms CPU per job while submitting"
                for n, r in enumerate(rounds)
            ),
            f"  median: {statistics.median(r['rate'] for r in rounds):.1f} jobs/s, p99 "
            f"{statistics.median(r['p99'] for r in rounds):.1f} ms, "
            f"{statistics.median(r['cpu'] for r in rounds):.1f} ms CPU per job",
        ]
        print("\n".join(lines))
        path = ROOT / "bench" / "results" / rounds[-1]["path"]
        text = path.read_text().replace(
            "command: .venv/bin/python bench/submit_load.py",
            f"command: .venv/bin/python bench/submit_load.py --rounds {args.rounds}",
            1,
        )
        path.write_text(text + "\n".join(lines) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
