"""Connecting to NATS, declaring streams, publishing, and durable pull consumers.

Consumers ack only after the handler returns, and handlers commit before they return, so
a crash between commit and ack means a redelivery that an idempotent handler shrugs off.
A message that can never be processed (undecodable, wrong type, rejected by the handler,
or out of delivery attempts) is parked on the dead-letter stream and terminated, never
retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import nats
import structlog
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError
from opentelemetry import trace

from stride.bus import subjects
from stride.obs.tracing import extract_context, inject_headers
from stride.runtime.errors import InvalidArgument, StartupError

log = structlog.get_logger(__name__)
tracer = trace.get_tracer("stride.bus")

TYPE_HEADER = "Stride-Type"
"""Full protobuf name of the payload, checked by consumers before decoding."""
MSG_ID_HEADER = "Nats-Msg-Id"

M = TypeVar("M", bound=Message)


def message_headers(message: Message) -> dict[str, str]:
    """Headers for publishing ``message`` later (outbox): payload type and trace context."""
    headers = {TYPE_HEADER: message.DESCRIPTOR.full_name}
    inject_headers(headers)
    return headers


class PermanentError(Exception):
    """Raised by a handler for a message that will never succeed: dead-letter it now."""


@dataclass(frozen=True)
class Delivery:
    """What a handler may want to know about the message besides its payload."""

    subject: str
    message_id: str
    attempt: int


Handler = Callable[[M, Delivery], Awaitable[None]]


class Bus:
    """A NATS connection with JetStream, opened by :meth:`connect`."""

    def __init__(self, nc: NatsClient, name: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.name = name
        self._consumers: set[asyncio.Task[None]] = set()

    @classmethod
    async def connect(cls, url: str, name: str, timeout: float = 10.0) -> Bus:
        """Connect, retrying for up to ``timeout`` seconds, then reconnecting forever.

        Fails with a one-line :class:`StartupError` naming the URL if no server answers.
        """
        last_error: list[str] = []

        async def on_error(error: Exception) -> None:
            last_error[:] = [f"{type(error).__name__}: {error}"]
            log.warning("nats error", error=last_error[0])

        async def on_disconnect() -> None:
            log.warning("nats disconnected")

        async def on_reconnect() -> None:
            log.info("nats reconnected")

        try:
            nc = await asyncio.wait_for(
                nats.connect(
                    servers=[u.strip() for u in url.split(",")],
                    name=name,
                    connect_timeout=max(1, int(min(timeout, 5))),
                    reconnect_time_wait=0.5,
                    max_reconnect_attempts=-1,
                    error_cb=on_error,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                ),
                timeout=timeout,
            )
        except (TimeoutError, OSError, nats.errors.Error) as error:
            reason = last_error[0] if last_error else f"{type(error).__name__}: {error}"
            raise StartupError(
                f"cannot connect to NATS at {url} within {timeout:g}s ({reason})"
            ) from None
        return cls(nc, name)

    @property
    def is_connected(self) -> bool:
        """True while the connection is up (not reconnecting, draining or closed)."""
        return bool(self.nc.is_connected)

    async def ensure_streams(
        self, specs: tuple[subjects.StreamSpec, ...] = subjects.STREAMS
    ) -> None:
        """Create the contract's streams, or update them to the declared config. Idempotent."""
        for spec in specs:
            config = api.StreamConfig(
                name=spec.name,
                description=spec.description,
                subjects=list(spec.subjects),
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                max_age=spec.max_age.total_seconds(),
                duplicate_window=subjects.DUPLICATE_WINDOW.total_seconds(),
            )
            try:
                await self.js.stream_info(spec.name)
            except NotFoundError:
                try:
                    await self.js.add_stream(config)
                except BadRequestError as error:
                    # Two services starting together may race to create it.
                    if error.err_code != 10058:
                        raise
            else:
                await self.js.update_stream(config)

    async def publish(
        self,
        subject: str,
        message: Message,
        message_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> api.PubAck:
        """Publish to JetStream with de-duplication id, payload type and trace context."""
        with tracer.start_as_current_span(
            f"publish {subject}",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": subject,
                "messaging.message.id": message_id,
            },
        ):
            all_headers = {**(headers or {}), **message_headers(message), MSG_ID_HEADER: message_id}
            return await self.js.publish(subject, message.SerializeToString(), headers=all_headers)

    async def publish_raw(
        self, subject: str, payload: bytes, message_id: str, headers: Mapping[str, str]
    ) -> api.PubAck:
        """Publish already-serialized bytes with the given headers (the outbox relay's path)."""
        with tracer.start_as_current_span(
            f"publish {subject}",
            context=extract_context(headers),
            kind=trace.SpanKind.PRODUCER,
            attributes={"messaging.system": "nats", "messaging.destination.name": subject},
        ):
            all_headers = {**headers, MSG_ID_HEADER: message_id}
            return await self.js.publish(subject, payload, headers=all_headers)

    async def consume(
        self,
        *,
        stream: str,
        durable: str,
        filter_subject: str,
        message_type: type[M],
        handler: Handler[M],
        stop: asyncio.Event,
        max_deliver: int = 5,
        ack_wait: float = 30.0,
        batch: int = 16,
    ) -> None:
        """Run a durable pull consumer until ``stop`` is set.

        The consumer is created or updated to this config, so a restarted service resumes
        where its predecessor acked.
        """
        config = api.ConsumerConfig(
            durable_name=durable,
            filter_subject=filter_subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            max_deliver=max_deliver,
            ack_wait=ack_wait,
        )
        subscription = await self.js.pull_subscribe(
            filter_subject, durable=durable, stream=stream, config=config
        )
        log.info("consumer started", durable=durable, subject=filter_subject)
        current = asyncio.current_task()
        if current is not None:
            self._consumers.add(current)
        try:
            while not stop.is_set():
                try:
                    messages = await subscription.fetch(batch=batch, timeout=1.0)
                except (NatsTimeoutError, TimeoutError):
                    continue
                except nats.errors.ConnectionClosedError:
                    if stop.is_set():
                        break
                    raise
                for msg in messages:
                    await self._deliver(msg, durable, message_type, handler, max_deliver)
        finally:
            if current is not None:
                self._consumers.discard(current)
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _deliver(
        self, msg: Msg, durable: str, message_type: type[M], handler: Handler[M], max_deliver: int
    ) -> None:
        headers = dict(msg.headers or {})
        attempt = msg.metadata.num_delivered or 1
        delivery = Delivery(msg.subject, headers.get(MSG_ID_HEADER, ""), attempt)
        with tracer.start_as_current_span(
            f"consume {msg.subject}",
            context=extract_context(headers),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "messaging.consumer.group.name": durable,
                "messaging.message.id": delivery.message_id,
            },
        ):
            expected = message_type.DESCRIPTOR.full_name
            sent_type = headers.get(TYPE_HEADER)
            if sent_type is not None and sent_type != expected:
                await self._dead_letter(
                    msg, durable, f"payload type {sent_type}, expected {expected}"
                )
                return
            try:
                message = message_type.FromString(msg.data)
            except DecodeError as error:
                await self._dead_letter(msg, durable, f"undecodable {expected}: {error}")
                return
            try:
                await handler(message, delivery)
            except (PermanentError, InvalidArgument) as error:
                await self._dead_letter(msg, durable, f"rejected by handler: {error}")
                return
            except Exception as error:
                if attempt >= max_deliver:
                    await self._dead_letter(
                        msg,
                        durable,
                        f"failed {attempt} times, last: {type(error).__name__}: {error}",
                    )
                    return
                delay = min(0.5 * 2 ** (attempt - 1), 10.0)
                log.warning(
                    "handler failed; will retry",
                    durable=durable,
                    subject=msg.subject,
                    attempt=attempt,
                    retry_in=delay,
                    error=f"{type(error).__name__}: {error}",
                )
                await msg.nak(delay=delay)
                return
            await msg.ack_sync()

    async def _dead_letter(self, msg: Msg, durable: str, reason: str) -> None:
        """Park the message with its reason, then terminate it so it is never redelivered."""
        log.error("message dead-lettered", durable=durable, subject=msg.subject, reason=reason)
        headers = {
            **{k: v for k, v in (msg.headers or {}).items() if k != MSG_ID_HEADER},
            "Stride-Original-Subject": msg.subject,
            "Stride-Dead-Letter-Reason": reason[:1000],
        }
        original_id = (msg.headers or {}).get(
            MSG_ID_HEADER
        ) or f"{msg.metadata.stream}-{msg.metadata.sequence.stream}"
        await self.js.publish(
            subjects.dead_letter(durable),
            msg.data,
            headers={**headers, MSG_ID_HEADER: f"dl-{durable}-{original_id}"},
        )
        await msg.term()

    async def serve_requests(
        self,
        subject: str,
        queue: str,
        handler: Callable[[bytes, Mapping[str, str]], Awaitable[bytes]],
        stop: asyncio.Event,
    ) -> None:
        """Answer core NATS requests on ``subject`` in queue group ``queue`` until ``stop``."""

        async def on_request(msg: Msg) -> None:
            headers = dict(msg.headers or {})
            with tracer.start_as_current_span(
                f"serve {msg.subject}", context=extract_context(headers), kind=trace.SpanKind.SERVER
            ):
                reply = await handler(msg.data, headers)
                await msg.respond(reply)

        subscription = await self.nc.subscribe(subject, queue=queue, cb=on_request)
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.drain()  # type: ignore[no-untyped-call]

    async def request(self, subject: str, message: Message, timeout: float) -> bytes:
        """Send a core NATS request with trace context; returns the raw reply payload."""
        with tracer.start_as_current_span(f"request {subject}", kind=trace.SpanKind.CLIENT):
            headers: dict[str, str] = {TYPE_HEADER: message.DESCRIPTOR.full_name}
            inject_headers(headers)
            reply = await self.nc.request(
                subject, message.SerializeToString(), timeout=timeout, headers=headers
            )
            return bytes(reply.data)

    async def close(self, timeout: float = 5.0) -> None:
        """Let consumers finish their message, then drain (flush) and close.

        Consumers notice the stop event within one fetch timeout. Pull subscriptions are
        closed by their consumers rather than drained, because draining one with a fetch
        still pending never completes.
        """
        if self._consumers:
            await asyncio.wait(set(self._consumers), timeout=timeout)
        if self.nc.is_closed:
            return
        try:
            await asyncio.wait_for(self.nc.drain(), timeout)
        except Exception as error:
            log.warning("nats drain incomplete; closing", error=f"{type(error).__name__}: {error}")
            with contextlib.suppress(Exception):
                await self.nc.close()
