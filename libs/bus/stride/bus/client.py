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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import nats
import structlog
from google.protobuf.message import DecodeError, Message
from nats.aio.client import NO_RESPONDERS_STATUS
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError
from nats.protocol.parser import AUTHORIZATION_VIOLATION
from opentelemetry import trace

from stride.bus import permissions
from stride.bus.signing import (
    EventSigner,
    ForgedSender,
    MessageSigner,
    SenderVerifier,
    SignerFor,
    logical_message_id,
)
from stride.bus.topics import (
    DUPLICATE_WINDOW,
    STREAMS,
    TYPE_HEADER,
    Outgoing,
    RequestTopic,
    Stream,
    Topic,
    dead_letter_subject,
    message_headers,
)
from stride.obs.tracing import extract_context, inject_headers
from stride.runtime import tls
from stride.runtime.errors import InvalidArgument, StartupError, Unavailable

log = structlog.get_logger(__name__)
tracer = trace.get_tracer("stride.bus")

MSG_ID_HEADER = "Nats-Msg-Id"
AUTHENTICATION_EXPIRED = "authentication expired"
"""What NATS says (``-ERR 'User Authentication Expired'``) when a client's user expires."""
PROGRESS_HEADER = "Stride-Progress"
"""Marks a responder's progress message (empty) to a request's reply subject."""

ACK_WAIT_SECONDS = 5.0
CONSUMER_CHECK_SECONDS = 5.0
"""How often an idle consumer asks JetStream whether its durable consumer still exists (and
notes how far it has acked): a deleted consumer makes fetches time out as if nothing came,
so without asking, the service would wait forever."""
CONSUMER_RETRY_SECONDS = 0.5
"""Pause before fetching again when JetStream answers neither a fetch nor a question about
the consumer (a server restarting): the consumer waits instead of crashing its service."""
"""How long JetStream waits for an ack before it redelivers a message to another consumer
of the durable. Short, so a message whose consumer crashed mid-handler (a plan interrupted by
an optimizer crash) is redelivered within seconds; a handler that takes longer is not
redelivered under it, because the consumer tells JetStream it is still working
(``in_progress``) every third of this."""

M = TypeVar("M", bound=Message)
T = TypeVar("T")

__all__ = [
    "TYPE_HEADER",
    "BatchHandler",
    "Bus",
    "Delivery",
    "Handler",
    "PermanentError",
    "message_headers",
]


class PermanentError(Exception):
    """Raised by a handler for a message that will never succeed: dead-letter it now."""


@dataclass(frozen=True)
class Delivery:
    """What a handler may want to know about the message besides its payload."""

    subject: str
    message_id: str
    attempt: int
    key: str
    """The subject's key (the job id of a job-scoped topic)."""
    span: trace.Span | None = field(default=None, compare=False, repr=False)
    """In a batch, the span of this message's handling, in its own trace (see
    :meth:`traced`). None for a single handler (its span is current already)."""

    def traced(self) -> contextlib.AbstractContextManager[object]:
        """Where a batch handler works on this message alone: in the message's own trace,
        so what that work publishes stays in it (nothing changes for a single handler)."""
        if self.span is None:
            return contextlib.nullcontext()
        return trace.use_span(self.span, end_on_exit=False)


Handler = Callable[[M, Delivery], Awaitable[None]]
BatchHandler = Callable[[Sequence[tuple[M, Delivery]]], Awaitable[Sequence[BaseException | None]]]
"""Handles a fetched batch at once (one transaction for many metrics) and returns, per
message and in order, None (done: acked) or the exception that message met (dead-lettered
or retried as a single handler's would be)."""


