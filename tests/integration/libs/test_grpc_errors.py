"""How a real server of :class:`stride.runtime.grpc_server.GrpcServer` ends a call whose
servicer fails: a domain error is its status, anything else INTERNAL, and a servicer whose
own abort was already under way keeps that abort's status (a failure after an abort that
could not be sent once crashed the handler with "Abort already called!")."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
import pytest

from stride.runtime.errors import NotFound
from stride.runtime.grpc_server import GrpcServer

pytestmark = pytest.mark.asyncio

SERVICE = "stride.test.Failing"


async def _domain(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    raise NotFound(f"job {request.decode()!r} is not known")


async def _bug(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    raise KeyError("a servicer bug")


async def _after_abort(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    try:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "upstream is gone")
    except grpc.aio.AbortError:
        # What a failed send of the abort's status looks like to the interceptor: the
        # handler ends with an error after its abort began.
        raise RuntimeError("the status could not be sent") from None
    return b""


@pytest.fixture
async def address() -> AsyncIterator[str]:
    server = GrpcServer([SERVICE], "127.0.0.1", 0)
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(behaviour)
        for name, behaviour in (("Domain", _domain), ("Bug", _bug), ("AfterAbort", _after_abort))
    }
    server.server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler(SERVICE, handlers)]
    )
    port = await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def _failure(address: str, method: str) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await channel.unary_unary(f"/{SERVICE}/{method}", None, None)(b"job-x", timeout=5)
    return failed.value


async def test_a_domain_error_is_its_status_with_its_message(address: str) -> None:
    failed = await _failure(address, "Domain")
    assert failed.code() == grpc.StatusCode.NOT_FOUND
    assert failed.details() == "job 'job-x' is not known"


async def test_a_servicer_bug_is_internal_and_names_the_method_only(address: str) -> None:
    failed = await _failure(address, "Bug")
    assert failed.code() == grpc.StatusCode.INTERNAL
    assert failed.details() == f"internal error in /{SERVICE}/Bug; see the server log"
    assert "a servicer bug" not in str(failed.details())


async def test_a_failure_after_the_servicers_own_abort_keeps_that_status(
    address: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="grpc"):
        failed = await _failure(address, "AfterAbort")
    assert failed.code() == grpc.StatusCode.UNAVAILABLE
    assert failed.details() == "upstream is gone"
    assert not [r for r in caplog.records if "Abort already called" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info and "Abort already" in str(r.exc_info[1])]
