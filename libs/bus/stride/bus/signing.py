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

In plain text (``STRIDE_INSECURE=1``) nothing is signed or checked, as nothing is verified
on gRPC there either.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Callable, Mapping

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from stride.runtime.certs import verified_signer
from stride.runtime.tls import TlsMaterial

SIGNER_HEADER = "Stride-Signer"
SIGNATURE_HEADER = "Stride-Signature"
_CONTEXT = b"stride-bus-v1\0"


class ForgedSender(Exception):
    """An event whose sender cannot be verified, or who may not publish it; says why."""


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


SignerFor = Callable[[str], "MessageSigner | None"]
"""The signer of a subject's events (a service signs everything as itself; a tool playing
several parts signs each topic as its producer)."""


class SenderVerifier:
    """Checks an event's signature against the deployment's CA."""

    def __init__(self, ca_pem: bytes) -> None:
        self._cas = tuple(x509.load_pem_x509_certificates(ca_pem))

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
        try:
            key.verify(
                base64.b64decode(signature, validate=True),
                _signed_bytes(subject, type_name, payload),
                ec.ECDSA(hashes.SHA256()),
            )
        except (ValueError, InvalidSignature):
            raise ForgedSender(
                f"the signature is not {identity!r}'s over this subject and payload"
            ) from None
        return identity

    def check(
        self,
        subject: str,
        type_name: str,
        payload: bytes,
        headers: Mapping[str, str],
        producers: tuple[str, ...],
    ) -> str:
        """:meth:`sender`, which must be one of ``producers``."""
        identity = self.sender(subject, type_name, payload, headers)
        if identity not in producers:
            raise ForgedSender(
                f"sent by {identity!r}; only {' or '.join(producers)} may publish it"
            )
        return identity


def as_producers(load: Callable[[str], TlsMaterial | None]) -> SignerFor:
    """Signs each contract topic's events as its first producer, with the keys ``load``
    gives (``tls.load``): for tools that play several parts of the suite on a machine that
    holds every identity's key (``stride loadgen`` and ``stride replay`` with the state
    folder's certificates, tests with the session's). A subject of no topic is unsigned."""
    from stride.bus.topics import TOPICS

    signers: dict[str, MessageSigner | None] = {}

    def signer_for(subject: str) -> MessageSigner | None:
        for topic in TOPICS:
            if topic.producers and topic.key_of(subject) is not None:
                identity = topic.producers[0]
                if identity not in signers:
                    material = load(identity)
                    signers[identity] = MessageSigner(material) if material else None
                return signers[identity]
        return None

    return signer_for
