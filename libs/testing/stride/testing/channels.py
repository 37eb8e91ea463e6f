"""gRPC channels of tests: mutual TLS like every client of the suite.

A test session has its own CA and certificates (the pytest plugin makes them once per
process and points ``STRIDE_TLS_DIR`` at them, so every service a test starts, in-process
or as a process, serves with them). A test dials a service as the ``cli`` identity and
checks that the server is the service it names.

Calls carry a user token (:mod:`stride.runtime.tokens`): an admin's unless the test asks
for another (:func:`user_token`, :func:`job_token`, or ``token=None`` for none), signed
with the session's ``users`` and ``podwatcher`` keys.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from stride.runtime import tls
from stride.runtime.certs import init
from stride.runtime.tokens import (
    JOB_ISSUER,
    TOKEN_ENV,
    USER_ISSUER,
    Signer,
    new_pod_key,
    write_pod_key,
    write_token,
)

IDENTITY = "cli"
ADMIN = "admin"
"""The user of the tokens test channels send by default (an admin)."""
_DEFAULT: Any = object()


def _signer(identity: str) -> Signer:
    material = tls.load(identity)
    if material is None:
        raise RuntimeError("plain text: tokens are neither signed nor checked")
    return Signer(material)


def user_token(user: str = ADMIN, *, admin: bool | None = None, ttl: float = 3600.0) -> str:
    """A user token signed by the session's ``users`` key (``admin`` defaults to whether
    ``user`` is :data:`ADMIN`)."""
    return _signer(USER_ISSUER).user_token(
        user, admin=(user == ADMIN) if admin is None else admin, ttl=ttl
    )


def job_token(job_id: str, pod: str = "pod-0", role: str = "worker", ttl: float = 3600.0) -> str:
    """A job token as the pod watcher gives a pod, signed by the session's ``podwatcher``."""
    return _signer(JOB_ISSUER).job_token(job_id, pod, role, ttl=ttl)


def job_token_file(folder: Path, job_id: str, pod: str = "pod-0", role: str = "worker") -> Path:
    """A job token file as the pod watcher writes one (for an agent or a trainer's client
    a test starts itself), with the pod's key beside it (:func:`pod_key_file`), which the
    token binds."""
    key = new_pod_key()
    write_pod_key(pod_key_file(folder / f"{pod}.token"), key)
    path = folder / f"{pod}.token"
    token = _signer(JOB_ISSUER).job_token(job_id, pod, role, pod_key=key.public_key())
    write_token(path, token)
    return path


def pod_key_file(token_file: Path) -> Path:
    """The pod key written beside ``token_file`` by :func:`job_token_file` (an agent's
    ``job_key_file``)."""
    return token_file.with_suffix(".key")


def _token(token: Any) -> tls.Token | None:
    if token is _DEFAULT:
        if tls.insecure():
            return None
        value = user_token()
        return lambda: value
    if token is None:
        return None
    if isinstance(token, str):
        fixed = token
        return lambda: fixed
    return token  # type: ignore[no-any-return]


def make_session_certificates() -> Path:
    """A fresh CA and every identity's certificate in a new temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="stride-test-tls-")) / "tls"
    init(folder)
    return folder


def ensure_certificates() -> None:
    """Point ``STRIDE_TLS_DIR`` at fresh certificates for this process and everything it
    starts, unless the environment already names TLS material or plain text (the pytest
    plugin and the benchmarks that start services call it first); and put an admin's user
    token in ``STRIDE_TOKEN`` for the clients run in-process or as commands (the CLI, the
    checkpoint and shard clients). Tests of the token paths themselves (``stride up``'s
    state folder, pods' job tokens) give their processes an environment of their own."""
    if not tls.configured():
        os.environ[tls.TLS_DIR_ENV] = str(make_session_certificates())
    if not tls.insecure() and not os.environ.get(TOKEN_ENV):
        os.environ[TOKEN_ENV] = user_token(ADMIN, ttl=7 * 24 * 3600.0)


def aio_channel(
    address: str,
    server: str,
    options: Sequence[tuple[str, Any]] = (),
    *,
    token: Any = _DEFAULT,
    identity: str = IDENTITY,
) -> grpc.aio.Channel:
    """An asyncio channel to the service ``server`` at ``address``; ``token``: a bearer
    token (a string, a callable, or None for none; default: an admin's)."""
    return tls.aio_channel(
        address, server=server, identity=identity, options=options, token=_token(token)
    )


def sync_channel(
    address: str,
    server: str,
    options: Sequence[tuple[str, Any]] = (),
    *,
    token: Any = _DEFAULT,
    identity: str = IDENTITY,
) -> grpc.Channel:
    """A blocking channel to the service ``server`` at ``address`` (see :func:`aio_channel`)."""
    return tls.sync_channel(
        address, server=server, identity=identity, options=options, token=_token(token)
    )
