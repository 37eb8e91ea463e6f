"""Who published an event: a signature by the sender's certificate, checked by consumers.

NATS delivers whatever anyone who can reach it publishes, and a header saying who sent it
is worth nothing. So every event a service publishes carries a signature (ECDSA P-256,
SHA-256) by the key of its TLS identity (:mod:`stride.runtime.tls`) over the subject, the
payload's type and a digest of the payload, with the signer's certificate:

- ``Stride-Signer``: the signer's certificate (base64 DER);
- ``Stride-Signature``: the signature (base64 DER).

A consumer checks that the deployment's CA issued the certificate, that the certificate
is one of the topic's producers (:attr:`~stride.bus.topics.Topic.producers`: a plan must
come from the optimizer, ``admitted`` from admission) and that the signature is that
certificate's key's over this very subject and payload. Anything else is dead-lettered
with the reason and never reaches a handler. The signature binds the subject, so an event
cannot be moved to another job's subject either.

**Pods.** Every pod's agent holds the same ``agent`` certificate, so a signature by it
would not say which job sent an event, and one job's pod could publish another job's step
metrics or acknowledge its commands. What pods publish (the topics whose producer is
:data:`POD_PRODUCER`) is signed instead with the pod's own key (:class:`PodSigner`),
beside the pod's job token, which the pod watcher signed and which binds that key
(``cnf.jwk``, :mod:`stride.runtime.tokens`):

- ``Stride-Job-Token``: the pod's job token;
- ``Stride-Signature``: the signature by the pod's key.

The consumer verifies the token (the pod watcher's, not expired), the signature with the
key it binds, and that the token's job is the subject's: the sender is that pod of that
job, and no other job's subject accepts it. A token alone (seen in a message) signs
nothing.

**Message ids.** JetStream drops a message whose ``Nats-Msg-Id`` it saw in the stream's
duplicate window, and the window is the stream's, not the publisher's: a logical id that
anyone can predict (``<pod>.ack.<version>.<action>``) lets one job publish another job's
future id on its own subject and so mute that job's event. So a signer also keys the ids
it publishes (:meth:`MessageSigner.message_id`): ``<logical id>#<tag>``, the tag an HMAC
over the subject and the logical id with a secret derived from the signer's private key.
No other identity can produce the tag, and the same publisher sending the same event
again (a retry, an outbox relay after a crash, a restarted pod with its kept key) makes
the same id, so its own redeliveries are still dropped. Consumers see the logical id
(:func:`logical_message_id`).

In plain text (``STRIDE_INSECURE=1``) nothing is signed or checked, as nothing is verified
on gRPC there either; message ids are the logical ones.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from stride.runtime.certs import verified_signer
from stride.runtime.tls import TlsMaterial
from stride.runtime.tokens import (
    JOB_ISSUER,
    JOB_TOKEN_TTL,
    JobIdentity,
    Signer,
    TokenError,
    Verifier,
    new_pod_key,
)

SIGNER_HEADER = "Stride-Signer"
SIGNATURE_HEADER = "Stride-Signature"
JOB_TOKEN_HEADER = "Stride-Job-Token"
POD_PRODUCER = "agent"
"""The producer of the topics pods publish (their agents): signed by :class:`PodSigner`."""
_CONTEXT = b"stride-bus-v1\0"
_ID_CONTEXT = b"stride-bus-message-id-v1\0"
ID_TAG_SEPARATOR = "#"
"""Between a message id's logical part and its keyed tag (logical ids use dots)."""
_ID_TAG_HEX = 32
"""128 bits of the HMAC: no guess collides within any duplicate window."""


