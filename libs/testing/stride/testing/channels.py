"""gRPC channels of tests: mutual TLS like every client of the suite.

A test session has its own CA and certificates (the pytest plugin makes them once per
process and points ``STRIDE_TLS_DIR`` at them, so every service a test starts, in-process
or as a process, serves with them). A test dials a service as the ``cli`` identity and
checks that the server is the service it names.
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

IDENTITY = "cli"


def make_session_certificates() -> Path:
    """A fresh CA and every identity's certificate in a new temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="stride-test-tls-")) / "tls"
    init(folder)
    return folder


def ensure_certificates() -> None:
    """Point ``STRIDE_TLS_DIR`` at fresh certificates for this process and everything it
    starts, unless the environment already names TLS material or plain text (the pytest
    plugin and the benchmarks that start services call it first)."""
    if not tls.configured():
        os.environ[tls.TLS_DIR_ENV] = str(make_session_certificates())


def aio_channel(
    address: str, server: str, options: Sequence[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """An asyncio channel to the service ``server`` at ``address``."""
    return tls.aio_channel(address, server=server, identity=IDENTITY, options=options)


def sync_channel(
    address: str, server: str, options: Sequence[tuple[str, Any]] = ()
) -> grpc.Channel:
    """A blocking channel to the service ``server`` at ``address``."""
    return tls.sync_channel(address, server=server, identity=IDENTITY, options=options)
