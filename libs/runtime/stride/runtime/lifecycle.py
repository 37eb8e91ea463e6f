"""A service process's life: start, supervise root tasks, and shut down in order.

Signal handlers only set the stop event. Root tasks are supervised: when one ends or
crashes, all stop. Shutdown goes health NOT_SERVING, then the gRPC server's grace period
and the bus drain, then the root tasks are cancelled with a bounded wait, then storage is
disposed and telemetry flushed. A hard-exit watchdog ends the process if any of that hangs.

Garbage: full collections run from a root task when the loop is quiet, not in the middle
of a request (:mod:`.collector`).

Health: the service names report readiness (their dependencies reachable). A host may also
report health names of its own (:meth:`ServiceHost.add_health_check`), for conditions an
operator must be alerted to that do not make the service unready, such as parked outbox
events; they are checked on the same beat.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from stride.obs.logging import configure_logging
from stride.obs.metrics import start_metrics_server
from stride.obs.secrets import redact
from stride.obs.tracing import configure_tracing, shutdown_tracing
from stride.runtime.collector import Collector
from stride.runtime.errors import StartupError
from stride.runtime.grpc_server import GrpcServer
from stride.runtime.settings import ServiceSettings, SettingsT, load_settings
from stride.runtime.tokens import Revocations, Verifier

log = structlog.get_logger(__name__)

EXIT_OK = 0
EXIT_TASK_FAILED = 1
EXIT_STARTUP_FAILED = 2
EXIT_WATCHDOG = 70
WATCHDOG_MARGIN_SECONDS = 5.0
"""Extra time beyond the grace period before the watchdog kills the process."""
STRAGGLER_WAIT_SECONDS = 3.0
"""How long cancelled root tasks get to finish their cleanup."""


@dataclass
class Dependency:
    """Something the service needs to be healthy (NATS, a database)."""

    name: str
    healthy: Callable[[], Awaitable[bool]]
    close: Callable[[], Coroutine[Any, Any, None]]
    closes_early: bool
    """True for the bus (drained with the server), False for storage (disposed last)."""


class ServiceHost:
    """Runs one service: its gRPC server, its dependencies and its root tasks."""

    def __init__(
        self,
        settings: ServiceSettings,
        server: GrpcServer,
        revocations: Revocations | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.settings = settings
        self.server = server
        self.stop = asyncio.Event()
        self.started = asyncio.Event()
        self.dependencies: list[Dependency] = []
        self._root_factories: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}
        self._serving = False
        self._health_checks: dict[str, Callable[[], Awaitable[bool]]] = {}
        self._health_reported: dict[str, bool] = {}
        self.collector = Collector()
        """Runs full garbage collections when the loop is quiet (:mod:`.collector`)."""
        self.revocations = revocations
        """The revoked tokens its server refuses, when it verifies tokens (filled from the
        bus: ``stride.wiring.connect_bus``)."""
        self.verifier = verifier
        """What its server checks tokens with (None in plain text)."""

    def add_dependency(self, dependency: Dependency) -> None:
        """Track a dependency for health and shutdown."""
        self.dependencies.append(dependency)

    def add_health_check(self, name: str, healthy: Callable[[], Awaitable[bool]]) -> None:
        """Report ``name`` as a gRPC health name of its own: SERVING while ``healthy()`` is
        True, NOT_SERVING otherwise (also if it raises), checked with the dependencies.

        For what an operator must see but that does not make the service unready (parked
        outbox events): the service names' readiness does not depend on it.
        """
        if name in self._health_checks or name in self.server.service_names:
            raise ValueError(f"health name {name!r} added twice")
        self._health_checks[name] = healthy

    def add_root_task(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``factory()`` as a supervised root task; it should return when ``stop`` is set."""
        if name in self._root_factories:
            raise ValueError(f"root task {name!r} added twice")
        self._root_factories[name] = factory

    async def _check_health(self) -> bool:
        results = await asyncio.gather(
            *(d.healthy() for d in self.dependencies), return_exceptions=True
        )
        unhealthy = [
            d.name for d, ok in zip(self.dependencies, results, strict=True) if ok is not True
        ]
        serving = not unhealthy
        if serving != self._serving:
            log.info("health changed", serving=serving, unhealthy=unhealthy)
            await self.server.set_serving(serving)
            self._serving = serving
        await self._check_own_health_names()
        return serving

    async def _check_own_health_names(self) -> None:
        names = list(self._health_checks)
        results = await asyncio.gather(
            *(self._health_checks[name]() for name in names), return_exceptions=True
        )
        for name, result in zip(names, results, strict=True):
            healthy = result is True
            if self._health_reported.get(name) == healthy:
                continue
            if isinstance(result, BaseException):
                log.warning("health check failed", health_name=name, error=str(result))
            log.info("health changed", health_name=name, serving=healthy)
            await self.server.set_health(name, healthy)
            self._health_reported[name] = healthy

    async def _collect_garbage(self) -> None:
        await self.collector.run(self.stop)

    async def _health_monitor(self) -> None:
        while not self.stop.is_set():
            await self._check_health()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.settings.health_interval_seconds)

    async def run(self, handle_signals: bool = True) -> int:
        """Serve until SIGTERM/SIGINT or a root task ends; returns the exit code.

        ``handle_signals=False`` is for running a service inside a test's event loop.
        """
        if handle_signals:
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop.set)
        port = await self.server.start()
        await self._check_health()
        self.started.set()
        log.info("service started", grpc_port=port, services=self.server.service_names)
        factories = {
            **self._root_factories,
            "health": self._health_monitor,
            "garbage collector": self._collect_garbage,
        }
        tasks = {asyncio.create_task(factory(), name=name) for name, factory in factories.items()}
        stop_waiter = asyncio.create_task(self.stop.wait())
        done, _ = await asyncio.wait({*tasks, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
        exit_code = EXIT_OK
        for task in done - {stop_waiter}:
            if task.cancelled():
                continue
            error = task.exception()
            if error is not None:
                log.error(
                    "root task crashed; stopping",
                    task=task.get_name(),
                    error=f"{type(error).__name__}: {error}",
                    exc_info=error,
                )
                exit_code = EXIT_TASK_FAILED
            elif not self.stop.is_set():
                log.error("root task ended unexpectedly; stopping", task=task.get_name())
                exit_code = EXIT_TASK_FAILED
        self.stop.set()
        stop_waiter.cancel()
        await self._shutdown(tasks)
        return exit_code

    async def _shutdown(self, tasks: set[asyncio.Task[None]]) -> None:
        grace = self.settings.shutdown_grace_seconds
        watchdog = _start_watchdog(grace + STRAGGLER_WAIT_SECONDS + WATCHDOG_MARGIN_SECONDS)
        log.info("shutting down", grace_seconds=grace)
        await self.server.set_serving(False)
        early = [d.close() for d in self.dependencies if d.closes_early]
        await asyncio.gather(self.server.stop(grace), *early, return_exceptions=True)
        for task in tasks:
            task.cancel()
        _, stragglers = (
            await asyncio.wait(tasks, timeout=STRAGGLER_WAIT_SECONDS) if tasks else ((), ())
        )
        for task in stragglers:
            log.warning("root task did not stop in time", task=task.get_name())
        late = [d.close() for d in self.dependencies if not d.closes_early]
        await asyncio.gather(*late, return_exceptions=True)
        shutdown_tracing()
        watchdog.cancel()
        log.info("stopped")


def _start_watchdog(seconds: float) -> threading.Timer:
    def hard_exit() -> None:
        sys.stderr.write(f"shutdown took longer than {seconds:g}s; exiting hard\n")
        os._exit(EXIT_WATCHDOG)

    timer = threading.Timer(seconds, hard_exit)
    timer.daemon = True
    timer.start()
    return timer


def run_service(
    settings_class: type[SettingsT],
    build: Callable[[SettingsT], Awaitable[ServiceHost]],
    migrate: Callable[[SettingsT], None] | None,
    argv: Sequence[str] | None = None,
) -> int:
    """The ``python -m stride.<service>`` entry point: ``serve`` (default) or ``migrate``.

    Any :class:`StartupError` becomes a single log line and exit code 2, not a traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "serve"
    service = settings_class.service_name
    if command not in ("serve", "migrate"):
        print(f"usage: python -m stride.{service} [serve|migrate]", file=sys.stderr)
        return EXIT_STARTUP_FAILED
    try:
        settings = load_settings(settings_class)
        configure_logging(service, settings.log_level, settings.log_json)
        if command == "migrate":
            if migrate is None:
                raise StartupError(f"{service} owns no database; there is nothing to migrate")
            migrate(settings)
            log.info("migrated", service=service)
            return EXIT_OK
        configure_tracing(service, settings.otlp_endpoint)
        start_metrics_server(settings.metrics_port)
        return asyncio.run(_serve(build, settings))
    except StartupError as error:
        log.error("startup failed", error=str(error))
        print(f"stride.{service}: {redact(str(error))}", file=sys.stderr)
        return EXIT_STARTUP_FAILED


async def _serve(build: Callable[[SettingsT], Awaitable[ServiceHost]], settings: SettingsT) -> int:
    host = await build(settings)
    return await host.run()
