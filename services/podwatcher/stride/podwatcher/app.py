"""The podwatcher's composition root: wires storage, backend, bus and API into a host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import structlog

from stride.api.podwatcher.v1 import podwatcher_service_pb2, podwatcher_service_pb2_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.db.outbox import Outbox
from stride.podwatcher.adapters.inbound.bus_handlers import (
    AckHandler,
    AdmittedHandler,
    FinishedHandler,
    PlanHandler,
)
from stride.podwatcher.adapters.inbound.grpc_api import ACCESS, PodWatcherApi
from stride.podwatcher.adapters.outbound.backends.base import Backend
from stride.podwatcher.adapters.outbound.backends.local import (
    LocalBackend,
    PodEnvironment,
    detect_local_node,
    pod_tls_folder,
)
from stride.podwatcher.adapters.outbound.backends.localpods import (
    Enforcement,
    LocalPods,
    firewall,
    sandbox,
)
from stride.podwatcher.adapters.outbound.backends.localpods.firewall import TfFirewall
from stride.podwatcher.adapters.outbound.backends.localpods.sandbox import PodSandboxes
from stride.podwatcher.db.tables import outbox as outbox_table
from stride.podwatcher.domain.nodes import parse_nodes
from stride.podwatcher.operator import Operator
from stride.podwatcher.settings import PodWatcherSettings
from stride.podwatcher.usecases import PodWatcher, Timing
from stride.runtime import tls
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.runtime.tokens import JOB_TOKEN_TTL, Signer
from stride.wiring import (
    connect_bus,
    consume,
    create_host,
    open_database,
    relay_outbox,
    serve_nats_callout,
)

log = structlog.get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = podwatcher_service_pb2.DESCRIPTOR.services_by_name["PodWatcherService"].full_name
SWEEP_DELAY_SECONDS = 3.0
"""After start-up, how long pod ends kept while the podwatcher was down get to be recorded
before rows still saying RUNNING without a pod are declared lost."""
RECONFIGURE_CHECK_SECONDS = 5.0


def make_backend(settings: PodWatcherSettings) -> Backend:
    """The local backend (the Kubernetes one is the :class:`Operator`'s)."""
    if settings.backend != "local":
        raise StartupError(f"make_backend builds the local backend, not {settings.backend}")
    nodes = (
        parse_nodes(settings.local_nodes)
        if settings.local_nodes.strip()
        else (detect_local_node(),)
    )
    state_dir = settings.local_state_dir.resolve()
    enforcement = (
        None if settings.local_enforcement == "auto" else Enforcement(settings.local_enforcement)
    )
    runtime = LocalPods(
        state_dir,
        enforcement=enforcement,
        eviction_threshold_bytes=settings.eviction_threshold_bytes,
    )
    environment = PodEnvironment(
        nats_url=settings.require_nats_url(),
        dispatcher_address=settings.dispatcher_address,
        ckptcache_address=settings.ckptcache_address,
        checkpoint_every_steps=settings.checkpoint_every_steps,
        verify_restores=settings.verify_restores,
        step_report_seconds=settings.step_report_seconds,
        jobs_dir=state_dir / "jobs",
        log_level=settings.log_level,
        trainer_module=settings.trainer_module,
    )
    base = dict(os.environ)
    material = tls.load(settings.service_name)
    folder = base.get(tls.TLS_DIR_ENV, "").strip()
    pod_tls = state_dir / "pod-tls"
    if material is not None and folder:
        base[tls.TLS_DIR_ENV] = str(pod_tls_folder(Path(folder), pod_tls))
    sandboxes = pod_sandboxes(settings, base, pod_tls, private=(state_dir / "tokens",))
    backend = LocalBackend(
        runtime,
        tuple(nodes),
        environment,
        base,
        signer=Signer(material) if material is not None else None,
        tokens_dir=state_dir / "tokens",
        sandboxes=sandboxes,
        firewall=tf_firewall(settings, runtime, state_dir),
    )
    log.info(
        "local pod backend",
        nodes=len(nodes),
        enforcement=backend.enforcement,
        note=backend.enforcement_note,
        sandbox="landlock" if sandboxes is not None else "off",
        tf_ports="own job only" if backend.firewall is not None else "open",
        state_dir=str(state_dir),
    )
    return backend


def pod_sandboxes(
    settings: PodWatcherSettings,
    environment: dict[str, str],
    pod_tls: Path,
    private: tuple[Path, ...],
) -> PodSandboxes | None:
    """How local pods are confined (:mod:`...localpods.sandbox`), or None (``off``, or not
    possible here and ``auto``: said in a warning). ``private``: folders no pod may read,
    which no folder readable by every pod may hold."""
    if settings.local_sandbox == "off":
        log.warning("local pods are not confined: they have the pod watcher's own rights")
        return None
    code = sandbox.code_paths(sys.executable, environment.get("PYTHONPATH", ""))
    why = sandbox.unavailable()
    if why is None:
        overlap = sandbox.forbidden_overlap(
            sandbox.policy(code=code, read=(), read_write=()),
            (*private, *_secret_folders()),
        )
        why = None if overlap is None else f"it would open the suite's secrets: {overlap}"
    if why is not None:
        if settings.local_sandbox == "landlock":
            raise StartupError(f"STRIDE_PODWATCHER_LOCAL_SANDBOX=landlock: {why}")
        log.warning("local pods are NOT confined to their own files", why=why)
        return None
    return sandbox.PodSandboxes(code, (pod_tls,))


def tf_firewall(
    settings: PodWatcherSettings, runtime: LocalPods, state_dir: Path
) -> TfFirewall | None:
    """What keeps other jobs' pods off a job's TensorFlow ports (:mod:`...localpods.firewall`),
    with the sandbox (``local_sandbox``); None where it cannot be (said in a warning)."""
    if settings.local_sandbox == "off":
        return None
    why = firewall.unavailable()
    if why is None and runtime.enforcement is Enforcement.CGROUP_V2:
        # A process is in one v2 group only: its pod's, which holds its limits.
        why = "pods' limits are cgroup v2 groups; job groups need the v1 limits or rlimit"
    if why is not None:
        if settings.local_sandbox == "landlock":
            raise StartupError(f"STRIDE_PODWATCHER_LOCAL_SANDBOX=landlock: {why}")
        log.warning("jobs' TensorFlow ports are open to other jobs' pods", why=why)
        return None
    return TfFirewall(state_dir)


def _secret_folders() -> tuple[Path, ...]:
    """The suite's certificate folder, if named (pods get a copy of theirs only)."""
    folder = os.environ.get(tls.TLS_DIR_ENV, "").strip()
    return (Path(folder),) if folder else ()


async def build(settings: PodWatcherSettings) -> ServiceHost:
    """Connect everything and return a host ready to run. On Kubernetes this waits for the
    Lease first (:mod:`stride.podwatcher.operator`)."""
    operator = (
        await Operator.start(settings, [SERVICE_NAME]) if settings.backend == "kubernetes" else None
    )
    backend: Backend = operator.backend if operator is not None else make_backend(settings)
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    bus = await connect_bus(settings, host)
    # Before the pods start: their agents connect as soon as they run.
    await serve_nats_callout(host, bus, settings.nats_callout_seed_file)
    database = await open_database(settings, host, MIGRATIONS)
    outbox = Outbox(outbox_table)
    timing = Timing(
        relaunch_budget=settings.relaunch_budget,
        oom_replan_seconds=settings.oom_replan_seconds,
        reconfigure_timeout_seconds=settings.reconfigure_timeout_seconds,
        usage_interval_seconds=settings.usage_interval_seconds,
    )
    pods = PodWatcher(database, outbox, backend, bus, timing, cluster=settings.cluster_name)

    async def backend_ready() -> bool:
        return True

    host.add_dependency(Dependency("pod backend", backend_ready, backend.close, False))
    podwatcher_service_pb2_grpc.add_PodWatcherServiceServicer_to_server(
        PodWatcherApi(pods, backend.enforcement), host.server.server
    )
    relay_outbox(host, outbox, database, bus)
    if operator is not None:
        operator.attach(host, pods)
        host.add_dependency(Dependency("lease", backend_ready, operator.close, False))
    await pods.startup()
    _add_work(host, pods, backend, settings)
    _consume_events(host, bus, pods)
    return host


def _add_work(
    host: ServiceHost, pods: PodWatcher, backend: Backend, settings: PodWatcherSettings
) -> None:
    """The root tasks: pods' ends recorded, the reconcile loop, and the periodic work
    (usage samples, reconfigure timeouts, the sweep for lost pods, job tokens, nodes)."""

    async def record_ends() -> None:
        ends = backend.ended()
        while not host.stop.is_set():
            next_end = asyncio.ensure_future(anext(ends))
            stop = asyncio.ensure_future(host.stop.wait())
            done, _ = await asyncio.wait({next_end, stop}, return_when=asyncio.FIRST_COMPLETED)
            if next_end not in done:
                next_end.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await next_end
                return
            stop.cancel()
            try:
                await pods.pod_ended(next_end.result())
            except StopAsyncIteration:
                return
            except Exception:  # one bad end must not stop the others being recorded
                log.exception("recording a pod's end failed; it is reported again on restart")

    async def every(seconds: float, work: object, first_delay: float = 0.0) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(host.stop.wait(), first_delay)
            return
        while not host.stop.is_set():
            try:
                await work()  # type: ignore[operator]
            except Exception:
                log.exception("periodic podwatcher work failed", work=getattr(work, "__name__", ""))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(host.stop.wait(), seconds)

    async def sweep_once() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(host.stop.wait(), SWEEP_DELAY_SECONDS)
            return
        await pods.sweep_lost()
        await host.stop.wait()  # a root task that ends would stop the service

    host.add_root_task("pod-ends", record_ends)
    host.add_root_task("reconcile", lambda: pods.reconcile_loop(host.stop))
    host.add_root_task(
        "usage", lambda: every(settings.usage_interval_seconds, pods.sample_usage, 1.0)
    )
    host.add_root_task(
        "reconfigures", lambda: every(RECONFIGURE_CHECK_SECONDS, pods.check_reconfigures, 5.0)
    )
    host.add_root_task("sweep-lost", sweep_once)

    async def refresh_tokens() -> None:
        written = await backend.refresh_tokens()
        log.debug("job tokens rewritten", pods=written)

    # Job tokens live an hour; rewritten at a quarter of that (and at once, for pods an
    # earlier podwatcher started, whose tokens may have expired meanwhile).
    host.add_root_task("job-tokens", lambda: every(JOB_TOKEN_TTL / 4, refresh_tokens))
    host.add_root_task(
        "inventory", lambda: every(settings.inventory_interval_seconds, pods.check_inventory)
    )


def _consume_events(host: ServiceHost, bus: Bus, pods: PodWatcher) -> None:
    """Admissions, plans, finished jobs and the chiefs' acks, from the bus."""
    consume(
        host,
        bus,
        topics.JOB_ADMITTED,
        durable="podwatcher-admitted",
        batch_handler=AdmittedHandler(pods),
        batch=64,
    )
    consume(
        host,
        bus,
        topics.PLAN,
        durable="podwatcher-plans",
        batch_handler=PlanHandler(pods),
        batch=64,
    )
    consume(
        host, bus, topics.JOB_FINISHED, durable="podwatcher-finished", handler=FinishedHandler(pods)
    )
    consume(
        host, bus, topics.CONTROL_ACK, durable="podwatcher-control-acks", handler=AckHandler(pods)
    )
