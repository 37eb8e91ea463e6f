"""Configdb's composition root: wires storage, bus consumers and API into a service host."""

from __future__ import annotations

from pathlib import Path

from stride.api.configdb.v1 import configdb_service_pb2, configdb_service_pb2_grpc
from stride.bus.client import Bus
from stride.configdb.adapters.bus_handlers import FinishedHandler, PlanHandler, SubmittedHandler
from stride.configdb.adapters.grpc_api import ConfigDbApi
from stride.configdb.history import JobHistory
from stride.configdb.settings import ConfigDbSettings
from stride.events.v1 import job_pb2, plan_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = configdb_service_pb2.DESCRIPTOR.services_by_name["ConfigDbService"].full_name


def _add_consumers(host: ServiceHost, bus: Bus, history: JobHistory) -> None:
    consume(
        host,
        bus,
        "consume-submitted",
        stream="STRIDE_JOBS",
        durable="configdb-submitted",
        filter_subject="stride.jobs.v1.submitted.*",
        message_type=job_pb2.JobSubmitted,
        handler=SubmittedHandler(history),
    )
    consume(
        host,
        bus,
        "consume-plans",
        stream="STRIDE_PLANS",
        durable="configdb-plans",
        filter_subject="stride.plans.v1.*",
        message_type=plan_pb2.ResourcePlan,
        handler=PlanHandler(history),
    )
    consume(
        host,
        bus,
        "consume-finished",
        stream="STRIDE_JOBS",
        durable="configdb-finished",
        filter_subject="stride.jobs.v1.finished.*",
        message_type=job_pb2.JobFinished,
        handler=FinishedHandler(history),
    )


async def build(settings: ConfigDbSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME])
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    # Configdb publishes nothing, so it has no outbox: it only records and answers.
    history = JobHistory(database, settings.warm_start_candidates)
    configdb_service_pb2_grpc.add_ConfigDbServiceServicer_to_server(
        ConfigDbApi(history), host.server.server
    )
    _add_consumers(host, bus, history)
    return host
