"""Benchmark: Environment A (``stride sim --env deadline``) under the Stride policy.

Run: ``.venv/bin/python bench/sim_speed.py`` (writes ``bench/results/sim_speed.txt``).

Each case runs in a fresh Python process so its wall time and peak resident memory
(``resource.getrusage(...).ru_maxrss``, which includes the interpreter and libraries) are its
own. Cases: the first 300 jobs of ``itp-ef/cluster01.csv`` and ``itp-ef/cluster04.csv`` with
incremental admission (the default) and with Algorithm 1 re-run from scratch at every decision
(``run_deadline(..., incremental=False)``); then the first 3,000 jobs of ``cluster04.csv``
incremental only; then the whole ``cluster04.csv`` (15,802 jobs, the target is <= 120 s)
incremental only. The from-scratch side runs only the 300-job windows: on whole traces it
does not finish in reasonable time (cluster01, 1,595 jobs, ran over 6 minutes). Wall time
and CPU time (``time.process_time``) are both printed, with the load average, because other
work on a 2-core machine inflates wall time.
Cluster ``n16g8`` (128 GPUs), A100 curves, seed 0, 20 s scaling pause.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
RESULT = ROOT / "bench" / "results" / "sim_speed.txt"
TARGET_SECONDS = 120.0
WINDOW = 300
CASES: tuple[tuple[str, int | None, bool], ...] = (
    ("cluster01", WINDOW, True),
    ("cluster01", WINDOW, False),
    ("cluster04", WINDOW, True),
    ("cluster04", WINDOW, False),
    ("cluster04", 3000, True),
    ("cluster04", None, True),
)


def run_case(trace: str, first_n: int | None, incremental: bool) -> dict[str, object]:
    """One simulation in this process: wall time, peak RSS and the headline metrics."""
    from stride.sim.deadline import DeadlineCluster, run_deadline
    from stride.sim.traces import (
        TraceWindow,
        load_cluster_spec,
        load_curves,
        load_deadline_trace,
    )

    curves = load_curves(TRACES / "throughputs_A100")
    cluster = DeadlineCluster.from_spec(load_cluster_spec(TRACES / "cluster_specs" / "n16g8.csv"))
    window = TraceWindow(first_n=first_n) if first_n is not None else TraceWindow()
    jobs = load_deadline_trace(TRACES / "itp-ef" / f"{trace}.csv", window)
    start = time.perf_counter()
    cpu = time.process_time()
    result = run_deadline(jobs, cluster, "stride", 0, curves, incremental=incremental)
    wall = time.perf_counter() - start
    return {
        "wall": wall,
        "cpu": time.process_time() - cpu,
        "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "jobs": result.jobs,
        "met": result.met,
        "dropped": len(result.dropped),
        "dsr": result.dsr,
        "scaling_events": result.scaling_events,
    }


def _spawn(trace: str, first_n: int | None, incremental: bool) -> dict[str, object]:
    args = [sys.executable, __file__, "--case", trace, str(first_n or 0), str(int(incremental))]
    out = subprocess.run(args, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    data: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return data


def main() -> None:
    """Run every case in a child process, print and write the table."""
    lines = [
        "command: .venv/bin/python bench/sim_speed.py",
        f"machine: {platform.machine()}, python {platform.python_version()}, "
        f"cluster n16g8 (128 GPUs), policy stride, seed 0",
        "from-scratch admission runs the 300-job windows only (on whole traces it does not"
        " finish in reasonable time); the whole cluster04 runs incremental (target <= 120 s)",
        f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
    ]
    for line in lines:
        print(line, flush=True)
    walls: dict[tuple[str, int | None, bool], float] = {}
    for trace, first_n, incremental in CASES:
        data = _spawn(trace, first_n, incremental)
        wall = float(str(data["wall"]))
        walls[(trace, first_n, incremental)] = wall
        span = f"first {first_n}" if first_n else "whole trace"
        mode = "incremental " if incremental else "from-scratch"
        line = (
            f"{trace} {span:>11} ({data['jobs']} jobs) {mode}: {wall:8.2f} s wall, "
            f"{float(str(data['cpu'])):8.2f} s CPU, "
            f"peak RSS {float(str(data['maxrss_mib'])):.0f} MiB | met {data['met']}, "
            f"dropped {data['dropped']}, DSR {float(str(data['dsr'])):.3f}, "
            f"scaling events {data['scaling_events']}"
        )
        if first_n is None:
            verdict = "PASS" if wall <= TARGET_SECONDS else "FAIL (wall)"
            line += f" | target <= {TARGET_SECONDS:.0f} s: {verdict}"
        print(line, flush=True)
        lines.append(line)
        fast = walls.get((trace, first_n, True))
        if not incremental and fast:
            ratio = f"{trace} first {first_n}: from-scratch / incremental = "
            ratio += f"{wall / fast:.1f}x"
            print(ratio, flush=True)
            lines.append(ratio)
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--case":
        n = int(sys.argv[3])
        print(json.dumps(run_case(sys.argv[2], n or None, sys.argv[4] == "1")))
    else:
        main()
