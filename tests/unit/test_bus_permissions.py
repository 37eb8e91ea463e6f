"""NATS permissions derived from the bus contract (stride.bus.permissions)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stride.bus import callout, permissions, topics
from stride.bus.permissions import UnknownConsumer, check_consumer
from stride.runtime import certs, tls
from stride.runtime.embedded_nats import nats_server_binary

TOPICS: list[topics.Topic[Any]] = [
    value for value in vars(topics).values() if isinstance(value, topics.Topic)
]


@pytest.mark.parametrize("identity", tls.SERVICE_IDENTITIES)
def test_a_service_publishes_exactly_the_topics_it_produces(identity: str) -> None:
    allowed = set(permissions.permissions(identity).publish)
    for topic in TOPICS:
        assert (topic.pattern() in allowed) == (identity in topic.producers), topic.pattern()
    # Nothing else of the streams' subjects: every other publish is JetStream API, its
    # dead letters or the executor's requests.
    others = {
        subject
        for subject in allowed
        if subject.startswith("stride.") and subject not in {t.pattern() for t in TOPICS}
    }
    assert others <= {
        *(topics.dead_letter_subject(c.durable) for c in permissions.CONSUMERS),
        topics.EXECUTOR_RUN.pattern(),
    }


@pytest.mark.parametrize("identity", [*tls.SERVICE_IDENTITIES, "trainer", "users", "nats"])
def test_no_one_but_the_administrator_manages_streams_or_others_consumers(identity: str) -> None:
    allowed = permissions.permissions(identity)
    # Stream info, and reading single messages of the streams it follows (revocations).
    followed = {
        f"$JS.API.STREAM.MSG.GET.{t.stream.name}" for t in permissions.FOLLOWS.get(identity, ())
    }
    for subject in allowed.publish:
        if subject.startswith("$JS.API.STREAM."):
            assert subject.startswith("$JS.API.STREAM.INFO.") or subject in followed, subject
        assert ".DELETE." not in subject, subject
        assert subject != "$JS.API.>", subject
    mine = {c.durable for c in permissions.CONSUMERS if c.identity == identity}
    for consumer in permissions.CONSUMERS:
        api = f"$JS.API.CONSUMER.MSG.NEXT.{consumer.topic.stream.name}.{consumer.durable}"
        assert (api in allowed.publish) == (consumer.durable in mine)
    # Replies only in its own inbox; stream subjects never by plain subscription.
    assert allowed.subscribe[0] == f"_INBOX_{identity}.>"
    streamed = {topic.pattern() for topic in TOPICS}
    followed_topics = {topic.pattern() for topic in permissions.FOLLOWS.get(identity, ())}
    assert not streamed & set(allowed.subscribe) - {topics.CONTROL_COMMAND.pattern()} - (
        followed_topics
    )


@pytest.mark.parametrize("identity", tls.SERVICE_IDENTITIES)
def test_every_server_follows_the_revoked_tokens(identity: str) -> None:
    allowed = permissions.permissions(identity)
    assert topics.TOKEN_REVOKED.pattern() in allowed.subscribe
    assert f"$JS.API.STREAM.MSG.GET.{topics.AUTH.name}" in allowed.publish
    # Only admission publishes them.
    assert (topics.TOKEN_REVOKED.pattern() in allowed.publish) == (identity == "admission")


def test_who_serves_and_who_asks() -> None:
    executor = permissions.permissions("executor")
    assert executor.allow_responses and topics.EXECUTOR_RUN.pattern() in executor.subscribe
    assert topics.EXECUTOR_RUN.pattern() in permissions.permissions("optimizer").publish
    assert topics.EXECUTOR_RUN.pattern() not in permissions.permissions("podwatcher").publish
    agent = permissions.permissions("agent")
    assert topics.CONTROL_COMMAND.pattern() in agent.subscribe
    assert set(agent.publish) >= {topics.STEP_METRICS.pattern(), topics.CONTROL_ACK.pattern()}
    assert not agent.allow_responses
    # A request is answered with progress messages and then the answer: the server lets the
    # executor send that many to one reply subject, not the single message ``true`` allows.
    (entry,) = [u for u in permissions.server_users(["executor"]) if u["user"] == "executor"]
    assert entry["permissions"]["allow_responses"] == {"max": topics.EXECUTOR_RUN.max_replies}
    # An hour's run (the executor's longest time limit) fits, with a message a second.
    assert topics.EXECUTOR_RUN.max_replies * topics.EXECUTOR_RUN.progress_seconds > 3600


def test_consumers_are_checked_against_the_registry() -> None:
    check_consumer("optimizer", "optimizer-admitted", topics.JOB_ADMITTED)
    with pytest.raises(UnknownConsumer, match="belongs to 'optimizer'"):
        check_consumer("podwatcher", "optimizer-admitted", topics.JOB_ADMITTED)
    with pytest.raises(UnknownConsumer, match=re.escape(f"on {topics.JOB_ADMITTED.pattern()}")):
        check_consumer("optimizer", "optimizer-admitted", topics.JOB_FINISHED)
    with pytest.raises(UnknownConsumer, match=re.escape("not in stride.bus.permissions.CONSUMERS")):
        check_consumer("optimizer", "optimizer-new", topics.PLAN)
    durables = [c.durable for c in permissions.CONSUMERS]
    assert len(durables) == len(set(durables))
    for consumer in permissions.CONSUMERS:
        assert consumer.durable.startswith(f"{consumer.identity}-")
        assert consumer.identity in tls.SERVICE_IDENTITIES


@pytest.mark.parametrize("issuer_from", ["seed", "environment"])
def test_the_generated_configuration_is_one_nats_server_accepts(
    tmp_path: Path, issuer_from: str
) -> None:
    certs.init(tmp_path, identities=("nats",))
    issuer = callout.public_key_of(tmp_path / callout.SEED_NAME)
    config = tmp_path / "nats.conf"
    config.write_text(
        permissions.server_config(
            cert_file=str(tmp_path / "nats.crt"),
            key_file=str(tmp_path / "nats.key"),
            ca_file=str(tmp_path / "ca.crt"),
            identities=tls.IDENTITIES,
            callout_issuer=issuer if issuer_from == "seed" else permissions.ISSUER_FROM_ENVIRONMENT,
        )
    )
    checked = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, callout.ISSUER_ENV: issuer},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "is valid" in checked.stdout + checked.stderr
