"""Commands for jobs while they run: ``stride top``, ``stride logs``, ``stride scale`` and
``stride wait``.

They read what each service knows through its gRPC API: jobs from admission, plans from
the optimizer, pods from the podwatcher and data progress from the dispatcher. A service
that does not answer shows as "-" in ``top`` instead of ending the view.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, TypeVar

import grpc
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as dispatcher_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as optimizer_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as optimizer_grpc
from stride.api.podwatcher.v1 import podwatcher_service_pb2 as podwatcher_pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as podwatcher_grpc
from stride.cli import channels
from stride.cli.endpoints import NoSuite, address
from stride.events.v1 import optimization_pb2, plan_pb2, pod_pb2
from stride.runtime.tls import TlsConfigError

T = TypeVar("T")
RPC_TIMEOUT_SECONDS = 10.0
TERMINAL = {
    admission_pb.JOB_STATE_SUCCEEDED,
    admission_pb.JOB_STATE_FAILED,
    admission_pb.JOB_STATE_CANCELLED,
    admission_pb.JOB_STATE_REJECTED,
}
DATASET = "train"
StateDir = Annotated[
    Path,
    typer.Option("--state-dir", envvar="STRIDE_STATE_DIR", help="The suite's state dir."),
]


class Unanswered(Exception):
    """A service did not answer; the message says which and why, in one line."""


def ask(service: str, state_dir: Path, rpc: Callable[[grpc.Channel], T]) -> T:
    """Run ``rpc`` against ``service``; errors become :class:`Unanswered`."""
    try:
        target = address(service, state_dir)
        opened = channels.channel(target, service, state_dir)
    except (NoSuite, TlsConfigError) as error:
        raise Unanswered(str(error)) from None
    with opened as channel:
        try:
            return rpc(channel)
        except grpc.RpcError as error:
            code, details = error.code(), error.details()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise Unanswered(
                    f"cannot reach {service} at {target} ({details}); is the suite up?"
                ) from None
            raise Unanswered(details or code.name) from None


def _role(role: plan_pb2.Role.ValueType) -> str:
    return plan_pb2.Role.Name(role).removeprefix("ROLE_").lower()


def _phase(phase: pod_pb2.PodPhase.ValueType) -> str:
    return pod_pb2.PodPhase.Name(phase).removeprefix("POD_PHASE_").lower()


def _failure(reason: pod_pb2.PodFailureReason.ValueType) -> str:
    names = {
        pod_pb2.POD_FAILURE_REASON_OOM_KILLED: "OOMKilled",
        pod_pb2.POD_FAILURE_REASON_EVICTED: "Evicted",
        pod_pb2.POD_FAILURE_REASON_ERROR: "Error",
    }
    return names.get(reason, "")


def _mib(value: int) -> str:
    return f"{value / 1024**2:,.0f}Mi"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


@dataclass
class Progress:
    """What ``top`` remembers between frames to estimate throughput and ETA."""

    seen: dict[str, tuple[float, float]] = field(default_factory=dict)
    """job -> (monotonic time, fraction done) at the previous frame."""
    rate: dict[str, float] = field(default_factory=dict)
    """job -> fraction per second."""


def _fraction(state: dispatcher_pb.GetDatasetStateResponse, epochs: int) -> float:
    shards = state.todo + state.doing + state.done
    if state.finished:
        return 1.0
    within = state.done / shards if shards else 0.0
    return min((state.epoch + within) / max(epochs, 1), 1.0)


def _get_plan(job_id: str) -> Callable[[grpc.Channel], optimizer_pb.GetPlanResponse]:
    def rpc(channel: grpc.Channel) -> optimizer_pb.GetPlanResponse:
        return optimizer_grpc.OptimizerServiceStub(channel).GetPlan(
            optimizer_pb.GetPlanRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
        )

    return rpc


def _get_pods(job_id: str) -> Callable[[grpc.Channel], podwatcher_pb.GetJobPodsResponse]:
    def rpc(channel: grpc.Channel) -> podwatcher_pb.GetJobPodsResponse:
        return podwatcher_grpc.PodWatcherServiceStub(channel).GetJobPods(
            podwatcher_pb.GetJobPodsRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
        )

    return rpc


def _get_data(job_id: str) -> Callable[[grpc.Channel], dispatcher_pb.GetDatasetStateResponse]:
    def rpc(channel: grpc.Channel) -> dispatcher_pb.GetDatasetStateResponse:
        return dispatcher_grpc.DispatcherServiceStub(channel).GetDatasetState(
            dispatcher_pb.GetDatasetStateRequest(job_id=job_id, dataset=DATASET),
            timeout=RPC_TIMEOUT_SECONDS,
        )

    return rpc


def frame(state_dir: Path, progress: Progress, all_jobs: bool) -> Group:
    """One view of every running job (every job with ``all_jobs``)."""
    try:
        jobs = ask(
            "admission",
            state_dir,
            lambda ch: admission_grpc.AdmissionServiceStub(ch).ListJobs(
                admission_pb.ListJobsRequest(page_size=50), timeout=RPC_TIMEOUT_SECONDS
            ),
        ).jobs
    except Unanswered as error:
        return Group(f"[red]jobs: {escape(str(error))}[/]")
    summary = Table(title="stride top", title_justify="left")
    for column in (
        "job",
        "user",
        "state",
        "stage",
        "plan",
        "pods",
        "progress",
        "samples/s",
        "eta",
    ):
        summary.add_column(column, justify="right" if column in ("samples/s", "plan") else "left")
    details: list[Table] = []
    now = time.monotonic()
    for job in jobs:
        if job.state in TERMINAL and not all_jobs:
            continue
        state_name = admission_pb.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
        plan_text, pods_text, progress_text, rate_text, eta_text = "-", "-", "-", "-", "-"
        stage_text = "-"
        try:
            plan = ask(
                "optimizer",
                state_dir,
                _get_plan(job.job_id),
            )
            plan_text = f"v{plan.plan.version}"
            # The optimizer's stage (DLRover sec. 4.2), and its windows decided so far.
            stage = optimization_pb2.JobStage.Name(plan.stage).removeprefix("JOB_STAGE_")
            stage_text = f"{stage.lower()} ({plan.windows} windows)"
        except Unanswered:
            pass
        try:
            pods = ask(
                "podwatcher",
                state_dir,
                _get_pods(job.job_id),
            ).pods
            running = sum(p.phase == pod_pb2.POD_PHASE_RUNNING for p in pods)
            pods_text = f"{running}/{len(pods)} running"
            table = Table(title=f"pods of {job.job_id}", title_justify="left")
            for column in (
                "pod",
                "role",
                "phase",
                "node",
                "cpu used/limit",
                "memory used/limit",
                "restarts",
                "last failure",
            ):
                table.add_column(column)
            for pod in pods:
                table.add_row(
                    pod.name,
                    _role(pod.role),
                    _phase(pod.phase),
                    pod.node,
                    f"{pod.cpu_used:.2f}/{pod.cpu:g}",
                    f"{_mib(pod.memory_used_bytes)}/{_mib(pod.memory_bytes)}",
                    str(pod.restarts),
                    escape(_failure(pod.last_failure)),
                )
            details.append(table)
        except Unanswered:
            pass
        try:
            data = ask(
                "dispatcher",
                state_dir,
                _get_data(job.job_id),
            )
            epochs = int(job.spec.termination.max_epochs or 1)
            done = _fraction(data, epochs)
            progress_text = f"{done:.0%} (epoch {min(data.epoch + 1, epochs)}/{epochs})"
            previous = progress.seen.get(job.job_id)
            if previous is not None and now > previous[0] and done >= previous[1]:
                rate = (done - previous[1]) / (now - previous[0])
                progress.rate[job.job_id] = 0.5 * rate + 0.5 * progress.rate.get(job.job_id, rate)
            progress.seen[job.job_id] = (now, done)
            rate = progress.rate.get(job.job_id, 0.0)
            records = job.spec.dataset.record_count * epochs
            if rate > 0:
                rate_text = f"{rate * records:,.0f}"
                eta_text = _duration((1.0 - done) / rate) if done < 1 else "done"
        except Unanswered:
            pass
        summary.add_row(
            job.job_id,
            job.spec.user,
            state_name,
            stage_text,
            plan_text,
            pods_text,
            progress_text,
            rate_text,
            eta_text,
        )
    return Group(summary, *details)


def register(app: typer.Typer, default_state_dir: Path, console: Console, errors: Console) -> None:
    """Add the running-job commands to ``app``."""

    def fail(message: str) -> None:
        errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)

    @app.command()
    def top(
        state_dir: StateDir = default_state_dir,
        interval: Annotated[float, typer.Option(min=0.2, help="Seconds between frames.")] = 2.0,
        once: Annotated[bool, typer.Option(help="Print one frame and exit.")] = False,
        all_jobs: Annotated[bool, typer.Option("--all", help="Show ended jobs too.")] = False,
    ) -> None:
        """A live view of jobs, their pods, plan version, progress, throughput and ETA."""
        progress = Progress()
        if once:
            console.print(frame(state_dir, progress, all_jobs))
            return
        try:
            with Live(frame(state_dir, progress, all_jobs), console=console, screen=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(frame(state_dir, progress, all_jobs))
        except KeyboardInterrupt:
            return

    @app.command()
    def logs(
        job_id: str,
        pod: Annotated[str, typer.Argument(help="One pod; all of the job's by default.")] = "",
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing.")] = False,
        tail: Annotated[int, typer.Option(min=1, max=10_000, help="Lines to start with.")] = 100,
        state_dir: StateDir = default_state_dir,
    ) -> None:
        """Print a job's pod logs (trainer and agent), and follow them with -f."""

        def stream(channel: grpc.Channel) -> None:
            replies = podwatcher_grpc.PodWatcherServiceStub(channel).GetPodLogs(
                podwatcher_pb.GetPodLogsRequest(
                    job_id=job_id, pod_name=pod, follow=follow, tail_lines=tail
                ),
                timeout=None if follow else RPC_TIMEOUT_SECONDS,
            )
            for reply in replies:
                for line in reply.lines:
                    prefix = "" if pod else f"{reply.pod_name} "
                    console.print(f"{prefix}{line}", markup=False, highlight=False, soft_wrap=True)

        try:
            ask("podwatcher", state_dir, stream)
        except Unanswered as error:
            fail(str(error))
        except KeyboardInterrupt:
            return

    @app.command()
    def scale(
        job_id: str,
        workers: Annotated[int, typer.Option("--workers", min=1, help="Workers wanted.")],
        ps: Annotated[int, typer.Option("--ps", min=0, help="PS wanted (0: keep).")] = 0,
        reason: Annotated[str, typer.Option(help="Why, kept with the plan.")] = "",
        state_dir: StateDir = default_state_dir,
    ) -> None:
        """An operator's manual plan: publish the job's next plan version with these counts
        (recorded as an override, as DLRover's ScalePlan)."""
        try:
            reply = ask(
                "optimizer",
                state_dir,
                lambda ch: optimizer_grpc.OptimizerServiceStub(ch).ScaleJob(
                    optimizer_pb.ScaleJobRequest(
                        job_id=job_id, workers=workers, ps=ps, reason=reason
                    ),
                    timeout=RPC_TIMEOUT_SECONDS,
                ),
            )
        except Unanswered as error:
            fail(str(error))
            return
        roles = ", ".join(f"{r.count} {_role(r.role)}" for r in reply.plan.roles)
        console.print(f"{job_id}: plan v{reply.plan.version} published ({roles})", highlight=False)

    @app.command()
    def wait(
        job_id: str,
        timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait at most.")] = 3600,
        state_dir: StateDir = default_state_dir,
    ) -> None:
        """Wait until a job ends; exit 0 if it succeeded, 1 if it failed or was cancelled."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                job = ask(
                    "admission",
                    state_dir,
                    lambda ch: admission_grpc.AdmissionServiceStub(ch).GetJob(
                        admission_pb.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS
                    ),
                ).job
            except Unanswered as error:
                fail(str(error))
                return
            if job.state in TERMINAL:
                name = admission_pb.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
                console.print(f"{job_id} {name}", highlight=False)
                raise typer.Exit(0 if job.state == admission_pb.JOB_STATE_SUCCEEDED else 1)
            if time.monotonic() > deadline:
                fail(f"{job_id} did not end within {timeout:g} s")
            time.sleep(1.0)
