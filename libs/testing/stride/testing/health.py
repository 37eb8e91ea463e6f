"""Asking a service under test for its health, the way an orchestrator's probe would."""

from __future__ import annotations

from collections.abc import Awaitable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.runtime.healthcheck import probe_identity
from stride.testing.channels import aio_channel

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health(port: int, name: str, server: str | None = None) -> int:
    """The status of health name ``name`` on a local server, or -1 while it does not answer.

    ``server``: the service's identity, by default read off ``name``
    (``stride.api.admission.v1.AdmissionService`` is ``admission``)."""
    identity = probe_identity(name, server)
    async with aio_channel(f"127.0.0.1:{port}", identity) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=name), timeout=2
            )
        except grpc.aio.AioRpcError:
            return -1
    return int(reply.status)


async def equals(probe: Awaitable[object], expected: object) -> bool:
    """Whether ``probe`` gives ``expected`` (a truthy answer for ``assert_eventually``)."""
    return (await probe) == expected
