"""The ``stride loadgen`` command: the simulator's jobs played against the running suite
(:mod:`stride.cli.loadgen`), with a live progress bar, a wall-time bound and a report."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stride.cli import channels
from stride.cli.endpoints import NoSuite, SuiteState, address
from stride.cli.running import failer
from stride.runtime.tls import TlsConfigError

StateDir = Annotated[
    Path,
    typer.Option("--state-dir", envvar="STRIDE_STATE_DIR", help="The suite's state dir."),
]


def _suite_nats_url(state_dir: Path) -> str:
    state = SuiteState.read(state_dir)
    if state is None or not state.ready or not state.nats_url:
        raise NoSuite(f"no running suite in {state_dir}: run `stride up`, or set STRIDE_NATS_URL")
    return state.nats_url


TickSeconds = Annotated[
    float | None,
    typer.Option(
        min=1.0,
        help="Simulated seconds per metric window; it must be the optimizer's "
        "(STRIDE_OPTIMIZER_TICK_SECONDS). Default: ask the optimizer.",
    ),
]
DecisionWait = Annotated[
    float, typer.Option(min=0.05, help="Wall seconds to wait for a window's plan.")
]
WindowSeconds = Annotated[
    float,
    typer.Option(
        min=0.0,
        help="Wall seconds between a job's windows (0: each as soon as the last one was "
        "decided, which drives the suite at its saturation).",
    ),
]
PaceSeconds = Annotated[
    float,
    typer.Option(
        min=1.0,
        help="With --window-seconds: pace the jobs for this many wall seconds, then let "
        "them finish unpaced (latencies are recorded while paced).",
    ),
]
MaxWallSeconds = Annotated[
    float,
    typer.Option(
        min=1.0,
        help="Stop every job where it is after this many wall seconds and report what "
        "was played (a partial report).",
    ),
]


def register(app: typer.Typer, default_state_dir: Path, console: Console, errors: Console) -> None:
    """Add ``stride loadgen`` to ``app``."""

    fail = failer(errors)

    @app.command()
    def loadgen(
        env: Annotated[str, typer.Option(help="The simulated environment: dlrm.")] = "dlrm",
        jobs: Annotated[int, typer.Option(min=1, max=10_000, help="Jobs to play.")] = 50,
        seed: Annotated[int, typer.Option(help="Seed of the job population (as stride sim).")] = 1,
        tick_seconds: TickSeconds = None,
        decision_wait: DecisionWait = 15.0,
        window_seconds: WindowSeconds = 0.0,
        pace_seconds: PaceSeconds = 10**9,
        max_wall_seconds: MaxWallSeconds = 10**9,
        concurrency: Annotated[
            int, typer.Option(min=1, max=10_000, help="Jobs playing at once.")
        ] = 64,
        traces: Annotated[
            Path, typer.Option(help="The public traces folder (PAI straggler data).")
        ] = Path("../shared/traces"),
        out: Annotated[Path, typer.Option(help="Where to write the JSON report.")] = Path(
            "loadgen-report.json"
        ),
        state_dir: StateDir = default_state_dir,
    ) -> None:
        """Play the simulator's jobs as their agents against the running suite, then compare the
        live decisions and run times with `stride sim` on the same jobs."""
        from stride.cli.loadgen import LoadgenError, Tally, compare, run, write_report

        if env != "dlrm":
            fail(f"--env: only dlrm can be played live, got {env!r}")
            return
        covs = traces / "pai-minibatch-time" / "coefficient_variation.csv"
        if not covs.is_file():
            fail(f"--traces: {covs} not found (the PAI straggler data the dlrm jobs use)")
            return
        tally = Tally()
        started = time.monotonic()
        try:
            nats_url = os.environ.get("STRIDE_NATS_URL") or _suite_nats_url(state_dir)
            admission = address("admission", state_dir)
            optimizer = address("optimizer", state_dir)
            with progress_bar(console, tally, jobs):
                played, population, options = asyncio.run(
                    run(
                        nats_url,
                        admission,
                        optimizer,
                        jobs,
                        seed,
                        tick_seconds,
                        decision_wait,
                        covs,
                        concurrency=concurrency,
                        window_seconds=window_seconds,
                        pace_seconds=pace_seconds,
                        tls_environ=channels.client_environ(state_dir),
                        token=channels.client_token(state_dir),
                        max_wall_seconds=max_wall_seconds,
                        tally=tally,
                    )
                )
        except (NoSuite, LoadgenError, TlsConfigError) as error:
            fail(str(error))
            return
        except grpc.RpcError as error:
            code = error.code().name if isinstance(error, grpc.aio.AioRpcError) else "UNKNOWN"
            fail(f"the suite refused or dropped a call ({code}): {error}")
            return
        report = compare(played, population, seed, options.tick, options.space)
        report["wall_seconds"] = time.monotonic() - started
        report["tick_seconds"] = options.tick
        write_report(report, out)
        print_report(console, report, jobs, seed, len(population), out)


@contextlib.contextmanager
def progress_bar(console: Console, tally: Any, jobs: int) -> Iterator[None]:
    """A live bar: jobs finished, windows decided and agreement so far."""
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} jobs"),
        TextColumn("{task.fields[windows]} windows, {task.fields[agreement]} agreed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("playing", total=jobs, windows=0, agreement="-")
        stop = threading.Event()

        def refresh() -> None:
            agreement = f"{tally.agreed / tally.windows:.1%}" if tally.windows else "-"
            done = tally.finished + tally.failed
            bar.update(task, completed=done, windows=tally.windows, agreement=agreement)

        def follow() -> None:
            while not stop.wait(0.5):
                refresh()

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
            refresh()


def print_report(
    console: Console, report: dict[str, Any], jobs: int, seed: int, population: int, out: Path
) -> None:
    table = Table(title=f"stride loadgen --env dlrm --jobs {jobs} --seed {seed}")
    for column in ("", "completed", "JCT median", "JCT p90"):
        table.add_column(column, justify="left" if not column else "right")
    for name in ("live", "sim"):
        summary = report[name]
        done = report["completed"] if name == "live" else report.get("sim_completed", "-")
        table.add_row(
            name,
            f"{done} of {population}",
            "-" if math.isnan(summary["median_s"]) else f"{summary['median_s']:,.0f} s",
            "-" if math.isnan(summary["p90_s"]) else f"{summary['p90_s']:,.0f} s",
        )
    console.print(table)
    stopped = [job for job in report["per_job"] if job["error"]]
    for job in stopped[:5]:
        console.print(f"job {job['index']} ({job['job_id'] or 'not submitted'}): {job['error']}")
    if len(stopped) > 5:
        console.print(f"... and {len(stopped) - 5} more (see {out})")
    if not report["comparable"]:
        console.print(f"not compared: {report['why']}", highlight=False)
    if report["windows"]:
        console.print(
            f"decisions equal to stride sim's on the same observations: "
            f"{report['decisions_agreed']} of {report['windows']} windows "
            f"({report['agreement']:.1%}); report in {out}",
            highlight=False,
        )
    else:
        console.print(f"no window was decided; report in {out}", highlight=False)
