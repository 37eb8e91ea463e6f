"""Environment A on the tuning traces, every policy: the recorded reports and a summary.

Run: ``.venv/bin/python bench/sim_deadline_suite.py [name ...]`` (names below; default all),
or with ``--summary`` to rewrite only the summary from the recorded reports.

Each trace runs through the real CLI (``stride sim --env deadline``) on the cluster shape
ElasticFlow's own scripts give it (its artifact's Fig. 8b script: clusters 1, 2, 3 and 5 on
``n8g8``, cluster 4 on ``n16g8``, the Philly trace on ``n4g8``; the 195-job testbed trace
on ``n16g8``), so every report under ``bench/results/sim/deadline-<name>/`` states the
command that reproduces it. The Philly trace is for evaluation only (traces README). Then
``bench/results/sim/deadline-summary.md`` puts the deadline satisfactory ratios side by side
with the average improvements ElasticFlow reported, from each report's ``results.json``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACES = Path("../shared/traces")
RESULTS = ROOT / "bench" / "results" / "sim"
RUNS: dict[str, tuple[str, str]] = {
    "195job": ("itp-ef/195job.csv", "n16g8"),
    "itp-cluster01": ("itp-ef/cluster01.csv", "n8g8"),
    "itp-cluster02": ("itp-ef/cluster02.csv", "n8g8"),
    "itp-cluster03": ("itp-ef/cluster03.csv", "n8g8"),
    "itp-cluster04": ("itp-ef/cluster04.csv", "n16g8"),
    "itp-cluster05": ("itp-ef/cluster05.csv", "n8g8"),
    "philly-103959": ("philly-vc/philly_103959.csv", "n4g8"),
}
EVALUATION = frozenset({"philly-103959"})
"""Not used for tuning (traces README: tune on itp 01-05 and 195job.csv only)."""
POLICIES = ("stride", "chronus", "themis", "tiresias", "gandiva", "edf", "edf-ac")
REPORTED_RATIO = {
    "chronus": 1.68,
    "themis": 1.76,
    "tiresias": 2.15,
    "gandiva": 2.58,
    "edf": 12.95,
}
"""ElasticFlow (seed 001) sec. 6.3: "On average, ElasticFlow improves the deadline
satisfactory ratio to 12.95x, 2.58x, 2.15x, 1.76x, and 1.68x compared to EDF, Gandiva,
Tiresias, Themis, and Chronus" over the ITP and Philly traces of Fig. 8b (whose mean DSRs
are EF 0.761, Chronus 0.451, Themis 0.432, Tiresias 0.401, Gandiva 0.304, EDF 0.286)."""


def command(name: str) -> list[str]:
    """The CLI call that produces one recorded report."""
    trace, spec = RUNS[name]
    return [
        ".venv/bin/stride",
        "sim",
        "--env",
        "deadline",
        "--trace",
        str(TRACES / trace),
        "--cluster",
        str(TRACES / "cluster_specs" / f"{spec}.csv"),
        "--curves",
        str(TRACES / "throughputs_A100"),
        "--policies",
        ",".join(POLICIES),
        "--seed",
        "0",
        "--out",
        f"bench/results/sim/deadline-{name}",
    ]


def summary() -> str:
    """DSR per trace and policy, Stride's ratio to each baseline beside ElasticFlow's."""
    lines = [
        "# Environment A (deadlines on GPUs): DSR on the tuning traces",
        "",
        "Made by `.venv/bin/python bench/sim_deadline_suite.py` from the reports beside this"
        " file (each states the command that reproduces it). Every policy sees the same"
        " trace, A100 curves, 20 s overhead per start, rescale or migration, and seed 0.",
        "",
    ]
    header = "| trace | use | cluster | jobs | " + " | ".join(POLICIES) + " |"
    lines += [header, "|" + "---|" * (4 + len(POLICIES))]
    ratios: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    dsrs: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    for name, (_, spec) in RUNS.items():
        path = RESULTS / f"deadline-{name}" / "results.json"
        if not path.exists():
            continue
        results = json.loads(path.read_text())["results"]
        jobs = next(iter(results.values()))["jobs"]
        cells = []
        for policy in POLICIES:
            dsr = results.get(policy, {}).get("dsr")
            cells.append("n/a" if dsr is None else f"{dsr:.3f}")
            if dsr is not None:
                dsrs[policy].append(dsr)
            stride = results.get("stride", {}).get("dsr")
            if dsr and stride:
                ratios[policy].append(stride / dsr)
        use = "evaluation" if name in EVALUATION else "tuning"
        lines.append(f"| {name} | {use} | {spec} | {jobs} | " + " | ".join(cells) + " |")
    means = [
        f"{sum(values) / len(values):.3f}" if values else "n/a"
        for values in (dsrs[policy] for policy in POLICIES)
    ]
    lines.append("| mean | | | | " + " | ".join(means) + " |")
    lines += [
        "",
        "Stride's DSR over each baseline's (geometric mean over the traces above) beside"
        " ElasticFlow's average improvement over the same baseline (sec. 6.3; its Fig. 8b mean"
        " DSRs are EF 0.761, Chronus 0.451, Themis 0.432, Tiresias 0.401, Gandiva 0.304,"
        " EDF 0.286):",
        "",
        "| baseline | Stride / baseline (ours) | EF / baseline (reported) | met? |",
        "|---|---|---|---|",
    ]
    for policy in POLICIES[1:]:
        values = ratios[policy]
        if not values or policy not in REPORTED_RATIO:
            continue
        product = 1.0
        for value in values:
            product *= value
        ours = product ** (1 / len(values))
        reported = REPORTED_RATIO[policy]
        verdict = "yes" if ours >= reported else "no"
        lines.append(f"| {policy} | {ours:.2f} | {reported:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"


def main(names: list[str]) -> None:
    """Run the named traces (all by default), then rewrite the summary."""
    for name in [] if names == ["--summary"] else names or list(RUNS):
        if name not in RUNS:
            raise SystemExit(f"unknown run {name!r}; known: {', '.join(RUNS)}")
        argv = command(name)
        print("$", shlex.join(argv), flush=True)
        start = time.perf_counter()
        subprocess.run(argv, check=True, cwd=ROOT)
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    text = summary()
    (RESULTS / "deadline-summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
