"""Who may do what on NATS, derived from the bus contract (:mod:`.topics`).

Each identity of the deployment's CA (``stride.runtime.tls``) is one NATS user, mapped from
its client certificate (``verify_and_map``). Its permissions follow from the contract:

- **publish** the subjects of the topics it produces (``Topic.producers``), and nothing
  else: only admission may publish ``admitted``, only the optimizer plans;
- **JetStream, only its own consumers**: create, read and pull from the durable consumers
  it runs (:data:`CONSUMERS`), acknowledge their messages, and park their dead letters;
  read the streams' info. No identity but the bus administrator (:data:`ADMIN`) may create,
  change or delete a stream, or touch another identity's consumer;
- **subscribe** to its own reply inbox (``_INBOX_<identity>``, the prefix its client uses),
  and to the core subjects it serves (the executor's requests, the agent's commands);
- requests: the optimizer may ask the executor pool; the executor may answer whoever asked
  (``allow_responses``), with progress messages before the answer (up to
  ``RequestTopic.max_replies`` messages per request);
- **follow** what every server must know (:data:`FOLLOWS`: revoked tokens): subscribe to the
  topic's subjects and read its stream's retained messages one by one (``STREAM.MSG.GET``),
  so a server started later replays them (``stride.bus.client.Follower``).

Consumers also verify the sender of every event (:mod:`.signing`); these permissions stop a
forged event from reaching a stream at all, and a deleted consumer from stopping a service.

:func:`server_users` renders the users for a nats-server configuration
(:func:`server_config`); the embedded server runs with it, and ``stride bus config`` prints it
for an operator's own NATS (README, "NATS").

Training pods' agents have no user of their own in the configuration: an agent connects with
its pod's job token, and NATS asks the pod watcher (its *auth callout*, :mod:`.callout`),
which answers with a user for that one job and pod (:func:`agent_permissions`): it may
publish only that job's step metrics and control acknowledgements and read only that job's
control commands and its own inbox. Every other identity is in the callout's ``auth_users``:
NATS authorizes it from the configuration, as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stride.bus import topics
from stride.bus.topics import STREAMS, Topic, dead_letter_subject
from stride.runtime import tls

ADMIN = "cli"
"""The identity that declares streams (``stride bus init``; the embedded suite's supervisor)
and may read and publish every subject: the administrator's CLI certificate."""

INBOX_PREFIX = "_INBOX_"
"""Each identity's reply subjects are ``_INBOX_<identity>.>`` (its client's inbox prefix)."""


def inbox_prefix(identity: str) -> str:
    """The inbox prefix a client of ``identity`` uses, so it can only read its own replies."""
    return f"{INBOX_PREFIX}{identity}"


@dataclass(frozen=True)
class Consumer:
    """A durable pull consumer one identity runs on one topic."""

    identity: str
    durable: str
    topic: Topic[Any]


CONSUMERS: tuple[Consumer, ...] = (
    Consumer("admission", "admission-finished", topics.JOB_FINISHED),
    Consumer("admission", "admission-inventory", topics.NODE_INVENTORY),
    Consumer("admission", "admission-plans", topics.PLAN),
    Consumer("optimizer", "optimizer-admitted", topics.JOB_ADMITTED),
    Consumer("optimizer", "optimizer-finished", topics.JOB_FINISHED),
    Consumer("optimizer", "optimizer-shares", topics.JOB_SHARE),
    Consumer("optimizer", "optimizer-pod-failed", topics.POD_FAILED),
    Consumer("optimizer", "optimizer-step-metrics", topics.STEP_METRICS),
    Consumer("optimizer", "optimizer-usage", topics.POD_USAGE),
    Consumer("optimizer", "optimizer-stragglers", topics.STRAGGLER_DETECTED),
    Consumer("configdb", "configdb-submitted", topics.JOB_SUBMITTED),
    Consumer("configdb", "configdb-plans", topics.PLAN),
    Consumer("configdb", "configdb-finished", topics.JOB_FINISHED),
    Consumer("configdb", "configdb-step-metrics", topics.STEP_METRICS),
    Consumer("configdb", "configdb-usage", topics.POD_USAGE),
    Consumer("dispatcher", "dispatcher-pods-failed", topics.POD_FAILED),
    Consumer("dispatcher", "dispatcher-pods-deleted", topics.POD_DELETED),
    Consumer("podwatcher", "podwatcher-admitted", topics.JOB_ADMITTED),
    Consumer("podwatcher", "podwatcher-plans", topics.PLAN),
    Consumer("podwatcher", "podwatcher-finished", topics.JOB_FINISHED),
    Consumer("podwatcher", "podwatcher-control-acks", topics.CONTROL_ACK),
)
"""Every durable consumer of the suite, by the identity that runs it. A service that starts a
consumer not listed here fails at build time (``stride.wiring.consume``), so the list and the
permissions cannot drift from the code."""

SERVES: Mapping[str, tuple[str, ...]] = {
    "executor": (topics.EXECUTOR_RUN.pattern(),),
    "agent": (topics.CONTROL_COMMAND.pattern(),),
}
"""Core (non-stream) subjects an identity subscribes to: requests it answers, commands it
follows."""

ASKS: Mapping[str, tuple[str, ...]] = {
    "optimizer": (topics.EXECUTOR_RUN.pattern(),),
}
"""Core request subjects an identity publishes to (and gets replies in its inbox)."""

FOLLOWS: Mapping[str, tuple[Topic[Any], ...]] = {
    identity: (topics.TOKEN_REVOKED,) for identity in tls.SERVICE_IDENTITIES
}
"""Topics an identity follows whole (replayed from the stream, then live): every server
refuses revoked tokens."""

RESPONDS: Mapping[str, int] = {
    # One request may be answered with progress messages before its reply
    # (stride.bus.topics.RequestTopic); ``true`` alone would allow one message.
    "executor": topics.EXECUTOR_RUN.max_replies,
    # NATS's authorization requests for training pods (stride.bus.callout): one reply each.
    "podwatcher": 1,
}
"""Identities that reply to requests (``allow_responses``), with the most replies each."""

CALLOUT_HOST = "podwatcher"
"""The identity that answers NATS's authorization requests for training pods."""

AGENT = "agent"
"""The identity of a training pod's agent: no user in the configuration (see the module)."""


class UnknownConsumer(ValueError):
    """A durable consumer that :data:`CONSUMERS` does not list for its identity."""


def check_consumer(identity: str, durable: str, topic: Topic[Any]) -> None:
    """Raise :class:`UnknownConsumer` unless ``identity`` runs ``durable`` on ``topic``."""
    for consumer in CONSUMERS:
        if consumer.durable == durable:
            if consumer.identity != identity or consumer.topic != topic:
                raise UnknownConsumer(
                    f"consumer {durable!r} belongs to {consumer.identity!r} on "
                    f"{consumer.topic.pattern()}, not to {identity!r} on {topic.pattern()}"
                )
            return
    raise UnknownConsumer(
        f"consumer {durable!r} of {identity!r} is not in stride.bus.permissions.CONSUMERS; "
        "add it there so NATS lets the service create it"
    )


@dataclass(frozen=True)
class Permissions:
    """One user's allow lists (everything else is denied)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: int = 0
    """The most replies to one request (0: it answers none)."""


def _consumer_api(consumer: Consumer) -> list[str]:
    stream, durable = consumer.topic.stream.name, consumer.durable
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
        dead_letter_subject(durable),
    ]


def _all_topics() -> list[Topic[Any]]:
    return [value for value in vars(topics).values() if isinstance(value, Topic)]


def permissions(identity: str) -> Permissions:
    """What ``identity`` may publish and subscribe to (see the module)."""
    inbox = f"{inbox_prefix(identity)}.>"
    if identity == ADMIN:
        # The administrator's tools (loadgen, replay) play producers; consumers still take
        # only events signed with the producer's key (stride.bus.signing).
        return Permissions(
            publish=("$JS.API.>", "$JS.ACK.>", "stride.>"), subscribe=(inbox, "stride.>")
        )
    publish: list[str] = ["$JS.API.INFO"]
    publish += [f"$JS.API.STREAM.INFO.{stream.name}" for stream in STREAMS]
    publish += [topic.pattern() for topic in _all_topics() if identity in topic.producers]
    for consumer in CONSUMERS:
        if consumer.identity == identity:
            publish += _consumer_api(consumer)
    publish += ASKS.get(identity, ())
    followed = FOLLOWS.get(identity, ())
    publish += [f"$JS.API.STREAM.MSG.GET.{topic.stream.name}" for topic in followed]
    subscribe = [inbox, *SERVES.get(identity, ()), *(topic.pattern() for topic in followed)]
    if identity == CALLOUT_HOST:
        subscribe.append(CALLOUT_SUBJECT)
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=tuple(dict.fromkeys(subscribe)),
        allow_responses=RESPONDS.get(identity, 0),
    )


CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
"""Where NATS asks the callout host to authorize a client (``stride.bus.callout``)."""


def agent_inbox_prefix(job_id: str, pod: str) -> str:
    """The inbox prefix of one pod's agent: its replies are its own."""
    return (
        f"{inbox_prefix(AGENT)}.{topics.check_token(job_id, 'job id')}."
        f"{topics.check_token(pod, 'pod name')}"
    )


def agent_permissions(job_id: str, pod: str) -> Permissions:
    """What the agent of one pod of ``job_id`` may do: the agent identity's permissions with
    every job-scoped subject narrowed to this job, and its own inbox."""
    general = permissions(AGENT)
    # What every server follows (revoked tokens) is keyed by token, not by job: the agent
    # follows all of it, like every server (narrowed, its subscription was refused).
    followed = FOLLOWS.get(AGENT, ())
    scoped = {
        topic.pattern(): topic.subject(job_id) for topic in _all_topics() if topic not in followed
    }

    def narrow(subjects: Iterable[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(scoped.get(subject, subject) for subject in subjects))

    inbox = f"{inbox_prefix(AGENT)}.>"
    return Permissions(
        publish=narrow(general.publish),
        subscribe=tuple(
            f"{agent_inbox_prefix(job_id, pod)}.>" if subject == inbox else subject
            for subject in narrow(general.subscribe)
        ),
    )


def server_users(identities: Iterable[str]) -> list[dict[str, Any]]:
    """The ``authorization.users`` entries of a nats-server configuration: one user per
    identity, named as its certificate (``verify_and_map``), with its permissions; none for
    the agent (see the module)."""
    users = []
    for identity in identities:
        if identity == AGENT:
            continue
        allowed = permissions(identity)
        publish: dict[str, Any] = {"allow": list(allowed.publish)}
        entry: dict[str, Any] = {
            "user": identity,
            "permissions": {"publish": publish, "subscribe": {"allow": list(allowed.subscribe)}},
        }
        if allowed.allow_responses:
            entry["permissions"]["allow_responses"] = {"max": allowed.allow_responses}
        users.append(entry)
    return users


ISSUER_FROM_ENVIRONMENT = "$STRIDE_NATS_CALLOUT_ISSUER"
"""The issuer of a configuration that is not made per deployment (the Helm chart's): NATS
reads the variable from its environment."""

SYSTEM_USER_ENV = "STRIDE_NATS_SYSTEM_USER"
"""Where NATS reads the system user's public key from in such a configuration: the Helm
chart's Secret ``<fullname>-nats-callout`` holds it (key ``system-user``)."""
SYSTEM_USER_FROM_ENVIRONMENT = f"${SYSTEM_USER_ENV}"
"""The system user of a configuration that is not made per deployment: NATS reads
:data:`SYSTEM_USER_ENV` from its environment."""


def server_config(
    *,
    cert_file: str,
    key_file: str,
    ca_file: str,
    identities: Sequence[str],
    callout_issuer: str,
    system_user: str | None = None,
) -> str:
    """The lock-down part of a nats-server configuration: mutual TLS with the deployment's
    CA (every client must present a certificate of it), one user per identity, mapped from
    its certificate, with its permissions, and the auth callout that makes the training
    pods' users (``callout_issuer``: its public key, or :data:`ISSUER_FROM_ENVIRONMENT`).
    ``system_user``: the public key (``U...``) of the one user of NATS's system account
    (:data:`SYSTEM_ACCOUNT`), with which the pod watcher disconnects revoked pods' sessions
    (``stride.bus.sessions``), or :data:`SYSTEM_USER_FROM_ENVIRONMENT`; None: no system
    user, and a revoked session lasts until its NATS user expires. Listen address and
    JetStream are the caller's. (The configuration format accepts JSON values, so values
    are JSON.)"""
    users = server_users(identities)
    # Everyone the configuration names is authorized by it, not by the callout.
    auth_users = [user["user"] for user in users]
    system: dict[str, Any] = {}
    if system_user is not None:
        if system_user != SYSTEM_USER_FROM_ENVIRONMENT:
            _public_key(system_user, "U", "system user")
        auth_users.append("@SYSTEM_USER@")
        system = {
            "system_account": SYSTEM_ACCOUNT,
            "accounts": {SYSTEM_ACCOUNT: {"users": [{"nkey": "@SYSTEM_USER@"}]}},
        }
    # A variable reference is written bare, for NATS to resolve.
    callout = {"issuer": "@ISSUER@", "auth_users": auth_users}
    body = {
        "tls": {
            "cert_file": cert_file,
            "key_file": key_file,
            "ca_file": ca_file,
            "verify_and_map": True,
            "timeout": 2,
        },
        "authorization": {"users": users, "auth_callout": callout},
        **system,
    }
    issuer = (
        callout_issuer
        if callout_issuer == ISSUER_FROM_ENVIRONMENT
        else json.dumps(_public_account_key(callout_issuer))
    )
    user = system_user if system_user == SYSTEM_USER_FROM_ENVIRONMENT else json.dumps(system_user)
    lines = ["# Generated by Stride (stride.bus.permissions from the bus contract): do not edit."]
    lines += [f"{key}: {json.dumps(value, indent=2)}" for key, value in body.items()]
    text = "\n".join(lines).replace('"@ISSUER@"', issuer).replace('"@SYSTEM_USER@"', user)
    return text + "\n"


def _public_account_key(text: str) -> str:
    return _public_key(text, "A", "callout issuer")


def _public_key(text: str, prefix: str, what: str) -> str:
    if len(text) != 56 or not text.startswith(prefix) or not text.isalnum() or not text.isupper():
        kind = "an account" if prefix == "A" else "a user"
        raise ValueError(f"{what} {text!r}: not {kind} public nkey ({prefix}..., 56 chars)")
    return text


SYSTEM_ACCOUNT = "SYS"
"""NATS's system account (the server's own requests: CONNZ, KICK). Its one user is the
pod watcher's system connection; no other identity is in it."""
