"""Commands for jobs while they run: ``stride top``, ``stride logs``, ``stride scale`` and
``stride wait``.

They read what each service knows through its gRPC API: jobs from admission, plans and the
throughput of the jobs' newest step metrics from the optimizer, pods from the podwatcher and
data progress from the dispatcher. A service that does not answer shows as "-" in ``top``
instead of ending the view.
"""

from __future__ import annotations

import contextlib
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
from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2, pod_pb2
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


def total_samples(spec: job_pb2.JobSpec) -> int:
    """Samples the job trains on in all, as its termination says: ``max_steps`` global
    batches, else ``max_epochs`` passes over its dataset (one pass when neither is set, as
    the trainer reads it)."""
    if spec.termination.max_steps > 0:
        return spec.termination.max_steps * spec.batch_size
    return max(spec.termination.max_epochs, 1) * spec.dataset.record_count


def data_consumed(state: dispatcher_pb.GetDatasetStateResponse, spec: job_pb2.JobSpec) -> float:
    """Samples the dispatcher says are done. A job read by steps (GoldMiner's data-worker
    mode): every step up to the consumed one. By shards: the epochs before the current one
    and the done share of its shards (the whole job once the last epoch is complete)."""
    if state.finished:
        return float(total_samples(spec))
    if state.HasField("consumed_step") and spec.batch_size > 0:
        per_epoch = -(-spec.dataset.record_count // spec.batch_size)
        epochs, steps = divmod(state.consumed_step + 1, per_epoch)
        done = epochs * spec.dataset.record_count + steps * spec.batch_size
        return float(min(done, total_samples(spec)))
    shards = state.todo + state.doing + state.done
    within = state.done / shards if shards else 0.0
    return (state.epoch + within) * spec.dataset.record_count


@dataclass(frozen=True)
class Speed:
    """How fast a job trains and how far it is: what ``top`` shows as its progress,
    samples/s and ETA."""

    total: int
    """Samples the job trains on in all (:func:`total_samples`)."""
    consumed: float | None
    """Samples done so far; None when neither the dispatcher nor the step metrics say."""
    samples_per_second: float
    """The job's current throughput; 0 when it is not known."""

    @property
    def done(self) -> float | None:
        """The fraction of :attr:`total` done, or None when it is not known."""
        if self.consumed is None or self.total <= 0:
            return None
        return min(self.consumed / self.total, 1.0)

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until the rest is trained at the current throughput; 0 once nothing is
        left; None when the rest or the throughput is not known."""
        if self.consumed is None or self.total <= 0:
            return None
        remaining = max(self.total - self.consumed, 0.0)
        if remaining == 0:
            return 0.0
        return remaining / self.samples_per_second if self.samples_per_second > 0 else None


@dataclass
class Progress:
    """What ``top`` remembers between frames: where each job's count of consumed samples
    stood when ``top`` first saw it. The throughput is the step metrics' own (the newest
    window the trainer measured); a job without one (the optimizer not answering, or not
    measuring the job's kind of plan) gets the rate of its count over the frames instead,
    coarser since the dispatcher counts a shard at a time."""

    first: dict[str, tuple[float, float]] = field(default_factory=dict)
    """job -> (monotonic time, samples consumed) when first seen."""
    last: dict[str, float] = field(default_factory=dict)
    """job -> samples consumed at the previous frame."""

    def rate(self, job_id: str, consumed: float, now: float) -> float:
        """Samples per second since the job was first seen; 0 until it moved. A count that
        went back (restored from a checkpoint) starts over."""
        start = self.first.get(job_id)
        if start is None or consumed < self.last.get(job_id, 0.0):
            start = self.first[job_id] = (now, consumed)
        self.last[job_id] = consumed
        return (consumed - start[1]) / (now - start[0]) if now > start[0] else 0.0


def measure(
    job: admission_pb.Job,
    plan: optimizer_pb.GetPlanResponse | None,
    data: dispatcher_pb.GetDatasetStateResponse | None,
    progress: Progress,
    now: float,
) -> Speed:
    """The job's :class:`Speed` from what the services answered (None: did not). The
    dispatcher's shards say how far the data is; a job without a dataset there (a simulated
    one) is as far as its step metrics count."""
    if data is not None:
        consumed: float | None = data_consumed(data, job.spec)
    elif plan is not None and plan.samples_consumed > 0:
        consumed = float(plan.samples_consumed)
    else:
        consumed = None
    rate = plan.samples_per_second if plan is not None else 0.0
    if rate <= 0 and consumed is not None:
        rate = progress.rate(job.job_id, consumed, now)
    return Speed(total_samples(job.spec), consumed, rate)


def speed_cells(
    speed: Speed, state: admission_pb.JobState.ValueType, epoch_text: str = ""
) -> tuple[str, str, str]:
    """The progress, samples/s and ETA cells of a job's row; an ended job has no speed."""
    done = speed.done
    progress_text = "-" if done is None else f"{done:.0%}{epoch_text}"
    if state in TERMINAL:
        return progress_text, "-", "done" if state == admission_pb.JOB_STATE_SUCCEEDED else "-"
    rate = speed.samples_per_second
    eta = speed.eta_seconds
    eta_text = "-" if eta is None else "done" if eta == 0 else _duration(eta)
    return progress_text, f"{rate:,.0f}" if rate > 0 else "-", eta_text


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


