"""`stride sim`: replay a trace (or a seeded synthetic population) through Stride's policies
and the baselines, and write a Markdown report with plots."""

from __future__ import annotations

import dataclasses
import math
import shlex
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from stride.sim.engine import SimulationError
from stride.sim.report import RunContext, write_report


class SimUsageError(ValueError):
    """A `stride sim` option is missing or wrong; the message names it."""


def parse_window(text: str) -> Any:
    """``START:END`` seconds of submission time, ``first:N`` jobs, or ``all``."""
    from stride.sim.traces import TraceWindow

    if text in ("", "all"):
        return TraceWindow()
    if text.startswith("first:"):
        count = text.removeprefix("first:")
        if not count.isdigit() or int(count) < 1:
            raise SimUsageError(f"--window: {text!r} must be first:N with N >= 1")
        return TraceWindow(first_n=int(count))
    start, separator, end = text.partition(":")
    try:
        if not separator:
            raise ValueError
        return TraceWindow(start=float(start or "-inf"), end=float(end or "inf"))
    except ValueError:
        raise SimUsageError(f"--window: {text!r} is not START:END, first:N or all") from None


def _policies(requested: str, known: Sequence[str]) -> list[str]:
    names = [name.strip() for name in requested.split(",") if name.strip()] or list(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SimUsageError(f"--policies: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def _run_all(
    console: Console, policies: list[str], run_one: Callable[[str], Any]
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("simulating", total=len(policies))
        for policy in policies:
            progress.update(task, description=f"simulating {policy}")
            results[policy] = run_one(policy)
            progress.advance(task)
    return results


def simulate(
    env: str,
    trace: Path | None,
    cluster: Path | None,
    curves: Path | None,
    policies: str,
    seed: int,
    window: str,
    jobs: int,
    out: Path,
    console: Console,
    traces: Path = Path("../shared/traces"),
    cpus: int = 6000,
    memory_gib: int = 40000,
    model: str = "stride",
    slot: float = 60.0,
    pause: float = 20.0,
    best_effort_fraction: float = 0.0,
    curve_error: float = 0.0,
) -> Path:
    """Run one environment for every requested policy and write the report; returns its path."""
    command = "stride sim " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    stride_version = version("stride-platform")
    if env != "deadline" and (
        model != "stride" or curve_error or best_effort_fraction or slot != 60.0 or pause != 20.0
    ):
        raise SimUsageError(
            "--model, --slot, --pause, --best-effort-fraction and --curve-error "
            "apply to --env deadline only"
        )
    if env == "deadline":
        return _deadline(
            trace,
            cluster,
            curves,
            policies,
            seed,
            window,
            out,
            console,
            command,
            stride_version,
            model,
            slot,
            pause,
            best_effort_fraction,
            curve_error,
        )
    if env == "dataworkers":
        results, context = _dataworkers(
            trace, policies, seed, window, jobs, console, command, stride_version
        )
    elif env == "dlrm":
        from stride.sim import dlrm

        covs = traces / "pai-minibatch-time" / "coefficient_variation.csv"
        names = _policies(policies, list(dlrm.POLICIES))
        results = _run_all(
            console, names, lambda p: dlrm.run_dlrm(jobs, cpus, memory_gib, p, seed, covs)
        )
        context = RunContext(
            environment="DLRM CPU jobs (DLRover setting)",
            trace="synthetic, seeded",
            window=f"{jobs} jobs",
            cluster=f"{cpus} cores, {memory_gib} GiB (one pool)",
            seed=seed,
            stride_version=stride_version,
            command=command,
            notes=dlrm.report_notes(results),
        )
    else:
        raise SimUsageError(f"--env: {env!r} is not deadline, dlrm or dataworkers")
    return write_report(out, context, results)


def run_cli(**options: Any) -> int:
    """Entry used by the typer command: one error line and exit 2 on bad input."""
    console = Console()
    try:
        report = simulate(console=console, **options)
    except (SimUsageError, SimulationError, OSError) as error:
        Console(stderr=True).print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        return 2
    console.print(f"report: {report}", highlight=False)
    return 0


def _dataworkers(
    trace: Path | None,
    policies: str,
    seed: int,
    window: str,
    jobs: int,
    console: Console,
    command: str,
    stride_version: str,
) -> tuple[dict[str, Any], RunContext]:
    """The data-worker environment's runs and report context (see :func:`simulate`): the
    synthetic load, or with ``trace`` the jobs of an itp-raw window."""
    from stride.sim.dataworkers import (
        DATAWORKER_POLICIES,
        DataWorkerCluster,
        run_dataworkers,
        trace_dataworker_jobs,
    )

    dw_cluster = DataWorkerCluster()
    names = _policies(policies, list(DATAWORKER_POLICIES))
    shape = f"{dw_cluster.nodes} x ({dw_cluster.gpus_per_node} GPU, {dw_cluster.cpus_per_node} CPU)"
    if trace is None:
        if window not in ("", "all"):
            raise SimUsageError("--window: applies to --env dataworkers only with --trace")
        results = _run_all(console, names, lambda p: run_dataworkers(jobs, dw_cluster, p, seed))
        return results, RunContext(
            environment="data workers (GoldMiner setting)",
            trace="synthetic, seeded",
            window=f"{jobs} jobs",
            cluster=shape,
            seed=seed,
            stride_version=stride_version,
            command=command,
            notes=("the job population is synthetic: no public data-worker trace exists",),
        )
    population = trace_dataworker_jobs(_trace_window(trace, window), seed)
    results = _run_all(
        console,
        names,
        lambda p: run_dataworkers(len(population), dw_cluster, p, seed, jobs=population),
    )
    return results, RunContext(
        environment="data workers (GoldMiner setting)",
        trace=f"{trace} (arrivals, GPUs and durations)",
        window=f"{window or 'all'} ({len(population)} jobs, arrivals from the first at 0 s)",
        cluster=shape,
        seed=seed,
        stride_version=stride_version,
        command=command,
        notes=(
            "traces: microsoft/elasticflow-traces (MIT)",
            "per-job CPU demands are synthetic, drawn with the seed (no public trace has "
            "them): half CPU-intensive (best-fit CPUs per GPU U(12, 64)), half not "
            "(U(4, 12)); training-worker CPUs per GPU U(1, 3)",
            "a GoldMiner job runs without data workers, at the hardware ratio "
            "(fallback_jobs), when the CPUs no training worker holds as it starts cannot "
            "give it its tuned speed or 95% of its speed without them (GoldMiner's fallback, "
            "sec. 3.4.1), e.g. a CPU-intensive 64-GPU job on this 64-GPU cluster",
        ),
    )


def _trace_window(trace: Path, window: str) -> list[Any]:
    """The rows of an itp-raw trace that ``--window`` keeps, rebased; every problem is a
    :class:`SimUsageError` naming ``--trace`` or ``--window``."""
    from stride.sim.traces import TraceError, TraceWindow, load_raw_trace, select_window

    if not trace.is_file():
        raise SimUsageError(
            f"--trace: no file {trace} (an itp-raw CSV, e.g. ../shared/traces/itp-raw/"
            "cluster01.csv)"
        )
    selected = parse_window(window)
    if not selected.start < selected.end:
        raise SimUsageError(f"--window: {window!r} is empty: END must be after START")
    try:
        rows = load_raw_trace(trace, TraceWindow(rebase=False))
    except (TraceError, UnicodeDecodeError) as error:
        raise SimUsageError(f"--trace: {error}") from None
    first, last = rows[0].submission_time, rows[-1].submission_time
    span = f"{trace.name} has submissions from {first:g} to {last:g} s"
    if selected.end <= first or selected.start > last:
        raise SimUsageError(f"--window: {window!r} lies outside the trace ({span})")
    try:
        return select_window(rows, selected, str(trace))
    except TraceError:
        raise SimUsageError(f"--window: {window!r} holds no job ({span})") from None


def _deadline(
    trace: Path | None,
    cluster: Path | None,
    curves: Path | None,
    policies: str,
    seed: int,
    window: str,
    out: Path,
    console: Console,
    command: str,
    stride_version: str,
    model: str,
    slot: float,
    pause: float,
    best_effort_fraction: float,
    curve_error: float,
) -> Path:
    """The deadline environment's run and report (see :func:`simulate`)."""
    from stride.sim.deadline import (
        EF_MODEL_POLICIES,
        MODELS,
        POLICIES,
        DeadlineCluster,
        physical_bound,
        run_deadline,
    )
    from stride.sim.traces import load_cluster_spec, load_curves, load_deadline_trace

    if trace is None or cluster is None or curves is None:
        raise SimUsageError("--trace, --cluster and --curves are required for --env deadline")
    if model not in MODELS:
        raise SimUsageError(f"--model: {model!r} is not one of {', '.join(MODELS)}")
    if not (slot > 0 and math.isfinite(slot)):
        raise SimUsageError(f"--slot: must be a finite number of seconds > 0, got {slot}")
    if not (pause >= 0 and math.isfinite(pause)):
        raise SimUsageError(f"--pause: must be a finite number of seconds >= 0, got {pause}")
    if not 0.0 <= best_effort_fraction <= 1.0:
        raise SimUsageError(
            f"--best-effort-fraction: must be in [0, 1], got {best_effort_fraction}"
        )
    if not 0.0 <= curve_error < 1.0:
        raise SimUsageError(f"--curve-error: must be in [0, 1), got {curve_error}")
    trace_jobs = load_deadline_trace(trace, parse_window(window))
    spec = load_cluster_spec(cluster)
    library = load_curves(curves)
    gpu_cluster = DeadlineCluster.from_spec(spec)
    known = list(POLICIES) if model == "stride" else list(EF_MODEL_POLICIES)
    names = _policies(policies, known)
    results = _run_all(
        console,
        names,
        lambda p: run_deadline(
            trace_jobs,
            gpu_cluster,
            p,
            seed,
            library,
            pause_seconds=pause,
            best_effort_fraction=best_effort_fraction,
            model=model,
            slot=slot,
            curve_error=curve_error,
        ),
    )
    bound = physical_bound(trace_jobs, gpu_cluster, library, model=model, pause_seconds=pause)
    if model == "stride":
        cost = (
            f"cost model: stride (event-driven; every start, resume, rescale or migration "
            f"pauses the job {pause:g} s; ElasticFlow sec. 6.6, Fig. 12b)"
        )
    else:
        cost = (
            f"cost model: elasticflow (ElasticFlow's published simulator: rounds at least "
            f"{slot:g} s apart, per-round overhead 2 s, or 2 + 2 (log2 n + 1) s on a new GPU "
            f"range, +27 s every {int(slot)}th round; raw curves for the elastic baselines, "
            f"trace durations for the non-elastic ones)"
        )
    context = RunContext(
        environment="deadline (GPU, ElasticFlow setting)",
        trace=str(trace),
        window=f"{window or 'all'} ({len(trace_jobs)} jobs)",
        cluster=f"{cluster.name} ({gpu_cluster.num_gpus} GPUs)",
        seed=seed,
        stride_version=stride_version,
        command=command,
        notes=(
            f"throughput tables: {curves}",
            "traces: microsoft/elasticflow-traces (MIT)",
            cost,
            f"best-effort fraction {best_effort_fraction:g}, curve error +-{curve_error:g}",
            "placement: Stride places GPUs by buddy allocation with migration (sec. 4.3) "
            "when the node tree allows it (stride model); baselines count GPUs",
            "ElasticFlow's reported DSR means over its traces (Fig. 8b): EF 0.761, "
            "Chronus 0.451, Themis 0.432, Tiresias 0.401, Gandiva 0.304, EDF 0.286",
        ),
    )
    return write_report(
        out,
        context,
        results,
        sections=[guarantee_section(results, bound)],
        capacity=gpu_cluster.num_gpus,
        extra={"physical_bound": dataclasses.asdict(bound)},
    )


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def guarantee_section(results: dict[str, Any], bound: Any) -> str:
    """The deadline report's guarantee table: admission, the guarantee kept, and each DSR
    beside the trace's physical bound (lambda >= 1 and < 1 apart)."""
    lines = [
        "## Guarantees and the physical bound",
        "",
        "Physical bound: the share of deadline jobs that could meet their deadline running "
        "alone on the empty cluster at their fastest size. No policy can exceed it.",
        "",
        "| policy | admitted | declined | best effort | admitted hard deadlines met | "
        "cluster efficiency | DSR | DSR lambda >= 1 | bound lambda >= 1 | DSR lambda < 1 | "
        "bound lambda < 1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        lines.append(
            f"| {name} | {result.admitted} | {result.declined} | {result.best_effort} | "
            f"{_share(result.admitted_hard_met)} | {result.cluster_efficiency:.3f} | "
            f"{_share(result.dsr)} | {_share(result.dsr_lambda_ge_1)} | "
            f"{_share(bound.lambda_ge_1)} | {_share(result.dsr_lambda_lt_1)} | "
            f"{_share(bound.lambda_lt_1)} |"
        )
    lines.append(f"| physical bound | | | | | | {_share(bound.all)} | | | | |")
    return "\n".join(lines)
