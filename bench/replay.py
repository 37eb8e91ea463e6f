"""Benchmark: ``stride replay`` against ``stride sim`` on the same trace and cluster.

Run: ``.venv/bin/python bench/replay.py [name ...]`` (names below; default all; writes
``bench/results/replay-<name>.txt``).

Each run is the real CLI: ``stride replay`` starts an embedded nats-server and a real
admission process on a stepped clock (the replay moves it from event to event), submits the
trace's jobs through gRPC at their arrivals, simulates their pods from the published shares,
and also runs ``stride sim``'s Stride policy in-process on the same inputs. Recorded: both
deadline satisfactory ratios, their difference (target: within 1 percentage point) and the
jobs decided differently, and the replay's wall time beside the simulator's (the reference:
the same decisions without services, storage or a bus). ``195job-300x`` is the accelerated
clock (admission's clock runs 300 times the wall clock) for comparison.

Traces (microsoft/elasticflow-traces, MIT) on the cluster shapes ElasticFlow's scripts give
them (as ``bench/sim_deadline_suite.py``); A100 curves (pkusys/ElasticFlow tables).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from suite import record

from stride.testing import SHARED_TRACES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
RUNS: dict[str, tuple[str, str, str]] = {
    # name: (trace, cluster spec, clock: "stepped" or a speedup for the accelerated clock,
    # where a decision's latency is multiplied by the speedup on admission's clock).
    "195job": ("itp-ef/195job.csv", "n16g8", "stepped"),
    "itp-cluster05": ("itp-ef/cluster05.csv", "n8g8", "stepped"),
    "195job-300x": ("itp-ef/195job.csv", "n16g8", "300"),
}


def run(name: str) -> None:
    trace, cluster, clock = RUNS[name]
    command = [
        sys.executable,
        "-m",
        "stride.cli",
        "replay",
        "--trace",
        str(SHARED_TRACES / trace),
        "--cluster",
        str(SHARED_TRACES / "cluster_specs" / f"{cluster}.csv"),
        "--curves",
        str(SHARED_TRACES / "throughputs_A100"),
        *(
            ["--clock", "stepped"]
            if clock == "stepped"
            else ["--clock", "accelerated", "--speedup", clock]
        ),
    ]
    began = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "160"}
    )
    shown = " ".join(shlex.quote(part) for part in [".venv/bin/stride", *command[3:]])
    record(
        RESULTS / f"replay-{name}.txt",
        [
            f"$ {shown}",
            done.stdout.rstrip(),
            done.stderr.rstrip(),
            f"exit status {done.returncode}; {time.monotonic() - began:.0f} s in all",
        ],
    )


if __name__ == "__main__":
    for chosen in sys.argv[1:] or list(RUNS):
        run(chosen)