def _plan_of(state_dir: Path, job_id: str) -> optimizer_pb.GetPlanResponse | None:
    """The job's newest plan from the optimizer (None: it did not answer)."""
    try:
        return ask("optimizer", state_dir, _get_plan(job_id))
    except Unanswered:
        return None


def _plan_cells(plan: optimizer_pb.GetPlanResponse | None) -> tuple[str, str]:
    """The plan's version, and the optimizer's stage (DLRover sec. 4.2) with its windows
    decided so far."""
    if plan is None:
        return "-", "-"
    stage = optimization_pb2.JobStage.Name(plan.stage).removeprefix("JOB_STAGE_")
    return f"v{plan.plan.version}", f"{stage.lower()} ({plan.windows} windows)"


def _pods_of(state_dir: Path, job_id: str) -> tuple[str, Table | None]:
    """The job's pods running of all, and a table of them (None: the pod watcher did not
    answer)."""
    try:
        pods = ask("podwatcher", state_dir, _get_pods(job_id)).pods
    except Unanswered:
        return "-", None
    running = sum(p.phase == pod_pb2.POD_PHASE_RUNNING for p in pods)
    table = Table(title=f"pods of {job_id}", title_justify="left")
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
    return f"{running}/{len(pods)} running", table


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
        "input",
    ):
        summary.add_column(column, justify="right" if column in ("samples/s", "plan") else "left")
    details: list[Table] = []
    now = time.monotonic()
    for job in jobs:
        if job.state in TERMINAL and not all_jobs:
            continue
        state_name = admission_pb.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
        plan = _plan_of(state_dir, job.job_id)
        plan_text, stage_text = _plan_cells(plan)
        pods_text, table = _pods_of(state_dir, job.job_id)
        if table is not None:
            details.append(table)
        data: dispatcher_pb.GetDatasetStateResponse | None = None
        epoch_text = ""
        with contextlib.suppress(Unanswered):
            data = ask("dispatcher", state_dir, _get_data(job.job_id))
            epochs = int(job.spec.termination.max_epochs or 1)
            epoch = data.epoch
            if data.HasField("consumed_step") and job.spec.batch_size > 0:  # read by steps
                per_epoch = -(-job.spec.dataset.record_count // job.spec.batch_size)
                epoch = (data.consumed_step + 1) // per_epoch
            epoch_text = f" (epoch {min(epoch + 1, epochs)}/{epochs})"
        speed = measure(job, plan, data, progress, now)
        progress_text, rate_text, eta_text = speed_cells(speed, job.state, epoch_text)
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
            queue_cell(plan),
        )
    return Group(summary, *details)


def queue_cell(plan: optimizer_pb.GetPlanResponse | None) -> str:
    """A job's input queue (GoldMiner's data-worker mode): who makes its mini-batches, the
    share of the newest window its chief waited for them, and how many were ready."""
    if plan is None or not plan.HasField("input_queue"):
        return "-"
    queue = plan.input_queue
    makers = f"{queue.data_workers} data workers" if queue.data_workers else "the chief"
    return f"{makers}, waited {queue.wait_share:.0%}, {queue.queue_length} ready"


def register(app: typer.Typer, default_state_dir: Path, console: Console, errors: Console) -> None:
    """Add the running-job commands to ``app``: top, logs, scale and wait."""
    fail = failer(errors)
    _register_top(app, default_state_dir, console, fail)
    _register_logs(app, default_state_dir, console, fail)
    _register_scale(app, default_state_dir, console, fail)
    _register_wait(app, default_state_dir, console, fail)


def failer(errors: Console) -> Callable[[str], None]:
    """Print an error the CLI's way and exit with 2."""

    def fail(message: str) -> None:
        errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)

    return fail


def _register_top(
    app: typer.Typer, default_state_dir: Path, console: Console, fail: Callable[[str], None]
) -> None:
    """Add ``stride top`` to ``app``."""

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


def _register_logs(
    app: typer.Typer, default_state_dir: Path, console: Console, fail: Callable[[str], None]
) -> None:
    """Add ``stride logs`` to ``app``."""

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


def _register_scale(
    app: typer.Typer, default_state_dir: Path, console: Console, fail: Callable[[str], None]
) -> None:
    """Add ``stride scale`` to ``app``."""

    @app.command()
    def scale(
        job_id: str,
        workers: Annotated[int, typer.Option("--workers", min=1, help="Workers wanted.")],
        ps: Annotated[int, typer.Option("--ps", min=0, help="PS wanted (0: keep).")] = 0,
        data_workers: Annotated[
            int | None,
            typer.Option(
                "--data-workers", min=0, help="Data workers wanted (0: none; unset: keep)."
            ),
        ] = None,
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
                        job_id=job_id,
                        workers=workers,
                        ps=ps,
                        reason=reason,
                        data_workers=data_workers,
                    ),
                    timeout=RPC_TIMEOUT_SECONDS,
                ),
            )
        except Unanswered as error:
            fail(str(error))
            return
        roles = ", ".join(f"{r.count} {_role(r.role)}" for r in reply.plan.roles)
        console.print(f"{job_id}: plan v{reply.plan.version} published ({roles})", highlight=False)


def _register_wait(
    app: typer.Typer, default_state_dir: Path, console: Console, fail: Callable[[str], None]
) -> None:
    """Add ``stride wait`` to ``app``."""

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
