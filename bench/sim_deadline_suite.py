"""Environment A on the tuning traces, every policy, under both cost models: the recorded
reports, a summary and the curve-error robustness table.

Run: ``.venv/bin/python bench/sim_deadline_suite.py [--model stride|elasticflow|both]
[name ...]`` (names below; default all, both models), ``--summary`` to rewrite only the
summary from the recorded reports, or ``--robustness`` for the curve-error table
(``bench/results/sim/deadline-robustness.md``).

Each trace runs through the real CLI (``stride sim --env deadline``) on the cluster shape
ElasticFlow's own scripts give it (its artifact's Fig. 8b script: clusters 1, 2, 3 and 5 on
``n8g8``, cluster 4 on ``n16g8``, the Philly trace on ``n4g8``; the 195-job testbed trace
on ``n16g8``), so every report under ``bench/results/sim/deadline-<name>/`` states the
command that reproduces it. The Philly trace is for evaluation only (traces README). Then
``bench/results/sim/deadline-summary.md`` puts the deadline satisfactory ratios side by side
with the average improvements ElasticFlow reported, from each report's ``results.json``.
Under ``--model elasticflow`` (ElasticFlow's published simulator's cost model) the reports
go to ``deadline-ef-<name>/``, with the slot ElasticFlow's scripts use (240 s for the
195-job trace, 60 s for the ITP traces); the summary sets both models side by side with
the ``elasticflow`` and ``elasticflow-noac`` baselines and the share of admitted hard
deadlines Stride met.
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
POLICIES = (
    "stride",
    "elasticflow",
    "elasticflow-noac",
    "chronus",
    "themis",
    "tiresias",
    "gandiva",
    "edf",
    "edf-ac",
)
SLOTS = {"195job": 240}
"""ElasticFlow's slot per trace under its model (its run_fig9.sh: 240 s for the testbed
trace; run_fig8b.sh: 60 s for the others)."""
ROBUSTNESS = ("stride", "elasticflow", "edf")
ROBUSTNESS_TRACES = ("195job", "itp-cluster01", "itp-cluster05")
ERRORS = (0.0, 0.1, 0.2)
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


def out_dir(name: str, model: str) -> Path:
    """Where one recorded report lives."""
    return RESULTS / (f"deadline-{name}" if model == "stride" else f"deadline-ef-{name}")


def command(name: str, model: str = "stride", *extra: str) -> list[str]:
    """The CLI call that produces one recorded report."""
    trace, spec = RUNS[name]
    argv = [
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
        str(out_dir(name, model).relative_to(ROOT)),
    ]
    if model == "elasticflow":
        argv += ["--model", "elasticflow", "--slot", str(SLOTS.get(name, 60))]
    return argv + list(extra)


def _results(name: str, model: str) -> dict[str, dict[str, object]] | None:
    path = out_dir(name, model) / "results.json"
    if not path.exists():
        return None
    results: dict[str, dict[str, object]] = json.loads(path.read_text())["results"]
    return results


def _cell(value: object) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:.3f}"


def _model_table(model: str) -> list[str]:
    """One model's DSR table, with Stride against the better ElasticFlow baseline."""
    header = "| trace | use | cluster | jobs | " + " | ".join(POLICIES) + " | Stride >= EF? |"
    lines = [header, "|" + "---|" * (5 + len(POLICIES))]
    dsrs: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    for name, (_, spec) in RUNS.items():
        results = _results(name, model)
        if results is None:
            continue
        jobs = next(iter(results.values()))["jobs"]
        cells = []
        for policy in POLICIES:
            dsr = results.get(policy, {}).get("dsr")
            cells.append(_cell(dsr))
            if isinstance(dsr, int | float):
                dsrs[policy].append(dsr)
        stride = results.get("stride", {})
        best = max(
            float(results.get(policy, {}).get("dsr") or 0.0)  # type: ignore[arg-type]
            for policy in ("elasticflow", "elasticflow-noac")
        )
        kept = stride.get("admitted_hard_met")
        verdict = (
            "yes" if float(stride.get("dsr") or 0.0) >= best else "**no**"  # type: ignore[arg-type]
        ) + f" (kept {_cell(kept)})"
        use = "evaluation" if name in EVALUATION else "tuning"
        lines.append(
            f"| {name} | {use} | {spec} | {jobs} | " + " | ".join(cells) + f" | {verdict} |"
        )
    means = [
        f"{sum(values) / len(values):.3f}" if values else "n/a"
        for values in (dsrs[policy] for policy in POLICIES)
    ]
    lines.append("| mean | | | | " + " | ".join(means) + " | |")
    return lines


