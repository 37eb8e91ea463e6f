"""Event signatures (stride.bus.signing): a consumer knows who published an event, and
refuses it from anyone but the topic's producers."""

from __future__ import annotations

from pathlib import Path

import pytest

from stride.bus import topics
from stride.bus.signing import (
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    ForgedSender,
    MessageSigner,
    SenderVerifier,
    as_producers,
)
from stride.events.v1 import plan_pb2
from stride.runtime import tls
from stride.runtime.certs import init


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("bus") / "tls"
    init(target)
    return target


def load(folder: Path, identity: str) -> tls.TlsMaterial:
    material = tls.load(identity, {tls.TLS_DIR_ENV: str(folder)})
    assert material is not None
    return material


def plan_event(job: str = "job-a") -> topics.Outgoing:
    return topics.PLAN.outgoing(job, plan_pb2.ResourcePlan(job_id=job, version=2), f"{job}.2")


def signed(folder: Path, identity: str, event: topics.Outgoing) -> dict[str, str]:
    headers = dict(event.headers)
    signer = MessageSigner(load(folder, identity))
    headers.update(signer.headers(event.subject, headers[topics.TYPE_HEADER], event.payload))
    return headers


def check(folder: Path, event: topics.Outgoing, headers: dict[str, str]) -> str:
    verifier = SenderVerifier((folder / "ca.crt").read_bytes())
    return verifier.check(
        event.subject, headers.get(topics.TYPE_HEADER, ""), event.payload, headers,
        topics.PLAN.producers,
    )  # fmt: skip


def test_a_plan_signed_by_the_optimizer_is_the_optimizers(folder: Path) -> None:
    event = plan_event()
    assert check(folder, event, signed(folder, "optimizer", event)) == "optimizer"


@pytest.mark.parametrize("identity", ["admission", "agent", "trainer", "cli", "podwatcher"])
def test_a_plan_signed_by_anyone_else_is_refused(folder: Path, identity: str) -> None:
    event = plan_event()
    with pytest.raises(ForgedSender, match=f"sent by '{identity}'; only optimizer may publish"):
        check(folder, event, signed(folder, identity, event))


def test_unsigned_changed_moved_or_foreign_events_are_refused(folder: Path, tmp_path: Path) -> None:
    event = plan_event()
    with pytest.raises(ForgedSender, match="unsigned"):
        check(folder, event, dict(event.headers))
    headers = signed(folder, "optimizer", event)
    bigger = plan_event()
    changed = topics.Outgoing(
        event.subject,
        plan_pb2.ResourcePlan(job_id="job-a", version=99).SerializeToString(),
        event.message_id,
        bigger.headers,
    )
    with pytest.raises(ForgedSender, match="not 'optimizer''s over this subject and payload"):
        check(folder, changed, headers)
    moved = topics.Outgoing(
        topics.PLAN.subject("job-b"), event.payload, event.message_id, event.headers
    )
    with pytest.raises(ForgedSender, match="over this subject"):
        check(folder, moved, headers)
    other = tmp_path / "other"
    init(other)
    with pytest.raises(ForgedSender, match="not issued by this deployment's CA"):
        check(folder, event, signed(other, "optimizer", event))
    with pytest.raises(ForgedSender, match="not a certificate"):
        check(folder, event, {**headers, SIGNER_HEADER: "AAAA"})
    with pytest.raises(ForgedSender, match="signature"):
        check(folder, event, {**headers, SIGNATURE_HEADER: "not base64!"})


def test_every_topic_names_its_producers_and_tools_sign_as_them(folder: Path) -> None:
    signer_for = as_producers(lambda identity: load(folder, identity))
    for topic in topics.TOPICS:
        assert topic.producers and set(topic.producers) <= set(tls.SERVICE_IDENTITIES)
        signer = signer_for(topic.subject("job-a"))
        assert signer is not None and signer.identity == topic.producers[0]
    assert signer_for("stride.unknown.v1.job-a") is None
