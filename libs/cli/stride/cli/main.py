"""The ``stride`` command: submit jobs, watch them, and run the suite locally."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import grpc
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.configdb.v1 import configdb_service_pb2 as configdb_pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as configdb_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.api.podwatcher.v1 import podwatcher_service_pb2 as podwatcher_pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as podwatcher_grpc
from stride.cli import channels
from stride.cli.endpoints import (
    DatabaseKind,
    NoSuite,
    Phase,
    ProcessState,
    SuiteState,
    address,
    pid_alive,
)
from stride.cli.jobspec import SpecError, load_submission
from stride.cli.loadgen_command import register as register_loadgen
from stride.cli.running import register as register_running
from stride.cli.shards import register as register_shards
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.obs.secrets import redact
from stride.runtime import tls
from stride.runtime.tls import INSECURE_WARNING, TlsConfigError

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
register_running(app, DEFAULT_STATE_DIR, console, errors)  # top, logs, scale, wait
register_loadgen(app, DEFAULT_STATE_DIR, console, errors)  # `stride loadgen`


class CliError(Exception):
    """A failure to report as one line and exit code 2."""


def fail(message: str) -> None:
    """Print one error line and exit 2. ``message`` is literal text: a ``[tag]`` in a server's
    answer or a log line is shown, not read as markup."""
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def call(service: str, state_dir: Path, rpc: Callable[[grpc.Channel], T]) -> T:
    """Run ``rpc`` against ``service``; gRPC and discovery errors become one clear line."""
    target = address(service, state_dir)
    try:
        opened = channels.channel(target, service, state_dir)
    except TlsConfigError as error:
        raise CliError(str(error)) from None
    with opened as channel:
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


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def share_line(job: admission_pb.Job) -> str:
    """What a job may hold now, as admission last set it."""
    if not job.HasField("share"):
        return "none (no scaling curve: the optimizer sizes it within the cluster)"
    share = job.share
    if share.share.devices or job.spec.resource_kind == job_pb2.RESOURCE_KIND_GPU:
        held = f"{share.share.devices} GPUs"
    else:
        held = (
            f"{share.units} CPU units"
            + (f" + {share.headroom_units} lent while idle" if share.headroom_units else "")
            + f" ({share.share.cpu:g} cores, "
            f"{share.share.memory_bytes / 1024**3:g} GiB"
            + (f", {share.share.workers} workers" if share.share.workers else "")
            + ")"
        )
    if share.gpus:
        nodes = sorted({gpu.node for gpu in share.gpus})
        held += f" on {', '.join(nodes[:4])}" + (" ..." if len(nodes) > 4 else "")
    if not share.units:
        held = "nothing now (waits for capacity)"
    return f"{held}, v{share.version}: {share.reason}"


def guarantee_line(job: admission_pb.Job) -> str:
    """Whether the job's deadline is guaranteed, and its reservation now."""
    decision = job.decision
    if job.HasField("share") and job.share.guaranteed:
        minimum = job.share.minimum
        reserved = f"{minimum.devices} GPUs" if minimum.devices else f"{minimum.cpu:g} cores"
        finish = (
            f", done by {_iso(decision.guaranteed_finish.ToDatetime(tzinfo=UTC))}"
            if decision.HasField("guaranteed_finish")
            else ""
        )
        return f"deadline guaranteed under the model: {reserved} reserved now{finish}"
    if not job.spec.HasField("deadline"):
        return "none (best effort)"
    if decision.outcome == job_pb2.ADMISSION_OUTCOME_REJECTED:
        return "refused"
    return "not guaranteed (runs best effort)"


def _outcome_name(outcome: job_pb2.AdmissionOutcome.ValueType) -> str:
    return job_pb2.AdmissionOutcome.Name(outcome).removeprefix("ADMISSION_OUTCOME_").lower()


