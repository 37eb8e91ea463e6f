"""Admission's composition root: wires storage, bus, policy and API into a service host."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from pathlib import Path

import structlog
import yaml

from stride.admission.adapters.inbound.bus_handlers import (
    FinishedHandler,
    InventoryHandler,
    PlanHandler,
)
from stride.admission.adapters.inbound.grpc_api import ACCESS, AdmissionApi, ReplayClockApi
from stride.admission.adapters.outbound.history import ConfigDbRuns
from stride.admission.db.tables import outbox as outbox_table
from stride.admission.domain.gputree import GpuTree
from stride.admission.domain.quotas import Quota, quotas_from_config
from stride.admission.settings import AdmissionSettings
from stride.admission.share_requests import ShareRequests
from stride.admission.usecases import Clock, Cluster, SteppedClock, Submissions, wall_clock
from stride.api.admission.v1 import admission_service_pb2, admission_service_pb2_grpc
from stride.bus import topics
from stride.db.outbox import Outbox
from stride.policy.elasticflow.units import GIB, CpuUnit, cpu_capacity
from stride.runtime.auth import RateLimiter
from stride.runtime.errors import InvalidArgument, StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.runtime.machine import machine_cores, machine_memory_bytes
from stride.wiring import connect_bus, consume, create_host, open_database, relay_outbox

log = structlog.get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = admission_service_pb2.DESCRIPTOR.services_by_name["AdmissionService"].full_name
CLOCK_SERVICE_NAME = admission_service_pb2.DESCRIPTOR.services_by_name[
    "ReplayClockService"
].full_name


async def build(settings: AdmissionSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    quotas = configured_quotas(settings)  # a bad file stops start-up before anything opens
    names = [SERVICE_NAME, CLOCK_SERVICE_NAME] if settings.replay_stepped else [SERVICE_NAME]
    host = create_host(settings, names, ACCESS)
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    outbox = Outbox(outbox_table)
    history = None
    if settings.configdb_address:
        history = ConfigDbRuns(settings.configdb_address)
        host.add_dependency(Dependency("config DB channel", _always, history.close, False))
    submissions = Submissions(
        database,
        outbox,
        cluster(settings),
        replay_clock(settings),
        settings.replay_speedup,
        history,
        settings.default_max_active_jobs,
    )
    requests = ShareRequests(submissions)
    submissions.capacity_freed = requests.settle  # a job's end settles the queued requests
    admission_service_pb2_grpc.add_AdmissionServiceServicer_to_server(
        AdmissionApi(submissions, submission_rate(settings), requests), host.server.server
    )
    if settings.replay_stepped:
        admission_service_pb2_grpc.add_ReplayClockServiceServicer_to_server(
            ReplayClockApi(submissions), host.server.server
        )
    relay_outbox(host, outbox, database, bus)

    async def rounds_until_stop() -> None:
        """Slot-boundary rounds are timers; they stop with the service."""
        await host.stop.wait()
        submissions.close()

    host.add_root_task("admission-rounds", rounds_until_stop)
    await submissions.load_quotas(quotas)
    await submissions.resume()
    await submissions.decide_pending()
    consume(
        host,
        bus,
        topics.JOB_FINISHED,
        durable="admission-finished",
        handler=FinishedHandler(submissions),
    )
    consume(
        host,
        bus,
        topics.PLAN,
        durable="admission-plans",
        handler=PlanHandler(requests),
    )
    if settings.capacity_source == "nodes":
        consume(
            host,
            bus,
            topics.NODE_INVENTORY,
            durable="admission-inventory",
            handler=InventoryHandler(submissions),
        )
    return host


def submission_rate(settings: AdmissionSettings) -> RateLimiter | None:
    """The token bucket per user of SubmitJob (None: the rate is off)."""
    if not settings.submit_rate_per_second:
        return None
    return RateLimiter(settings.submit_rate_per_second, settings.submit_rate_burst)


def configured_quotas(settings: AdmissionSettings) -> tuple[Quota, ...]:
    """The quotas file's quotas; a bad file stops start-up naming the entry and field."""
    if settings.quotas_file is None:
        return ()
    try:
        data = yaml.safe_load(settings.quotas_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise StartupError(f"quotas_file {settings.quotas_file}: {error}") from None
    try:
        return quotas_from_config(data)
    except InvalidArgument as error:
        raise StartupError(f"{settings.quotas_file}: {error}") from None


def replay_clock(settings: AdmissionSettings) -> Clock:
    """The wall clock, a replay's accelerated one (``replay_speedup`` > 1) or its stepped
    one (``replay_stepped``)."""
    if settings.replay_stepped:
        assert settings.replay_origin is not None  # the settings require it
        log.warning("replay clock: stepped, moved only by ReplayClockService.Advance")
        return SteppedClock(settings.replay_origin)
    if settings.replay_speedup == 1.0:
        return wall_clock
    speedup = settings.replay_speedup
    origin = settings.replay_origin if settings.replay_origin is not None else time.time()
    log.warning("replay clock: time runs faster than the wall clock", speedup=speedup)

    def accelerated() -> datetime:
        return datetime.fromtimestamp(origin + (time.time() - origin) * speedup, UTC)

    return accelerated


def cluster(settings: AdmissionSettings) -> Cluster:
    """What admission plans on, from its settings (this machine's cores and memory when no
    CPU capacity is set), with the curves table if one is configured."""
    if settings.cluster_cpu is not None and settings.cluster_memory_gib is not None:
        cpu, memory = settings.cluster_cpu, int(settings.cluster_memory_gib * GIB)
    else:
        cpu, memory = float(machine_cores()), machine_memory_bytes()
    unit_memory = settings.cpu_unit_memory_gib
    if unit_memory is None:  # the cluster's memory per core, in quarters of a GiB
        per_core = memory / GIB / cpu * settings.cpu_unit_cores
        unit_memory = max(0.25, math.floor(per_core * 4) / 4)
    unit = CpuUnit(settings.cpu_unit_cores, int(unit_memory * GIB))
    curves = {}
    if settings.curves_dir is not None:
        from stride.sim.traces import load_curves  # the simulator's tables, made concave alike

        curves = load_curves(settings.curves_dir).curves
    planned = Cluster(
        gpus=settings.cluster_gpus,
        cpu_units=cpu_capacity(cpu, memory, unit),
        unit=unit,
        curves=curves,
        tree=GpuTree.parse(settings.cluster_topology) if settings.cluster_topology else None,
    )
    log.info(
        "admission plans on",
        gpus=planned.gpus,
        cpu_units=planned.cpu_units,
        unit_cores=unit.cpu,
        unit_memory_gib=unit.memory_bytes / GIB,
        known_curves=len(curves),
        gpu_tree=planned.tree.shape if planned.tree is not None else "counted",
    )
    return planned


async def _always() -> bool:
    """The config DB channel needs no check: a call that fails is logged and the job is
    planned without a warm-start curve."""
    return True
