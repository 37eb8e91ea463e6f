"""`stride sim`: replay a trace (or a seeded synthetic population) through Stride's policies
and the baselines, and write a Markdown report with plots."""

from __future__ import annotations

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
) -> Path:
    """Run one environment for every requested policy and write the report; returns its path."""
    command = "stride sim " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    stride_version = version("stride-platform")
    if env == "deadline":
        from stride.sim.deadline import POLICIES, DeadlineCluster, run_deadline
        from stride.sim.traces import load_cluster_spec, load_curves, load_deadline_trace

        if trace is None or cluster is None or curves is None:
            raise SimUsageError("--trace, --cluster and --curves are required for --env deadline")
        trace_jobs = load_deadline_trace(trace, parse_window(window))
        spec = load_cluster_spec(cluster)
        library = load_curves(curves)
        gpu_cluster = DeadlineCluster.from_spec(spec)
        names = _policies(policies, list(POLICIES))
        results = _run_all(
            console, names, lambda p: run_deadline(trace_jobs, gpu_cluster, p, seed, library)
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
                "overhead: every start, resume, rescale or migration pauses the job 20 s "
                "(ElasticFlow sec. 6.6, Fig. 12b)",
                "placement: Stride places GPUs by buddy allocation with migration (sec. 4.3) "
                "when the node tree allows it; baselines count GPUs",
                "ElasticFlow's reported DSR means over its traces (Fig. 8b): EF 0.761, "
                "Chronus 0.451, Themis 0.432, Tiresias 0.401, Gandiva 0.304, EDF 0.286",
            ),
        )
    elif env == "dataworkers":
        from stride.sim.dataworkers import DATAWORKER_POLICIES, DataWorkerCluster, run_dataworkers

        dw_cluster = DataWorkerCluster()
        names = _policies(policies, list(DATAWORKER_POLICIES))
        results = _run_all(console, names, lambda p: run_dataworkers(jobs, dw_cluster, p, seed))
        context = RunContext(
            environment="data workers (GoldMiner setting)",
            trace="synthetic, seeded",
            window=f"{jobs} jobs",
            cluster=(
                f"{dw_cluster.nodes} x ({dw_cluster.gpus_per_node} GPU, "
                f"{dw_cluster.cpus_per_node} CPU)"
            ),
            seed=seed,
            stride_version=stride_version,
            command=command,
            notes=("the job population is synthetic: no public data-worker trace exists",),
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
