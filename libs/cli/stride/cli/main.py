"""The ``stride`` command: submit jobs, watch them, and run the suite locally."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import grpc
import typer
from rich.console import Console
from rich.table import Table

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.configdb.v1 import configdb_service_pb2 as configdb_pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as configdb_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.api.podwatcher.v1 import podwatcher_service_pb2 as podwatcher_pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as podwatcher_grpc
from stride.cli.endpoints import NoSuite, SuiteState, address, pid_alive
from stride.cli.jobspec import SpecError, load_spec
from stride.cli.shards import register as register_shards
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2

app = typer.Typer(
    help="Stride: training jobs that size themselves. Submit a job without resources.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        envvar="STRIDE_STATE_DIR",
        help="Where `stride up` keeps its state (default ~/.local/state/stride).",
    ),
]
T = TypeVar("T")
DEFAULT_STATE_DIR = Path.home() / ".local" / "state" / "stride"
RPC_TIMEOUT_SECONDS = 10.0
register_shards(app, DEFAULT_STATE_DIR, console, errors)  # `stride shards <job>`


class CliError(Exception):
    """A failure to report as one line and exit code 2."""


def fail(message: str) -> None:
    """Print one error line and exit 2."""
    errors.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def call(service: str, state_dir: Path, rpc: Callable[[grpc.Channel], T]) -> T:
    """Run ``rpc`` against ``service``; gRPC and discovery errors become one clear line."""
    target = address(service, state_dir)
    with grpc.insecure_channel(target) as channel:
        try:
            return rpc(channel)
        except grpc.RpcError as error:
            code = error.code()
            details = error.details()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise CliError(
                    f"cannot reach {service} at {target} ({details}); is the suite up?"
                ) from None
            raise CliError(details or code.name) from None


def _role_name(role: plan_pb2.Role.ValueType) -> str:
    return plan_pb2.Role.Name(role).removeprefix("ROLE_").lower()


def _gib(value: int) -> str:
    return f"{value / 1024**3:.1f} GiB"


def _state_name(state: admission_pb.JobState.ValueType) -> str:
    return admission_pb.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def _outcome_name(outcome: job_pb2.AdmissionOutcome.ValueType) -> str:
    return job_pb2.AdmissionOutcome.Name(outcome).removeprefix("ADMISSION_OUTCOME_").lower()


@app.command()
def submit(
    spec_file: Annotated[Path, typer.Argument(help="Job spec (YAML) with no resources.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
    request_id: Annotated[str, typer.Option(help="Idempotency key: resubmitting is safe.")] = "",
    wait: Annotated[bool, typer.Option(help="Wait for the first plan, then show status.")] = False,
) -> None:
    """Submit a job. Stride validates it, decides admission and plans its resources."""
    try:
        spec = load_spec(spec_file)
        job = call(
            "admission",
            state_dir,
            lambda ch: (
                admission_grpc.AdmissionServiceStub(ch)
                .SubmitJob(
                    admission_pb.SubmitJobRequest(spec=spec, request_id=request_id),
                    timeout=RPC_TIMEOUT_SECONDS,
                )
                .job
            ),
        )
    except (SpecError, CliError, NoSuite) as error:
        fail(f"{spec_file}: {error}" if isinstance(error, SpecError) else str(error))
        return
    outcome = _outcome_name(job.decision.outcome)
    console.print(f"[bold]{job.job_id}[/] {outcome}: {job.decision.reason}", highlight=False)
    if wait:
        _wait_for_plan(job.job_id, state_dir)
        status(job.job_id, state_dir)


def _wait_for_plan(job_id: str, state_dir: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            call(
                "podwatcher",
                state_dir,
                lambda ch: podwatcher_grpc.PodWatcherServiceStub(ch).GetJobPods(
                    podwatcher_pb.GetJobPodsRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
                ),
            )
            return
        except CliError:
            time.sleep(0.2)
    fail(f"{job_id}: no plan reached the podwatcher within {timeout:g}s")


def _optional(rpc: Callable[[], T]) -> T | None:
    try:
        return rpc()
    except CliError:
        return None


@app.command()
def status(
    job_id: Annotated[str, typer.Argument(help="A job id; omit to list jobs.")] = "",
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Show one job (decision, plan, what the podwatcher holds) or list all jobs."""
    try:
        if not job_id:
            _list_jobs(state_dir)
            return
        job = call(
            "admission",
            state_dir,
            lambda ch: (
                admission_grpc.AdmissionServiceStub(ch)
                .GetJob(admission_pb.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS)
                .job
            ),
        )
    except (CliError, NoSuite) as error:
        fail(str(error))
        return
    plan_reply = _optional(
        lambda: call(
            "optimizer",
            state_dir,
            lambda ch: optimizer_grpc.OptimizerServiceStub(ch).GetPlan(
                optimizer_pb.GetPlanRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
            ),
        )
    )
    pods = _optional(
        lambda: call(
            "podwatcher",
            state_dir,
            lambda ch: podwatcher_grpc.PodWatcherServiceStub(ch).GetJobPods(
                podwatcher_pb.GetJobPodsRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
            ),
        )
    )
    record = _optional(
        lambda: call(
            "configdb",
            state_dir,
            lambda ch: configdb_grpc.ConfigDbServiceStub(ch).GetJobRecord(
                configdb_pb.GetJobRecordRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
            ),
        )
    )

    summary = Table(title=f"job {job.job_id}", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    spec = job.spec
    termination = (
        f"{spec.termination.max_steps} steps"
        if spec.termination.max_steps
        else f"{spec.termination.max_epochs} epochs"
    )
    summary.add_row("name / user", f"{spec.name} / {spec.user}")
    summary.add_row("model", spec.model.name)
    summary.add_row("dataset", f"{spec.dataset.name} ({spec.dataset.record_count:,} records)")
    summary.add_row("batch / termination", f"{spec.batch_size} / {termination}")
    summary.add_row(
        "deadline",
        spec.deadline.ToDatetime().isoformat() + "Z"
        if spec.HasField("deadline")
        else "none (best effort)",
    )
    summary.add_row("state", _state_name(job.state))
    summary.add_row(
        "decision",
        f"{_outcome_name(job.decision.outcome)} by {job.decision.policy}: {job.decision.reason}"
        if job.HasField("decision")
        else "pending",
    )
    if plan_reply is not None:
        stage = plan_reply.stage
        summary.add_row(
            "optimizer",
            f"plan v{plan_reply.plan.version} ({plan_reply.plan.reason}), stage "
            f"{optimization_pb2.JobStage.Name(stage).removeprefix('JOB_STAGE_').lower()}",
        )
    else:
        summary.add_row("optimizer", "no plan yet")
    if pods is not None:
        state_name = (
            podwatcher_pb.PlanState.Name(pods.plan.state).removeprefix("PLAN_STATE_").lower()
        )
        summary.add_row(
            "podwatcher", f"plan v{pods.plan.plan.version} {state_name}, {len(pods.pods)} pods"
        )
    else:
        summary.add_row("podwatcher", "no plan yet")
    summary.add_row(
        "configdb", f"recorded, {len(record.record.plans)} plan(s)" if record else "not yet"
    )
    console.print(summary)
    if plan_reply is not None:
        console.print(_plan_table(plan_reply.plan))


def _plan_table(plan: plan_pb2.ResourcePlan) -> Table:
    table = Table(
        title=f"plan v{plan.version}: {plan.reason} ({plan.algorithm})", title_justify="left"
    )
    for column in ("role", "pods", "cpu each", "memory each"):
        table.add_column(column, justify="left" if column == "role" else "right")
    for role in plan.roles:
        table.add_row(
            _role_name(role.role), str(role.count), f"{role.cpu:g}", _gib(role.memory_bytes)
        )
    return table


def _list_jobs(state_dir: Path) -> None:
    jobs = call(
        "admission",
        state_dir,
        lambda ch: (
            admission_grpc.AdmissionServiceStub(ch)
            .ListJobs(admission_pb.ListJobsRequest(), timeout=RPC_TIMEOUT_SECONDS)
            .jobs
        ),
    )
    table = Table(title="jobs", title_justify="left")
    for column in ("job", "name", "user", "state", "decision", "submitted"):
        table.add_column(column, no_wrap=column in ("job", "submitted"))
    for job in jobs:
        table.add_row(
            job.job_id,
            job.spec.name,
            job.spec.user,
            _state_name(job.state),
            _outcome_name(job.decision.outcome) if job.HasField("decision") else "-",
            job.submitted_at.ToDatetime().strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)


@app.command()
def plans(job_id: str, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Show every plan version of a job."""
    try:
        reply = call(
            "optimizer",
            state_dir,
            lambda ch: optimizer_grpc.OptimizerServiceStub(ch).ListPlans(
                optimizer_pb.ListPlansRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
            ),
        )
    except (CliError, NoSuite) as error:
        fail(str(error))
        return
    for plan in reply.plans:
        console.print(_plan_table(plan))


@app.command()
def cancel(job_id: str, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Cancel a job and free its capacity."""
    try:
        job = call(
            "admission",
            state_dir,
            lambda ch: (
                admission_grpc.AdmissionServiceStub(ch)
                .CancelJob(
                    admission_pb.CancelJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
                )
                .job
            ),
        )
    except (CliError, NoSuite) as error:
        fail(str(error))
        return
    console.print(f"{job.job_id} {_state_name(job.state)}")


@app.command()
def sim(
    env: Annotated[str, typer.Option(help="deadline, dlrm or dataworkers.")] = "deadline",
    trace: Annotated[Path | None, typer.Option(help="Trace CSV (deadline env).")] = None,
    cluster: Annotated[Path | None, typer.Option(help="Cluster spec CSV (deadline env).")] = None,
    curves: Annotated[
        Path | None, typer.Option(help="Folder of throughput tables (deadline env).")
    ] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated; default all.")] = "",
    seed: Annotated[int, typer.Option(help="Seed: the same seed gives the same report.")] = 1,
    window: Annotated[str, typer.Option(help="START:END seconds, first:N, or all.")] = "all",
    jobs: Annotated[int, typer.Option(help="Jobs (synthetic environments).")] = 1000,
    out: Annotated[Path, typer.Option(help="Output directory for report.md and plots.")] = Path(
        "sim-report"
    ),
    traces: Annotated[
        Path, typer.Option(help="The public traces folder (PAI straggler data for dlrm).")
    ] = Path("../shared/traces"),
    cpus: Annotated[int, typer.Option(help="Cluster cores (dlrm env).")] = 6000,
    memory_gib: Annotated[int, typer.Option(help="Cluster memory in GiB (dlrm env).")] = 40000,
) -> None:
    """Replay a trace through Stride's policies and the baselines; write a report."""
    from stride.cli.simulate import run_cli

    code = run_cli(
        env=env,
        trace=trace,
        cluster=cluster,
        curves=curves,
        policies=policies,
        seed=seed,
        window=window,
        jobs=jobs,
        out=out,
        traces=traces,
        cpus=cpus,
        memory_gib=memory_gib,
    )
    if code:
        raise typer.Exit(code)


@app.command()
def up(
    state_dir: StateDir = DEFAULT_STATE_DIR,
    foreground: Annotated[bool, typer.Option(help="Run in this terminal; Ctrl-C stops.")] = False,
) -> None:
    """Start the whole suite locally (embedded NATS and SQLite unless URLs are configured)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    existing = SuiteState.read(state_dir)
    if existing is not None and pid_alive(existing.supervisor_pid):
        fail(
            f"a suite is already running from {state_dir} "
            f"(pid {existing.supervisor_pid}); `stride down` first"
        )
    (state_dir / "endpoints.json").unlink(missing_ok=True)
    command = [sys.executable, "-m", "stride.cli.supervisor", "--state-dir", str(state_dir)]
    if foreground:
        raise typer.Exit(subprocess.call(command))
    log_path = state_dir / "supervisor.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    with console.status("starting the suite..."):
        while True:
            state = SuiteState.read(state_dir)
            if process.poll() is not None or (state is not None and state.error):
                reason = (
                    state.error
                    if state is not None and state.error
                    else log_path.read_text()[-2000:]
                )
                fail(f"the suite did not start: {reason.strip()} (logs in {state_dir / 'logs'})")
            if state is not None and state.ready:
                break
            time.sleep(0.2)
    table = Table(title=f"stride suite up (pid {state.supervisor_pid})", title_justify="left")
    table.add_column("service")
    table.add_column("gRPC address")
    table.add_row("nats" + (" (embedded)" if state.embedded_nats else ""), state.nats_url)
    for service, target in state.services.items():
        table.add_row(service, target)
    console.print(table)
    console.print(f"database: {state.database}; logs: {state_dir / 'logs'}", highlight=False)


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop the suite that `stride up` started."""
    state = SuiteState.read(state_dir)
    if state is None or not pid_alive(state.supervisor_pid):
        console.print(f"no suite running from {state_dir}")
        (state_dir / "endpoints.json").unlink(missing_ok=True)
        return
    os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    with console.status("stopping the suite..."):
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            _reap(state.supervisor_pid)
            time.sleep(0.2)
    if pid_alive(state.supervisor_pid):
        fail(f"the suite (pid {state.supervisor_pid}) did not stop within 60s")
    console.print("suite stopped")


def _reap(pid: int) -> None:
    # The supervisor may be our own child (same process ran `up`); collect it so it is gone.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
