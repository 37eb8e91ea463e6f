"""The gRPC server every service runs: health (per service name), reflection, tracing, and
the mapping from domain errors to status codes.

Handlers raise :mod:`stride.runtime.errors`; the interceptor here turns them into a status
whose message names the bad field, so no servicer hand-writes ``context.abort`` for them.

Requests that do not decode as the method's request type never reach a servicer: grpc would
answer them with a bare INTERNAL ("Exception deserializing request!"), which reads as a
server bug. The interceptor gives every handler a deserializer that cannot fail, and the
handler answers such a request INVALID_ARGUMENT naming the method and the expected type.

A status message is cut to :data:`MAX_STATUS_MESSAGE_BYTES`: it travels in a trailer, and
one over the client's metadata limit (16 KiB by default) replaces the status with a bare
RESOURCE_EXHAUSTED, losing the code and the field it named. Messages should not repeat a
huge value in the first place (:func:`stride.vocabulary.echo`); this is the backstop.

The server's message size limits are set on purpose per service
(:attr:`~stride.runtime.settings.ServiceSettings.grpc_max_receive_message_bytes` and
``grpc_max_send_message_bytes``); grpc itself answers RESOURCE_EXHAUSTED past them. Within
that, each method has its own request limit, declared in its proto
(``stride.api.limits.v1.max_request_bytes``, 64 KiB where unset): a request over it is
RESOURCE_EXHAUSTED naming the method and the limit, before it is decoded. A GetJob's id
need not be allowed the megabytes a checkpoint header may take.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
import structlog
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from stride.api.limits.v1 import limits_pb2
from stride.runtime import auth, collector, errors
from stride.runtime.tls import TlsMaterial, server_credentials

log = structlog.get_logger(__name__)

SMALL_REQUESTS_BYTES = 1024 * 1024
"""A server whose transport limit is at most this takes only small requests: it keeps
HTTP/2's flow-control windows at their default (no bandwidth-delay probing), so a flood of
oversized requests cannot make each connection buffer megabytes before gRPC refuses them
(#37: 100 concurrent 3.9 MB SubmitJobs had pushed admission to 834 MiB). Servers that take
big streams (the checkpoint cache's uploads) keep the probing that makes them fast."""
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024
"""A Stride method's request limit when its proto sets no ``max_request_bytes``: enough
for any request made of ids, names and a few numbers, and 1/64 of a server's default."""
"""gRPC's own default receive limit, which every client also applies to what it receives."""

MAX_STATUS_MESSAGE_BYTES = 1024
"""Longest status message sent, in UTF-8 bytes. gRPC percent-encodes every non-ASCII byte,
so even then the trailer stays far below a client's 8 KiB soft metadata limit, and 1 KiB is
plenty for a field path and what is wrong with it."""

_STATUS_BY_ERROR: dict[type[errors.StrideError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
}


def status_for(error: errors.StrideError) -> grpc.StatusCode:
    """The gRPC status code a domain error maps to."""
    for error_type, code in _STATUS_BY_ERROR.items():
        if isinstance(error, error_type):
            return code
    return grpc.StatusCode.UNKNOWN


def bounded_message(message: str) -> str:
    """``message``, cut to :data:`MAX_STATUS_MESSAGE_BYTES` with a note of how much was cut;
    the start, which names the field, is kept."""
    encoded = message.encode()
    if len(encoded) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    kept = encoded[: MAX_STATUS_MESSAGE_BYTES - 40].decode(errors="ignore")
    return f"{kept}… ({len(message) - len(kept):,} characters cut)"


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], error: Exception, method: str
) -> None:
    if isinstance(error, errors.StrideError):
        message = bounded_message(error.message)
        log.info("rpc rejected", method=method, code=status_for(error).name, error=message)
        await context.abort(status_for(error), message)
    log.exception("rpc failed", method=method)
    trace.get_current_span().record_exception(error)
    try:
        await context.abort(
            grpc.StatusCode.INTERNAL, f"internal error in {method}; see the server log"
        )
    except grpc.aio.UsageError:
        # The servicer's own abort had begun and failed to send its status (the caller was
        # gone): the call is over; end the handler as an abort does.
        raise grpc.aio.AbortError(f"{method}: the call ended before its status was sent") from None


class _ServerSpan:
    """A server span that takes no stack trace for a deliberate abort: the status code and
    message are on the span already (the instrumentation's servicer context sets them)."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def __getattr__(self, name: str) -> Any:
        return getattr(self._span, name)

    def record_exception(self, exception: BaseException, *args: Any, **kwargs: Any) -> None:
        if not isinstance(exception, grpc.aio.AbortError):
            self._span.record_exception(exception, *args, **kwargs)


class _ServerTracer:
    """The tracer the gRPC server instrumentation gets (through :class:`ServerTracing`)."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tracer, name)

    @contextmanager
    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Iterator[_ServerSpan]:
        kwargs["record_exception"] = False
        with self._tracer.start_as_current_span(*args, **kwargs) as span:
            yield _ServerSpan(span)


class ServerTracing:
    """The tracer provider of every server's RPC spans: the global one, except that a call
    refused on purpose (every status the error mapping sends is an abort) records no
    exception event. OpenTelemetry's gRPC instrumentation records one, with the formatted
    stack, for every abort, twice (the interceptor and the span's context manager): on
    Python 3.11 each formatting parses every frame's line (``traceback``'s caret anchors,
    ``ast.parse``), which made a rejected call cost more than an answered one, and ran the
    interpreter's AST constructor from the serving thread while another thread might be
    parsing too (CPython 3.11 shares its recursion counter between threads: "AST
    constructor recursion depth mismatch"). An unexpected error is still recorded once, by
    :func:`_abort`, on the span that is current there."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> _ServerTracer:
        return _ServerTracer(trace.get_tracer_provider().get_tracer(*args, **kwargs))


class RefusedRequest:
    """Stands in for a request refused before it was decoded; the handler aborts with
    :attr:`code` and :attr:`message`.

    grpc calls the deserializer before any handler code runs and turns its exception into
    INTERNAL with no way to choose the status, so the deserializer returns this instead.
    """

    code = grpc.StatusCode.INVALID_ARGUMENT
    method: str

    @property
    def message(self) -> str:
        raise NotImplementedError


class OversizedRequest(RefusedRequest):
    """A request larger than its method's ``max_request_bytes`` (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, method: str, size: int, limit: int) -> None:
        self.method = method
        self.size = size
        self.limit = limit

    @property
    def message(self) -> str:
        return (
            f"{self.method}: the request is {self.size:,} bytes, over the method's limit of "
            f"{self.limit:,} (max_request_bytes in its proto)"
        )


class UndecodableRequest(RefusedRequest):
    """A request whose bytes did not decode (INVALID_ARGUMENT naming the method)."""

    def __init__(self, method: str, type_name: str, error: Exception) -> None:
        self.method = method
        self.type_name = type_name
        self.error = error

    @property
    def message(self) -> str:
        """The status message: the method, that its request could not be decoded, and why."""
        reason = str(self.error).strip() or type(self.error).__name__
        return bounded_message(
            f"{self.method}: the request could not be decoded as {self.type_name} ({reason}); "
            "is the client built from the same proto?"
        )


def _request_type_name(deserializer: Callable[[bytes], Any]) -> str:
    # Generated handlers register ``<Request>.FromString``, a classmethod bound to the type.
    message_type = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_type, "DESCRIPTOR", None)
    full_name = getattr(descriptor, "full_name", None)
    return full_name if isinstance(full_name, str) else "the method's request type"


