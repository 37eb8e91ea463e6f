"""Benchmark: the optimizer's live loop under load, and the live system against the
simulator on the same jobs.

Run: ``.venv/bin/python bench/optimizer_loop.py`` (writes ``bench/results/optimizer_loop.txt``);
``--jobs N`` plays N jobs (default 100).

A real suite on this machine (`stride up`: embedded NATS, SQLite, every service, the
optimizer with the simulator's search space and 180 s windows), and ``stride loadgen``'s
players for N jobs of the seeded DLRM population, all at once. Measured, side by side:

- **window to decision**: for every window, the wall time from the player publishing the
  window's steps to the optimizer's decision being visible (its plan API reports the window
  decided, or the new plan). Goal: p99 under 1 s. Reference in the same run: the stage
  step's own compute time for the same requests in one process (what the loop costs at
  the least), so the ratio is the loop's overhead (bus, database, executor hop).
- **live against the simulator**: the run times of the N jobs played live against
  ``stride sim``'s Stride policy on the same jobs (median and p90), and the share of windows
  decided as the simulator's policy decides on the same observations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stride.cli.loadgen import compare, run

RESULTS = Path(__file__).parent / "results" / "optimizer_loop.txt"
TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
TICK = 180.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def stride(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stride.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="stride-bench-loop-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update(
        {
            "STRIDE_STATE_DIR": str(state),
            "STRIDE_OPTIMIZER_MAX_POD_CPU": "16",
            "STRIDE_OPTIMIZER_MAX_JOB_CPU": "200",
            "STRIDE_OPTIMIZER_TICK_SECONDS": str(TICK),
            "STRIDE_LOG_LEVEL": "WARNING",
        }
    )
    up = stride("up", env=env)
    if up.returncode != 0:
        print(up.stdout + up.stderr)
        return 1
    try:
        suite = json.loads((state / "endpoints.json").read_text())
        started = time.monotonic()
        played, population = asyncio.run(
            run(
                suite["nats_url"],
                suite["services"]["admission"],
                suite["services"]["optimizer"],
                args.jobs,
                args.seed,
                TICK,
                30.0,
                TRACES / "pai-minibatch-time" / "coefficient_variation.csv",
            )
        )
        wall = time.monotonic() - started
    finally:
        stride("down", env=env)
    report = compare(played, population, args.seed, TICK)
    latencies = [x for p in played for x in p.latencies]
    reference = [x for p in played for x in p.compute]
    p99 = percentile(latencies, 0.99)
    lines = [
        f"$ .venv/bin/python bench/optimizer_loop.py --jobs {args.jobs} --seed {args.seed}",
        f"machine: {os.cpu_count()} cores; suite: stride up (embedded NATS, SQLite), "
        f"optimizer with the simulator's grid and {TICK:g} s windows; {args.jobs} jobs at once",
        f"wall time: {wall:.0f} s; windows: {len(latencies)}",
        "",
        "window to decision (wall)       p50        p99     max",
        f"  live loop                {statistics.median(latencies) * 1000:7.1f} ms "
        f"{percentile(latencies, 0.99) * 1000:7.1f} ms {max(latencies) * 1000:7.1f} ms",
        f"  stage step alone         {statistics.median(reference) * 1000:7.1f} ms "
        f"{percentile(reference, 0.99) * 1000:7.1f} ms {max(reference) * 1000:7.1f} ms",
        f"  ratio (p99)              {p99 / percentile(reference, 0.99):.1f}x"
        f"   goal p99 < 1 s: {'PASS' if p99 < 1.0 else 'FAIL'}",
        "",
        "live against stride sim (same jobs, all started at once, no queueing)",
        f"  decisions equal to the simulator's on the same observations: "
        f"{report['decisions_agreed']} of {report['windows']} ({report['agreement']:.1%})",
        f"  completed: live {report['completed']} of {report['jobs']}",
        f"  JCT median: live {report['live']['median_s']:,.0f} s, sim "
        f"{report['sim']['median_s']:,.0f} s "
        f"(ratio {report['live']['median_s'] / report['sim']['median_s']:.2f})",
        f"  JCT p90:    live {report['live']['p90_s']:,.0f} s, sim "
        f"{report['sim']['p90_s']:,.0f} s "
        f"(ratio {report['live']['p90_s'] / report['sim']['p90_s']:.2f})",
        "  (run times agree in distribution only: each player draws the 5 % measurement noise",
        "   from its own generator, so a job's samples, fits and path differ from the sim's)",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