class _Connection(NatsClient):
    """nats-py's client, except that an Authorization Violation on a live connection makes it
    reconnect instead of closing for good.

    nats-py closes the connection at any ``-ERR`` the server sends; nats.c and nats.go
    retry a reconnect that meets an authorization error. A pod's agent needs the retry: its
    NATS user comes from the pod watcher's auth callout, and after a NATS restart the agent
    is often back before the pod watcher has answered its callout requests again. The server
    then refuses the agent once, and nats-py left the agent without NATS for the rest of its
    life (its job stalled until the pod was replaced; `make chaos` caught it). Refusals for
    good (a revoked token) are still refused at every try, so nothing gets in that would not
    have; the agent stays unhealthy and says why.

    The same for a user that expired (:data:`~stride.bus.callout.SESSION_SECONDS`): the
    agent reconnects with its job token as the pod watcher rewrote it, and gets a new user."""

    async def _process_err(self, err_msg: str) -> None:
        refused = AUTHORIZATION_VIOLATION in err_msg or AUTHENTICATION_EXPIRED in err_msg.lower()
        if refused and self.options["allow_reconnect"] and self.is_connected:
            self._err = nats.errors.AuthorizationError()
            await self._error_cb(self._err)
            await self._process_op_err(self._err)
            return
        await super()._process_err(err_msg)


async def flush_in_order(nc: NatsClient) -> None:
    """Return once the server has taken every command written on ``nc`` before (a SUB just
    made: a message published after this reaches it).

    ``nc.flush()`` alone does not promise it in nats-py 2.16: it writes its PING straight
    to the socket, ahead of the commands still waiting for the client's flusher task, so the
    PONG can come back before the server has the SUB. A message another client published
    in that window was lost (seen in full test runs: the first revocation or control
    command to a pod that had just subscribed never came, the next ones did). The flusher
    was woken by the SUB and normally writes it before the first PONG is read; if it was
    still draining an earlier write, what it holds is waited for (a moment at most: a
    connection that never stops publishing never shows it empty). The second PING then goes
    out after the SUB, and its PONG means the server has it."""
    await nc.flush()
    for _ in range(PENDING_CHECKS):  # nats-py offers no event for it
        if nc.pending_data_size == 0:
            break
        await asyncio.sleep(PENDING_CHECK_SECONDS)
    await nc.flush()


PENDING_CHECKS, PENDING_CHECK_SECONDS = 200, 0.005
"""How often, and how far apart, :func:`flush_in_order` looks whether the client's flusher
has written what it holds (a second at most)."""


async def _dial(url: str, name: str, timeout: float, options: dict[str, Any]) -> _Connection:
    """Connect to NATS, retrying for up to ``timeout`` seconds, then reconnecting forever;
    a one-line :class:`StartupError` naming the URL if no server answers in time."""
    last_error: list[str] = []

    async def on_error(error: Exception) -> None:
        last_error[:] = [f"{type(error).__name__}: {error}"]
        log.warning("nats error", error=last_error[0])

    async def on_disconnect() -> None:
        log.warning("nats disconnected")

    async def on_reconnect() -> None:
        log.info("nats reconnected")

    nc = _Connection()
    try:
        await asyncio.wait_for(
            nc.connect(
                servers=[u.strip() for u in url.split(",")],
                name=name,
                connect_timeout=max(1, int(min(timeout, 5))),
                # Annotated int, used as seconds to sleep: a float is what it means.
                reconnect_time_wait=0.5,  # type: ignore[arg-type]
                max_reconnect_attempts=-1,
                error_cb=on_error,
                disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect,
                **options,
            ),
            timeout=timeout,
        )
    except (TimeoutError, OSError, nats.errors.Error) as error:
        reason = last_error[0] if last_error else f"{type(error).__name__}: {error}"
        with contextlib.suppress(Exception):  # a half-made connection's tasks
            await nc.close()
        raise StartupError(
            f"cannot connect to NATS at {url} within {timeout:g}s ({reason})"
        ) from None
    return nc


