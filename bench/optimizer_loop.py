"""Benchmark: the optimizer's live loop under load, and the live system against the
simulator on the same jobs.

Run: ``.venv/bin/python bench/optimizer_loop.py`` (writes ``bench/results/optimizer_loop.txt``).

A real suite on this machine (`stride up`: embedded NATS and PostgreSQL, every service, the
optimizer with the simulator's search space and 180 s windows), played by ``stride
loadgen``'s simulated agents in three runs, one after the other, on the one suite:

1. **live against the simulator** (``--compare-jobs``, default 20, as fast as decided, to
   their end): the share of windows decided as the simulator's policy decides on the same
   observations, and the run times against ``stride sim``'s Stride policy on the same jobs
   (median and p90). Each player is the simulator's own environment with the suite in its
   policy's place, so the run times agree job by job where the decisions do.
2. **saturation** (``--jobs``, default 100, all at once): every job sends its next window as
   soon as the last was decided, for ``--saturation-seconds`` (then stopped where they
   are). Measured: for every window, the wall time from the agent publishing the window's
   steps to the optimizer's decision reaching it on the bus (the new plan, or the
   announcement that the plan holds); the windows decided per second; the optimizer's CPU
   per window. Goal: p99 under 1 s. A closed loop's wait is bound by Little's law (the
   jobs always waiting over the rate decided), which the report prints beside it: the goal
   needs over ``--jobs`` windows decided per second.
3. **a realistic pace at scale** (``--paced-jobs``, default 1,000): each job reports one
   window per ``--window-seconds`` of wall time (default 60: one a minute), at random
   phases, for ``--pace-seconds`` (then stopped as they are, none going on unpaced). Same
   measures, for the start-up (every job submitted, admitted and given plan 1 at once,
   until each has sent its first window) and the steady state after it. Goal: p99 under
   1 s in the steady state.

Reference in the same runs: the stage step's own compute time for the same requests in one
process (the least the loop can cost).
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

from suite import CpuMeter, percentile, record, running_suite

from stride.cli import channels
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
    max_wall_seconds: float = float("inf"),
) -> tuple[list[Played], Any, float, dict[str, float]]:
    """Play the jobs; (what each did, the population, wall seconds, CPU s by process, the
    load generator's own included)."""
    meter = CpuMeter(Path(suite["state_dir"]), postgres=True)
    before = meter.sample()
    own = time.process_time()
    started = time.monotonic()
    played, population, _ = asyncio.run(
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
            max_wall_seconds=max_wall_seconds,
            token=channels.client_token(Path(suite["state_dir"])),
        )
    )
    wall = time.monotonic() - started
    spent = {name: value - before.get(name, 0.0) for name, value in meter.sample().items()}
    spent["load generator"] = time.process_time() - own
    return played, population, wall, spent


def latency_rows(
    played: list[Played], spent: dict[str, float], wall: float, steady: bool = False
) -> tuple[list[str], float]:
    """The run's latency table, CPU per window and goal line. With ``steady``, the goal is
    judged on the steady state: the windows sent once every job had sent its first (before
    that, the start-up: every job submitted, admitted and given plan 1 at once)."""
    latencies = [x for p in played for x in p.latencies]
    reference = [x for p in played for x in p.compute]
    windows = sum(p.windows for p in played)
    rows = [
        ("live loop", latencies),
    ]
    judged = latencies
    if steady:
        started = max((p.sent[0] for p in played if p.sent), default=0.0)
        before = [
            x for p in played for x, at in zip(p.latencies, p.sent, strict=True) if at < started
        ]
        judged = [
            x for p in played for x, at in zip(p.latencies, p.sent, strict=True) if at >= started
        ]
        first = min((p.sent[0] for p in played if p.sent), default=started)
        rows = [
            (f"  start-up ({started - first:.0f} s)", before),
            (f"  steady ({len(judged)} w.)", judged),
            ("  all windows", latencies),
        ]
    p99 = percentile(judged, 0.99)
    optimizer_cpu = spent["optimizer"]
    busiest = sorted(spent.items(), key=lambda item: -item[1])[:6]
    return [
        f"  {len(latencies)} windows measured, {windows} played in {wall:.0f} s "
        f"({windows / wall:.1f} windows decided per second)",
        "  window to decision (wall)     p50        p90        p99        max",
        *(_latency_row(name, values) for name, values in rows if values),
        _latency_row("stage step alone", reference),
        f"    ratio (p99)            {p99 / percentile(reference, 0.99):.1f}x",
        f"  optimizer CPU per window: {optimizer_cpu / max(windows, 1) * 1000:.2f} ms "
        f"({optimizer_cpu:.1f} s for {windows} windows)",
        "  CPU of the machine's 2 cores by process (cores busy on average): "
        + ", ".join(f"{name} {value / wall:.2f}" for name, value in busiest),
        f"  goal p99 < 1 s{' (steady state)' if steady else ''}: {'PASS' if p99 < 1.0 else 'FAIL'}",
    ], p99


