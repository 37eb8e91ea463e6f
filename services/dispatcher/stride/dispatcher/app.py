"""The dispatcher's composition root: wires storage, bus and the shard API into a service host."""

from __future__ import annotations

from pathlib import Path

from stride.api.dispatcher.v1 import dispatcher_service_pb2, dispatcher_service_pb2_grpc
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.grpc_api import DispatcherApi
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.dispatching import ShardDispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.runtime.lifecycle import ServiceHost
from stride.wiring import connect_bus, create_host, open_database, relay_outbox

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = dispatcher_service_pb2.DESCRIPTOR.services_by_name["DispatcherService"].full_name


async def build(settings: DispatcherSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME])
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    outbox = Outbox(outbox_table)
    dispatcher = ShardDispatcher(database, outbox, settings.lease_duration)
    dispatcher_service_pb2_grpc.add_DispatcherServiceServicer_to_server(
        DispatcherApi(dispatcher), host.server.server
    )
    # Shard events (done, failed, requeued) leave through the outbox. Consuming pod events
    # (lost pods), the lease sweeper and straggler detection arrive with the shard
    # dispatcher issue as further root tasks here.
    relay_outbox(host, outbox, database, bus)
    return host