def request_limit(method: str) -> int | None:
    """The largest request ``method`` (``/package.Service/Method``) accepts: its proto's
    ``max_request_bytes`` option, else :data:`DEFAULT_MAX_REQUEST_BYTES` for Stride's own
    APIs; None for others (health, reflection), which only the server's limit bounds."""
    name = method.lstrip("/").replace("/", ".")
    try:
        descriptor = descriptor_pool.Default().FindMethodByName(name)
    except KeyError:
        return None
    options = descriptor.GetOptions()
    if options.HasExtension(limits_pb2.max_request_bytes):
        return int(options.Extensions[limits_pb2.max_request_bytes])
    if descriptor.containing_service.full_name.startswith("stride.api."):
        return DEFAULT_MAX_REQUEST_BYTES
    return None


def tolerant_deserializer(
    deserializer: Callable[[bytes], Any] | None, method: str, limit: int | None = None
) -> Callable[[bytes], Any] | None:
    """``deserializer``, returning a :class:`RefusedRequest` where the request is over
    ``limit`` bytes (:class:`OversizedRequest`) or it would raise
    (:class:`UndecodableRequest`).

    Any exception counts: whatever a deserializer raises means the bytes are not a request
    of its type (protobuf raises DecodeError for bad wire data and invalid UTF-8 alike).
    """
    if deserializer is None:
        return None
    type_name = _request_type_name(deserializer)
    decode = deserializer

    def deserialize(data: bytes) -> Any:
        if limit is not None and len(data) > limit:
            return OversizedRequest(method, len(data), limit)
        try:
            return decode(data)
        except Exception as error:
            return UndecodableRequest(method, type_name, error)

    return deserialize


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], request: RefusedRequest) -> None:
    log.info("rpc rejected", method=request.method, code=request.code.name, error=request.message)
    await context.abort(request.code, request.message)


