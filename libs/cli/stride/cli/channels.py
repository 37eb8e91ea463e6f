"""The CLI's gRPC channels: mutual TLS as the ``cli`` identity (:mod:`stride.runtime.tls`).

The material comes from the environment when it names any (``STRIDE_TLS_DIR``, the
``STRIDE_TLS_*_FILE`` trio, or ``STRIDE_INSECURE``: a compose or remote deployment), else
from what `stride up` recorded in the state folder: the certificates it made there, or
that it runs in plain text (``stride up --insecure``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import grpc

from stride.cli.endpoints import SuiteState
from stride.runtime import tls

IDENTITY = "cli"


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
        target, server=service, identity=IDENTITY, environ=client_environ(state_dir)
    )


def aio_channel(target: str, service: str, state_dir: Path) -> grpc.aio.Channel:
    """An asyncio channel to ``service`` at ``target``."""
    return tls.aio_channel(
        target, server=service, identity=IDENTITY, environ=client_environ(state_dir)
    )
