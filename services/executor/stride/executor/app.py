"""The executor's composition root: registry, runner, NATS queue group and gRPC API.

Stateless (DLRover sec. 4.3: "Since those executors are stateless, we can create more
executors when there are more running jobs"): no database, nothing to migrate, and any
replica can answer any request.
"""

from __future__ import annotations

import contextlib

from stride.api.executor.v1 import executor_service_pb2, executor_service_pb2_grpc
from stride.bus import topics
from stride.executor.adapters.inbound.bus_handlers import RequestHandler
from stride.executor.adapters.inbound.grpc_api import ACCESS, ExecutorApi
from stride.executor.adapters.outbound.workers import WorkerPool, load_registry
from stride.executor.settings import ExecutorSettings
from stride.executor.usecases import AlgorithmRunner
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.wiring import connect_bus, create_host

SERVICE_NAME = executor_service_pb2.DESCRIPTOR.services_by_name["ExecutorService"].full_name


async def build(settings: ExecutorSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    bus = await connect_bus(settings, host)
    try:
        registry = load_registry(settings.registry)
    except (ImportError, AttributeError) as error:
        raise StartupError(f"registry {settings.registry!r} cannot be loaded: {error}") from None
    workers = WorkerPool(
        settings.request_concurrency, settings.request_time_limit_seconds, settings.registry
    )
    await workers.start()

    async def always() -> bool:
        return True

    host.add_dependency(Dependency("algorithm workers", always, workers.close, False))
    runner = AlgorithmRunner(registry, settings.replica_name, workers)
    executor_service_pb2_grpc.add_ExecutorServiceServicer_to_server(
        ExecutorApi(runner), host.server.server
    )
    handler = RequestHandler(runner)
    # Subscribed here, before the host reports started: a request sent once the service is
    # up always finds this replica (a subscription made later by a task raced it).
    subscriptions = [
        await bus.answer_requests(topics.EXECUTOR_RUN, handler)
        for _ in range(settings.request_concurrency)
    ]

    async def drain_on_stop() -> None:
        await host.stop.wait()
        for subscription in subscriptions:
            with contextlib.suppress(Exception):
                await subscription.drain()  # type: ignore[no-untyped-call]

    host.add_root_task("serve-requests", drain_on_stop)
    return host