class Bus:
    """A NATS connection with JetStream, opened by :meth:`connect`."""

    def __init__(
        self,
        nc: NatsClient,
        name: str,
        signer_for: SignerFor | None = None,
        verifier: SenderVerifier | None = None,
    ) -> None:
        """``signer_for``: who signs the events published on a subject (None: unsigned);
        ``verifier``: checks the sender of every event consumed (None: nothing checked).
        See :mod:`stride.bus.signing`."""
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.name = name
        self.signer_for = signer_for
        self.verifier = verifier
        self._consumers: set[asyncio.Task[None]] = set()

    @classmethod
    async def connect(
        cls,
        url: str,
        name: str,
        timeout: float = 10.0,
        *,
        identity: str | None = None,
        signer_for: SignerFor | None = None,
        environ: Mapping[str, str] | None = None,
        signer: EventSigner | None = None,
        token: Callable[[], str | None] | None = None,
        inbox: str | None = None,
    ) -> Bus:
        """Connect, retrying for up to ``timeout`` seconds, then reconnecting forever.

        ``identity``: sign every event published as this TLS identity and check the sender
        of every event consumed (:mod:`stride.bus.signing`; nothing in plain text), as
        every service does. ``signer_for`` instead: who signs each subject (a tool playing
        several parts), events consumed checked against the same CA. Neither: unsigned and
        unchecked (a reader of streams, a test's own bus). ``environ``: where the TLS
        material is named (default: this process's environment). ``signer``: with
        ``identity``, signs every event instead of the identity's certificate (a pod's
        agent: :class:`~stride.bus.signing.PodSigner`). ``token`` and ``inbox``: a pod's agent
        presents its job token (read again at every reconnect) and reads replies under its
        own pod's prefix; NATS then asks the pod watcher for its user
        (:mod:`stride.bus.callout`).

        Fails with a one-line :class:`StartupError` naming the URL if no server answers.
        """
        verifier: SenderVerifier | None = None
        material: tls.TlsMaterial | None = None
        if identity is not None:
            material = tls.load(identity, environ)
            if material is not None:
                chosen: EventSigner = signer or MessageSigner(material)
                verifier = SenderVerifier(material.ca)
                signer_for = lambda _subject: chosen  # noqa: E731
        elif signer_for is not None:
            material = tls.load(permissions.ADMIN, environ)
            verifier = SenderVerifier(material.ca) if material is not None else None
        # Where NATS asks for TLS (a locked-down server), the client presents its identity's
        # certificate, which NATS maps to that identity's user, and reads replies only under
        # its own inbox prefix (stride.bus.permissions). A plain server never asks.
        secure: dict[str, Any] = {}
        if material is not None:
            secure = {
                "tls": tls.ssl_client_context(material),
                "inbox_prefix": inbox or permissions.inbox_prefix(material.identity),
            }
            if token is not None:
                secure["token"] = token
        nc = await _dial(url, name, timeout, secure)
        return cls(nc, name, signer_for, verifier)

    def _signed(self, subject: str, payload: bytes, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with the publisher's signature and its keyed message id
        (:func:`stride.bus.signing.keyed_message_id`), if it signs."""
        signer = self.signer_for(subject) if self.signer_for is not None else None
        if signer is not None:
            headers.update(signer.headers(subject, headers.get(TYPE_HEADER, ""), payload))
            headers[MSG_ID_HEADER] = signer.message_id(subject, headers[MSG_ID_HEADER])
        return headers

    def forged(
        self,
        topic: Topic[Any],
        subject: str,
        payload: bytes,
        headers: Mapping[str, str],
        key: str,
    ) -> str | None:
        """Why an event's sender is not one ``topic`` accepts (:mod:`stride.bus.signing`;
        ``key``: the subject's job), or None: verified, or nothing is checked (plain text)."""
        if self.verifier is None:
            return None
        try:
            self.verifier.check(
                subject, headers.get(TYPE_HEADER, ""), payload, headers, topic.producers, key
            )
        except ForgedSender as error:
            return str(error)
        return None

    @property
    def is_connected(self) -> bool:
        """True while the connection is up (not reconnecting, draining or closed)."""
        return bool(self.nc.is_connected)

    async def ensure_streams(self, specs: tuple[Stream, ...] = STREAMS) -> None:
        """Create the contract's streams, or update them to the declared config. Idempotent,
        and read-only when every stream is already as declared: on a locked-down NATS
        (:mod:`stride.bus.permissions`) only the bus administrator may declare streams, so a
        service then only reads them, and fails with a clear error if one is missing or
        outdated (NATS drops a request it does not permit, which reaches us as a timeout)."""
        for spec in specs:
            config = stream_config(spec)
            try:
                try:
                    info = await self.js.stream_info(spec.name)
                except NotFoundError:
                    try:
                        await self.js.add_stream(config)
                    except BadRequestError as error:
                        # Two services starting together may race to create it.
                        if error.err_code != 10058:
                            raise
                else:
                    if not _same_stream(info.config, config):
                        await self.js.update_stream(config)
            except NatsTimeoutError:
                raise StartupError(
                    f"stream {spec.name}: JetStream did not answer declaring it (missing or "
                    f"not as declared); if NATS is locked down, the bus administrator "
                    f"declares the streams first: `stride bus init`"
                ) from None

    async def publish(self, topic: Topic[M], key: str, message: M, message_id: str) -> api.PubAck:
        """Publish one event of ``topic`` for ``key`` (a job id), with its de-duplication id,
        payload type and trace context."""
        return await self.publish_outgoing(topic.outgoing(key, message, message_id))

    async def publish_outgoing(self, event: Outgoing) -> api.PubAck:
        """Publish an event built by :meth:`Topic.outgoing`."""
        with tracer.start_as_current_span(
            f"publish {event.subject}",
            kind=trace.SpanKind.PRODUCER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": event.subject,
                "messaging.message.id": event.message_id,
            },
        ):
            headers = {**event.headers, MSG_ID_HEADER: event.message_id}
            inject_headers(headers)
            self._signed(event.subject, event.payload, headers)
            return await self.js.publish(event.subject, event.payload, headers=headers)

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
            all_headers = self._signed(subject, payload, {**headers, MSG_ID_HEADER: message_id})
            return await self.js.publish(subject, payload, headers=all_headers)

    async def consume(
        self,
        topic: Topic[M],
        *,
        durable: str,
        handler: Handler[M] | None = None,
        stop: asyncio.Event,
        max_deliver: int = 5,
        ack_wait: float = ACK_WAIT_SECONDS,
        batch: int = 16,
        batch_handler: BatchHandler[M] | None = None,
    ) -> None:
        """Run a durable pull consumer of every job's ``topic`` events until ``stop`` is set.

        Exactly one of ``handler`` (one message at a time) and ``batch_handler`` (each
        fetched batch at once, for high-rate facts such as metrics) is given; either way a
        message is acked only after its handler returned for it. A handler's acks are
        confirmed by the server before the next message; a batch handler's are not waited
        for, so it must apply a redelivered message as a no-op (metrics are stored by key).

        The consumer is created or updated to this config, so a restarted service resumes
        where its predecessor acked. Messages fetched but not yet handled when ``stop`` is
        set are nak'ed, so a successor gets them at once instead of after ``ack_wait``.
        """
        if (handler is None) == (batch_handler is None):
            raise ValueError("consume needs exactly one of handler and batch_handler")
        filter_subject = topic.pattern()
        config = api.ConsumerConfig(
            durable_name=durable,
            filter_subject=filter_subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL,
            # Unlimited: the consumer itself decides when a failing message is dead-lettered
            # (after ``max_deliver`` failures of the handler, never for Unavailable).
            max_deliver=-1,
            ack_wait=ack_wait,
        )
        stream = topic.stream.name
        subscription = await self.js.pull_subscribe(
            filter_subject, durable=durable, stream=stream, config=config
        )
        log.info("consumer started", durable=durable, subject=filter_subject)
        current = asyncio.current_task()
        if current is not None:
            self._consumers.add(current)
        loop = asyncio.get_running_loop()
        checked = loop.time()
        acked = 0
        """The consumer's ack floor when last seen: every message up to it was handled."""
        try:
            while not stop.is_set():
                try:
                    messages = await subscription.fetch(batch=batch, timeout=1.0)
                except (
                    NatsTimeoutError,
                    TimeoutError,
                    ServiceUnavailableError,
                    NotFoundError,
                ) as e:
                    # Nothing came (idle: ask now and then), or the fetch was answered "no
                    # responders" (the consumer is gone, or JetStream is not answering).
                    idle = isinstance(e, NatsTimeoutError | TimeoutError)
                    if idle and loop.time() - checked < CONSUMER_CHECK_SECONDS:
                        continue
                    checked = loop.time()
                    subscription, acked = await self._ensure_consumer(
                        subscription, filter_subject, stream, config, acked
                    )
                    continue
                except nats.errors.ConnectionClosedError:
                    if stop.is_set():
                        break
                    raise
                if batch_handler is not None:
                    await self._deliver_batch(
                        messages, durable, topic, batch_handler, max_deliver, ack_wait
                    )
                    continue
                assert handler is not None
                for index, msg in enumerate(messages):
                    if stop.is_set():
                        for unhandled in messages[index:]:
                            with contextlib.suppress(Exception):
                                await unhandled.nak()
                        break
                    await self._deliver(msg, durable, topic, handler, max_deliver, ack_wait)
        finally:
            if current is not None:
                self._consumers.discard(current)
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()

    async def _ensure_consumer(
        self,
        subscription: JetStreamContext.PullSubscription,
        filter_subject: str,
        stream: str,
        config: api.ConsumerConfig,
        acked: int,
    ) -> tuple[JetStreamContext.PullSubscription, int]:
        """The subscription to fetch from next and the ack floor: the same one if the
        consumer exists (its floor noted), a new one if it was deleted (:meth:`_recreate`),
        and the same one after a pause if JetStream does not answer now."""
        try:
            info = await self.js.consumer_info(stream, config.durable_name or "")
            return subscription, max(acked, info.ack_floor.stream_seq)
        except NotFoundError:
            pass
        except (ServiceUnavailableError, NatsTimeoutError, TimeoutError) as error:
            log.warning(
                "jetstream not answering; retrying",
                durable=config.durable_name,
                error=f"{type(error).__name__}: {error}",
            )
            await asyncio.sleep(CONSUMER_RETRY_SECONDS)
            return subscription, acked
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()
        return await self._recreate(filter_subject, stream, config, acked), acked

    async def _recreate(
        self, filter_subject: str, stream: str, config: api.ConsumerConfig, acked: int
    ) -> JetStreamContext.PullSubscription:
        """A durable consumer someone deleted, made again from just after what it had
        acked (the messages since are delivered again; handlers are idempotent, as for any
        redelivery), not a service that silently waits forever."""
        again = (
            replace(
                config, deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=acked + 1
            )
            if acked
            else config
        )
        log.warning(
            "consumer was deleted; recreated",
            durable=config.durable_name,
            stream=stream,
            from_sequence=acked + 1,
        )
        return await self.js.pull_subscribe(
            filter_subject, durable=config.durable_name, stream=stream, config=again
        )

    async def _deliver(
        self,
        msg: Msg,
        durable: str,
        topic: Topic[M],
        handler: Handler[M],
        max_deliver: int,
        ack_wait: float,
    ) -> None:
        headers = dict(msg.headers or {})
        with tracer.start_as_current_span(
            f"consume {msg.subject}",
            context=extract_context(headers),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": msg.subject,
                "messaging.consumer.group.name": durable,
                "messaging.message.id": headers.get(MSG_ID_HEADER, ""),
            },
        ):
            opened = await self._open(msg, durable, topic)
            if opened is None:
                return
            message, delivery = opened
            try:
                await _working([msg], handler(message, delivery), ack_wait / 3)
            except Exception as error:
                await self._settle(msg, durable, delivery.attempt, max_deliver, error)
                return
            await msg.ack_sync()

    async def _deliver_batch(
        self,
        messages: Sequence[Msg],
        durable: str,
        topic: Topic[M],
        handler: BatchHandler[M],
        max_deliver: int,
        ack_wait: float,
    ) -> None:
        """One span for the batch, linked to each message's producer span; and, in each
        message's own trace, a span of its handling (a child of its producer's span, linked
        to the batch's), so a job's trace still shows every service that handled its
        events when they came in a batch."""
        links = []
        for msg in messages:
            context = trace.get_current_span(extract_context(dict(msg.headers or {})))
            if context.get_span_context().is_valid:
                links.append(trace.Link(context.get_span_context()))
        with tracer.start_as_current_span(
            f"consume {topic.pattern()}",
            kind=trace.SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "nats",
                "messaging.destination.name": topic.pattern(),
                "messaging.consumer.group.name": durable,
                "messaging.batch.message_count": len(messages),
            },
        ):
            opened: list[tuple[Msg, M, Delivery]] = []
            for msg in messages:
                one = await self._open(msg, durable, topic)
                if one is not None:
                    opened.append((msg, *one))
            if not opened:
                return
            batch_span = trace.get_current_span().get_span_context()
            spans = [
                tracer.start_span(
                    f"consume {msg.subject}",
                    context=extract_context(dict(msg.headers or {})),
                    kind=trace.SpanKind.CONSUMER,
                    links=[trace.Link(batch_span)] if batch_span.is_valid else None,
                    attributes={
                        "messaging.system": "nats",
                        "messaging.destination.name": msg.subject,
                        "messaging.consumer.group.name": durable,
                        "messaging.message.id": delivery.message_id,
                        "messaging.batch.message_count": len(opened),
                    },
                )
                for msg, _, delivery in opened
            ]
            outcomes: Sequence[BaseException | None]
            try:
                outcomes = await _working(
                    [msg for msg, _, _ in opened],
                    handler(
                        [
                            (message, replace(delivery, span=span))
                            for (_, message, delivery), span in zip(opened, spans, strict=True)
                        ]
                    ),
                    ack_wait / 3,
                )
            except Exception as error:
                outcomes = [error] * len(opened)
            except BaseException:  # cancelled (the service stops): the spans end here
                for span in spans:
                    span.end()
                raise
            if len(outcomes) != len(opened):
                wrong = RuntimeError(
                    f"batch handler answered {len(outcomes)} of {len(opened)} messages"
                )
                outcomes = [wrong] * len(opened)
            for span, outcome in zip(spans, outcomes, strict=True):
                if outcome is not None:
                    span.record_exception(outcome)
                    span.set_status(trace.Status(trace.StatusCode.ERROR, str(outcome)[:200]))
                span.end()
            for (msg, _, delivery), outcome in zip(opened, outcomes, strict=True):
                if outcome is None:
                    # Not waited for (one round trip per message was most of nats-server's
                    # work under 1,000 agents, bench/agents_load.py): a lost ack redelivers
                    # the message, and batch handlers store each fact once however often
                    # it comes.
                    await msg.ack()
                else:
                    await self._settle(msg, durable, delivery.attempt, max_deliver, outcome)

    async def _open(self, msg: Msg, durable: str, topic: Topic[M]) -> tuple[M, Delivery] | None:
        """The message and its delivery, or None after dead-lettering one no handler may
        see: another payload type, undecodable, or about another job than its subject."""
        headers = dict(msg.headers or {})
        attempt = msg.metadata.num_delivered or 1
        key = topic.key_of(msg.subject) or ""
        message_id = logical_message_id(headers.get(MSG_ID_HEADER, ""))
        delivery = Delivery(msg.subject, message_id, attempt, key)
        message_type = topic.message_type
        expected = message_type.DESCRIPTOR.full_name
        sent_type = headers.get(TYPE_HEADER)
        forged = self.forged(topic, msg.subject, msg.data, headers, key)
        if forged is not None:
            await self._dead_letter(msg, durable, f"sender: {forged}")
            return None
        if sent_type is not None and sent_type != expected:
            await self._dead_letter(msg, durable, f"payload type {sent_type}, expected {expected}")
            return None
        try:
            message = message_type.FromString(msg.data)
        except DecodeError as error:
            await self._dead_letter(msg, durable, f"undecodable {expected}: {error}")
            return None
        job_id = getattr(message, "job_id", None)
        if isinstance(job_id, str) and job_id and job_id != key:
            # A payload about another job than its subject names is a producer's bug or
            # a forgery; either way no handler should act on it.
            await self._dead_letter(
                msg, durable, f"job_id {job_id[:64]!r} does not match subject {msg.subject}"
            )
            return None
        return message, delivery

    async def _settle(
        self, msg: Msg, durable: str, attempt: int, max_deliver: int, error: BaseException
    ) -> None:
        """A message whose handler failed: dead-lettered if it can never succeed (rejected
        as invalid, or out of attempts), else handed back to be redelivered later."""
        if isinstance(error, PermanentError | InvalidArgument):
            await self._dead_letter(msg, durable, f"rejected by handler: {error}")
            return
        if attempt >= max_deliver and not isinstance(error, Unavailable):
            await self._dead_letter(
                msg, durable, f"failed {attempt} times, last: {type(error).__name__}: {error}"
            )
            return
        # A dependency that is down (the executor pool, a database) is waited for, as long
        # as it takes: the fact is kept, never dead-lettered for that.
        delay = min(0.5 * 2 ** (min(attempt, 8) - 1), 10.0)
        log.warning(
            "handler failed; will retry",
            durable=durable,
            subject=msg.subject,
            attempt=attempt,
            retry_in=delay,
            error=f"{type(error).__name__}: {error}",
        )
        await msg.nak(delay=delay)

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
            dead_letter_subject(durable),
            msg.data,
            headers={**headers, MSG_ID_HEADER: f"dl-{durable}-{original_id}"},
        )
        await msg.term()

    async def answer_requests(
        self,
        topic: RequestTopic,
        handler: Callable[[bytes, Mapping[str, str]], Awaitable[bytes]],
    ) -> Subscription:
        """Subscribe ``handler`` to ``topic``'s queue group and return once the server has
        the subscription (flushed), so a request sent after this returns finds a responder.
        While the handler runs, the requester hears every ``topic.progress_seconds`` that
        it does (:class:`~stride.bus.topics.RequestTopic`). The caller drains the returned
        subscription when it stops."""

        async def on_request(msg: Msg) -> None:
            headers = dict(msg.headers or {})
            with tracer.start_as_current_span(
                f"serve {msg.subject}", context=extract_context(headers), kind=trace.SpanKind.SERVER
            ):
                progress = (
                    asyncio.create_task(self._tell_progress(msg.reply, topic.progress_seconds))
                    if msg.reply
                    else None
                )
                try:
                    reply = await handler(msg.data, headers)
                finally:
                    if progress is not None:
                        progress.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await progress
                await msg.respond(reply)

        subscription = await self.nc.subscribe(
            topic.pattern(), queue=topic.queue_group, cb=on_request
        )
        await flush_in_order(self.nc)
        return subscription

    async def watch(self, topic: Topic[M], on_event: Callable[[str, M], None]) -> Subscription:
        """Follow every job's ``topic`` events as they are published, ``on_event(job_id,
        message)`` for each, and return once the server has the subscription (flushed).

        For watchers (``stride loadgen``, dashboards), never alone for facts a service must
        act on: this is core NATS, so nothing published before is replayed and nothing is
        acked (:class:`Follower` adds the replay). An event of another type or that does
        not decode is logged and skipped. The caller unsubscribes the returned subscription
        when it stops."""

        async def on_message(msg: Msg) -> None:
            self.accept(topic, msg.subject, msg.data, msg.headers or {}, on_event)

        subscription = await self.nc.subscribe(topic.pattern(), cb=on_message)
        await flush_in_order(self.nc)
        return subscription

    def accept(
        self,
        topic: Topic[M],
        subject: str,
        data: bytes,
        headers: Mapping[str, str],
        on_event: Callable[[str, M], None],
    ) -> None:
        """``on_event(key, message)`` for a watched or replayed event of ``topic`` if its
        sender is one the topic accepts; anything else is logged and skipped."""
        key = topic.key_of(subject)
        sent_type = headers.get(TYPE_HEADER)
        if key is None or (
            sent_type is not None and sent_type != topic.message_type.DESCRIPTOR.full_name
        ):
            return
        forged = self.forged(topic, subject, data, headers, key)
        if forged is not None:
            log.warning("event of an unverified sender skipped", subject=subject, reason=forged)
            return
        try:
            message = topic.message_type.FromString(data)
        except DecodeError as error:
            log.warning("undecodable event skipped", subject=subject, error=str(error))
            return
        on_event(key, message)

    async def request(
        self,
        topic: RequestTopic,
        name: str,
        message: Message,
        timeout: float,
        silence: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> bytes:
        """Send a core NATS request for ``name`` (an algorithm) with trace context; returns
        the raw reply payload.

        Raises ``nats.errors.NoRespondersError`` when no replica is subscribed, and
        ``nats.errors.TimeoutError`` when no answer comes within ``timeout`` or the replica
        that took the request says nothing (no progress message, see
        :meth:`answer_requests`) for ``silence`` seconds (default: ``timeout``), as a
        replica that was killed or lost its connection does."""
        subject = topic.subject(name)
        quiet_limit = timeout if silence is None else min(silence, timeout)
        with tracer.start_as_current_span(f"request {subject}", kind=trace.SpanKind.CLIENT):
            all_headers = {**(headers or {}), **message_headers(message)}
            inbox = self.nc.new_inbox()
            replies = await self.nc.subscribe(inbox)
            try:
                await self.nc.publish(
                    subject, message.SerializeToString(), reply=inbox, headers=all_headers
                )
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while True:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise NatsTimeoutError
                    reply = await replies.next_msg(timeout=min(quiet_limit, left))
                    said = reply.headers or {}
                    if said.get(api.Header.STATUS) == NO_RESPONDERS_STATUS:
                        raise nats.errors.NoRespondersError
                    if PROGRESS_HEADER not in said:
                        return bytes(reply.data)
            finally:
                with contextlib.suppress(Exception):
                    await replies.unsubscribe()

    async def _tell_progress(self, reply_subject: str, every: float) -> None:
        """Tell a requester, now and every ``every`` seconds, that its request is running."""
        try:
            while True:
                await self.nc.publish(reply_subject, b"", headers={PROGRESS_HEADER: "running"})
                await asyncio.sleep(every)
        except Exception as error:  # the connection is closing: the requester will ask again
            log.warning("could not tell a requester its request runs", error=str(error))

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


def stream_config(spec: Stream) -> api.StreamConfig:
    """The JetStream configuration a contract stream is declared with."""
    return api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        max_age=spec.max_age.total_seconds(),
        duplicate_window=DUPLICATE_WINDOW.total_seconds(),
    )


