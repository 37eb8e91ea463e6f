"""``stride sim --model elasticflow`` beside ElasticFlow's own simulator, policy by policy.

Run: ``EF_SIM_DIR=/path/to/ElasticFlow/scheduler [EF_PYTHON=/path/to/python]
.venv/bin/python bench/ef_head_to_head.py`` (skips, exit 0, without ``EF_SIM_DIR``).

``EF_SIM_DIR`` is a checkout of pkusys/ElasticFlow's ``ElasticFlow/scheduler`` outside this
project with its stubs built (``make rpc``); ``EF_PYTHON`` a Python with its requirements
(cvxpy, ecos, pandas, grpcio-tools, ...). Nothing of it is copied or imported here: it runs
unmodified as a subprocess (``scheduler.py --simulation=True``), and its DSR is read from
the ``final_result.csv`` it writes. Our side runs in this process on the same trace, cluster
shape, A100 tables and slot. The table records both DSRs, their difference and both wall
times, in ``bench/results/ef_head_to_head.txt``.

Calibration points: 195job.csv on n16g8 with a 240 s slot (its ``run_fig9.sh`` setting, the
issue's reference), and itp cluster01 and cluster05 on n8g8 with a 60 s slot (the shapes of
our deadline suite). Its Themis (a convex program per round) takes over half an hour on an
ITP trace, so it runs on 195job only. Chronus needs Gurobi and is not run.
"""

from __future__ import annotations

import csv
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / ".." / "shared" / "traces"
RESULT = ROOT / "bench" / "results" / "ef_head_to_head.txt"
THEIRS = {
    "elasticflow": "ef-accessctrl",
    "elasticflow-noac": "ef",
    "edf": "edf",
    "edf-ac": "edf-accessctrl",
    "tiresias": "dlas-gpu",
    "themis": "themis",
    "gandiva": "gandiva",
}
"""Our policy name -> the ``--schedule`` of ElasticFlow's simulator."""
POINTS = (
    ("195job", "n16g8", 240, tuple(THEIRS)),
    ("cluster01", "n8g8", 60, tuple(name for name in THEIRS if name != "themis")),
    ("cluster05", "n8g8", 60, tuple(name for name in THEIRS if name != "themis")),
)


def theirs(sim_dir: Path, python: str, trace: str, spec: str, slot: int, policy: str) -> float:
    """ElasticFlow's simulator's DSR for one policy (run unmodified in ``sim_dir``)."""
    schedule = THEIRS[policy]
    with tempfile.TemporaryDirectory(prefix="ef-sim-") as logs:
        argv = [
            python,
            "scheduler.py",
            f"--cluster_spec=cluster_specs/{spec}.csv",
            "--print",
            f"--scheme={'gandiva' if schedule == 'gandiva' else 'elastic'}",
            f"--trace_file={(TRACES / 'itp-ef' / f'{trace}.csv').resolve()}",
            f"--schedule={schedule}",
            f"--log_path={logs}",
            "--simulation=True",
            f"--scheduling_slot={slot}",
            "--gpu_type=A100",
        ]
        subprocess.run(argv, cwd=sim_dir, check=True, capture_output=True, timeout=7200)
        with open(Path(logs) / "final_result.csv", newline="") as file:
            rows = list(csv.DictReader(file))
        return float(rows[-1]["ddl_satis_ratio"])


def ours(trace: str, spec: str, slot: int, policy: str) -> float:
    """Our simulator's DSR for one policy under ElasticFlow's cost model."""
    from stride.sim.deadline import DeadlineCluster, run_deadline
    from stride.sim.traces import load_cluster_spec, load_curves, load_deadline_trace

    jobs = load_deadline_trace(TRACES / "itp-ef" / f"{trace}.csv")
    cluster = DeadlineCluster.from_spec(load_cluster_spec(TRACES / "cluster_specs" / f"{spec}.csv"))
    curves = load_curves(TRACES / "throughputs_A100")
    result = run_deadline(jobs, cluster, policy, 0, curves, model="elasticflow", slot=slot)
    return result.dsr or 0.0


def main() -> int:
    """Run every calibration point on both simulators and record the table."""
    sim_dir = os.environ.get("EF_SIM_DIR")
    if not sim_dir:
        print("skipped: set EF_SIM_DIR to ElasticFlow's scheduler/ directory (see docstring)")
        return 0
    python = os.environ.get("EF_PYTHON", sys.executable)
    lines = [
        "$ EF_SIM_DIR=... EF_PYTHON=... .venv/bin/python bench/ef_head_to_head.py",
        f"# ElasticFlow simulator: {sim_dir} (run with {python})",
        "",
        "| trace | cluster | slot | policy | ElasticFlow's simulator | ours (--model "
        "elasticflow) | difference | their s | our s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for trace, spec, slot, policies in POINTS:
        for policy in policies:
            started = time.perf_counter()
            reference = theirs(Path(sim_dir), python, trace, spec, slot, policy)
            middle = time.perf_counter()
            mine = ours(trace, spec, slot, policy)
            ended = time.perf_counter()
            worst = max(worst, abs(mine - reference))
            lines.append(
                f"| {trace} | {spec} | {slot} | {policy} | {reference:.4f} | {mine:.4f} | "
                f"{mine - reference:+.4f} | {middle - started:.1f} | {ended - middle:.1f} |"
            )
            print(lines[-1], flush=True)
    lines += ["", f"largest |difference|: {worst:.4f}"]
    text = "\n".join(lines) + "\n"
    RESULT.write_text(text)
    print(text)
    print("recorded:", shlex.quote(str(RESULT.relative_to(ROOT))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
