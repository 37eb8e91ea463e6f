"""The podwatcher's composition root: wires storage, backend, bus and API into a host."""

from __future__ import annotations

from pathlib import Path

from stride.api.podwatcher.v1 import podwatcher_service_pb2, podwatcher_service_pb2_grpc
from stride.bus import topics
from stride.podwatcher.adapters.inbound.bus_handlers import PlanHandler
from stride.podwatcher.adapters.inbound.grpc_api import PodWatcherApi
from stride.podwatcher.adapters.outbound.backends.base import Backend
from stride.podwatcher.adapters.outbound.backends.local import LocalBackend, detect_local_node
from stride.podwatcher.settings import PodWatcherSettings
from stride.podwatcher.usecases import PlanRecords
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = podwatcher_service_pb2.DESCRIPTOR.services_by_name["PodWatcherService"].full_name


def make_backend(settings: PodWatcherSettings) -> Backend:
    """The backend the settings name; fails startup clearly for one not built yet."""
    if settings.backend == "local":
        return LocalBackend(detect_local_node())
    raise StartupError(
        f"the {settings.backend} backend is not implemented yet; "
        "set STRIDE_PODWATCHER_BACKEND=local"
    )


async def build(settings: PodWatcherSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    backend = make_backend(settings)
    host = create_host(settings, [SERVICE_NAME])
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    # No outbox yet: nothing is published until the backends report pod events.
    records = PlanRecords(database, backend)
    podwatcher_service_pb2_grpc.add_PodWatcherServiceServicer_to_server(
        PodWatcherApi(records), host.server.server
    )
    consume(host, bus, topics.PLAN, durable="podwatcher-plans", handler=PlanHandler(records))
    return host
