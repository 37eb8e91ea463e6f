"""How a service process is put together from the shared libraries.

Every service's ``app.py`` does the same few steps (gRPC server and host, bus with the
contract's streams, its database migrated or checked, the outbox relay); they live here
once so the services differ only in what is theirs.

Storage imports are deferred to the functions that need them: the agent, executor and
checkpoint cache own no tables, and their images do not install SQLAlchemy.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import structlog
from google.protobuf.message import Message

from stride.bus import permissions, topics
from stride.bus.client import ACK_WAIT_SECONDS, BatchHandler, Bus, Follower, Handler
from stride.bus.permissions import check_consumer
from stride.bus.signing import EventSigner
from stride.bus.topics import Topic
from stride.events.v1 import auth_pb2
from stride.runtime import tls
from stride.runtime.auth import Access, RateLimiter, Rule
from stride.runtime.errors import StartupError
from stride.runtime.grpc_server import GrpcServer
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.runtime.settings import ServiceSettings
from stride.runtime.tokens import Revocations, TokenError, Verifier

M = TypeVar("M", bound=Message)
log = structlog.get_logger("stride.wiring")

if TYPE_CHECKING:
    from stride.bus.callout import Callout
    from stride.db.engine import Database
    from stride.db.outbox import Outbox


def create_host(
    settings: ServiceSettings,
    service_names: Sequence[str],
    access: Mapping[str, Rule],
    *,
    only_job: str | None = None,
) -> ServiceHost:
    """A host with a gRPC server (health, reflection, error mapping, the service's message
    size limits, mutual TLS as the service's identity, ``access``: who may call each
    method, :mod:`stride.runtime.auth`; ``only_job``: a server for one job's pod) for
    ``service_names``.

    Without TLS material the service does not start (:func:`stride.runtime.tls.load` says
    what to set); plain text only with ``STRIDE_INSECURE=1``, and then with a warning (and
    no caller is authenticated: tokens need the CA to be verified)."""
    material = tls.load(settings.service_name)
    if material is None:
        log.warning("insecure", detail=tls.INSECURE_WARNING)
    revocations = Revocations() if material is not None else None
    try:
        verifier = Verifier(material.ca, revocations) if material is not None else None
    except TokenError as error:
        raise StartupError(f"{material.source if material else ''}: {error}") from None
    server = GrpcServer(
        service_names,
        settings.grpc_host,
        settings.grpc_port,
        max_receive_message_bytes=settings.grpc_max_receive_message_bytes,
        max_send_message_bytes=settings.grpc_max_send_message_bytes,
        tls=material,
        access=Access(
            access,
            verifier,
            only_job=only_job,
            limiter=RateLimiter(settings.grpc_rate_per_second, settings.grpc_rate_burst),
            service=settings.service_name,
        ),
    )
    return ServiceHost(settings, server, revocations, verifier)


async def connect_bus(
    settings: ServiceSettings,
    host: ServiceHost,
    signer: EventSigner | None = None,
    *,
    token: Callable[[], str | None] | None = None,
    inbox: str | None = None,
) -> Bus:
    """Connect to NATS, declare the contract's streams, and track the connection's health.
    ``signer``: signs the events published instead of the service's certificate (a pod's
    agent signs with its pod's key); ``token`` and ``inbox``: a pod's agent's job token and
    inbox prefix (its NATS user is its job's, :mod:`stride.bus.callout`).

    A host whose server verifies tokens follows the revoked ones (:func:`follow_revocations`)
    and has read every revocation so far when this returns, before its server takes a call."""
    bus = await Bus.connect(
        settings.require_nats_url(),
        name=f"stride-{settings.service_name}",
        timeout=settings.connect_timeout_seconds,
        identity=settings.service_name,
        signer=signer,
        token=token,
        inbox=inbox,
    )
    await bus.ensure_streams()

    async def connected() -> bool:
        return bus.is_connected

    host.add_dependency(Dependency("nats", connected, bus.close, closes_early=True))
    if host.revocations is not None:
        await follow_revocations(host, bus, host.revocations)
    return bus


async def serve_nats_callout(
    host: ServiceHost, bus: Bus, seed_file: Path | None, system_seed_file: Path | None = None
) -> None:
    """Answer NATS's authorization requests for training pods (:mod:`stride.bus.callout`):
    a user for one job and pod to an agent whose job token this suite's pod watcher signed
    and nobody revoked. ``seed_file``: the issuer's seed (unreadable: the service does not
    start); default ``nats-callout.nk`` in the certificate folder, if there. Nothing in
    plain text (no TLS, no users)."""
    from stride.bus.callout import SEED_NAME, Callout, CalloutError, Issuer, serve

    if host.verifier is None:
        return
    if seed_file is None:
        folder = os.environ.get(tls.TLS_DIR_ENV, "")
        seed_file = Path(folder.strip()) / SEED_NAME if folder.strip() else None
        if seed_file is None or not seed_file.exists():
            # A NATS prepared otherwise (not by stride.bus.lockdown) may give agents users
            # of its own; one locked down by Stride refuses them until this is set.
            log.warning(
                "no NATS auth callout seed: training pods' agents get no NATS user from "
                "this pod watcher",
                setting=f"STRIDE_{host.settings.service_name.upper()}_NATS_CALLOUT_SEED_FILE",
            )
            return
    try:
        issuer = Issuer.from_file(seed_file)
    except CalloutError as error:
        raise StartupError(str(error)) from None
    # The server's own verifier: the same revocations and verified-token cache.
    answering = Callout(issuer, host.verifier.verify)
    await serve(bus.nc, answering)
    log.info("answering NATS authorization for training pods", issuer=issuer.public_key)
    from stride.runtime.certs import SYSTEM_SEED_NAME

    seed = system_seed_file or seed_file.parent / SYSTEM_SEED_NAME
    await _guard_sessions(host, bus, answering, seed if seed.is_file() else None)


async def _guard_sessions(
    host: ServiceHost, bus: Bus, answering: Callout, seed: Path | None
) -> None:
    """End the NATS sessions of tokens no longer valid (:mod:`stride.bus.sessions`), as the
    NATS system account's user whose seed is ``seed`` (None: there is none)."""
    import nats

    from stride.bus.sessions import SessionGuard

    material = tls.load(permissions.CALLOUT_HOST)
    if seed is None or material is None:
        log.warning(
            "no NATS system user: a revoked pod's NATS session lasts until its user expires",
            seed=str(seed),
            expires_after_seconds=answering.session_seconds,
        )
        return
    try:
        system = await nats.connect(
            bus.nc.connected_url.geturl() if bus.nc.connected_url else "",
            tls=tls.ssl_client_context(material),
            nkeys_seed=str(seed),
            name=f"{host.settings.service_name}-sessions",
            max_reconnect_attempts=-1,
        )
    except (OSError, nats.errors.Error) as error:
        raise StartupError(
            f"NATS refused the system user of {seed} ({type(error).__name__}: {error}); "
            "is NATS configured by this folder's `stride bus config`?"
        ) from None
    guard = SessionGuard(system, answering)
    host.add_root_task("nats-sessions", lambda: guard.run(host.stop))

    async def connected() -> bool:
        return bool(system.is_connected)

    host.add_dependency(Dependency("nats-system", connected, system.close, closes_early=True))
    log.info("ending NATS sessions of revoked tokens", system_user=str(seed))


REVOCATION_CATCH_UP_SECONDS = 10.0
"""How often a server re-reads the revocations stream for what its live subscription may
have missed (a reconnect); a revocation normally arrives within milliseconds."""


async def follow_revocations(host: ServiceHost, bus: Bus, revocations: Revocations) -> None:
    """Fill ``revocations`` from the bus: every revocation the stream holds now (before
    this returns), then each one admission publishes (signed by admission, or skipped)."""

    def revoked(_key: str, event: auth_pb2.TokenRevocation) -> None:
        if event.token_id:
            revocations.revoke_token(event.token_id)
        elif event.user and event.HasField("issued_before"):
            revocations.revoke_user(event.user, event.issued_before.ToNanoseconds() / 1e9)
        elif event.job_id and event.HasField("issued_before"):
            revocations.revoke_job(event.job_id, event.issued_before.ToNanoseconds() / 1e9)
            return  # one per ended job: not worth a log line
        else:
            log.warning("revocation naming no token, user or job skipped")
            return
        log.info(
            "token revoked",
            token_id=event.token_id or None,
            user=event.user or None,
            revoked_by=event.revoked_by,
        )

    follower = Follower(bus, topics.TOKEN_REVOKED, revoked)
    await follower.start()
    host.add_root_task(
        "follow-revocations", lambda: follower.run(host.stop, REVOCATION_CATCH_UP_SECONDS)
    )


async def open_database(
    settings: ServiceSettings, host: ServiceHost, script_location: Path
) -> Database:
    """Open the service's database, migrate it (or check it is migrated), track its health."""
    from stride.db.engine import Database
    from stride.db.migrations import require_migrated, upgrade

    url = settings.require_database_url()
    database = Database(url, settings.service_name)
    await database.check_reachable(settings.connect_timeout_seconds)
    if settings.auto_migrate:
        await asyncio.to_thread(upgrade, url, settings.service_name, script_location)
    else:
        await asyncio.to_thread(require_migrated, url, settings.service_name, script_location)
    host.add_dependency(Dependency("database", database.ping, database.dispose, closes_early=False))
    return database


def relay_outbox(
    host: ServiceHost,
    outbox: Outbox,
    database: Database,
    bus: Bus,
    *,
    poll_seconds: float = 1.0,
    batch: int = 100,
) -> None:
    """Run the outbox relay as a root task, and report parked events on the health name
    ``stride.outbox`` (:data:`stride.db.outbox.HEALTH_NAME`).

    The relay knows the server's ``max_payload`` (from its INFO), so an event over it is
    parked unsent. The outbox's own :class:`~stride.db.outbox.RelayHooks`, if it has them,
    carry its reads and writes (the dispatcher's fast path). ``stride.outbox`` is NOT_SERVING
    while any event is parked; the service's own health name is not affected by it.
    """
    from stride.db.outbox import HEALTH_NAME

    def max_payload() -> int:
        return int(bus.nc.max_payload)

    host.add_root_task(
        "outbox-relay",
        lambda: outbox.run_relay(
            database,
            bus.publish_raw,
            host.stop,
            poll_seconds=poll_seconds,
            batch=batch,
            max_payload=max_payload,
        ),
    )
    host.add_health_check(HEALTH_NAME, lambda: outbox.nothing_parked(database))


def migrate_command(script_location: Path) -> Callable[[ServiceSettings], None]:
    """The ``migrate`` sub-command of a service that owns tables."""

    def migrate(settings: ServiceSettings) -> None:
        from stride.db.migrations import upgrade

        upgrade(settings.require_database_url(), settings.service_name, script_location)

    return migrate


def consume(
    host: ServiceHost,
    bus: Bus,
    topic: Topic[M],
    *,
    durable: str,
    handler: Handler[M] | None = None,
    ack_wait: float = ACK_WAIT_SECONDS,
    batch_handler: BatchHandler[M] | None = None,
    batch: int = 16,
) -> None:
    """Run a durable pull consumer of ``topic`` as a root task named after ``durable``,
    stopping with the host (``handler`` per message, or ``batch_handler`` per fetched
    batch of up to ``batch`` messages: see :meth:`stride.bus.client.Bus.consume`).

    The consumer must be the service's in :data:`stride.bus.permissions.CONSUMERS` (the
    list a locked-down NATS grants): a new one that is not fails the build, not the
    deployment."""
    check_consumer(host.settings.service_name, durable, topic)
    host.add_root_task(
        f"consume-{durable}",
        lambda: bus.consume(
            topic,
            durable=durable,
            handler=handler,
            batch_handler=batch_handler,
            batch=batch,
            ack_wait=ack_wait,
            stop=host.stop,
        ),
    )
