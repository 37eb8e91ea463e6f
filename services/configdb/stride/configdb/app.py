"""Configdb's composition root: wires storage, bus consumers and API into a service host."""

from __future__ import annotations

from pathlib import Path

from stride.api.configdb.v1 import configdb_service_pb2, configdb_service_pb2_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.configdb.adapters.inbound.bus_handlers import (
    EventsHandler,
    MetricsHandler,
)
from stride.configdb.adapters.inbound.grpc_api import ACCESS, ConfigDbApi
from stride.configdb.settings import ConfigDbSettings
from stride.configdb.usecases import JobHistory
from stride.runtime.lifecycle import ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
EVENTS_BATCH = 64
"""Job events fetched and stored at once (one transaction per fetch)."""
SERVICE_NAME = configdb_service_pb2.DESCRIPTOR.services_by_name["ConfigDbService"].full_name


def _add_consumers(host: ServiceHost, bus: Bus, history: JobHistory) -> None:
    # A job's events come with every submission: each fetched batch in one transaction.
    consume(
        host,
        bus,
        topics.JOB_SUBMITTED,
        durable="configdb-submitted",
        batch_handler=EventsHandler(history.submitted_all),
        batch=EVENTS_BATCH,
    )
    consume(
        host,
        bus,
        topics.PLAN,
        durable="configdb-plans",
        batch_handler=EventsHandler(history.plans_made),
        batch=EVENTS_BATCH,
    )
    consume(
        host,
        bus,
        topics.JOB_FINISHED,
        durable="configdb-finished",
        batch_handler=EventsHandler(history.finished_all),
        batch=EVENTS_BATCH,
    )
    # Metrics come at a high rate: each fetched batch is stored in one transaction.
    metrics = MetricsHandler(history)
    consume(
        host,
        bus,
        topics.STEP_METRICS,
        durable="configdb-step-metrics",
        batch_handler=metrics,
        batch=128,
    )
    consume(host, bus, topics.POD_USAGE, durable="configdb-usage", batch_handler=metrics, batch=128)


async def build(settings: ConfigDbSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    # Configdb publishes nothing, so it has no outbox: it only records and answers.
    history = JobHistory(database, settings.warm_start_candidates)
    configdb_service_pb2_grpc.add_ConfigDbServiceServicer_to_server(
        ConfigDbApi(history), host.server.server
    )
    _add_consumers(host, bus, history)
    return host
