"""The CLI's gRPC channels: mutual TLS as the ``cli`` identity (:mod:`stride.runtime.tls`).

The material comes from the environment when it names any (``STRIDE_TLS_DIR``, the
``STRIDE_TLS_*_FILE`` trio, or ``STRIDE_INSECURE``: a compose or remote deployment), else
from what `stride up` recorded in the state folder: the certificates it made there, or
that it runs in plain text (``stride up --insecure``).

Every call carries the user's token (:mod:`stride.runtime.tokens`): ``STRIDE_TOKEN``, else
the file ``STRIDE_TOKEN_FILE`` names, else the admin token `stride up` wrote into its state
folder (``tokens/admin.token``: whoever runs the suite on their machine administers it;
``STRIDE_TOKEN_FILE=<state>/tokens/demo.token`` acts as the demo user).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import grpc

from stride.cli.endpoints import SuiteState
from stride.runtime import tls
from stride.runtime.tokens import TokenSource

IDENTITY = "cli"
ADMIN_TOKEN = "admin.token"
"""The admin token `stride up` writes into ``<state>/tokens/``."""
DEMO_TOKEN = "demo.token"
"""The demo user's token beside it."""


def tokens_dir(state_dir: Path) -> Path:
    return state_dir / "tokens"


def client_token(state_dir: Path) -> TokenSource | None:
    """The user token of a CLI call (see the module docstring); None: none found, and the
    server says what it needs."""
    given = TokenSource.from_environment()
    if given is not None:
        return given
    default = tokens_dir(state_dir) / ADMIN_TOKEN
    return TokenSource(path=default) if default.is_file() else None


def client_environ(state_dir: Path) -> Mapping[str, str]:
    """The environment :func:`stride.runtime.tls.load` reads for a CLI call."""
    if tls.configured():
        return os.environ
    state = SuiteState.read(state_dir)
    if state is not None and state.tls_dir:
        return {**os.environ, tls.TLS_DIR_ENV: state.tls_dir}
    if state is not None and state.insecure:
        return {**os.environ, tls.INSECURE_ENV: "1"}
    return os.environ


def channel(target: str, service: str, state_dir: Path) -> grpc.Channel:
    """A blocking channel to ``service`` at ``target``."""
    return tls.sync_channel(
        target,
        server=service,
        identity=IDENTITY,
        environ=client_environ(state_dir),
        token=client_token(state_dir),
    )


def aio_channel(target: str, service: str, state_dir: Path) -> grpc.aio.Channel:
    """An asyncio channel to ``service`` at ``target``."""
    return tls.aio_channel(
        target,
        server=service,
        identity=IDENTITY,
        environ=client_environ(state_dir),
        token=client_token(state_dir),
    )