@app.command()
def submit(
    spec_file: Annotated[Path, typer.Argument(help="Job spec (YAML) with no resources.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
    request_id: Annotated[
        str,
        typer.Option(
            help="Idempotency key to use instead of the one derived from the user and spec."
        ),
    ] = "",
    new: Annotated[
        bool,
        typer.Option("--new", help="Make a new job even if this spec was submitted before."),
    ] = False,
    wait: Annotated[bool, typer.Option(help="Wait for the first plan, then show status.")] = False,
    deadline: Annotated[
        str | None,
        typer.Option(
            help="Replace the spec's deadline: +7h20m, +2d or an RFC 3339 time (e.g. the one a "
            "refusal named)."
        ),
    ] = None,
) -> None:
    """Submit a job. Stride validates it, decides admission and plans its resources.

    Submitting the same spec again (after a timeout, say) returns the job the first
    submission made instead of making a second one; `--new` makes another job on purpose.
    A refused deadline is answered with one Stride could guarantee; exit status 3.
    """
    if new and request_id:
        _submit_error("give --new or --request-id, not both")
    try:
        submission = load_submission(spec_file, deadline=deadline)
    except SpecError as error:
        _submit_error(f"{_printable(str(spec_file))}: {error}")
    for line in submission.warnings:
        warn(line)
    key = request_id or (f"new-{uuid.uuid4().hex}" if new else submission.request_id)
    sent_at = datetime.now(UTC)
    try:
        job = call("admission", state_dir, lambda ch: _submit_job(ch, submission.spec, key))
    except SpecError as error:
        _submit_error(f"{_printable(str(spec_file))}: {error}")
    except (CliError, NoSuite) as error:
        _submit_error(str(error))
    outcome = _outcome_name(job.decision.outcome)
    console.print(
        f"[bold]{job.job_id}[/] {outcome}: {escape(job.decision.reason)}", highlight=False
    )
    note = resubmission_note(job, sent_at)
    if note:
        console.print(note, markup=False, highlight=False)
    if job.decision.outcome == job_pb2.ADMISSION_OUTCOME_REJECTED:
        if job.decision.HasField("earliest_deadline"):
            console.print(
                "to run it with a deadline Stride can keep: stride submit "
                f"{_printable(str(spec_file))} --deadline "
                f"{_iso(job.decision.earliest_deadline.ToDatetime(tzinfo=UTC))}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(3)
    if wait:
        _wait_for_plan(job.job_id, state_dir)
        status(job.job_id, state_dir)


RESUBMIT_TOLERANCE = timedelta(seconds=5)
"""A job stored this long before `stride submit` sent its request was made by an earlier
submission of the same spec. Generous enough for the clock difference between a client and
a server kept by NTP; a retry after a timeout comes at least a timeout later."""


def resubmission_note(job: admission_pb.Job, sent_at: datetime) -> str:
    """A line saying that ``job`` was made by an earlier submission of the same spec, if it
    was stored well before this submission was sent; "" for a job made now."""
    submitted_at = job.submitted_at.ToDatetime(tzinfo=UTC)
    if submitted_at >= sent_at - RESUBMIT_TOLERANCE:
        return ""
    return (
        f"note: the same spec was submitted at {submitted_at:%Y-%m-%d %H:%M:%S}Z; this is "
        f"that job (now {_state_name(job.state)}). `stride submit --new` makes another."
    )


def _submit_job(channel: grpc.Channel, spec: job_pb2.JobSpec, request_id: str) -> admission_pb.Job:
    """SubmitJob; a refused spec becomes a :class:`SpecError` naming the field, and a
    timeout says that running the same command again is safe."""
    try:
        return (
            admission_grpc.AdmissionServiceStub(channel)
            .SubmitJob(
                admission_pb.SubmitJobRequest(spec=spec, request_id=request_id),
                timeout=RPC_TIMEOUT_SECONDS,
            )
            .job
        )
    except grpc.RpcError as error:
        details = error.details() or ""
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            field, _, problem = details.partition(": ")
            if not problem:
                field, problem = "spec", details
            raise SpecError(field, problem) from None
        if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise CliError(
                f"admission did not answer within {RPC_TIMEOUT_SECONDS:g}s; the job may exist "
                "already: run the same `stride submit` again (it returns that job, not a new one)"
            ) from None
        raise


def _submit_error(message: str) -> NoReturn:
    """One error line (``error: <file>: <field>: <problem>``) and exit code 2. The message
    is printed as it is: a spec's values are not markup."""
    errors.print("[bold red]error:[/] ", end="", highlight=False)
    errors.print(message, markup=False, emoji=False, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _printable(text: str) -> str:
    """``text`` with unprintable characters escaped, so a file name stays on one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


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
    """An answer from a service that may be absent (not running, or not in this suite)."""
    try:
        return rpc()
    except (CliError, NoSuite):
        return None


@app.command()
def status(
    job_id: Annotated[str, typer.Argument(help="A job id; omit to list jobs.")] = "",
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Show one job (decision, plan, what the podwatcher holds) or list all jobs.

    Every service of a local suite that is not running (crash-looping, backing off, or not
    healthy yet) gets a warning line first, with its log file and its last output.
    """
    _report_suite_problems(state_dir)
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

    summary = _job_summary(job, plan_reply, pods, record)
    console.print(summary)
    if plan_reply is not None:
        console.print(_plan_table(plan_reply.plan))
    if record is not None and record.record.profiles:
        console.print(_profile_table(record.record.profiles))


def _job_summary(
    job: admission_pb.Job,
    plan_reply: optimizer_pb.GetPlanResponse | None,
    pods: podwatcher_pb.GetJobPodsResponse | None,
    record: configdb_pb.GetJobRecordResponse | None,
) -> Table:
    """``stride status``'s table of one job: its spec, admission's decision and share, and
    what the optimizer, the pod watcher and the config DB hold of it."""
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
    summary.add_row("share", share_line(job))
    summary.add_row("guarantee", guarantee_line(job))
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
    return summary


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


def _profile_table(profiles: Sequence[configdb_pb.RuntimeProfile]) -> Table:
    """What the job measured under each plan (configdb's runtime profile)."""
    table = Table(title="measured (runtime profile)", title_justify="left")
    for column in ("plan", "samples/s", "step", "role", "pods", "cpu mean/max/limit", "memory"):
        table.add_column(column, justify="left" if column in ("plan", "role") else "right")
    for profile in profiles:
        throughput = (
            (f"{profile.samples_per_second:,.0f}", f"{profile.step_seconds * 1000:.0f} ms")
            if profile.windows
            else ("-", "-")
        )
        rows = profile.roles or [configdb_pb.RoleUsage()]
        for index, usage in enumerate(rows):
            first = index == 0
            table.add_row(
                f"v{profile.plan_version}" if first else "",
                throughput[0] if first else "",
                throughput[1] if first else "",
                _role_name(usage.role) if usage.samples else "-",
                str(usage.pods) if usage.samples else "-",
                f"{usage.cpu_used_mean:.2f}/{usage.cpu_used_max:.2f}/{usage.cpu_limit:g}"
                if usage.samples
                else "-",
                f"{usage.memory_used_max_bytes / 1024**2:,.0f} of "
                f"{usage.memory_limit_bytes / 1024**2:,.0f} MiB"
                if usage.samples
                else "-",
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
def explain(job_id: str, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Show why each plan of a job was chosen: algorithm, stage, inputs, prediction."""
    try:
        reply = call(
            "optimizer",
            state_dir,
            lambda ch: optimizer_grpc.OptimizerServiceStub(ch).GetPlanExplanation(
                optimizer_pb.GetPlanExplanationRequest(job_id=job_id),
                timeout=RPC_TIMEOUT_SECONDS,
            ),
        )
    except (CliError, NoSuite) as error:
        fail(str(error))
        return
    for explanation in reply.explanations:
        console.print(_plan_table(explanation.plan))
        for line in _explanation_lines(explanation):
            console.print(f"  {line}", highlight=False)
        console.print()
    try:
        events = call(
            "optimizer",
            state_dir,
            lambda ch: optimizer_grpc.OptimizerServiceStub(ch).ListOptimizationEvents(
                optimizer_pb.ListOptimizationEventsRequest(job_id=job_id),
                timeout=RPC_TIMEOUT_SECONDS,
            ),
        ).events
    except (CliError, NoSuite) as error:
        fail(str(error))
        return
    held = [event for event in events if "; held: " in event.detail]
    if held:
        console.print("decisions held (the plan did not change):")
        for event in held:
            moment = event.created_at.ToDatetime().strftime("%H:%M:%S")
            console.print(f"  {moment}  {_printable(event.detail)}", highlight=False)
    stragglers = [e for e in events if e.root_cause == optimization_pb2.ROOT_CAUSE_STRAGGLER]
    if stragglers:
        console.print("stragglers (the dispatcher gives them smaller shards):")
        for event in stragglers:
            moment = event.created_at.ToDatetime().strftime("%H:%M:%S")
            console.print(f"  {moment}  {_printable(event.detail)}", highlight=False)


def _explanation_lines(why: optimizer_pb.PlanExplanation) -> list[str]:
    """The reasons of one plan, a line each (only what was recorded)."""
    if not why.recorded:
        return ["(made before explanations were recorded)"]
    lines = [
        f"why: {why.detail}",
        f"stage: {why.stage}; root cause: {why.root_cause}; by {why.algorithm}",
    ]
    if why.sample_count:
        lines.append(f"inputs: {why.samples_used} throughput samples ({why.sample_count} in all)")
    if why.fit_rmsle >= 0:
        lines.append(f"fit: RMSLE {why.fit_rmsle:.3f}")
    if why.predicted_throughput >= 0:
        lines.append(
            f"predicted: {why.predicted_throughput:,.0f} samples/s"
            + (
                f" (the pods before: {why.predicted_current:,.0f})"
                if why.predicted_current >= 0
                else ""
            )
        )
    if why.cost >= 0:
        lines.append(f"cost: {why.cost:g} (cores + 0.125 x GiB)")
    if why.bound:
        lines.append(f"bound by: {why.bound}")
    if why.fallback:
        lines.append(f"fallback: {why.fallback}")
    return lines


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
    console.print("its pods are being removed; its checkpoints are kept", highlight=False)


@app.command()
def replay(
    trace: Annotated[Path, typer.Option(help="Deadline trace CSV (ElasticFlow's format).")],
    cluster: Annotated[Path, typer.Option(help="Cluster spec CSV (its GPUs).")],
    curves: Annotated[Path, typer.Option(help="Folder of throughput tables.")] = Path(
        "../shared/traces/throughputs_A100"
    ),
    clock: Annotated[
        str,
        typer.Option(
            help="stepped: the replay moves admission's clock event to event (the "
            "simulator's decisions at any speed); accelerated: it runs --speedup times "
            "the wall clock."
        ),
    ] = "stepped",
    speedup: Annotated[
        float,
        typer.Option(min=1.0, max=100_000.0, help="Replay seconds per wall second (accelerated)."),
    ] = 500.0,
    window: Annotated[str, typer.Option(help="START:END seconds, first:N, or all.")] = "all",
    state_dir: Annotated[
        Path | None, typer.Option(help="Keep the replay's NATS store, database and logs here.")
    ] = None,
    sim_too: Annotated[
        bool, typer.Option("--sim/--no-sim", help="Also run stride sim and compare.")
    ] = True,
) -> None:
    """Drive a live admission service with a trace on a fast clock; print its deadline
    ratio beside stride sim's on the same trace and cluster."""
    from stride.cli.replay import ReplayError, replay_trace
    from stride.cli.simulate import SimUsageError, parse_window
    from stride.policy.errors import PolicyError
    from stride.sim.engine import SimulationError

    try:
        result = replay_trace(
            trace, cluster, curves, speedup, parse_window(window), state_dir, sim_too, clock
        )
    except (ReplayError, SimUsageError, SimulationError, PolicyError) as error:
        fail(str(error))
        return
    except ExceptionGroup as group:  # a submission failed: say which, not the traceback
        first = group.exceptions[0]
        if isinstance(first, ReplayError):
            fail(str(first))
            return
        raise
    live = result.live
    table = Table(title=f"replay of {trace.name} on {result.gpus} GPUs")
    for column in ("", "jobs", "with deadline", "refused", "met", "DSR", "wall time"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row(
        "live admission (stepped)"
        if live.clock == "stepped"
        else f"live admission (x{live.speedup:g})",
        str(live.jobs),
        str(live.deadline_jobs),
        str(live.rejected),
        str(live.met),
        "-" if live.dsr is None else f"{live.dsr:.4f}",
        f"{live.wall_seconds:.1f} s",
    )
    if result.sim_dsr is not None:
        table.add_row(
            "stride sim",
            str(live.jobs),
            str(live.deadline_jobs),
            "",
            "",
            f"{result.sim_dsr:.4f}",
            f"{result.sim_wall_seconds:.1f} s",
        )
    console.print(table)
    if result.difference_pp is not None:
        console.print(
            f"difference: {result.difference_pp:+.2f} percentage points (live - sim)",
            highlight=False,
        )
        shown = ", ".join(result.differing[:10]) + (" ..." if len(result.differing) > 10 else "")
        console.print(
            f"jobs decided differently: {len(result.differing)}"
            + (f" ({shown})" if result.differing else ""),
            highlight=False,
        )


@app.command()
def sim(
    env: Annotated[str, typer.Option(help="deadline, dlrm or dataworkers.")] = "deadline",
    trace: Annotated[
        Path | None,
        typer.Option(
            help="Trace CSV (deadline env). Dataworkers env: an itp-raw CSV whose window "
            "(--window) gives the jobs' arrivals, GPUs and durations instead of --jobs "
            "synthetic ones."
        ),
    ] = None,
    cluster: Annotated[Path | None, typer.Option(help="Cluster spec CSV (deadline env).")] = None,
    curves: Annotated[
        Path | None, typer.Option(help="Folder of throughput tables (deadline env).")
    ] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated; default all.")] = "",
    seed: Annotated[
        int,
        typer.Option(
            help="Seed: the same seed gives the same report. Deadline env: it draws only which "
            "jobs are best effort (--best-effort-fraction) and each job's true speed "
            "(--curve-error); with neither, it changes nothing (the trace fixes the rest). "
            "Synthetic envs: it draws the job population (dataworkers with --trace: the "
            "jobs' CPU demands)."
        ),
    ] = 1,
    model: Annotated[
        str,
        typer.Option(
            help="Deadline env cost model: stride (ours: event-driven, a pause per start or "
            "rescale) or elasticflow (ElasticFlow's published simulator: rounds at least "
            "--slot apart, overhead every round, raw curves and trace durations for the "
            "baselines)."
        ),
    ] = "stride",
    slot: Annotated[
        float, typer.Option(help="Seconds between rounds under --model elasticflow.")
    ] = 60.0,
    pause: Annotated[
        float,
        typer.Option(help="Seconds a job pauses per start or rescale under --model stride."),
    ] = 20.0,
    best_effort_fraction: Annotated[
        float, typer.Option(help="Share of deadline jobs made best effort (seeded draw).")
    ] = 0.0,
    curve_error: Annotated[
        float,
        typer.Option(
            help="E: each job's true curve is its profiled one times a seeded factor in "
            "[1-E, 1+E]; the policies see only the profiled one (deadline env)."
        ),
    ] = 0.0,
    window: Annotated[
        str,
        typer.Option(
            help="Jobs of --trace submitted in START:END seconds (END excluded), the "
            "first:N, or all."
        ),
    ] = "all",
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
        model=model,
        slot=slot,
        pause=pause,
        best_effort_fraction=best_effort_fraction,
        curve_error=curve_error,
    )
    if code:
        raise typer.Exit(code)


STOP_TIMEOUT_SECONDS = 60.0
"""Seven services stopped one after another, each within its 10 s grace, take well under this;
the supervisor's own SIGKILL fallback (20 s a service) makes the worst case longer, but a
stop that takes a minute is stuck and worth reporting."""


@app.command()
def up(
    state_dir: StateDir = DEFAULT_STATE_DIR,
    foreground: Annotated[bool, typer.Option(help="Run in this terminal; Ctrl-C stops.")] = False,
    executors: Annotated[
        int, typer.Option(min=1, max=32, help="Replicas of the executor pool (a queue group).")
    ] = 1,
    insecure: Annotated[
        bool,
        typer.Option(
            help="Run gRPC in plain text, without certificates: anyone who can reach a port "
            "can call it. Only on a machine of your own."
        ),
    ] = False,
    database: Annotated[
        DatabaseKind,
        typer.Option(
            help="Where the services keep their data when STRIDE_DATABASE_URL names no "
            "server: the embedded PostgreSQL 18 (data in <state>/postgres) or a SQLite file "
            "per service (<state>/db)."
        ),
    ] = DatabaseKind.POSTGRES,
) -> None:
    """Start the whole suite locally (embedded NATS and PostgreSQL unless URLs are configured).

    Every gRPC server and client speaks mutual TLS with certificates made on first start in
    the state folder (``tls/``, by ``stride certs init``), unless ``STRIDE_TLS_DIR`` (or the
    ``STRIDE_TLS_*_FILE`` trio) names others, or ``--insecure``.

    Succeeds once NATS and admission are up, naming any other service that crash-loops (it
    keeps being restarted with back-off); fails, leaving nothing running, if they are not.
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    existing = SuiteState.read(state_dir)
    if existing is not None and pid_alive(existing.supervisor_pid):
        fail(
            f"a suite is already running from {state_dir} "
            f"(pid {existing.supervisor_pid}); `stride down` first"
        )
    (state_dir / "endpoints.json").unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "stride.cli.supervisor",
        "--state-dir",
        str(state_dir),
        "--executors",
        str(executors),
        "--database",
        database.value,
        *(["--insecure"] if insecure else []),
    ]
    if insecure:
        errors.print(
            f"[bold yellow]warning:[/] {escape(INSECURE_WARNING)}", highlight=False, soft_wrap=True
        )
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
                break
            if state is not None and state.ready:
                break
            time.sleep(0.2)
    if state is None or not state.ready:
        # The supervisor stops everything it started after a failed start; wait for that,
        # so a failed `stride up` leaves no process behind.
        with (
            console.status("the suite did not start; stopping what did..."),
            contextlib.suppress(subprocess.TimeoutExpired),
        ):
            process.wait(STOP_TIMEOUT_SECONDS)
        # A failed start leaves its state file with the error; read it again in case the
        # supervisor wrote it after the last look.
        state = SuiteState.read(state_dir) or state
        reason = (
            state.error
            if state is not None and state.error
            else "".join(_log_tail(log_path, 10)) or f"the supervisor exited ({process.returncode})"
        )
        # The reason quotes service logs, whose "[error   ]" must not be read as markup.
        fail(f"the suite did not start: {reason.strip()} (logs in {state_dir / 'logs'})")
        return
    _print_suite(state, state_dir)
    _report_nodes(state_dir)
    _report_suite_problems(state_dir)


def _print_suite(state: SuiteState, state_dir: Path) -> None:
    """What ``stride up`` started: each process and its address, the database, the logs,
    how gRPC is secured and where the tokens are."""
    table = Table(title=f"stride suite up (pid {state.supervisor_pid})", title_justify="left")
    table.add_column("service")
    table.add_column("gRPC address")
    table.add_column("state")
    table.add_row(
        "nats" + (" (embedded)" if state.embedded_nats else ""),
        redact(state.nats_url),
        _phase_text(state.nats_process) if state.nats_process else "external",
    )
    if state.postgres_process is not None:
        table.add_row("postgres (embedded)", "unix socket", _phase_text(state.postgres_process))
    for service, target in state.services.items():
        table.add_row(service, target, _phase_text(state.processes.get(service)))
    console.print(table)
    console.print(f"database: {redact(state.database)}", highlight=False, soft_wrap=True)
    if state.database_data:
        console.print(
            f"data: {state.database_data} (kept by `stride down`)", highlight=False, soft_wrap=True
        )
    console.print(f"logs: {state_dir / 'logs'}", highlight=False, soft_wrap=True)
    console.print(
        "gRPC: plain text (--insecure)"
        if state.insecure
        else f"gRPC: mutual TLS; certificates in {state.tls_dir}",
        highlight=False,
    )
    if state.tokens_dir:
        console.print(
            f"tokens: admin {Path(state.tokens_dir) / channels.ADMIN_TOKEN} (the CLI's "
            f"default); user 'demo' {Path(state.tokens_dir) / channels.DEMO_TOKEN} "
            "(STRIDE_TOKEN_FILE=... to act as them)",
            highlight=False,
        )


def _report_nodes(state_dir: Path) -> None:
    """The podwatcher's nodes and how their limits are enforced."""
    try:
        nodes = call(
            "podwatcher",
            state_dir,
            lambda ch: (
                podwatcher_grpc.PodWatcherServiceStub(ch)
                .ListNodes(podwatcher_pb.ListNodesRequest(), timeout=RPC_TIMEOUT_SECONDS)
                .nodes
            ),
        )
    except (CliError, NoSuite):
        console.print("nodes: the podwatcher is not answering yet", highlight=False)
        return
    sizes: dict[tuple[float, int], int] = {}
    for node in nodes:
        sizes[(node.cpu, node.memory_bytes)] = sizes.get((node.cpu, node.memory_bytes), 0) + 1
    described = " + ".join(
        f"{count} x ({cpu:g} cpu, {_gib(memory)})" for (cpu, memory), count in sizes.items()
    )
    enforcement = nodes[0].enforcement if nodes else "unknown"
    meaning = {
        "cgroup-v1": "memory and CPU limits enforced by the kernel (cgroup v1)",
        "cgroup-v2": "memory and CPU limits enforced by the kernel (cgroup v2)",
        "rlimit": "no cgroup here: memory enforced by sampling, no CPU quota",
    }.get(enforcement, enforcement)
    console.print(f"nodes: {described}; limits: {meaning}", highlight=False)


certs_app = typer.Typer(help="Certificates for the suite's mutual TLS.", no_args_is_help=True)
app.add_typer(certs_app, name="certs")


@certs_app.command("init")
def certs_init(
    folder: Annotated[Path, typer.Argument(help="Where to write them (made 0700).")],
    san: Annotated[
        list[str] | None,
        typer.Option(help="Another DNS name or IP every certificate names (repeatable)."),
    ] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity of each certificate.")] = 365,
    kubernetes_secrets: Annotated[
        Path | None,
        typer.Option(help="Also write one kubernetes.io/tls Secret per identity to this file."),
    ] = None,
    fullname: Annotated[
        str, typer.Option(help="The Helm release's fullname (Secret names' prefix).")
    ] = "stride",
    namespace: Annotated[str | None, typer.Option(help="The Secrets' namespace.")] = None,
) -> None:
    """Make a CA and a certificate per identity (services, agent, trainer, CLI).

    Running it again keeps what is there and still good; `stride up` does it for its state
    folder by itself. Compose runs it in its `certs` service; for Helm, apply the file of
    ``--kubernetes-secrets`` (or let cert-manager issue them: see the chart's values).
    """
    from stride.runtime.certs import CertificateError, init
    from stride.runtime.certs import kubernetes_secrets as secrets

    try:
        issued = init(folder, extra_sans=san or (), days=days)
        if kubernetes_secrets is not None:
            kubernetes_secrets.write_text(secrets(folder, fullname, namespace))
            os.chmod(kubernetes_secrets, 0o600)
    except (CertificateError, OSError) as error:
        fail(str(error))
        return
    console.print(
        f"{issued.folder}: {len(issued.created)} files written, {len(issued.kept)} "
        "certificates kept" + (f"; Secrets in {kubernetes_secrets}" if kubernetes_secrets else ""),
        highlight=False,
    )


bus_app = typer.Typer(
    help="The NATS bus locked down: its configuration and streams.", no_args_is_help=True
)
app.add_typer(bus_app, name="bus")


def _tls_folder(tls_dir: Path | None, state_dir: Path) -> Path:
    """``tls_dir``, else ``$STRIDE_TLS_DIR``, else the suite's state folder's."""
    if tls_dir is not None:
        return tls_dir
    given = os.environ.get(tls.TLS_DIR_ENV, "").strip()
    return Path(given) if given else Path(state_dir) / "tls"


@bus_app.command("config")
def bus_config(
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="The folder of `stride certs init` (default: $STRIDE_TLS_DIR, else "
            "the suite's state folder's); only its identities' names are read."
        ),
    ] = None,
    cert: Annotated[
        str | None, typer.Option(help="The server certificate's path on the NATS host.")
    ] = None,
    key: Annotated[str | None, typer.Option(help="Its key's path on the NATS host.")] = None,
    ca: Annotated[str | None, typer.Option(help="The CA's path on the NATS host.")] = None,
    callout_issuer: Annotated[
        str | None,
        typer.Option(
            help="The auth callout issuer's public key (A...), or `env` for NATS to read "
            "$STRIDE_NATS_CALLOUT_ISSUER (default: from the folder's nats-callout.nk)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Write it here (0600), not stdout.")] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Print the lock-down configuration for your own nats-server: mutual TLS with the
    suite's CA, one user per identity whose publish and subscribe permissions come from
    the bus contract (only admission publishes `admitted`, only the optimizer plans, each
    service uses the JetStream API for its own consumers only), and the auth callout that
    gives each training pod a user for its own job (NATS 2.10+). Include it in the server's
    configuration, then run `stride bus init` once."""
    from stride.bus.lockdown import config_text, write_config
    from stride.runtime.errors import StartupError

    try:
        text = config_text(
            _tls_folder(tls_dir, state_dir),
            cert=cert,
            key=key,
            ca=ca,
            callout_issuer=callout_issuer,
        )
    except StartupError as error:
        fail(str(error))
        return
    if out is None:
        print(text, end="")
        return
    write_config(text, out)
    console.print(f"NATS configuration written to {out}", highlight=False)


@bus_app.command("init")
def bus_init(
    nats_url: Annotated[
        str, typer.Option(envvar="STRIDE_NATS_URL", help="The NATS to declare the streams on.")
    ],
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="The folder holding cli.crt and cli.key, the bus administrator's "
            "(default: $STRIDE_TLS_DIR, else the suite's state folder's)."
        ),
    ] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Declare the contract's JetStream streams as the bus administrator (the `cli`
    identity): on a locked-down NATS only it may, and the services only read them."""
    from stride.bus.lockdown import declare_streams
    from stride.runtime.errors import StartupError

    folder = _tls_folder(tls_dir, state_dir)
    try:
        declare_streams(nats_url, {tls.TLS_DIR_ENV: str(folder)})
    except (StartupError, TlsConfigError, OSError) as error:
        fail(str(error))
        return
    console.print(f"streams declared on {nats_url}", highlight=False)


token_app = typer.Typer(help="User tokens: who a CLI or API caller is.", no_args_is_help=True)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Argument(help="The user the token names (jobs are theirs).")],
    admin: Annotated[
        bool, typer.Option("--admin", help="Sees and manages every user's jobs and quotas.")
    ] = False,
    days: Annotated[
        float, typer.Option(min=0.001, max=365, help="How long the token is valid (days).")
    ] = 90.0,
    tls_dir: Annotated[
        Path | None,
        typer.Option(
            help="The folder of `stride certs init` holding users.key (default: "
            "$STRIDE_TLS_DIR, else the suite's state folder's)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Write it to this file (0600) instead of printing it.")
    ] = None,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Mint a user token, signed with the ``users`` key (only an administrator has it).

    Give it to the user: the CLI sends it from ``STRIDE_TOKEN`` or ``STRIDE_TOKEN_FILE``,
    and admission takes the job's user from it. Its id, which `stride token revoke --id`
    takes, is printed on standard error (or beside the file's name).
    """
    from stride.runtime.tokens import USER_ISSUER, Signer, TokenError, token_id_of, write_token
    from stride.vocabulary import InvalidWord, check_name

    try:
        check_name(user, "user")
    except InvalidWord as error:
        fail(f"{error.field}: {error.problem}")
        return
    folder = _tls_folder(tls_dir, state_dir)
    try:
        material = tls.load(USER_ISSUER, {tls.TLS_DIR_ENV: str(folder)})
        assert material is not None
        token = Signer(material).user_token(user, admin=admin, ttl=days * 86400.0)
        if out is not None:
            write_token(out, token)
    except (TlsConfigError, TokenError, OSError) as error:
        fail(f"cannot sign a token with {folder / (USER_ISSUER + '.key')}: {error}")
        return
    if out is None:
        print(token)
        errors.print(f"token id {token_id_of(token)}", highlight=False)
    else:
        console.print(
            f"token for {user!r}{' (admin)' if admin else ''}, valid {days:g} days: {out} "
            f"(id {token_id_of(token)})",
            highlight=False,
        )


@token_app.command("revoke")
def token_revoke(
    token: Annotated[
        str | None,
        typer.Argument(help="The token to revoke, or a file holding it (its id is read)."),
    ] = None,
    token_id: Annotated[
        str | None, typer.Option("--id", help="The id of the token to revoke.")
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(help="Revoke every token of this user made until now (new ones work)."),
    ] = None,
    reason: Annotated[str, typer.Option(help="Why, kept with the revocation.")] = "",
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Revoke a user token, or all of a user's tokens so far (admins only). Every Stride
    server refuses it from then on, one started later too."""
    from stride.runtime.tokens import TokenError, token_id_of

    if sum(value is not None for value in (token, token_id, user)) != 1:
        fail("give exactly one of TOKEN (or its file), --id and --user")
        return
    if token is not None:
        try:
            token_id = token_id_of(token)
        except TokenError as not_a_token:
            try:  # then a file holding one
                token_id = token_id_of(Path(token).read_text())
            except (OSError, UnicodeDecodeError, TokenError) as error:
                fail(f"TOKEN: neither a token ({not_a_token}) nor a file holding one ({error})")
                return
    reply = _admission(
        state_dir,
        lambda stub: stub.RevokeTokens(
            admission_pb.RevokeTokensRequest(
                token_id=token_id or "", user=user or "", reason=reason
            ),
            timeout=RPC_TIMEOUT_SECONDS,
        ),
    )
    what = (
        f"token {reply.revocation.token_id}"
        if reply.revocation.token_id
        else f"every token of {reply.revocation.user!r} made until now"
    )
    console.print(f"revoked {what}", highlight=False)


nodes_app = typer.Typer(
    help="The podwatcher's nodes: list them, drain one (admission re-checks guarantees), "
    "restore it.",
    no_args_is_help=False,
)
app.add_typer(nodes_app, name="nodes")


def _podwatcher(state_dir: Path, rpc: Callable[[Any], T]) -> T:
    try:
        return call(
            "podwatcher", state_dir, lambda ch: rpc(podwatcher_grpc.PodWatcherServiceStub(ch))
        )
    except (CliError, NoSuite) as error:
        fail(str(error))
        raise AssertionError("unreachable") from None


@nodes_app.callback(invoke_without_command=True)
def nodes_list(ctx: typer.Context, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Every node: its cores, memory and GPUs, what pods were given on it, and whether it is
    drained."""
    if ctx.invoked_subcommand is not None:
        return
    listed = _podwatcher(
        state_dir,
        lambda stub: (
            stub.ListNodes(podwatcher_pb.ListNodesRequest(), timeout=RPC_TIMEOUT_SECONDS).nodes
        ),
    )
    table = Table(title="nodes")
    for column in ("node", "cpu", "memory", "gpus", "cpu given", "memory given", "state"):
        table.add_column(column, justify="left" if column in ("node", "state") else "right")
    for node in listed:
        table.add_row(
            node.name,
            f"{node.cpu:g}",
            _gib(node.memory_bytes),
            str(node.devices),
            f"{node.cpu_allocated:g}",
            _gib(node.memory_allocated_bytes),
            "drained" if node.drained else "ready",
        )
    console.print(table)


@nodes_app.command("drain")
def nodes_drain(
    name: Annotated[str, typer.Argument(help="The node to drain (see `stride nodes`).")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Take a node out: its pods are evicted and relaunched where their plans fit, and
    admission plans without it (a job whose guarantee no longer holds is told)."""
    evicted = _podwatcher(
        state_dir,
        lambda stub: (
            stub.DrainNode(
                podwatcher_pb.DrainNodeRequest(name=name), timeout=RPC_TIMEOUT_SECONDS
            ).evicted_pods
        ),
    )
    console.print(
        f"{name} drained; evicted {len(evicted)} pod(s)"
        + (f": {', '.join(evicted)}" if evicted else ""),
        highlight=False,
        soft_wrap=True,
    )


@nodes_app.command("restore")
def nodes_restore(
    name: Annotated[str, typer.Argument(help="The drained node to put back.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Put a drained node back (admission counts it again)."""
    _podwatcher(
        state_dir,
        lambda stub: stub.RestoreNode(
            podwatcher_pb.RestoreNodeRequest(name=name), timeout=RPC_TIMEOUT_SECONDS
        ),
    )
    console.print(f"{name} restored", highlight=False)


quota_app = typer.Typer(
    help="User and team quotas: admission rejects a job over one, naming it.",
    no_args_is_help=False,
)
app.add_typer(quota_app, name="quota")


def _admission(state_dir: Path, rpc: Callable[[Any], T]) -> T:
    try:
        return call("admission", state_dir, lambda ch: rpc(admission_grpc.AdmissionServiceStub(ch)))
    except (CliError, NoSuite) as error:
        fail(str(error))
        raise AssertionError("unreachable") from None


def _quota_table(statuses: list[admission_pb.QuotaStatus]) -> Table:
    table = Table(title="quotas")
    for column in ("scope", "active jobs", "submissions", "window", "members", "grants", "set by"):
        table.add_column(
            column, justify="right" if column in ("active jobs", "submissions") else "left"
        )
    for status in statuses:
        quota, use = status.quota, status.use
        table.add_row(
            quota.scope,
            f"{use.active_jobs} of {quota.max_active_jobs or 'any'}",
            f"{use.submissions} of {quota.max_submissions or 'any'}",
            f"{quota.window_seconds / 3600:g}h",
            ", ".join(quota.members) or "-",
            _grants(quota),
            quota.source,
        )
    return table


def _grants(quota: admission_pb.Quota) -> str:
    """What a quota lets its users ask for beyond the defaults."""
    grants = []
    if quota.max_priority:
        grants.append(job_pb2.Priority.Name(quota.max_priority).removeprefix("PRIORITY_").lower())
    if quota.allow_simulated:
        grants.append("simulated")
    return ", ".join(grants) or "-"


@quota_app.callback(invoke_without_command=True)
def quota_list(ctx: typer.Context, state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Every quota and what its user or team holds now."""
    if ctx.invoked_subcommand is not None:
        return
    listed = _admission(
        state_dir,
        lambda stub: (
            stub.ListQuotas(admission_pb.ListQuotasRequest(), timeout=RPC_TIMEOUT_SECONDS).quotas
        ),
    )
    if not listed:
        console.print("no quotas")
        return
    console.print(_quota_table(list(listed)))


@quota_app.command("set")
def quota_set(
    scope: Annotated[str, typer.Argument(help="user:<name> or team:<name>.")],
    max_active_jobs: Annotated[
        int, typer.Option(help="Jobs admitted or queued at once (0: no limit).")
    ] = 0,
    max_submissions: Annotated[
        int, typer.Option(help="Jobs submitted within --window-hours (0: no limit).")
    ] = 0,
    window_hours: Annotated[float, typer.Option(help="The submission window.")] = 24.0,
    members: Annotated[str, typer.Option(help="A team's users, comma-separated.")] = "",
    max_priority: Annotated[
        str, typer.Option(help="Grants a priority above normal to its users: high.")
    ] = "",
    allow_simulated: Annotated[
        bool, typer.Option(help="Lets its users submit simulated jobs (no pods run).")
    ] = False,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Set (replace) a quota. One below what the scope holds now is set too: its jobs stay,
    and new ones are rejected until the use falls below it."""
    priority = job_pb2.PRIORITY_UNSPECIFIED
    if max_priority:
        try:
            priority = job_pb2.Priority.Value(f"PRIORITY_{max_priority.upper()}")
        except ValueError:
            fail(f"--max-priority: {max_priority!r} is not a priority (low, normal, high)")
    quota = admission_pb.Quota(
        scope=scope,
        max_active_jobs=max_active_jobs,
        max_submissions=max_submissions,
        window_seconds=window_hours * 3600,
        members=[m.strip() for m in members.split(",") if m.strip()],
        max_priority=priority,
        allow_simulated=allow_simulated,
    )
    status = _admission(
        state_dir,
        lambda stub: (
            stub.SetQuota(
                admission_pb.SetQuotaRequest(quota=quota), timeout=RPC_TIMEOUT_SECONDS
            ).status
        ),
    )
    console.print(_quota_table([status]))


@quota_app.command("show")
def quota_show(
    scope: Annotated[str, typer.Argument(help="user:<name> or team:<name>.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """One quota and its use."""
    status = _admission(
        state_dir,
        lambda stub: (
            stub.GetQuota(
                admission_pb.GetQuotaRequest(scope=scope), timeout=RPC_TIMEOUT_SECONDS
            ).status
        ),
    )
    console.print(_quota_table([status]))


@quota_app.command("delete")
def quota_delete(
    scope: Annotated[str, typer.Argument(help="user:<name> or team:<name>.")],
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Remove a quota."""
    _admission(
        state_dir,
        lambda stub: stub.DeleteQuota(
            admission_pb.DeleteQuotaRequest(scope=scope), timeout=RPC_TIMEOUT_SECONDS
        ),
    )
    console.print(f"quota of {scope} removed", highlight=False)


def _phase_text(process: ProcessState | None) -> str:
    if process is None:
        return "unknown"
    if process.crash_looping:
        return f"crash-looping ({process.restarts} exits in a row)"
    if process.restarts and process.phase is not Phase.RUNNING:
        return f"{process.phase.value} after {process.restarts} exit(s)"
    return process.phase.value


def _log_tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines(keepends=True)[-lines:]
    except FileNotFoundError:
        return []


def _report_suite_problems(state_dir: Path) -> None:
    """A warning line for every process of the local suite that is not running healthily."""
    state = SuiteState.read(state_dir)
    if state is None or not state.ready:
        return
    if not pid_alive(state.supervisor_pid):
        warn(
            f"the suite's supervisor (pid {state.supervisor_pid}) is not running, so nothing "
            f"restarts its services: `stride down`, then `stride up` (state in {state_dir})"
        )
        return
    for line, process in state.problems():
        warn(line)
        for output in process.last_output:
            # Logs are not markup: print them as they are.
            console.print(f"    {output}", markup=False, highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """Print one warning line (on stdout: it is part of the status the user asked for)."""
    console.print("[bold yellow]warning:[/] ", end="", highlight=False)
    console.print(message, markup=False, highlight=False, soft_wrap=True)


@app.command()
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop the suite that `stride up` started (also while a service is backing off)."""
    state = SuiteState.read(state_dir)
    if state is None or not pid_alive(state.supervisor_pid):
        console.print(f"no suite running from {state_dir}")
        (state_dir / "endpoints.json").unlink(missing_ok=True)
        return
    os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    with console.status("stopping the suite..."):
        while pid_alive(state.supervisor_pid) and time.monotonic() < deadline:
            _reap(state.supervisor_pid)
            time.sleep(0.2)
    if pid_alive(state.supervisor_pid):
        fail(
            f"the suite (pid {state.supervisor_pid}) did not stop within "
            f"{STOP_TIMEOUT_SECONDS:g}s; see {state_dir / 'supervisor.log'}"
        )
    console.print("suite stopped")


def _reap(pid: int) -> None:
    # The supervisor may be our own child (same process ran `up`); collect it so it is gone.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
