"""A gRPC health probe for container health checks: exits 0 only when SERVING.

Usage: ``python -m stride.runtime.healthcheck --address 127.0.0.1:50051 --service NAME``.
Shipped in the package so images need no separate probe binary.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str, timeout: float) -> tuple[bool, str]:
    """Ask ``address`` for the health of ``service``; returns (serving, status name)."""
    with grpc.insecure_channel(address) as channel:
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
    args = parser.parse_args(argv)
    serving, status = check(args.address, args.service, args.timeout)
    print(f"{args.address} {args.service or '(server)'}: {status}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
