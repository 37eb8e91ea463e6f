"""Mutual TLS for every gRPC server and client of the suite (service identity).

Every process presents a certificate signed by the deployment's CA and accepts only peers
that do: a server requires a client certificate, and a client checks that the server's
certificate names the service it meant to reach. The name checked is the service's
identity (``admission``, ``dispatcher``, ...), not the address dialled, so the same
certificates work on ``127.0.0.1`` (``stride up``), on compose's host names and on
Kubernetes Service names.

Where the material comes from (read from the environment, so services, the CLI, the agent
and the trainer's clients all agree):

- ``STRIDE_TLS_CERT_FILE``, ``STRIDE_TLS_KEY_FILE``, ``STRIDE_TLS_CA_FILE``: one identity's
  certificate, key and the CA (the layout cert-manager writes into a Secret: ``tls.crt``,
  ``tls.key``, ``ca.crt``; what the Helm chart mounts);
- else ``STRIDE_TLS_DIR``: a folder as :mod:`stride.runtime.certs` writes it (``ca.crt`` and
  ``<identity>.crt`` / ``<identity>.key`` per identity; what ``stride up`` and compose use);
- else ``STRIDE_INSECURE=1``: plain text, with a warning at every start. Not for a shared
  cluster: anyone who can reach a port can call it.

With none of these a server refuses to start and a client refuses to dial, and the error
says what to set: TLS is on by default.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from stride.runtime.errors import StartupError

TLS_DIR_ENV = "STRIDE_TLS_DIR"
CERT_FILE_ENV = "STRIDE_TLS_CERT_FILE"
KEY_FILE_ENV = "STRIDE_TLS_KEY_FILE"
CA_FILE_ENV = "STRIDE_TLS_CA_FILE"
INSECURE_ENV = "STRIDE_INSECURE"

CA_CERT_NAME = "ca.crt"
"""The CA's certificate in a :data:`TLS_DIR_ENV` folder."""

SERVICE_IDENTITIES = (
    "admission",
    "optimizer",
    "executor",
    "configdb",
    "dispatcher",
    "ckptcache",
    "podwatcher",
    "agent",
)
"""Every service (its ``service_name``), in start order."""

IDENTITIES = (*SERVICE_IDENTITIES, "trainer", "cli", "users", "nats")
"""Every identity ``stride certs init`` issues a certificate to: the services, the agent
sidecar, the trainer's clients (checkpoints, shards, its agent), the CLI, ``users``, whose
key signs user tokens (:mod:`.tokens`; only the administrator holds it), and ``nats``, the
embedded NATS server's own certificate."""

INSECURE_WARNING = (
    f"{INSECURE_ENV} is set: gRPC runs in plain text without peer authentication; anyone "
    "who can reach a port can call every method. Use it only on a machine of your own."
)


class TlsConfigError(StartupError):
    """The TLS material is missing, unreadable or inconsistent; the message says which."""


@dataclass(frozen=True)
class TlsMaterial:
    """One identity's PEM certificate chain and key, and the CA it trusts."""

    identity: str
    certificate: bytes
    key: bytes
    ca: bytes
    source: str
    """Where it was read from (for messages)."""


def ssl_client_context(material: TlsMaterial) -> ssl.SSLContext:
    """A TLS client context (for NATS) that presents ``material``'s certificate and trusts
    only its CA. The key passes through a private temporary folder: :mod:`ssl` loads a
    certificate chain from files only."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=material.ca.decode())
    with tempfile.TemporaryDirectory(prefix="stride-tls-") as folder:
        certificate, key = Path(folder) / "identity.crt", Path(folder) / "identity.key"
        certificate.write_bytes(material.certificate)
        key.touch(mode=0o600)
        key.write_bytes(material.key)
        context.load_cert_chain(certificate, key)
    return context


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment names TLS material or plain text at all (else a caller with
    a default of its own, like ``stride up``'s state folder, may supply it)."""
    env = os.environ if environ is None else environ
    return any(
        env.get(name) for name in (TLS_DIR_ENV, CERT_FILE_ENV, KEY_FILE_ENV, CA_FILE_ENV)
    ) or insecure(env)


def insecure(environ: Mapping[str, str] | None = None) -> bool:
    """Whether plain text was asked for explicitly (``STRIDE_INSECURE`` 1/true/yes)."""
    value = (os.environ if environ is None else environ).get(INSECURE_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TlsConfigError(f"cannot read the {what} {path}: {error.strerror or error}") from None
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"the {what} {path} is not PEM (no -----BEGIN line)")
    return data


