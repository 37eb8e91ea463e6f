"""Training pods get a NATS user for their own job only: the auth callout (stride.bus.callout)
on a real, locked-down nats-server, answered as the pod watcher answers it.

Before, every agent shared one NATS user: one job's pod could read every job's control
commands and publish on every job's subjects (consumers refused what it signed for another
job, but NATS let it through).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import structlog.testing

from stride.bus import callout, permissions, topics
from stride.bus.callout import Callout, Issuer
from stride.bus.client import Bus, flush_in_order
from stride.bus.lockdown import config_text
from stride.bus.sessions import SessionGuard
from stride.bus.signing import PodSigner, logical_message_id
from stride.events.v1 import auth_pb2, control_pb2
from stride.runtime import tls
from stride.runtime.certs import SYSTEM_SEED_NAME
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.tokens import JOB_ISSUER, Revocations, Signer, Verifier, new_pod_key
from stride.testing.channels import job_token, user_token
from stride.testing.eventually import assert_eventually

A, B = "job-callout00000a", "job-callout00000b"

# nats-py leaves the socket of a connection the server refused (Authorization Violation)
# for the garbage collector, which warns "unclosed StreamWriter" in whichever test it runs
# in; this module refuses connections on purpose.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in.*StreamWriter.__del__:pytest.PytestUnraisableExceptionWarning"
)


def _folder() -> Path:
    return Path(os.environ[tls.TLS_DIR_ENV])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    nats_server = NatsServer(tmp_path / "nats", locked=config_text(_folder())).start()
    try:
        yield nats_server
    finally:
        nats_server.stop()


@pytest.fixture
async def revocations(server: NatsServer) -> AsyncIterator[Revocations]:
    """The pod watcher's side: its NATS user answers the callout (and declares the streams
    as the administrator would)."""
    admin = await Bus.connect(server.url, "test-admin", 10, identity=permissions.ADMIN)
    await admin.ensure_streams()
    await admin.close()
    revoked = Revocations()
    material = tls.load(permissions.CALLOUT_HOST)
    assert material is not None
    host = await Bus.connect(server.url, "test-podwatcher", 10, identity=permissions.CALLOUT_HOST)
    issuer = Issuer.from_file(_folder() / callout.SEED_NAME)
    await callout.serve(host.nc, Callout(issuer, Verifier(material.ca, revoked).verify))
    try:
        yield revoked
    finally:
        await host.close()


def _context(identity: str) -> ssl.SSLContext:
    material = tls.load(identity)
    assert material is not None
    return tls.ssl_client_context(material)


async def _pod(
    server: NatsServer, token: str | None, job: str = A, pod: str = "pod-0", cert: str = "agent"
) -> tuple[Any, list[str]]:
    """A pod's raw NATS connection (its agent's certificate and job token), and the errors
    the server sends it."""
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    connection = await nats.connect(
        server.url,
        tls=_context(cert),
        token=token,
        inbox_prefix=permissions.agent_inbox_prefix(job, pod),
        allow_reconnect=False,
        connect_timeout=5,
        error_cb=on_error,
    )
    return connection, errors


async def _refused(server: NatsServer, token: str | None) -> str:
    """Why the server would not let a pod with ``token`` in (it fails the test if it did)."""
    with pytest.raises(Exception) as refused:
        connection, _ = await _pod(server, token)
        await connection.close()
    return str(refused.value)


async def _settled() -> None:
    await asyncio.sleep(0.3)


async def test_a_pod_reads_and_writes_its_own_job_and_nothing_of_another(
    server: NatsServer, revocations: Revocations
) -> None:
    pod, errors = await _pod(server, job_token(A))
    podwatcher = await Bus.connect(server.url, "test-commands", 10, identity="podwatcher")
    reader = await nats.connect(
        server.url,
        tls=_context(permissions.ADMIN),
        inbox_prefix=permissions.inbox_prefix(permissions.ADMIN),
    )
    try:
        # Its own job: commands arrive, its step metrics are taken by JetStream (the reply
        # comes to its own inbox), its acknowledgements go out.
        commands = await pod.subscribe(topics.CONTROL_COMMAND.subject(A))
        await flush_in_order(pod)
        await podwatcher.nc.publish(topics.CONTROL_COMMAND.subject(A), b"for-a")
        await flush_in_order(podwatcher.nc)  # the server has it
        assert (await commands.next_msg(timeout=5)).data == b"for-a"
        acked = await pod.jetstream().publish(topics.STEP_METRICS.subject(A), b"steps-a")
        assert acked.stream == topics.STEP_METRICS.stream.name
        await pod.publish(topics.CONTROL_ACK.subject(A), b"ack-a")
        await flush_in_order(pod)
        assert errors == []

        # Another job's: NATS refuses the subscription and the publications.
        spying = await pod.subscribe(topics.CONTROL_COMMAND.subject(B))
        wildcard = await pod.subscribe(topics.CONTROL_COMMAND.pattern())
        await flush_in_order(pod)
        await podwatcher.nc.publish(topics.CONTROL_COMMAND.subject(B), b"for-b")
        await pod.publish(topics.STEP_METRICS.subject(B), b"forged-steps")
        await pod.publish(topics.CONTROL_ACK.subject(B), b"forged-ack")
        await pod.publish(topics.JOB_FINISHED.subject(B), b"forged-end")
        await flush_in_order(pod)
        await _settled()
        for forbidden in (
            f'subscription to "{topics.CONTROL_COMMAND.subject(B)}"',
            f'subscription to "{topics.CONTROL_COMMAND.pattern()}"',
            f'publish to "{topics.STEP_METRICS.subject(B)}"',
            f'publish to "{topics.CONTROL_ACK.subject(B)}"',
            f'publish to "{topics.JOB_FINISHED.subject(B)}"',
        ):
            assert any(forbidden in error for error in errors), (forbidden, errors)
        for subscription in (spying, wildcard):
            with pytest.raises(nats.errors.TimeoutError):
                await subscription.next_msg(timeout=0.5)
        # Nothing of B reached the streams: only A's step metrics are there.
        stored = await reader.jetstream().get_last_msg(
            topics.STEP_METRICS.stream.name, topics.STEP_METRICS.pattern()
        )
        assert stored.subject == topics.STEP_METRICS.subject(A) and stored.data == b"steps-a"

        # Another pod's replies: its inbox is its own.
        other, other_errors = await _pod(server, job_token(A, "pod-1"), pod="pod-1")
        try:
            await other.subscribe(f"{permissions.agent_inbox_prefix(A, 'pod-0')}.>")
            await flush_in_order(other)
            await _settled()
            assert any("subscription" in error for error in other_errors), other_errors
        finally:
            await other.close()
    finally:
        await pod.close()
        await podwatcher.close()
        await reader.close()


async def test_no_user_without_a_live_job_token_of_this_suite_on_an_agents_certificate(
    server: NatsServer, revocations: Revocations
) -> None:
    admission = tls.load("admission")
    assert admission is not None
    not_the_podwatchers = Signer(admission).job_token(A, "pod-0", "worker")
    for token in (None, "", "not-a-token", user_token("alice"), not_the_podwatchers):
        assert "Authorization Violation" in await _refused(server, token)
    # A job token on another identity's certificate: that identity's user, not the job's.
    trainer, errors = await _pod(server, job_token(A), cert="trainer")
    try:
        await trainer.subscribe(topics.CONTROL_COMMAND.subject(A))
        await flush_in_order(trainer)
        await _settled()
        assert any("permissions violation for subscription" in error for error in errors)
    finally:
        await trainer.close()
    # Revoked (as admission does when the job ends): refused from then on.
    token = job_token(A, "pod-7")
    pod, _ = await _pod(server, token, pod="pod-7")
    await pod.close()
    revocations.revoke_job(A, issued_before=float("inf"))
    assert "Authorization Violation" in await _refused(server, token)
    # The services' own users are the configuration's, untouched by the callout.
    service = await Bus.connect(server.url, "test-admission", 10, identity="admission")
    await service.close()


async def test_no_agent_connects_while_no_callout_answers(server: NatsServer) -> None:
    """Nobody answers (the pod watcher is down): the server gives up on the callout and
    closes the connection; the agent is not let in. (nats-py hands back the closed client
    rather than raising; the agent's Bus keeps retrying until a pod watcher answers.)"""
    pod, errors = await _pod(server, job_token(A))
    try:
        for _ in range(50):
            if not pod.is_connected:
                break
            await asyncio.sleep(0.1)
        assert not pod.is_connected, errors
    finally:
        await pod.close()


async def _serve_callout(server: NatsServer, revoked: Revocations) -> Bus:
    """The pod watcher's callout, on a connection of its own."""
    material = tls.load(permissions.CALLOUT_HOST)
    assert material is not None
    host = await Bus.connect(server.url, "test-podwatcher", 10, identity=permissions.CALLOUT_HOST)
    issuer = Issuer.from_file(_folder() / callout.SEED_NAME)
    await callout.serve(host.nc, Callout(issuer, Verifier(material.ca, revoked).verify))
    return host


async def test_an_agent_refused_while_the_callout_is_late_after_a_nats_restart_gets_back_in(
    server: NatsServer,
) -> None:
    """NATS restarts and the agent is back before the pod watcher answers its callout: the
    server refuses it once (Authorization Violation). nats-py closed the connection for good
    then, leaving the agent without NATS until its pod was replaced; it must reconnect as
    soon as the callout answers. A revoked job's agent is still refused at every try."""
    admin = await Bus.connect(server.url, "test-admin", 10, identity=permissions.ADMIN)
    await admin.ensure_streams()
    await admin.close()
    revoked = Revocations()
    podwatcher = await _serve_callout(server, revoked)
    agent = await Bus.connect(
        server.url,
        "test-agent",
        10,
        identity="agent",
        token=lambda: job_token(A, "pod-0"),
        inbox=permissions.agent_inbox_prefix(A, "pod-0"),
    )
    late: Bus | None = None
    try:
        assert agent.is_connected
        # The pod watcher is down; NATS dies and comes back on its port.
        await podwatcher.close()
        with structlog.testing.capture_logs() as logged:
            server.kill()
            server.start()

            def refused() -> bool:  # the server gives up on the unanswered callout (~2 s)
                errors = [entry.get("error", "") for entry in logged]
                return agent.nc.is_closed or any("AuthorizationError" in e for e in errors)

            await assert_eventually(refused, timeout=15, message="the agent was not refused")
        assert not agent.nc.is_closed, "the agent gave up on NATS"
        late = await _serve_callout(server, revoked)  # the pod watcher is back

        async def published() -> bool:
            """A step-metrics event taken by JetStream: the agent is back in, as its job."""
            try:
                acked = await agent.js.publish(
                    topics.STEP_METRICS.subject(A), b"steps-after", timeout=1
                )
            except (nats.errors.Error, TimeoutError) as error:
                raise AssertionError(f"not back in: {error!r}") from error
            return acked.stream == topics.STEP_METRICS.stream.name

        await assert_eventually(published, timeout=20, interval=0.2, message="agent not back")
        assert not agent.nc.is_closed
    finally:
        await agent.close()
        if late is not None:
            await late.close()


def _pod_signer(job: str, pod: str = "pod-0") -> tuple[PodSigner, str]:
    """A pod's signer and job token binding its key, as the pod watcher makes them."""
    key = new_pod_key()
    material = tls.load(JOB_ISSUER)
    assert material is not None
    token = Signer(material).job_token(job, pod, "worker", pod_key=key.public_key())
    return PodSigner(key, lambda: token), token


async def _agent_bus(server: NatsServer, signer: PodSigner, token: str, job: str) -> Bus:
    """A pod's agent on the bus as the agent connects: its job token opens its NATS user,
    its pod key signs what it publishes and keys the message ids."""
    return await Bus.connect(
        server.url,
        f"test-agent-{job}",
        10,
        identity=permissions.AGENT,
        signer=signer,
        token=lambda: token,
        inbox=permissions.agent_inbox_prefix(job, "pod-0"),
    )


async def test_a_pod_cannot_mute_another_jobs_events_with_their_message_ids(
    server: NatsServer, revocations: Revocations
) -> None:
    """Finding 2 of #37: JetStream drops a message whose ``Nats-Msg-Id`` it saw in the
    stream's duplicate window, whoever sent it. Job A's pod published on its own subject
    with job B's predictable next id, and B's reconfigure acknowledgement never reached the
    stream. Ids are now keyed with the publisher's own key: nothing A sends collides with
    B's, while B's own retry (and B's restarted agent, with its kept key) is still dropped."""
    signer_b, token_b = _pod_signer(B)
    agent_b = await _agent_bus(server, signer_b, token_b, B)
    attacker, errors = await _pod(server, job_token(A))
    logical = "pod-0.ack.2.reconfigure"
    try:
        # A publishes, on its own job's subject, every id it can make of B's next event.
        for forged in (logical, f"{logical}#{'0' * 32}", f"{logical}#"):
            acked = await attacker.jetstream().publish(
                topics.CONTROL_ACK.subject(A), b"", headers={"Nats-Msg-Id": forged}
            )
            assert not acked.duplicate
        assert errors == []

        ack = control_pb2.ControlAck(plan_version=2)
        first = await agent_b.publish(topics.CONTROL_ACK, B, ack, logical)
        assert not first.duplicate, "B's acknowledgement was muted by A's message ids"
        again = await agent_b.publish(topics.CONTROL_ACK, B, ack, logical)
        assert again.duplicate and again.seq == first.seq  # B's own retry: dropped
        restarted = await _agent_bus(server, signer_b, token_b, B)
        try:
            retried = await restarted.publish(topics.CONTROL_ACK, B, ack, logical)
            assert retried.duplicate and retried.seq == first.seq
        finally:
            await restarted.close()

        # The stream holds B's acknowledgement once, with its logical id for consumers.
        reader = await Bus.connect(server.url, "test-reader", 10, identity=permissions.ADMIN)
        try:
            stored = await reader.js.get_msg(topics.CONTROL_ACK.stream.name, first.seq)
        finally:
            await reader.close()
        assert stored.subject == topics.CONTROL_ACK.subject(B)
        wire_id = (stored.headers or {})["Nats-Msg-Id"]
        assert wire_id != logical and logical_message_id(wire_id) == logical
    finally:
        await attacker.close()
        await agent_b.close()


async def _callout_with_sessions(
    server: NatsServer, revoked: Revocations, session_seconds: float
) -> tuple[Bus, Callout, Any, asyncio.Event, asyncio.Task[None]]:
    """The pod watcher's callout issuing users of ``session_seconds``, and its session guard
    on a system-account connection (the folder's ``nats-system.nk``), checking every 0.2 s."""
    admin = await Bus.connect(server.url, "test-admin", 10, identity=permissions.ADMIN)
    await admin.ensure_streams()
    await admin.close()
    material = tls.load(permissions.CALLOUT_HOST)
    assert material is not None
    host = await Bus.connect(server.url, "test-podwatcher", 10, identity=permissions.CALLOUT_HOST)
    issuer = Issuer.from_file(_folder() / callout.SEED_NAME)
    answering = Callout(
        issuer, Verifier(material.ca, revoked).verify, session_seconds=session_seconds
    )
    await callout.serve(host.nc, answering)
    system = await nats.connect(
        server.url,
        tls=_context(permissions.CALLOUT_HOST),
        nkeys_seed=str(_folder() / SYSTEM_SEED_NAME),
    )
    stop = asyncio.Event()
    guard = asyncio.create_task(SessionGuard(system, answering).run(stop, interval=0.2))
    return host, answering, system, stop, guard


async def test_a_revoked_pods_session_ends_within_seconds_and_others_stay(
    server: NatsServer,
) -> None:
    """Finding 3 of #37: after job A ended and its tokens were revoked, A's open connection
    could still publish and subscribe. The pod watcher now disconnects it (NATS's KICK, as
    the system account's user) within about a second, and NATS refuses it again; job B's
    pod is left alone."""
    revoked = Revocations()
    host, answering, system, stop, guard = await _callout_with_sessions(server, revoked, 300)
    pod_a, _ = await _pod(server, job_token(A))
    pod_b, errors_b = await _pod(server, job_token(B), job=B)
    try:
        assert len(answering.sessions) == 2
        revoked.revoke_job(A, time.time() + 1)

        async def cut_off() -> bool:
            return not pod_a.is_connected

        await assert_eventually(cut_off, timeout=5, message="A's session outlived its job")
        assert "Authorization Violation" in await _refused(server, job_token(A, ttl=60))
        # B was not touched: still in, still publishing on its own job.
        acked = await pod_b.jetstream().publish(topics.STEP_METRICS.subject(B), b"steps-b")
        assert acked.stream == topics.STEP_METRICS.stream.name
        assert pod_b.is_connected and errors_b == []
        assert next(iter(answering.sessions.values())).job.job_id == B
    finally:
        stop.set()
        await guard
        for connection in (pod_a, pod_b, system):
            await connection.close()
        await host.close()


async def test_a_pods_nats_user_expires_and_is_renewed_while_its_token_is_valid(
    server: NatsServer,
) -> None:
    """A pod's NATS user is short-lived: NATS ends it when it expires, and the agent
    reconnects with its (rewritten) job token and is let in again. A connection that does not
    come back with a valid token stays out."""
    revoked = Revocations()
    host, _answering, system, stop, guard = await _callout_with_sessions(server, revoked, 2)
    token = job_token(A, "pod-0")
    agent = await Bus.connect(
        server.url,
        "test-agent",
        10,
        identity="agent",
        token=lambda: token,
        inbox=permissions.agent_inbox_prefix(A, "pod-0"),
    )
    raw, _errors = await _pod(server, job_token(A))  # no reconnect: ends with its user
    try:
        with structlog.testing.capture_logs() as logged:

            async def expired() -> bool:
                return bool(raw.is_closed)

            await assert_eventually(expired, timeout=10, message="the NATS user never expired")

            async def reconnected() -> bool:
                return any(entry.get("event") == "nats reconnected" for entry in logged)

            await assert_eventually(reconnected, timeout=10, message="the agent did not renew")
        acked = await agent.js.publish(topics.STEP_METRICS.subject(A), b"after-renewal")
        assert acked.stream == topics.STEP_METRICS.stream.name
        assert not agent.nc.is_closed
    finally:
        stop.set()
        await guard
        await agent.close()
        await raw.close()
        await system.close()
        await host.close()


async def test_agents_follow_revocations(server: NatsServer, revocations: Revocations) -> None:
    """Every agent logged a permissions violation for ``stride.auth.v1.*.revoked``: the
    subscription was narrowed to its own job as if it were job-scoped. Revocations are keyed
    by token, and every server (the agent too) follows all of them."""
    pod, errors = await _pod(server, job_token(A))
    admission = await Bus.connect(server.url, "test-admission", 10, identity="admission")
    try:
        revoked = await pod.subscribe(topics.TOKEN_REVOKED.pattern())
        await flush_in_order(pod)
        event = auth_pb2.TokenRevocation(token_id="t-1", revoked_by="admin")
        key = topics.revoked_token_key("t-1")
        await admission.publish(topics.TOKEN_REVOKED, key, event, "revoked.t-1")
        message = await revoked.next_msg(timeout=5)
        assert auth_pb2.TokenRevocation.FromString(message.data).token_id == "t-1"
        assert errors == []
    finally:
        await pod.close()
        await admission.close()
