"""Algorithms run in worker processes that can be stopped: the executor's time limit.

A thread cannot be stopped, so an algorithm run in one (as the executor did) holds a core
for as long as its arguments make it run, and a request with a huge search keeps it busy
indefinitely. Here each of the replica's ``request_concurrency`` slots is a worker process
(``spawn``: no forked locks or event loop) that imports the registry once and stays warm;
the first starts with the service, the others when requests first overlap.
A run that passes the time limit is stopped by killing its worker; a new worker takes its
place (in the background, a second or two of imports), and the caller gets
:class:`TimedOut`. A caller that goes away (a cancelled RPC) has its run stopped the same
way, so no abandoned search keeps a slot.

A worker ends with the service that started it, however the service ends: killed with
SIGKILL, a worker would otherwise run its search to the end for nobody, holding a core
beside the replica that replaced the service.

Nothing but plain values crosses the pipe: the algorithm's name, version, arguments and
job id; back, its reply as a dict and its plans as serialized protobufs, or what went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import multiprocessing.connection
import os
import threading
import traceback
from collections.abc import Callable, Coroutine
from multiprocessing.process import BaseProcess
from typing import Any

import structlog

from stride.events.v1 import plan_pb2
from stride.executor.adapters.convert import dict_to_struct, plan_to_proto, proposed_plans
from stride.executor.usecases import AlgorithmFailed, Outcome, TimedOut
from stride.policy.registry import InvalidRequest, Registry, to_dict
from stride.runtime.errors import InvalidArgument

log = structlog.get_logger(__name__)

DEFAULT_REGISTRY = "stride.policy.registry:default_registry"
STOP_GRACE_SECONDS = 2.0
PARENT_GONE_EXIT_CODE = 75
"""A worker's exit status when it ends because its service died (EX_TEMPFAIL)."""


def load_registry(path: str) -> Registry:
    """The registry a ``module:function`` path makes (the function takes no arguments)."""
    module_name, _, function_name = path.partition(":")
    factory: Callable[[], Registry] = getattr(importlib.import_module(module_name), function_name)
    return factory()


def _exit_with_parent() -> None:
    """End this process as soon as its parent dies (a thread waits on the parent's sentinel,
    which multiprocessing closes when the parent is gone; the main thread may be deep in a
    search and reads the pipe only between requests)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(PARENT_GONE_EXIT_CODE)

    threading.Thread(target=watch, name="stride-executor-parent", daemon=True).start()


def _serve(connection: multiprocessing.connection.Connection, registry_path: str) -> None:
    """A worker's life: answer requests until the pipe closes or its service dies."""
    _exit_with_parent()
    registry = load_registry(registry_path)
    connection.send(("ready",))
    while True:
        try:
            message = connection.recv()
        except EOFError:
            return
        if message is None:
            return
        name, version, arguments, job_id = message
        try:
            spec = registry.get(name, version)
            reply = spec.run_typed(spec.parse_request(arguments))
            plans = [
                plan_to_proto(plan, job_id).SerializeToString() for plan in proposed_plans(reply)
            ]
            answer: tuple[Any, ...] = ("ok", to_dict(reply), plans)
        except InvalidRequest as error:
            answer = ("invalid", error.field, error.problem)
        except Exception as error:
            answer = ("failed", f"{type(error).__name__}: {error}", traceback.format_exc())
        try:
            connection.send(answer)
        except (BrokenPipeError, OSError):
            return  # the service is gone (killed meanwhile): nobody to answer


class _Worker:
    def __init__(self, context: multiprocessing.context.SpawnContext, registry: str) -> None:
        self.connection, child = context.Pipe()
        self.process: BaseProcess = context.Process(
            target=_serve, args=(child, registry), name="stride-executor-worker", daemon=True
        )
        self.process.start()
        child.close()

    def ready(self, timeout: float) -> bool:
        try:
            return self.connection.poll(timeout) and self.connection.recv() == ("ready",)
        except (EOFError, OSError):  # it died while starting (its log says why)
            return False

    def kill(self) -> None:
        self.process.kill()
        self.process.join(STOP_GRACE_SECONDS)
        self.connection.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.send(None)
        self.process.join(STOP_GRACE_SECONDS)
        if self.process.is_alive():
            self.kill()
        self.connection.close()