def load(identity: str, environ: Mapping[str, str] | None = None) -> TlsMaterial | None:
    """``identity``'s material from the environment; None if plain text was asked for.

    Raises :class:`TlsConfigError` naming the variable to set when there is neither."""
    env = os.environ if environ is None else environ
    files = {name: env.get(name, "").strip() for name in (CERT_FILE_ENV, KEY_FILE_ENV, CA_FILE_ENV)}
    if any(files.values()):
        missing = [name for name, value in files.items() if not value]
        if missing:
            raise TlsConfigError(
                f"{', '.join(missing)} not set: {CERT_FILE_ENV}, {KEY_FILE_ENV} and "
                f"{CA_FILE_ENV} go together"
            )
        return TlsMaterial(
            identity,
            _read(Path(files[CERT_FILE_ENV]), "certificate"),
            _read(Path(files[KEY_FILE_ENV]), "private key"),
            _read(Path(files[CA_FILE_ENV]), "CA certificate"),
            files[CERT_FILE_ENV],
        )
    folder = env.get(TLS_DIR_ENV, "").strip()
    if folder:
        base = Path(folder)
        certificate = base / f"{identity}.crt"
        if not certificate.exists():
            raise TlsConfigError(
                f"{TLS_DIR_ENV}={folder} has no certificate for {identity!r} "
                f"({certificate.name}); `stride certs init {folder}` writes one per identity"
            )
        return TlsMaterial(
            identity,
            _read(certificate, "certificate"),
            _read(base / f"{identity}.key", "private key"),
            _read(base / CA_CERT_NAME, "CA certificate"),
            str(base),
        )
    if insecure(env):
        return None
    raise TlsConfigError(
        f"no TLS material for {identity!r}: set {TLS_DIR_ENV} to a folder made by "
        f"`stride certs init DIR` (or {CERT_FILE_ENV}, {KEY_FILE_ENV} and {CA_FILE_ENV}), "
        f"or {INSECURE_ENV}=1 for plain text on a machine of your own"
    )


def server_credentials(material: TlsMaterial) -> grpc.ServerCredentials:
    """Serve with ``material``'s certificate and require a client certificate from its CA."""
    return grpc.ssl_server_credentials(
        [(material.key, material.certificate)],
        root_certificates=material.ca,
        require_client_auth=True,
    )


def channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    """Trust ``material``'s CA and present its certificate."""
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca,
        private_key=material.key,
        certificate_chain=material.certificate,
    )


Token = Callable[[], "str | None"]
"""Where a client's bearer token comes from (:class:`.tokens.TokenSource`), asked per call."""


class _BearerPlugin(grpc.AuthMetadataPlugin):
    """Adds ``authorization: Bearer <token>`` to every call (a token file is re-read when
    it changed, so a pod's rewritten job token is picked up without a new channel)."""

    def __init__(self, token: Token) -> None:
        self.token = token

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        try:
            value = self.token()
        except Exception as error:  # a gRPC thread: the call fails with this message
            callback((), error)
            return
        callback((("authorization", f"Bearer {value}"),) if value else (), None)


def _dialling(
    server: str,
    identity: str,
    options: Sequence[tuple[str, Any]],
    environ: Mapping[str, str] | None,
    token: Token | None = None,
) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, Any]]]:
    """A client's credentials (None: plain text) and channel options. ``token``: a bearer
    token sent with every call (only over TLS: in plain text nothing verifies it)."""
    material = load(identity, environ)
    if material is None:
        return None, list(options)
    # The server's certificate must name the service dialled, whatever the address.
    override = ("grpc.ssl_target_name_override", server)
    credentials = channel_credentials(material)
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.metadata_call_credentials(_BearerPlugin(token), name="stride")
        )
    return credentials, [override, *options]


def aio_channel(
    address: str,
    *,
    server: str,
    identity: str,
    options: Sequence[tuple[str, Any]] = (),
    environ: Mapping[str, str] | None = None,
    interceptors: Sequence[Any] | None = None,
    token: Token | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel to the service ``server`` at ``address``, as ``identity``: mutual
    TLS unless plain text was asked for (:func:`load`); ``token``: the caller's bearer
    token (a user's or a job's, :mod:`.tokens`), asked for at every call."""
    credentials, settings = _dialling(server, identity, options, environ, token)
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=settings, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, settings, interceptors=interceptors)


def sync_channel(
    address: str,
    *,
    server: str,
    identity: str,
    options: Sequence[tuple[str, Any]] = (),
    environ: Mapping[str, str] | None = None,
    token: Token | None = None,
) -> grpc.Channel:
    """:func:`aio_channel` for blocking clients."""
    credentials, settings = _dialling(server, identity, options, environ, token)
    if credentials is None:
        return grpc.insecure_channel(address, options=settings)
    return grpc.secure_channel(address, credentials, options=settings)


def peer_identities(context: Any) -> tuple[str, ...]:
    """The verified names (SAN DNS names, else the common name) of a call's client
    certificate; empty for a plain-text call. Only what TLS verified: never a header."""
    auth = context.auth_context()
    names = [value.decode() for value in auth.get("x509_subject_alternative_name", [])]
    if not names:
        names = [value.decode() for value in auth.get("x509_common_name", [])]
    return tuple(names)
