"""A gRPC health probe for container health checks: exits 0 only when SERVING.

Usage: ``python -m stride.runtime.healthcheck --address 127.0.0.1:50051 --service NAME``.
Shipped in the package so images need no separate probe binary.

It speaks mutual TLS like every client (:mod:`stride.runtime.tls`): a probe runs in the
service's own container, so it presents the service's certificate and expects it back
(``--identity``, default ``STRIDE_TLS_IDENTITY``, else the part of the health service name
after ``stride.api.``: ``stride.api.admission.v1.AdmissionService`` is ``admission``).
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.runtime import tls

IDENTITY_ENV = "STRIDE_TLS_IDENTITY"


def probe_identity(service: str, given: str | None = None) -> str:
    """Whose certificate the probe presents and expects (see the module docstring)."""
    if given:
        return given
    from_env = os.environ.get(IDENTITY_ENV, "").strip()
    if from_env:
        return from_env
    parts = service.split(".")
    if len(parts) > 2 and parts[:2] == ["stride", "api"]:
        return parts[2]
    raise tls.TlsConfigError(
        f"--identity: which service is probed? Give --identity or {IDENTITY_ENV}"
    )


def check(
    address: str, service: str, timeout: float, identity: str | None = None
) -> tuple[bool, str]:
    """Ask ``address`` for the health of ``service``; returns (serving, status name)."""
    if identity is None and tls.insecure() and not os.environ.get(tls.TLS_DIR_ENV):
        identity = "probe"  # plain text: no certificate is read
    name = probe_identity(service, identity)
    with tls.sync_channel(address, server=name, identity=name) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as error:
            return False, f"{error.code().name}: {error.details()}"
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, name


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, check once, print the status, exit 0 if SERVING else 1."""
    parser = argparse.ArgumentParser(description="gRPC health probe")
    parser.add_argument("--address", required=True, help="host:port of the server")
    parser.add_argument("--service", default="", help="health service name; empty for overall")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait")
    parser.add_argument("--identity", default=None, help="the probed service's identity")
    args = parser.parse_args(argv)
    try:
        serving, status = check(args.address, args.service, args.timeout, args.identity)
    except tls.TlsConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