def _little(jobs: int, played: list[Played], wall: float) -> list[str]:
    """What a closed loop's latency is bound to: with ``jobs`` windows always waiting, the
    mean wait is ``jobs`` over the rate decided (Little's law)."""
    rate = sum(p.windows for p in played) / wall
    return [
        f"  closed loop: {jobs} windows always outstanding at {rate:.1f} decided/s make a mean "
        f"of {jobs / rate:.1f} s (Little's law); a p99 under 1 s here needs over {jobs} "
        f"decided per second, {jobs / rate:.1f}x what the whole suite and the load generator "
        f"decide together on this machine's {os.cpu_count()} cores",
    ]


def _latency_row(name: str, values: list[float]) -> str:
    return (
        f"    {name:<22} {statistics.median(values) * 1000:7.1f} ms "
        f"{percentile(values, 0.9) * 1000:7.1f} ms {percentile(values, 0.99) * 1000:7.1f} ms "
        f"{max(values) * 1000:7.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--saturation-seconds", type=float, default=90.0)
    parser.add_argument("--paced-jobs", type=int, default=1000)
    parser.add_argument("--window-seconds", type=float, default=60.0)
    parser.add_argument("--pace-seconds", type=float, default=300.0)
    parser.add_argument("--compare-jobs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    settings = {
        "STRIDE_OPTIMIZER_MAX_POD_CPU": "16",
        "STRIDE_OPTIMIZER_MAX_JOB_CPU": "200",
        "STRIDE_OPTIMIZER_TICK_SECONDS": str(TICK),
    }
    with running_suite(settings=settings) as suite:
        compared, population, compared_wall, _ = play(
            suite, args.compare_jobs, args.seed, 0.0, args.compare_jobs
        )
        saturated, _, saturated_wall, saturated_cpu = play(
            suite, args.jobs, args.seed, 0.0, args.jobs, max_wall_seconds=args.saturation_seconds
        )
        paced, _, paced_wall, paced_cpu = play(
            suite,
            args.paced_jobs,
            args.seed,
            args.window_seconds,
            args.paced_jobs,
            args.pace_seconds,
            # Stopped as the pace ends: none goes on unpaced to load the last paced ones.
            max_wall_seconds=args.pace_seconds,
        )
    saturated_rows, _ = latency_rows(saturated, saturated_cpu, saturated_wall)
    paced_rows, _ = latency_rows(paced, paced_cpu, paced_wall, steady=True)
    report = compare(compared, population, args.seed, TICK, None)
    live, sim = report["live"], report["sim"]
    lines = [
        f"$ .venv/bin/python bench/optimizer_loop.py --jobs {args.jobs} "
        f"--saturation-seconds {args.saturation_seconds:g} --paced-jobs {args.paced_jobs} "
        f"--window-seconds {args.window_seconds:g} --pace-seconds {args.pace_seconds:g} "
        f"--compare-jobs {args.compare_jobs} --seed {args.seed}",
        f"machine: {os.cpu_count()} cores, shared by the whole suite and the load generator; "
        f"suite: stride up (embedded NATS and PostgreSQL), optimizer with the simulator's "
        f"grid and {TICK:g} s windows",
        "",
        f"1. live against stride sim: {args.compare_jobs} jobs (all started at once, no "
        f"queueing), played as fast as decided to their end ({compared_wall:.0f} s)",
        f"  decisions equal to the simulator's on the same observations: "
        f"{report['decisions_agreed']} of {report['windows']} ({report['agreement']:.1%})",
        f"  completed: live {report['completed']} of {report['jobs']}, "
        f"sim {report.get('sim_completed', '-')}",
        f"  JCT median: live {live['median_s']:,.0f} s, sim {sim['median_s']:,.0f} s "
        f"(ratio {live['median_s'] / sim['median_s']:.3f})",
        f"  JCT p90:    live {live['p90_s']:,.0f} s, sim {sim['p90_s']:,.0f} s "
        f"(ratio {live['p90_s'] / sim['p90_s']:.3f})",
        "",
        f"2. saturation: {args.jobs} jobs at once, each window sent as soon as the last was "
        f"decided, for {args.saturation_seconds:g} s",
        *saturated_rows,
        *_little(args.jobs, saturated, saturated_wall),
        "",
        f"3. a realistic pace: {args.paced_jobs} jobs, one window per job every "
        f"{args.window_seconds:g} s (offered {args.paced_jobs / args.window_seconds:.1f} "
        f"windows/s), at random phases, for {args.pace_seconds:g} s",
        *paced_rows,
    ]
    record(RESULTS, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
