"""Benchmark: the optimizer's live loop under load, and the live system against the
simulator on the same jobs.

Run: ``.venv/bin/python bench/optimizer_loop.py`` (writes ``bench/results/optimizer_loop.txt``).

A real suite on this machine (`stride up`: embedded NATS, SQLite, every service, the
optimizer with the simulator's search space and 180 s windows), played by ``stride
loadgen``'s simulated agents in three runs, one after the other, on the one suite (the
comparison first, while the config DB is empty; numbered here as reported):

1. **paced** (``--jobs``, default 100): each job reports one window every
   ``--window-seconds`` of wall time (default 8 s: 100 jobs offer 12.5 windows/s, each job
   running 22x faster than real time), at random phases, as real jobs do, for the first
   ``--pace-seconds`` (default 120; then they finish unpaced, unmeasured). Measured: for
   every window, the wall time from the agent publishing the window's steps to the
   optimizer's decision reaching it on the bus (the new plan, or the announcement that the
   plan holds). Goal: p99 under 1 s. Reference in the same run: the stage step's own
   compute time for the same requests in one process (the least the loop can cost).
2. **saturation** (same jobs): every job sends its next window as soon as the last was
   decided, 64 at a time; the windows decided per second is the loop's capacity here.
3. **live against the simulator** (``--compare-jobs``, default 200, as fast as decided):
   the run times of the jobs played live against ``stride sim``'s Stride policy on the same
   jobs (median and p90), and the share of windows decided as the simulator's policy
   decides on the same observations.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from suite import percentile, record, running_suite

from stride.cli.loadgen import Played, compare, run

RESULTS = Path(__file__).parent / "results" / "optimizer_loop.txt"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
COVS = TRACES / "pai-minibatch-time" / "coefficient_variation.csv"
TICK = 180.0


def play(
    suite: dict[str, Any],
    jobs: int,
    seed: int,
    window_seconds: float,
    concurrency: int,
    pace_seconds: float = float("inf"),
) -> tuple[list[Played], Any, float]:
    started = time.monotonic()
    played, population = asyncio.run(
        run(
            suite["nats_url"],
            suite["services"]["admission"],
            suite["services"]["optimizer"],
            jobs,
            seed,
            TICK,
            30.0,
            COVS,
            concurrency=concurrency,
            window_seconds=window_seconds,
            pace_seconds=pace_seconds,
            # The suite's own certificates, which `stride up` made in its state folder.
            tls_environ={**os.environ, "STRIDE_TLS_DIR": suite["tls_dir"]},
        )
    )
    return played, population, time.monotonic() - started


def latency_rows(played: list[Played]) -> tuple[list[str], float]:
    latencies = [x for p in played for x in p.latencies]
    reference = [x for p in played for x in p.compute]
    p99 = percentile(latencies, 0.99)
    return [
        "  window to decision (wall)     p50        p90        p99        max",
        f"    live loop              {statistics.median(latencies) * 1000:7.1f} ms "
        f"{percentile(latencies, 0.9) * 1000:7.1f} ms {p99 * 1000:7.1f} ms "
        f"{max(latencies) * 1000:7.1f} ms",
        f"    stage step alone       {statistics.median(reference) * 1000:7.1f} ms "
        f"{percentile(reference, 0.9) * 1000:7.1f} ms "
        f"{percentile(reference, 0.99) * 1000:7.1f} ms {max(reference) * 1000:7.1f} ms",
        f"    ratio (p99)            {p99 / percentile(reference, 0.99):.1f}x",
    ], p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--window-seconds", type=float, default=8.0)
    parser.add_argument("--pace-seconds", type=float, default=120.0)
    parser.add_argument("--compare-jobs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    settings = {
        "STRIDE_OPTIMIZER_MAX_POD_CPU": "16",
        "STRIDE_OPTIMIZER_MAX_JOB_CPU": "200",
        "STRIDE_OPTIMIZER_TICK_SECONDS": str(TICK),
    }
    with running_suite(settings=settings) as suite:
        # The comparison first, on an empty config DB: later jobs of the same population
        # would warm-start from the earlier runs' finished jobs, which the simulator's run
        # (no history) does not.
        compared, population, compared_wall = play(suite, args.compare_jobs, args.seed, 0.0, 64)
        paced, _, paced_wall = play(
            suite, args.jobs, args.seed, args.window_seconds, args.jobs, args.pace_seconds
        )
        saturated, _, saturated_wall = play(suite, args.jobs, args.seed, 0.0, 64)
    paced_rows, p99 = latency_rows(paced)
    saturated_rows, _ = latency_rows(saturated)
    paced_windows = sum(p.windows for p in paced)
    saturated_windows = sum(p.windows for p in saturated)
    report = compare(compared, population, args.seed, TICK)
    live, sim = report["live"], report["sim"]
    lines = [
        f"$ .venv/bin/python bench/optimizer_loop.py --jobs {args.jobs} "
        f"--window-seconds {args.window_seconds:g} --pace-seconds {args.pace_seconds:g} "
        f"--compare-jobs {args.compare_jobs} "
        f"--seed {args.seed}",
        f"machine: {os.cpu_count()} cores, shared by the whole suite and the load generator; "
        f"suite: stride up (embedded NATS, SQLite), optimizer with the simulator's grid and "
        f"{TICK:g} s windows",
        "",
        f"1. paced: {args.jobs} jobs, one window per job every {args.window_seconds:g} s "
        f"(offered {args.jobs / args.window_seconds:.1f} windows/s; each job "
        f"{TICK / args.window_seconds:.0f}x faster than real time)",
        f"  {sum(len(p.latencies) for p in paced)} windows in the first "
        f"{args.pace_seconds:g} s measured (then the jobs ran unpaced to their end: "
        f"{paced_windows} windows in {paced_wall:.0f} s)",
        *paced_rows,
        f"  goal p99 < 1 s: {'PASS' if p99 < 1.0 else 'FAIL'}",
        "",
        f"2. saturation: the same {args.jobs} jobs, each window sent as soon as the last was "
        "decided, 64 jobs at a time",
        f"  {saturated_windows} windows in {saturated_wall:.0f} s: "
        f"{saturated_windows / saturated_wall:.1f} windows decided per second",
        *saturated_rows,
        "",
        f"3. live against stride sim: {args.compare_jobs} jobs (all started at once, no "
        f"queueing), played as fast as decided ({compared_wall:.0f} s)",
        f"  decisions equal to the simulator's on the same observations: "
        f"{report['decisions_agreed']} of {report['windows']} ({report['agreement']:.1%})",
        f"  completed: live {report['completed']} of {report['jobs']}",
        f"  JCT median: live {live['median_s']:,.0f} s, sim {sim['median_s']:,.0f} s "
        f"(ratio {live['median_s'] / sim['median_s']:.2f})",
        f"  JCT p90:    live {live['p90_s']:,.0f} s, sim {sim['p90_s']:,.0f} s "
        f"(ratio {live['p90_s'] / sim['p90_s']:.2f})",
        "  (run times agree in distribution only: each player draws the 5 % measurement noise",
        "   from its own generator, so a job's samples, fits and path differ from the sim's)",
    ]
    record(RESULTS, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
