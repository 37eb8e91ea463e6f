"""The optimizer's composition root: wires storage, bus and the plan API into a service host."""

from __future__ import annotations

from pathlib import Path

from stride.api.optimizer.v1 import optimizer_service_pb2, optimizer_service_pb2_grpc
from stride.bus import subjects
from stride.db.outbox import Outbox
from stride.events.v1 import job_pb2
from stride.optimizer.adapters.bus_handlers import AdmittedHandler, FinishedHandler
from stride.optimizer.adapters.grpc_api import OptimizerApi
from stride.optimizer.db.tables import outbox as outbox_table
from stride.optimizer.planning import Planning
from stride.optimizer.settings import OptimizerSettings
from stride.runtime.lifecycle import ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database, relay_outbox

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = optimizer_service_pb2.DESCRIPTOR.services_by_name["OptimizerService"].full_name
ADMITTED_DURABLE = "optimizer-admitted"
FINISHED_DURABLE = "optimizer-finished"
JOBS_STREAM = "STRIDE_JOBS"


async def build(settings: OptimizerSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME])
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    outbox = Outbox(outbox_table)
    planning = Planning(database, outbox, settings.max_pod_cpu)
    optimizer_service_pb2_grpc.add_OptimizerServiceServicer_to_server(
        OptimizerApi(planning), host.server.server
    )
    relay_outbox(host, outbox, database, bus)
    consume(
        host,
        bus,
        "consume-admitted",
        stream=JOBS_STREAM,
        durable=ADMITTED_DURABLE,
        filter_subject=subjects.job_decision("admitted", "*"),
        message_type=job_pb2.AdmissionDecision,
        handler=AdmittedHandler(planning),
        ack_wait=settings.ack_wait_seconds,
    )
    consume(
        host,
        bus,
        "consume-finished",
        stream=JOBS_STREAM,
        durable=FINISHED_DURABLE,
        filter_subject=subjects.job_finished("*"),
        message_type=job_pb2.JobFinished,
        handler=FinishedHandler(planning),
        ack_wait=settings.ack_wait_seconds,
    )
    return host