async def _decoded(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[Any]:
    """A request stream that aborts the call at the first message refused undecoded."""
    async for request in requests:
        if isinstance(request, RefusedRequest):
            await _refuse(context, request)
        yield request


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Maps :class:`~stride.runtime.errors.StrideError` to a status; anything else is INTERNAL.

    A request that does not decode is INVALID_ARGUMENT naming the method
    (:class:`UndecodableRequest`), one over its method's ``max_request_bytes`` is
    RESOURCE_EXHAUSTED (:class:`OversizedRequest`); for a request stream, at that message.

    Before the handler runs, ``access`` (:mod:`.auth`) decides whether the caller may call
    the method (UNAUTHENTICATED or PERMISSION_DENIED if not) and the handler finds the
    verified caller in :func:`.auth.current`. Without ``access`` every call is allowed as
    an unauthenticated caller (plain text, or a test server of one servicer).

    Unary and client-streaming calls count as work in flight (:func:`.collector.working`),
    so no early full garbage collection lands inside one; server streams (watches that
    mostly wait) do not.
    """

    def __init__(self, access: auth.Access | None = None) -> None:
        self.access = access

    def _authorize(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> auth.Caller:
        if self.access is None:
            return auth.UNAUTHENTICATED
        return self.access.authorize(method, context)

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
        deserializer = tolerant_deserializer(
            handler.request_deserializer, method, request_limit(method)
        )

        if handler.unary_unary:
            inner_uu: Any = handler.unary_unary

            async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, RefusedRequest):
                    await _refuse(context, request)
                try:
                    auth.set_current(self._authorize(method, context))
                    with collector.working():
                        return await inner_uu(request, context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as error:
                    await _abort(context, error, method)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, deserializer, handler.response_serializer
            )
        if handler.stream_unary:
            inner_su: Any = handler.stream_unary

            async def stream_unary(
                requests: Any, context: grpc.aio.ServicerContext[Any, Any]
            ) -> Any:
                try:
                    auth.set_current(self._authorize(method, context))
                    with collector.working():
                        return await inner_su(_decoded(requests, context), context)
                except (grpc.aio.AbortError, grpc.aio.UsageError):
                    raise
                except Exception as error:
                    await _abort(context, error, method)

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, deserializer, handler.response_serializer
            )
        inner_stream: Any = handler.unary_stream or handler.stream_stream
        streams_requests = handler.stream_stream is not None

        async def streaming(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            if isinstance(request, RefusedRequest):
                await _refuse(context, request)
            if streams_requests:
                request = _decoded(request, context)
            try:
                auth.set_current(self._authorize(method, context))
                async for response in inner_stream(request, context):
                    yield response
            except (grpc.aio.AbortError, grpc.aio.UsageError):
                raise
            except Exception as error:
                await _abort(context, error, method)

        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                streaming, deserializer, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            streaming, deserializer, handler.response_serializer
        )


class GrpcServer:
    """A grpc.aio server with health and reflection for the given service names.

    Each service name reports readiness: NOT_SERVING until the host sees its dependencies
    (NATS, database) reachable, and again whenever one is lost. The overall name ("")
    reports liveness: SERVING while the process runs, so a liveness probe does not restart
    a pod that is only waiting for NATS to come back.
    """

    def __init__(
        self,
        service_names: Sequence[str],
        host: str,
        port: int,
        *,
        max_receive_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_send_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tls: TlsMaterial | None = None,
        access: auth.Access | None = None,
    ) -> None:
        """``tls``: serve mutual TLS with this identity's certificate (:mod:`.tls`); None
        serves plain text, which the caller has made sure was asked for explicitly.
        ``access``: who may call which method (:mod:`.auth`)."""
        self.service_names = list(service_names)
        self.tls = tls
        self.address = f"{host}:{port}"
        self.max_receive_message_bytes = max_receive_message_bytes
        self.max_send_message_bytes = max_send_message_bytes
        not_health = filters.negate(filters.service_name("grpc.health.v1.Health"))
        self.server = grpc.aio.server(
            interceptors=[
                aio_server_interceptor(  # type: ignore[no-untyped-call]
                    tracer_provider=ServerTracing(), filter_=not_health
                ),
                ErrorMappingInterceptor(access),
            ],
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", max_receive_message_bytes),
                ("grpc.max_send_message_length", max_send_message_bytes),
                ("grpc.http2.bdp_probe", int(max_receive_message_bytes > SMALL_REQUESTS_BYTES)),
            ],
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
        if self.tls is None:
            self.port = self.server.add_insecure_port(self.address)
        else:
            self.port = self.server.add_secure_port(self.address, server_credentials(self.tls))
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

    async def set_health(self, name: str, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for ``name``, a health name of its own beside the
        service names (the outbox's, :meth:`ServiceHost.add_health_check`)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        """Stop accepting RPCs and give in-flight ones ``grace`` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
