"""Event signatures (stride.bus.signing): a consumer knows who published an event, and
refuses it from anyone but the topic's producers."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from stride.bus import topics
from stride.bus.signing import (
    JOB_TOKEN_HEADER,
    POD_PRODUCER,
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    ForgedSender,
    MessageSigner,
    PodSigner,
    SenderVerifier,
    as_producers,
    logical_message_id,
)
from stride.events.v1 import metrics_pb2, plan_pb2
from stride.runtime import tls
from stride.runtime.certs import init
from stride.runtime.tokens import Signer, new_pod_key


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
        subject = topic.subject("job-a")
        signer = signer_for(subject)
        assert signer is not None
        headers = signer.headers(subject, "t", b"payload")
        verifier = SenderVerifier((folder / "ca.crt").read_bytes())
        sender = verifier.check(subject, "t", b"payload", headers, topic.producers, "job-a")
        if topic.producers == (POD_PRODUCER,):
            # What pods publish: as a pod of the subject's job, never as a service.
            assert sender == "job 'job-a' (pod 'job-a-tool', tool)", (topic.name, sender)
        else:
            assert sender == topic.producers[0], (topic.name, sender)
    assert signer_for("stride.unknown.v1.job-a") is None


def metrics_event(job: str) -> topics.Outgoing:
    message = metrics_pb2.StepMetrics(job_id=job, pod_name=f"{job}-worker-0", steps=10)
    return topics.STEP_METRICS.outgoing(job, message, f"{job}.steps.1")


def pod_signed(
    folder: Path,
    event: topics.Outgoing,
    job: str,
    *,
    bound: ec.EllipticCurvePrivateKey | None = None,
    signing: ec.EllipticCurvePrivateKey | None = None,
    issuer: str = "podwatcher",
) -> dict[str, str]:
    """``event``'s headers as the agent of ``job``'s worker 0 signs them: the token binds
    ``bound`` (a fresh key), the signature is by ``signing`` (the bound key)."""
    bound = bound or new_pod_key()
    token = Signer(load(folder, issuer)).job_token(
        job, f"{job}-worker-0", "worker", pod_key=bound.public_key()
    )
    signer = PodSigner(signing or bound, lambda: token)
    headers = dict(event.headers)
    headers.update(signer.headers(event.subject, headers[topics.TYPE_HEADER], event.payload))
    return headers


def check_pod(folder: Path, event: topics.Outgoing, headers: dict[str, str], job: str) -> str:
    verifier = SenderVerifier((folder / "ca.crt").read_bytes())
    return verifier.check(
        event.subject, headers.get(topics.TYPE_HEADER, ""), event.payload, headers,
        topics.STEP_METRICS.producers, job,
    )  # fmt: skip


def test_a_pods_event_is_that_pods_of_that_job(folder: Path) -> None:
    event = metrics_event("job-a")
    sender = check_pod(folder, event, pod_signed(folder, event, "job-a"), "job-a")
    assert sender == "job 'job-a' (pod 'job-a-worker-0', worker)"


def test_one_jobs_pod_cannot_publish_for_another_job(folder: Path) -> None:
    # Job A's pod, with its own valid key and token, signs job B's metrics.
    event = metrics_event("job-b")
    headers = pod_signed(folder, event, "job-a")
    with pytest.raises(ForgedSender, match="works for job 'job-a', not 'job-b'"):
        check_pod(folder, event, headers, "job-b")
    # Nor moves its own signed event to job B's subject: the signature binds the subject.
    own = metrics_event("job-a")
    signed_own = pod_signed(folder, own, "job-a")
    moved = topics.Outgoing(event.subject, own.payload, own.message_id, own.headers)
    with pytest.raises(ForgedSender, match="over this subject"):
        check_pod(folder, moved, signed_own, "job-b")


def test_a_pods_event_signed_any_other_way_is_refused(folder: Path) -> None:
    event = metrics_event("job-a")
    # The certificate every agent shares says nothing about the job.
    with pytest.raises(ForgedSender, match="needs its job token and its signature"):
        check_pod(folder, event, signed(folder, "agent", event), "job-a")
    # A token with a signature by another key than the one it binds.
    with pytest.raises(ForgedSender, match="not pod 'job-a-worker-0'"):
        check_pod(folder, event, pod_signed(folder, event, "job-a", signing=new_pod_key()), "job-a")
    # A job token minted by a service other than the pod watcher.
    with pytest.raises(ForgedSender, match="must be signed by 'podwatcher'"):
        check_pod(folder, event, pod_signed(folder, event, "job-a", issuer="optimizer"), "job-a")
    # (An expired token is refused as everywhere tokens are: tests/unit/test_tokens.py.)


def test_a_token_that_binds_no_key_signs_nothing(folder: Path) -> None:
    event = metrics_event("job-a")
    token = Signer(load(folder, "podwatcher")).job_token("job-a", "job-a-worker-0", "worker")
    headers = dict(event.headers)
    headers.update(
        PodSigner(new_pod_key(), lambda: token).headers(
            event.subject, headers[topics.TYPE_HEADER], event.payload
        )
    )
    with pytest.raises(ForgedSender, match="binds no pod key"):
        check_pod(folder, event, headers, "job-a")
    # A user's token is no pod's either.
    user = Signer(load(folder, "users")).user_token("alice")
    headers[JOB_TOKEN_HEADER] = user
    with pytest.raises(ForgedSender, match="a user's token"):
        check_pod(folder, event, headers, "job-a")


def test_message_ids_are_keyed_by_the_publishers_own_key(folder: Path) -> None:
    """#37 finding 2: the wire id of an event is ``<logical id>#<tag>``; the tag only the
    publisher's key makes, for this subject and logical id, and it makes it again."""
    subject = topics.CONTROL_ACK.subject("job-a")
    logical = "pod-0.ack.2.reconfigure"
    pod = PodSigner(new_pod_key(), lambda: "token")
    other_pod = PodSigner(new_pod_key(), lambda: "token")
    service = MessageSigner(load(folder, "optimizer"))
    again = MessageSigner(load(folder, "optimizer"))  # another replica, the same key

    keyed = pod.message_id(subject, logical)
    assert keyed.startswith(f"{logical}#") and len(keyed) == len(logical) + 33
    assert logical_message_id(keyed) == logical
    assert pod.message_id(subject, logical) == keyed
    assert other_pod.message_id(subject, logical) != keyed
    assert pod.message_id(topics.CONTROL_ACK.subject("job-b"), logical) != keyed
    assert service.message_id(subject, logical) == again.message_id(subject, logical)
    assert service.message_id(subject, logical) != keyed
    assert logical_message_id("plain.id") == "plain.id"  # plain text: unkeyed