def id_secret(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The message-id secret of a signing key: derived from the private key, so every
    replica holding the same key (and a pod restarted with its kept key) derives the same."""
    private = key.private_numbers().private_value.to_bytes(66, "big")
    return hashlib.sha256(_ID_CONTEXT + private).digest()


def keyed_message_id(secret: bytes, subject: str, message_id: str) -> str:
    """``<message_id>#<tag>``: the wire id only the holder of ``secret`` makes for this
    subject and logical id (see the module)."""
    tag = hmac.new(secret, subject.encode() + b"\0" + message_id.encode(), hashlib.sha256)
    return f"{message_id}{ID_TAG_SEPARATOR}{tag.hexdigest()[:_ID_TAG_HEX]}"


def logical_message_id(wire_id: str) -> str:
    """The logical part of a (possibly keyed) message id."""
    logical, separator, _tag = wire_id.rpartition(ID_TAG_SEPARATOR)
    return logical if separator else wire_id


class ForgedSender(Exception):
    """An event whose sender cannot be verified, or who may not publish it; says why."""


def _check_signature(
    key: ec.EllipticCurvePublicKey, signature: str, signed: bytes, whose: str
) -> None:
    """:class:`ForgedSender` unless ``signature`` (base64) is ``key``'s over ``signed``."""
    try:
        key.verify(base64.b64decode(signature, validate=True), signed, ec.ECDSA(hashes.SHA256()))
    except (ValueError, InvalidSignature):
        raise ForgedSender(
            f"the signature is not {whose}'s over this subject and payload"
        ) from None


def _signed_bytes(subject: str, type_name: str, payload: bytes) -> bytes:
    digest = hashlib.sha256(payload).digest()
    return _CONTEXT + subject.encode() + b"\0" + type_name.encode() + b"\0" + digest


class MessageSigner:
    """Signs events with one identity's key."""

    def __init__(self, material: TlsMaterial) -> None:
        key = serialization.load_pem_private_key(material.key, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{material.identity!r}: an EC key is needed to sign events")
        certificate = x509.load_pem_x509_certificates(material.certificate)[0]
        self.identity = material.identity
        self._key = key
        self._id_secret = id_secret(key)
        self._certificate = base64.b64encode(
            certificate.public_bytes(serialization.Encoding.DER)
        ).decode()

    def headers(self, subject: str, type_name: str, payload: bytes) -> dict[str, str]:
        """The signature headers of one event."""
        signature = self._key.sign(
            _signed_bytes(subject, type_name, payload), ec.ECDSA(hashes.SHA256())
        )
        return {
            SIGNER_HEADER: self._certificate,
            SIGNATURE_HEADER: base64.b64encode(signature).decode(),
        }

    def message_id(self, subject: str, message_id: str) -> str:
        """The keyed wire id of one event (see the module)."""
        return keyed_message_id(self._id_secret, subject, message_id)


class EventSigner(Protocol):
    """Whatever signs an event: its headers for one subject and payload."""

    def headers(self, subject: str, type_name: str, payload: bytes) -> dict[str, str]: ...

    def message_id(self, subject: str, message_id: str) -> str: ...


SignerFor = Callable[[str], "EventSigner | None"]
"""The signer of a subject's events (a service signs everything as itself; a tool playing
several parts signs each topic as its producer)."""


class PodSigner:
    """Signs what one pod publishes with the pod's own key, beside the pod's job token
    (read from ``token`` at each event: the pod watcher rewrites it before it expires)."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, token: Callable[[], str | None]) -> None:
        self._key = key
        self._token = token
        self._id_secret = id_secret(key)

    def message_id(self, subject: str, message_id: str) -> str:
        """The keyed wire id of one event: only this pod's key makes it."""
        return keyed_message_id(self._id_secret, subject, message_id)

    def headers(self, subject: str, type_name: str, payload: bytes) -> dict[str, str]:
        token = self._token()
        if not token:
            raise TokenError("no job token to publish with (the pod watcher writes it)")
        signature = self._key.sign(
            _signed_bytes(subject, type_name, payload), ec.ECDSA(hashes.SHA256())
        )
        return {JOB_TOKEN_HEADER: token, SIGNATURE_HEADER: base64.b64encode(signature).decode()}


class SenderVerifier:
    """Checks an event's signature against the deployment's CA."""

    def __init__(self, ca_pem: bytes) -> None:
        self._cas = tuple(x509.load_pem_x509_certificates(ca_pem))
        self._tokens = Verifier(ca_pem)

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one verifier per connection
    def _signer(self, encoded: str) -> tuple[str, ec.EllipticCurvePublicKey]:
        try:
            der = base64.b64decode(encoded, validate=True)
            signer = verified_signer(der, self._cas)
        except ValueError as error:  # CertificateError included
            raise ForgedSender(f"{SIGNER_HEADER}: {error}") from None
        return signer.identity, signer.key

    def sender(
        self, subject: str, type_name: str, payload: bytes, headers: Mapping[str, str]
    ) -> str:
        """The verified identity that signed this event; :class:`ForgedSender` if none."""
        encoded = headers.get(SIGNER_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if not encoded or not signature:
            raise ForgedSender("unsigned: no sender signature")
        identity, key = self._signer(encoded)
        _check_signature(key, signature, _signed_bytes(subject, type_name, payload), repr(identity))
        return identity

    def pod_sender(
        self,
        subject: str,
        type_name: str,
        payload: bytes,
        headers: Mapping[str, str],
        job_id: str,
    ) -> JobIdentity:
        """The pod that signed this event for ``job_id`` (the subject's job), from its job
        token; :class:`ForgedSender` if its token, its signature or its job is not right."""
        token = headers.get(JOB_TOKEN_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if not token or not signature:
            raise ForgedSender("unsigned: a pod's event needs its job token and its signature")
        try:
            identity = self._tokens.verify(token)
        except TokenError as error:
            raise ForgedSender(f"{JOB_TOKEN_HEADER}: {error}") from None
        if not isinstance(identity, JobIdentity):
            raise ForgedSender(f"{JOB_TOKEN_HEADER}: a user's token; a pod's is needed")
        if identity.key is None:
            raise ForgedSender(f"{JOB_TOKEN_HEADER}: the token binds no pod key to sign with")
        _check_signature(
            identity.key,
            signature,
            _signed_bytes(subject, type_name, payload),
            f"pod {identity.pod!r}",
        )
        if identity.job_id != job_id:
            raise ForgedSender(
                f"pod {identity.pod!r} works for job {identity.job_id!r}, not {job_id!r}"
            )
        return identity

    def check(
        self,
        subject: str,
        type_name: str,
        payload: bytes,
        headers: Mapping[str, str],
        producers: tuple[str, ...],
        job_id: str = "",
    ) -> str:
        """:meth:`sender`, which must be one of ``producers``; for what pods publish,
        :meth:`pod_sender` for ``job_id`` (the subject's job)."""
        if producers == (POD_PRODUCER,):
            return self.pod_sender(subject, type_name, payload, headers, job_id).describe()
        identity = self.sender(subject, type_name, payload, headers)
        if identity not in producers:
            raise ForgedSender(
                f"sent by {identity!r}; only {' or '.join(producers)} may publish it"
            )
        return identity


class JobPods:
    """Signs as a pod of whichever job a subject names, minting that pod's key and job token
    with the pod watcher's key (as the pod watcher would for a pod it starts): for tools
    that play a job's pods (``stride loadgen``, benchmarks, tests)."""

    def __init__(self, podwatcher: TlsMaterial, pod: str = "tool") -> None:
        self._signer = Signer(podwatcher)
        self._pod = pod
        self._pods: dict[str, tuple[PodSigner, float]] = {}

    def for_job(self, job_id: str) -> PodSigner:
        """The signer of job ``job_id``'s pod (a new token at half its life)."""
        known = self._pods.get(job_id)
        if known is not None and time.time() < known[1]:
            return known[0]
        key = new_pod_key()
        token = self._signer.job_token(
            job_id, f"{job_id}-{self._pod}", self._pod, pod_key=key.public_key()
        )
        signer = PodSigner(key, lambda: token)
        self._pods[job_id] = (signer, time.time() + JOB_TOKEN_TTL / 2)
        return signer

    def headers(self, subject: str, type_name: str, payload: bytes) -> dict[str, str]:
        """Signed as the pod of the job ``subject`` names (one of the pods' topics)."""
        return self._pod_of(subject).headers(subject, type_name, payload)

    def message_id(self, subject: str, message_id: str) -> str:
        """Keyed as the pod of the job ``subject`` names."""
        return self._pod_of(subject).message_id(subject, message_id)

    def _pod_of(self, subject: str) -> PodSigner:
        from stride.bus.topics import TOPICS

        for topic in TOPICS:
            job_id = topic.key_of(subject) if topic.producers == (POD_PRODUCER,) else None
            if job_id:
                return self.for_job(job_id)
        raise TokenError(f"{subject}: not a subject pods publish on")


def _tool_signer(identity: str, load: Callable[[str], TlsMaterial | None]) -> EventSigner | None:
    """Who signs as ``identity`` for a tool (None: its key is not there): the pods' topics
    as a pod of the subject's job, minted with the pod watcher's key."""
    if identity == POD_PRODUCER:
        issuer = load(JOB_ISSUER)
        return JobPods(issuer) if issuer else None
    material = load(identity)
    return MessageSigner(material) if material else None


def as_producers(load: Callable[[str], TlsMaterial | None]) -> SignerFor:
    """Signs each contract topic's events as its first producer, with the keys ``load``
    gives (``tls.load``): for tools that play several parts of the suite on a machine that
    holds every identity's key (``stride loadgen`` and ``stride replay`` with the state
    folder's certificates, tests with the session's). What pods publish is signed as a pod
    of the subject's job (:class:`JobPods`, with the pod watcher's key). A subject of no
    topic is unsigned."""
    from stride.bus.topics import TOPICS

    signers: dict[str, EventSigner | None] = {}

    def signer_for(subject: str) -> EventSigner | None:
        for topic in TOPICS:
            if topic.producers and topic.key_of(subject) is not None:
                identity = topic.producers[0]
                if identity not in signers:
                    signers[identity] = _tool_signer(identity, load)
                return signers[identity]
        return None

    return signer_for
