"""Benchmark: ``stride replay`` against ``stride sim`` on the same trace and cluster.

Run: ``.venv/bin/python bench/replay.py [name ...]`` (names below; default all; writes
``bench/results/replay-<name>.txt``).

Each run is the real CLI: ``stride replay`` starts an embedded nats-server and a real
admission process whose clock runs ``speedup`` times faster than the wall clock, submits the
trace's jobs through gRPC at their arrivals, simulates their pods from the published shares,
and also runs ``stride sim``'s Stride policy in-process on the same inputs. Recorded: both
deadline satisfactory ratios and their difference (target: within 1 percentage point), and
the replay's wall time beside the simulator's (the reference: the same decisions without
services, storage or a bus).

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
RUNS: dict[str, tuple[str, str, int]] = {
    # name: (trace, cluster spec, speedup). The speedup keeps each run to minutes of wall
    # time: a decision's latency is multiplied by it on admission's clock.
    "195job": ("itp-ef/195job.csv", "n16g8", 300),
    "itp-cluster10": ("itp-ef/cluster10.csv", "n8g8", 3000),
}


def run(name: str) -> None:
    trace, cluster, speedup = RUNS[name]
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
        "--speedup",
        str(speedup),
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
