"""The executor's NATS entry point: requests on ``stride.executor.v1.run.>`` in the queue
group ``executors``, answered with an :class:`AlgorithmReply`.

Whatever arrives gets a reply, even bytes that are not a request: a requester waiting for
a reply that never comes only learns "timeout", and a crashed callback would say nothing
more in the replica's log either.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog
from google.protobuf.message import DecodeError

from stride.bus.client import TYPE_HEADER
from stride.events.v1 import optimization_pb2
from stride.executor.usecases import AlgorithmRunner, failed_reply

log = structlog.get_logger(__name__)

REQUEST_TYPE = optimization_pb2.AlgorithmRequest.DESCRIPTOR.full_name


class RequestHandler:
    """Decodes a request, runs it, encodes the reply."""

    def __init__(self, runner: AlgorithmRunner) -> None:
        self.runner = runner

    async def __call__(self, payload: bytes, headers: Mapping[str, str]) -> bytes:
        started = time.perf_counter()
        invalid = optimization_pb2.ALGORITHM_STATUS_INVALID_ARGUMENT
        sent_type = headers.get(TYPE_HEADER)
        if sent_type is not None and sent_type != REQUEST_TYPE:
            log.warning("request of the wrong type", type=sent_type)
            return failed_reply(
                "",
                invalid,
                f"request: payload type {sent_type}, expected {REQUEST_TYPE}",
                time.perf_counter() - started,
            ).SerializeToString()
        try:
            request = optimization_pb2.AlgorithmRequest.FromString(payload)
        except DecodeError as error:
            log.warning("undecodable request", error=str(error), size=len(payload))
            return failed_reply(
                "",
                invalid,
                f"request: undecodable {REQUEST_TYPE}: {error}",
                time.perf_counter() - started,
            ).SerializeToString()
        reply = await self.runner.reply_to(request)
        return reply.SerializeToString()
