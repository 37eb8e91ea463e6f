"""Mutual TLS on a real gRPC server as every service builds it (stride.runtime.tls): only a
client with a certificate of the deployment's CA gets an answer, the client checks it
reached the service it named, and the server sees the client's verified identity."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.runtime import tls
from stride.runtime.certs import init
from stride.runtime.grpc_server import GrpcServer

pytestmark = pytest.mark.asyncio

WHO = "/stride.test.Who/Am"


def _who_handler() -> grpc.GenericRpcHandler[bytes, bytes]:
    async def who(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        return ",".join(tls.peer_identities(context)).encode()

    return grpc.method_handlers_generic_handler(
        "stride.test.Who",
        {
            "Am": grpc.unary_unary_rpc_method_handler(
                who, request_deserializer=None, response_serializer=None
            )
        },
    )


@pytest.fixture
async def admission_server() -> AsyncIterator[str]:
    """A server with the admission identity of the session's certificates."""
    material = tls.load("admission")
    assert material is not None
    server = GrpcServer(["stride.api.admission.v1.AdmissionService"], "127.0.0.1", 0, tls=material)
    server.server.add_generic_rpc_handlers([_who_handler()])
    port = await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def _check(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), timeout=5
    )
    return int(reply.status)


async def _refused(address: str, credentials: grpc.ChannelCredentials) -> grpc.StatusCode:
    """The code a health check through ``credentials`` to admission's server fails with."""
    options = [("grpc.ssl_target_name_override", "admission")]
    async with grpc.aio.secure_channel(address, credentials, options) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _check(channel)
    return refused.value.code()


async def test_a_client_of_the_ca_is_answered_and_known_by_its_certificate(
    admission_server: str,
) -> None:
    async with tls.aio_channel(admission_server, server="admission", identity="trainer") as ch:
        assert await _check(ch) == health_pb2.HealthCheckResponse.SERVING
        who = await ch.unary_unary(WHO, None, None)(b"", timeout=5)
    assert "trainer" in who.decode().split(",")


async def test_a_plain_text_client_gets_nothing(admission_server: str) -> None:
    async with grpc.aio.insecure_channel(admission_server) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _check(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_client_without_a_certificate_gets_nothing(admission_server: str) -> None:
    material = tls.load("cli")
    assert material is not None
    ca = material.ca
    credentials = grpc.ssl_channel_credentials(root_certificates=ca)  # server auth only
    assert await _refused(admission_server, credentials) == grpc.StatusCode.UNAVAILABLE


async def test_a_certificate_of_another_ca_gets_nothing(
    admission_server: str, tmp_path: Path
) -> None:
    """Certificates made by another `stride certs init` (another deployment, or anyone
    with the cryptography package) are not this deployment's."""
    init(tmp_path / "other", identities=("cli",))
    other = tls.load("cli", {tls.TLS_DIR_ENV: str(tmp_path / "other")})
    assert other is not None
    ours = tls.load("cli")
    assert ours is not None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ours.ca, private_key=other.key, certificate_chain=other.certificate
    )
    assert await _refused(admission_server, credentials) == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_meant_another_service_does_not_trust_this_one(
    admission_server: str,
) -> None:
    """A client dialling the dispatcher that reaches admission's port (a wrong address, or
    an impostor with another service's certificate) refuses to talk."""
    async with tls.aio_channel(admission_server, server="dispatcher", identity="cli") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _check(ch)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_probe_presents_the_services_own_certificate(admission_server: str) -> None:
    """``python -m stride.runtime.healthcheck`` (compose's and Helm's probe) over mTLS."""
    from stride.runtime.healthcheck import check

    name = "stride.api.admission.v1.AdmissionService"
    serving, status = await asyncio.to_thread(check, admission_server, name, 5)
    assert (serving, status) == (False, "NOT_SERVING")  # no host marks it ready here
    serving, status = await asyncio.to_thread(check, admission_server, "", 5, "admission")
    assert (serving, status) == (True, "SERVING")
    serving, status = await asyncio.to_thread(check, admission_server, "", 5, "dispatcher")
    assert not serving and status.startswith("UNAVAILABLE")
