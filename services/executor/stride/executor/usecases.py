"""Running one algorithm request: look it up, parse its arguments, run it off the event loop.

Used by both entry points of a replica, the NATS queue group (the optimizer's path) and the
gRPC API (tools). :meth:`AlgorithmRunner.run` raises domain errors, which gRPC maps to status
codes; :meth:`AlgorithmRunner.reply_to` turns them into an :class:`AlgorithmReply` status,
because a NATS reply has no status code of its own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import structlog
from google.protobuf import struct_pb2
from opentelemetry import trace

from stride.events.v1 import optimization_pb2, plan_pb2
from stride.executor.adapters.convert import (
    dict_to_struct,
    plan_to_proto,
    proposed_plans,
    struct_to_dict,
)
from stride.policy.registry import (
    AlgorithmSpec,
    InvalidRequest,
    Registry,
    UnknownAlgorithm,
    to_dict,
)
from stride.runtime.errors import DeadlineExceeded, InvalidArgument, NotFound, StrideError

log = structlog.get_logger(__name__)
tracer = trace.get_tracer("stride.executor")


class AlgorithmFailed(StrideError):
    """The algorithm itself raised: a bug or a case it cannot handle (status INTERNAL)."""


class TimedOut(DeadlineExceeded):
    """The algorithm ran past the replica's time limit per request and was stopped."""


Outcome = tuple[struct_pb2.Struct, list[plan_pb2.ResourcePlan]]
"""An algorithm's reply as a Struct, and the plans it proposes."""


class Runs(Protocol):
    """Where algorithms run: :class:`InThreads` here, or worker processes that a time limit
    can stop (the service's, ``adapters.outbound.workers.WorkerPool``)."""

    async def run(
        self, name: str, version: int | None, arguments: dict[str, Any], job_id: str
    ) -> Outcome:
        """Run one algorithm; raises InvalidArgument, AlgorithmFailed or TimedOut."""
        ...


class InThreads:
    """Algorithms run in this process's threads: no time limit (a thread cannot be
    stopped), for embedding the runner; the service runs them in worker processes."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def run(
        self, name: str, version: int | None, arguments: dict[str, Any], job_id: str
    ) -> Outcome:
        spec = self.registry.get(name, version)
        try:
            return await asyncio.to_thread(_run, spec, arguments, job_id)
        except InvalidRequest as error:
            field = error.field
            # A quoted key (``['?']``, see stride.policy.serialization) hangs off the name.
            raise InvalidArgument(
                f"arguments{field}" if field.startswith("[") else f"arguments.{field}",
                error.problem,
            ) from None
        except Exception as error:
            log.exception("algorithm failed", algorithm=spec.qualified_name, job_id=job_id)
            raise AlgorithmFailed(
                f"{spec.qualified_name} failed: {type(error).__name__}: {error}"
            ) from error


class AlgorithmRunner:
    """Runs registered algorithms on protobuf requests."""

    def __init__(self, registry: Registry, replica: str, runs: Runs | None = None) -> None:
        self.registry = registry
        self.replica = replica
        self.runs: Runs = runs if runs is not None else InThreads(registry)

    def algorithms(self) -> list[AlgorithmSpec[Any, Any]]:
        """Every registered algorithm and version."""
        return self.registry.list()

    async def run(
        self, request: optimization_pb2.AlgorithmRequest
    ) -> optimization_pb2.AlgorithmReply:
        """Run ``request``; raises InvalidArgument, NotFound, AlgorithmFailed or TimedOut."""
        started = time.perf_counter()
        if not request.algorithm:
            raise InvalidArgument("algorithm", "is required")
        if request.version < 0:
            raise InvalidArgument(
                "version", f"must be 0 (the newest) or positive, got {request.version}"
            )
        try:
            spec = self.registry.get(request.algorithm, request.version or None)
        except UnknownAlgorithm as error:
            raise NotFound(str(error)) from None
        arguments = struct_to_dict(request.arguments)
        log.info(
            "algorithm started",
            algorithm=spec.qualified_name,
            job_id=request.job_id,
            request_id=request.request_id,
            replica=self.replica,
        )
        # A refused run (an algorithm's domain error) marks the span, and a crash is
        # recorded once, with its stack, on the call's span (stride.runtime.grpc_server).
        with tracer.start_as_current_span(
            f"run {spec.qualified_name}",
            attributes={
                "stride.algorithm": spec.qualified_name,
                "stride.job_id": request.job_id,
                "stride.executor.replica": self.replica,
            },
            record_exception=False,
        ):
            result, plans = await self.runs.run(spec.name, spec.version, arguments, request.job_id)
        elapsed = time.perf_counter() - started
        log.info(
            "algorithm ran",
            algorithm=spec.qualified_name,
            job_id=request.job_id,
            request_id=request.request_id,
            replica=self.replica,
            elapsed_seconds=elapsed,
        )
        return optimization_pb2.AlgorithmReply(
            request_id=request.request_id,
            status=optimization_pb2.ALGORITHM_STATUS_OK,
            result=result,
            algorithm=spec.qualified_name,
            plans=plans,
            elapsed_seconds=elapsed,
        )

    async def reply_to(
        self, request: optimization_pb2.AlgorithmRequest
    ) -> optimization_pb2.AlgorithmReply:
        """Run ``request`` and report any failure as the reply's status; never raises."""
        started = time.perf_counter()
        try:
            return await self.run(request)
        except InvalidArgument as error:
            status, message = optimization_pb2.ALGORITHM_STATUS_INVALID_ARGUMENT, error.message
        except NotFound as error:
            status, message = optimization_pb2.ALGORITHM_STATUS_NOT_FOUND, error.message
        except AlgorithmFailed as error:
            status, message = optimization_pb2.ALGORITHM_STATUS_INTERNAL, error.message
        except TimedOut as error:
            status = optimization_pb2.ALGORITHM_STATUS_DEADLINE_EXCEEDED
            message = error.message
        except Exception as error:
            log.exception(
                "request failed", algorithm=request.algorithm, request_id=request.request_id
            )
            status = optimization_pb2.ALGORITHM_STATUS_INTERNAL
            message = f"internal error: {type(error).__name__}: {error}"
        return failed_reply(
            request.request_id,
            status,
            message,
            time.perf_counter() - started,
            algorithm=_requested_name(request),
        )


def failed_reply(
    request_id: str,
    status: optimization_pb2.AlgorithmStatus.ValueType,
    error: str,
    elapsed: float,
    algorithm: str = "",
) -> optimization_pb2.AlgorithmReply:
    """A reply without a result."""
    return optimization_pb2.AlgorithmReply(
        request_id=request_id,
        status=status,
        error=error,
        algorithm=algorithm,
        elapsed_seconds=elapsed,
    )


def _requested_name(request: optimization_pb2.AlgorithmRequest) -> str:
    if not request.algorithm:
        return ""
    return f"{request.algorithm}/{request.version}" if request.version else request.algorithm


def _run(
    spec: AlgorithmSpec[Any, Any], arguments: dict[str, Any], job_id: str
) -> tuple[Any, list[plan_pb2.ResourcePlan]]:
    """The part that runs in a worker thread: parse, compute, serialize."""
    reply = spec.run_typed(spec.parse_request(arguments))
    result = dict_to_struct(to_dict(reply))
    return result, [plan_to_proto(plan, job_id) for plan in proposed_plans(reply)]
