"""The optimizer's composition root: wires storage, bus and the plan API into a service host."""

from __future__ import annotations

from pathlib import Path

from stride.api.optimizer.v1 import optimizer_service_pb2, optimizer_service_pb2_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.db.engine import Database
from stride.db.outbox import Outbox
from stride.decisions import build_decisions
from stride.optimizer.adapters.inbound.bus_handlers import (
    AdmittedHandler,
    FinishedHandler,
    MetricsHandler,
    PodFailedHandler,
    ShareHandler,
)
from stride.optimizer.adapters.inbound.grpc_api import ACCESS, OptimizerApi
from stride.optimizer.adapters.inbound.straggler_events import StragglerHandler
from stride.optimizer.adapters.outbound.admission import AdmissionShares
from stride.optimizer.adapters.outbound.history import ConfigDbHistory
from stride.optimizer.db.tables import outbox as outbox_table
from stride.optimizer.domain.feeding import FeedRule
from stride.optimizer.domain.observations import WindowRule
from stride.optimizer.settings import OptimizerSettings
from stride.optimizer.stragglers import StragglerEvents
from stride.optimizer.usecases import STAGE_STEP, Capacity, Planning
from stride.policy.goldminer import AllocationPolicy
from stride.policy.stages import search_space
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database, relay_outbox

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = optimizer_service_pb2.DESCRIPTOR.services_by_name["OptimizerService"].full_name
ADMITTED_DURABLE = "optimizer-admitted"
FINISHED_DURABLE = "optimizer-finished"
SHARE_DURABLE = "optimizer-shares"
POD_FAILED_DURABLE = "optimizer-pod-failed"
STEP_METRICS_DURABLE = "optimizer-step-metrics"
ADMITTED_BATCH = 64
"""Admissions stored together at most (a stream of submissions comes in batches)."""
USAGE_DURABLE = "optimizer-usage"
STRAGGLERS_DURABLE = "optimizer-stragglers"
METRICS_BATCH = 128
"""Metrics fetched and applied at once (one transaction per fetch)."""


async def build(settings: OptimizerSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    outbox = Outbox(outbox_table)
    decisions = build_decisions(
        settings.decisions,
        bus,
        settings.decision_timeout_seconds,
        settings.decision_silence_seconds,
    )
    history = None
    if settings.configdb_address:
        history = ConfigDbHistory(settings.configdb_address)
        host.add_dependency(Dependency("config DB channel", _always, history.close, False))
    shares = None
    if settings.admission_address:
        shares = AdmissionShares(settings.admission_address)
        host.add_dependency(Dependency("admission channel", _always, shares.close, False))
    planning = Planning(
        database,
        outbox,
        decisions.adjust,
        settings.max_pod_cpu,
        window=WindowRule(tick_seconds=settings.tick_seconds),
        space=search_space(settings.max_pod_cpu, settings.max_job_cpu),
        min_plan_interval_seconds=settings.min_plan_interval_seconds,
        override_hold_seconds=settings.override_hold_seconds,
        history=history,
        capacity=(
            Capacity(settings.cluster_cpu, settings.cluster_memory_gib)
            if settings.cluster_cpu is not None and settings.cluster_memory_gib is not None
            else None
        ),
        enforce_shares=settings.enforce_shares,
        shares=shares,
        fallback=build_decisions(
            {STAGE_STEP.name: "inprocess"}, None, settings.decision_timeout_seconds
        ).adjust,
        tune=decisions.tune_data_workers if settings.tune_data_workers else None,
        feed=FeedRule(
            interval_seconds=settings.tuning_interval_seconds,
            cpu_unit=settings.data_worker_cpu_unit,
            max_data_worker_cpu=settings.max_data_worker_cpu,
            max_data_workers=settings.max_data_workers,
        ),
        allocate=(
            AllocationPolicy(settings.data_worker_allocation)
            if settings.data_worker_allocation != "off"
            else None
        ),
    )
    optimizer_service_pb2_grpc.add_OptimizerServiceServicer_to_server(
        OptimizerApi(planning), host.server.server
    )
    relay_outbox(host, outbox, database, bus)
    _consume_facts(host, bus, planning, database, settings.ack_wait_seconds)
    host.add_root_task("due-decisions", lambda: planning.due.run(host.stop))
    allocation = planning.allocation
    if allocation is not None:
        interval = settings.allocation_interval_seconds
        host.add_root_task("data-worker-allocation", lambda: allocation.run(host.stop, interval))
    return host


def _consume_facts(
    host: ServiceHost, bus: Bus, planning: Planning, database: Database, ack_wait: float
) -> None:
    """The facts the optimizer acts on: admissions, ends, shares, pod failures, metrics
    and stragglers, each on its durable consumer."""
    consume(
        host,
        bus,
        topics.JOB_ADMITTED,
        durable=ADMITTED_DURABLE,
        batch_handler=AdmittedHandler(planning),
        batch=ADMITTED_BATCH,
        ack_wait=ack_wait,
    )
    consume(
        host,
        bus,
        topics.JOB_FINISHED,
        durable=FINISHED_DURABLE,
        handler=FinishedHandler(planning),
        ack_wait=ack_wait,
    )
    consume(
        host,
        bus,
        topics.JOB_SHARE,
        durable=SHARE_DURABLE,
        handler=ShareHandler(planning),
        ack_wait=ack_wait,
    )
    consume(
        host,
        bus,
        topics.POD_FAILED,
        durable=POD_FAILED_DURABLE,
        handler=PodFailedHandler(planning),
        ack_wait=ack_wait,
    )
    # Metrics come at a high rate: each fetched batch is applied in one transaction.
    metrics = MetricsHandler(planning)
    consume(
        host,
        bus,
        topics.STEP_METRICS,
        durable=STEP_METRICS_DURABLE,
        batch_handler=metrics,
        batch=METRICS_BATCH,
        ack_wait=ack_wait,
    )
    consume(
        host,
        bus,
        topics.POD_USAGE,
        durable=USAGE_DURABLE,
        batch_handler=metrics,
        batch=METRICS_BATCH,
        ack_wait=ack_wait,
    )
    consume(
        host,
        bus,
        topics.STRAGGLER_DETECTED,
        durable=STRAGGLERS_DURABLE,
        handler=StragglerHandler(StragglerEvents(database)),
        ack_wait=ack_wait,
    )


async def _always() -> bool:
    """The config DB is optional: its absence never makes the optimizer unhealthy."""
    return True
