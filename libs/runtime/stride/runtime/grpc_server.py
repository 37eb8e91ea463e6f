"""The gRPC server every service runs: health (per service name), reflection, tracing, and
the mapping from domain errors to status codes.

Handlers raise :mod:`stride.runtime.errors`; the interceptor here turns them into a status
whose message names the bad field, so no servicer hand-writes ``context.abort`` for them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from stride.runtime import errors

log = structlog.get_logger(__name__)

_STATUS_BY_ERROR: dict[type[errors.StrideError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_for(error: errors.StrideError) -> grpc.StatusCode:
    """The gRPC status code a domain error maps to."""
    for error_type, code in _STATUS_BY_ERROR.items():
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.UNKNOWN


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], error: Exception, method: str
) -> None:
    if isinstance(error, errors.StrideError):
        log.info("rpc rejected", method=method, code=status_for(error).name, error=error.message)
        await context.abort(status_for(error), error.message)
    log.exception("rpc failed", method=method)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; see the server log")


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Maps :class:`~stride.runtime.errors.StrideError` to a status; anything else is INTERNAL."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method

        if handler.unary_unary:
            inner_uu: Any = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                try:
                    return await inner_uu(request, context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as error:
                    await _abort(context, error, method)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_unary:
            inner_su: Any = handler.stream_unary

            async def stream_unary(
                requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                try:
                    return await inner_su(requests, context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as error:
                    await _abort(context, error, method)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, handler.request_deserializer, handler.response_serializer
            )
        inner_stream: Any = handler.unary_stream or handler.stream_stream

        async def streaming(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            try:
                async for response in inner_stream(request, context):
                    yield response
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as error:
                await _abort(context, error, method)

        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                streaming, handler.request_deserializer, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            streaming, handler.request_deserializer, handler.response_serializer
        )


class GrpcServer:
    """A grpc.aio server with health and reflection for the given service names.

    Each service name reports readiness: NOT_SERVING until the host sees its dependencies
    (NATS, database) reachable, and again whenever one is lost. The overall name ("")
    reports liveness: SERVING while the process runs, so a liveness probe does not restart
    a pod that is only waiting for NATS to come back.
    """

    def __init__(self, service_names: Sequence[str], host: str, port: int) -> None:
        self.service_names = list(service_names)
        self.address = f"{host}:{port}"
        not_health = filters.negate(filters.service_name("grpc.health.v1.Health"))
        self.server = grpc.aio.server(
            interceptors=[
                aio_server_interceptor(filter_=not_health),  # type: ignore[no-untyped-call]
                ErrorMappingInterceptor(),
            ],
            options=[("grpc.so_reuseport", 0)],
        )
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [
                *self.service_names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        self.port = 0

    async def start(self) -> int:
        """Bind and start serving; returns the bound port (useful when 0 was asked for)."""
        self.port = self.server.add_insecure_port(self.address)
        if self.port == 0:
            raise errors.StartupError(f"cannot bind gRPC to {self.address}: address in use?")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.set_serving(False)
        return self.port

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING (readiness) for every service name."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in self.service_names:
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        """Stop accepting RPCs and give in-flight ones ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