def _same_stream(present: api.StreamConfig, wanted: api.StreamConfig) -> bool:
    """Whether a stream already holds what the contract declares (the fields it sets)."""
    return (
        sorted(present.subjects or []) == sorted(wanted.subjects or [])
        and present.description == wanted.description
        and present.retention == wanted.retention
        and present.storage == wanted.storage
        and abs((present.max_age or 0) - (wanted.max_age or 0)) < 1e-3
        and abs((present.duplicate_window or 0) - (wanted.duplicate_window or 0)) < 1e-3
    )


async def _working(messages: Sequence[Msg], handling: Awaitable[T], every: float) -> T:
    """Await ``handling``, telling JetStream every ``every`` seconds that ``messages`` are
    still being worked on, so a slow handler is not redelivered under it."""
    task = asyncio.ensure_future(handling)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            for msg in messages:
                with contextlib.suppress(Exception):
                    await msg.in_progress()
    finally:
        if not task.done():
            task.cancel()


class Follower(Generic[M]):
    """Every event of one topic, for a fact each replica of a service must know (revoked
    tokens): first each one its stream still holds, read one by one in order
    (``STREAM.MSG.GET``, the only JetStream API a follower needs: no consumer is made),
    then each as it is published (core NATS, :meth:`Bus.watch`). :meth:`catch_up`, also
    run every few seconds by :meth:`run`, reads what the stream got since, so an event
    missed while the connection was down still arrives. ``on_event`` must be idempotent:
    an event can come both live and replayed."""

    def __init__(self, bus: Bus, topic: Topic[M], on_event: Callable[[str, M], None]) -> None:
        self.bus = bus
        self.topic = topic
        self.on_event = on_event
        self.next_sequence = 1
        self.subscription: Subscription | None = None

    async def start(self) -> None:
        """Subscribe, then replay the stream: an event published in between is seen twice,
        never missed."""
        self.subscription = await self.bus.watch(self.topic, self.on_event)
        await self.catch_up()

    async def catch_up(self) -> int:
        """Replay what the stream got since the last catch-up; the number of messages read."""
        stream = self.topic.stream.name
        state = (await self.bus.js.stream_info(stream)).state
        read = 0
        for sequence in range(max(self.next_sequence, state.first_seq), state.last_seq + 1):
            try:
                raw = await self.bus.js.get_msg(stream, sequence)
            except NotFoundError:  # deleted, or aged out since the info
                continue
            read += 1
            self.bus.accept(
                self.topic, raw.subject or "", raw.data or b"", raw.headers or {}, self.on_event
            )
        self.next_sequence = max(self.next_sequence, state.last_seq + 1)
        return read

    async def run(self, stop: asyncio.Event, every: float) -> None:
        """Catch up every ``every`` seconds until ``stop``; a failure is logged and retried."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
                break
            try:
                await self.catch_up()
            except (nats.errors.Error, OSError) as error:
                log.warning("follower catch-up failed", topic=self.topic.name, error=str(error))
        if self.subscription is not None:
            with contextlib.suppress(nats.errors.Error):
                await self.subscription.unsubscribe()