class WorkerPool:
    """``size`` warm worker processes; :meth:`run` runs one algorithm within a time limit."""

    def __init__(
        self,
        size: int,
        time_limit_seconds: float,
        registry: str = DEFAULT_REGISTRY,
        start_timeout_seconds: float = 60.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"size: must be >= 1, got {size}")
        self.size = size
        self.time_limit_seconds = time_limit_seconds
        self.registry = registry
        self.start_timeout_seconds = start_timeout_seconds
        self._context = multiprocessing.get_context("spawn")
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._replacing: set[asyncio.Task[None]] = set()
        self._all: set[_Worker] = set()
        self._starting = 0
        """Workers being spawned (counted in the slots until they are ready or fail)."""
        self.stopped = 0
        """Runs stopped at the time limit (or abandoned by their caller)."""

    async def start(self) -> None:
        """Start the first worker; returns once it has imported the registry (so a broken
        registry fails start-up). The others start when requests first overlap
        (:meth:`run`), so a replica that never runs two at once holds one worker's memory
        and start-up costs one worker's imports."""
        await self._add()

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        async def logged() -> None:
            try:
                await work
            except Exception as error:  # the slot stays empty; the others still serve
                log.error("could not start an executor worker", error=str(error))

        task = asyncio.create_task(logged())
        self._replacing.add(task)
        task.add_done_callback(self._replacing.discard)

    async def _add(self) -> None:
        self._starting += 1
        try:
            worker = await asyncio.to_thread(_Worker, self._context, self.registry)
        finally:
            self._starting -= 1
        if len(self._all) >= self.size:  # a replacement and a new slot crossed: one too many
            await asyncio.to_thread(worker.close)
            return
        self._all.add(worker)
        if not await asyncio.to_thread(worker.ready, self.start_timeout_seconds):
            self._all.discard(worker)
            await asyncio.to_thread(worker.kill)
            raise RuntimeError(
                f"an executor worker did not load {self.registry} within "
                f"{self.start_timeout_seconds:g}s"
            )
        self._idle.put_nowait(worker)

    def _replace(self, worker: _Worker) -> None:
        """Kill ``worker`` and start another in its slot, off the caller's path."""
        self._all.discard(worker)

        async def replace() -> None:
            await asyncio.to_thread(worker.kill)
            await self._add()

        self._in_background(replace())

    async def run(
        self, name: str, version: int | None, arguments: dict[str, Any], job_id: str
    ) -> Outcome:
        """Run one algorithm in a worker; raises InvalidArgument, AlgorithmFailed, TimedOut."""
        if self._idle.empty() and len(self._all) + self._starting < self.size:
            self._in_background(self._add())  # requests overlap: one more slot
        worker = await self._idle.get()
        limit = self.time_limit_seconds
        healthy = False
        try:
            await asyncio.to_thread(worker.connection.send, (name, version, arguments, job_id))
            if not await asyncio.to_thread(worker.connection.poll, limit):
                self.stopped += 1
                raise TimedOut(
                    f"{name} ran past the executor's time limit of {limit:g} s per request and "
                    "was stopped; ask for less work (a smaller search) or raise "
                    "STRIDE_EXECUTOR_REQUEST_TIME_LIMIT_SECONDS"
                )
            answer = await asyncio.to_thread(worker.connection.recv)
            healthy = True
        except (EOFError, OSError) as error:  # the worker died (killed, out of memory)
            raise AlgorithmFailed(f"{name}: its worker process died ({error!r})") from None
        except asyncio.CancelledError:
            self.stopped += 1  # the caller went away: stop its run, free the slot
            raise
        finally:
            if healthy:
                self._idle.put_nowait(worker)
            else:
                self._replace(worker)
        kind = answer[0]
        if kind == "ok":
            return dict_to_struct(answer[1]), [
                plan_pb2.ResourcePlan.FromString(p) for p in answer[2]
            ]
        if kind == "invalid":
            field = str(answer[1])
            # A quoted key (``['?']``, see stride.policy.serialization) hangs off the name.
            raise InvalidArgument(
                f"arguments{field}" if field.startswith("[") else f"arguments.{field}",
                answer[2],
            )
        log.error("algorithm failed", algorithm=name, job_id=job_id, traceback=answer[2])
        raise AlgorithmFailed(f"{name} failed: {answer[1]}")

    async def close(self) -> None:
        """Stop every worker (after the runs in flight)."""
        for task in list(self._replacing):
            with contextlib.suppress(Exception):
                await task
        workers = list(self._all)
        self._all.clear()
        await asyncio.gather(*(asyncio.to_thread(worker.close) for worker in workers))
