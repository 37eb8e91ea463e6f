"""Admission's composition root: wires storage, bus, policy and API into a service host."""

from __future__ import annotations

from pathlib import Path

from stride.admission.adapters.inbound.bus_handlers import FinishedHandler
from stride.admission.adapters.inbound.grpc_api import AdmissionApi
from stride.admission.db.tables import outbox as outbox_table
from stride.admission.settings import AdmissionSettings
from stride.admission.usecases import Submissions
from stride.api.admission.v1 import admission_service_pb2, admission_service_pb2_grpc
from stride.bus import topics
from stride.db.outbox import Outbox
from stride.decisions import build_decisions
from stride.runtime.lifecycle import ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database, relay_outbox

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = admission_service_pb2.DESCRIPTOR.services_by_name["AdmissionService"].full_name


async def build(settings: AdmissionSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME])
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    outbox = Outbox(outbox_table)
    decisions = build_decisions(
        settings.decisions,
        bus,
        settings.decision_timeout_seconds,
        settings.decision_attempt_seconds,
    )
    submissions = Submissions(database, outbox, decisions.admit)
    admission_service_pb2_grpc.add_AdmissionServiceServicer_to_server(
        AdmissionApi(submissions), host.server.server
    )
    relay_outbox(host, outbox, database, bus)
    await submissions.decide_pending()
    consume(
        host,
        bus,
        topics.JOB_FINISHED,
        durable="admission-finished",
        handler=FinishedHandler(submissions),
    )
    return host
