"""The checkpoint API (``stride.api.ckptcache.v1.CheckpointCacheService``) over
:class:`~stride.ckptcache.checkpoints.Checkpoints`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc
from stride.ckptcache.adapters.convert import (
    TIER_TO_PROTO,
    header_from_proto,
    header_to_proto,
    info_to_proto,
)
from stride.ckptcache.checkpoints import Checkpoints, CorruptCheckpoint
from stride.runtime.errors import InvalidArgument

Context = grpc.aio.ServicerContext[Any, Any]


async def _data_chunks(requests: AsyncIterator[pb.SaveCheckpointRequest]) -> AsyncIterator[bytes]:
    """The data chunks after the header; any further header or an empty chunk is refused."""
    index = 0
    async for request in requests:
        index += 1
        kind = request.WhichOneof("chunk")
        if kind == "header":
            raise InvalidArgument(
                "header", f"sent again in message {index + 1}; send it once, first"
            )
        if kind is None:
            raise InvalidArgument("data", f"message {index + 1} carries neither header nor data")
        yield request.data


class CheckpointCacheApi(pb_grpc.CheckpointCacheServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, checkpoints: Checkpoints) -> None:
        self.checkpoints = checkpoints

    async def SaveCheckpoint(
        self, request_iterator: AsyncIterator[pb.SaveCheckpointRequest], context: Context
    ) -> pb.SaveCheckpointResponse:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            raise InvalidArgument("header", "is required: the stream was empty")
        if first.WhichOneof("chunk") != "header":
            raise InvalidArgument("header", "must be the first message of the stream")
        info = await self.checkpoints.save(
            header_from_proto(first.header),
            first.header.SerializeToString(),
            _data_chunks(requests),
        )
        return pb.SaveCheckpointResponse(tier=TIER_TO_PROTO[info.tier])

    async def LoadCheckpoint(
        self, request: pb.LoadCheckpointRequest, context: Context
    ) -> AsyncIterator[pb.LoadCheckpointResponse]:
        stored, chunks = await self.checkpoints.load(request.job_id, request.checkpoint_id)
        yield pb.LoadCheckpointResponse(header=header_to_proto(stored))
        try:
            async for chunk in chunks:
                yield pb.LoadCheckpointResponse(data=chunk)
        except CorruptCheckpoint as error:
            await context.abort(grpc.StatusCode.DATA_LOSS, error.message)

    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        infos = await self.checkpoints.list(request.job_id)
        return pb.ListCheckpointsResponse(checkpoints=[info_to_proto(info) for info in infos])

    async def DeleteCheckpoint(
        self, request: pb.DeleteCheckpointRequest, context: Context
    ) -> pb.DeleteCheckpointResponse:
        await self.checkpoints.delete(request.job_id, request.checkpoint_id)
        return pb.DeleteCheckpointResponse()
