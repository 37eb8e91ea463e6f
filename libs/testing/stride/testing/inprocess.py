"""Run a service inside the test's event loop, with its real gRPC server, bus and database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from stride.runtime.lifecycle import ServiceHost
from stride.runtime.settings import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)


@asynccontextmanager
async def running_service(
    build: Callable[[S], Awaitable[ServiceHost]], settings: S, start_timeout: float = 30.0
) -> AsyncIterator[ServiceHost]:
    """Build and run a service until the block exits, then shut it down in order.

    ``host.server.port`` is the bound gRPC port (ask for port 0 in settings).
    """
    host = await build(settings)
    task = asyncio.create_task(host.run(handle_signals=False))
    started = asyncio.create_task(host.started.wait())
    done, _ = await asyncio.wait(
        {task, started}, timeout=start_timeout, return_when=asyncio.FIRST_COMPLETED
    )
    if task in done:
        started.cancel()
        raise RuntimeError(
            f"{settings.service_name} exited during startup with code {task.result()}"
        )
    if started not in done:
        host.stop.set()
        raise RuntimeError(f"{settings.service_name} did not start within {start_timeout:g}s")
    try:
        yield host
    finally:
        host.stop.set()
        await asyncio.wait_for(task, settings.shutdown_grace_seconds + 10)


def local_settings(settings_class: type[S], **values: Any) -> S:
    """Settings for a service run inside a test: a free port on loopback, fast health checks.

    ``values`` (nats_url, database_url, ...) are passed through and may override these.
    """
    defaults: dict[str, Any] = {
        "grpc_port": 0,
        "grpc_host": "127.0.0.1",
        "health_interval_seconds": 0.2,
    }
    return settings_class(**{**defaults, **values})