def summary() -> str:
    """DSR per trace and policy under both models, Stride's ratio to each baseline beside
    ElasticFlow's."""
    lines = [
        "# Environment A (deadlines on GPUs): DSR on the tuning traces",
        "",
        "Made by `.venv/bin/python bench/sim_deadline_suite.py` from the reports beside this"
        " file (each states the command that reproduces it). Every policy sees the same"
        ' trace, A100 curves and seed 0. "Stride >= EF?": Stride\'s DSR against the better of'
        " `elasticflow` and `elasticflow-noac`, with the share of its admitted hard deadlines"
        ' it met ("kept").',
        "",
        "## Our cost model (`--model stride`)",
        "",
        "Event-driven; 20 s pause per start, rescale or migration; concave curves for all.",
        "",
        *_model_table("stride"),
        "",
        "## ElasticFlow's simulator's cost model (`--model elasticflow`)",
        "",
        "Rounds at least a slot apart (240 s for 195job, 60 s otherwise), per-round"
        " overhead, raw curves for the elastic baselines, trace durations for the"
        " non-elastic ones (stride.sim.deadline_rounds). Chronus is not in ElasticFlow's"
        " simulator (it needs Gurobi): ours runs on trace durations here.",
        "",
        *_model_table("elasticflow"),
    ]
    ratios: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    for name in RUNS:
        results = _results(name, "stride")
        if results is None:
            continue
        stride = results.get("stride", {}).get("dsr")
        for policy in POLICIES:
            dsr = results.get(policy, {}).get("dsr")
            if isinstance(dsr, int | float) and dsr and isinstance(stride, int | float):
                ratios[policy].append(stride / dsr)
    lines += [
        "",
        "Stride's DSR over each baseline's under our model (geometric mean over the traces"
        " above) beside ElasticFlow's average improvement over the same baseline (sec. 6.3;"
        " its Fig. 8b mean DSRs are EF 0.761, Chronus 0.451, Themis 0.432, Tiresias 0.401,"
        " Gandiva 0.304, EDF 0.286):",
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


def robustness() -> str:
    """DSR and the admitted hard deadlines met at curve errors 0, 0.1 and 0.2 (seed 0)."""
    from stride.sim.deadline import DeadlineCluster, run_deadline
    from stride.sim.traces import load_cluster_spec, load_curves, load_deadline_trace

    curves = load_curves(ROOT / TRACES / "throughputs_A100")
    lines = [
        "# Environment A: robustness to wrong curves (`--curve-error E`)",
        "",
        "Made by `.venv/bin/python bench/sim_deadline_suite.py --robustness`. Each job's true"
        " throughput is its profiled curve times a factor drawn uniformly from [1-E, 1+E]"
        " (seed 0); every policy sees only the profiled curve. DSR / share of admitted"
        " hard deadlines met.",
        "",
        "| trace | model | policy | " + " | ".join(f"E = {e:g}" for e in ERRORS) + " |",
        "|---|---|---|" + "---|" * len(ERRORS),
    ]
    for name in ROBUSTNESS_TRACES:
        trace, spec = RUNS[name]
        jobs = load_deadline_trace(ROOT / TRACES / trace)
        cluster = DeadlineCluster.from_spec(
            load_cluster_spec(ROOT / TRACES / "cluster_specs" / f"{spec}.csv")
        )
        for model in ("stride", "elasticflow"):
            for policy in ROBUSTNESS:
                cells = []
                for error in ERRORS:
                    result = run_deadline(
                        jobs,
                        cluster,
                        policy,
                        0,
                        curves,
                        model=model,
                        slot=SLOTS.get(name, 60),
                        curve_error=error,
                    )
                    cells.append(f"{_cell(result.dsr)} / {_cell(result.admitted_hard_met)}")
                lines.append(f"| {name} | {model} | {policy} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    """Run the named traces (all by default) under the chosen models, then the summary."""
    if argv == ["--robustness"]:
        text = robustness()
        (RESULTS / "deadline-robustness.md").write_text(text)
        print(text)
        return
    models = ["stride", "elasticflow"]
    if argv[:1] == ["--model"]:
        choice, argv = argv[1], argv[2:]
        models = models if choice == "both" else [choice]
    for name in [] if argv == ["--summary"] else argv or list(RUNS):
        if name not in RUNS:
            raise SystemExit(f"unknown run {name!r}; known: {', '.join(RUNS)}")
        for model in models:
            args = command(name, model)
            print("$", shlex.join(args), flush=True)
            start = time.perf_counter()
            subprocess.run(args, check=True, cwd=ROOT)
            print(f"{name} ({model}): {time.perf_counter() - start:.0f} s", flush=True)
    text = summary()
    (RESULTS / "deadline-summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
