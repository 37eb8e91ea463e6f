"""The checkpoint API (``stride.api.ckptcache.v1.CheckpointCacheService``) over
:class:`~stride.ckptcache.usecases.Checkpoints`, with per-job isolation.

Every call needs the pod's job token (:data:`ACCESS`; the agent and the client library send
the one the pod watcher gave the pod), and the job comes from that verified token: a
request may only touch that job's checkpoints. Naming another job is PERMISSION_DENIED,
and names that could escape the job's space (``..``, ``/``) are INVALID_ARGUMENT, both
naming the field. An admin's user token may work on any job, named by the request or the
``stride-job-id`` metadata; so may any caller in plain text (``STRIDE_INSECURE=1``, where
nothing is verified).

A ``SaveCheckpoint`` stream that sends nothing for ``upload_idle_seconds`` is aborted
DEADLINE_EXCEEDED; the use case then releases its partial data and reservation at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, NoReturn, TypeVar

import grpc

from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc
from stride.ckptcache.adapters.convert import (
    TIER_TO_PROTO,
    header_from_proto,
    header_to_proto,
    info_to_proto,
)
from stride.ckptcache.domain import checksum
from stride.ckptcache.domain.checkpoints import check_job_id
from stride.ckptcache.usecases import Checkpoints, CorruptCheckpoint
from stride.runtime import auth
from stride.runtime.errors import DeadlineExceeded, InvalidArgument

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]

JOB_METADATA_KEY = "stride-job-id"
JOB_METADATA_FIELD = f"metadata {JOB_METADATA_KEY}"

SERVICE = pb.DESCRIPTOR.services_by_name["CheckpointCacheService"].full_name
ACCESS = auth.rules(
    SERVICE,
    {
        method: auth.rule(admins=True, jobs=True)
        for method in (
            "GetCacheInfo",
            "RegisterSegment",
            "SaveCheckpoint",
            "LocateCheckpoint",
            "LoadCheckpoint",
            "ListCheckpoints",
            "DeleteCheckpoint",
        )
    },
)


async def _deny(context: Context, field: str, problem: str) -> NoReturn:
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{field}: {problem}")
    raise AssertionError("abort returned")  # pragma: no cover


async def caller_job(context: Context, requested: str, field: str) -> str:
    """The caller's job: its token's (an admin or plain text: the metadata's, else the
    request's); ``requested`` must be empty or the same job."""
    caller = auth.current()
    if caller.job is not None:
        job_id = caller.job.job_id
        source = "this caller holds a token for job"
    else:
        values = [
            value
            for key, value in (context.invocation_metadata() or ())
            if key == JOB_METADATA_KEY and isinstance(value, str)
        ]
        if not values:
            if not requested:
                raise InvalidArgument(
                    JOB_METADATA_FIELD, "is required: every call names the caller's job"
                )
            values = [requested]
        job_id = values[0]
        source = "this call is for job"
    check_job_id(job_id, JOB_METADATA_FIELD)
    if requested:
        check_job_id(requested, field)
    if requested and requested != job_id:
        await _deny(
            context,
            field,
            f"{requested!r} is another job; {source} {job_id!r} and may only use its own "
            "checkpoints",
        )
    return job_id


async def idle_limited(items: AsyncIterator[T], seconds: float) -> AsyncIterator[T]:
    """``items``, ended with DeadlineExceeded when the next one takes longer than
    ``seconds`` to arrive."""
    iterator = aiter(items)
    while True:
        try:
            async with asyncio.timeout(seconds):
                item = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise DeadlineExceeded(
                f"the upload sent nothing for {seconds:g} s (STRIDE_CKPTCACHE_UPLOAD_IDLE_"
                "SECONDS); it is discarded and its shared memory released"
            ) from None
        yield item


async def _data_chunks(
    requests: AsyncIterator[pb.SaveCheckpointRequest],
) -> AsyncIterator[tuple[bytes, int | None]]:
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
        crc = request.data_crc32c if request.HasField("data_crc32c") else None
        yield request.data, crc


class CheckpointCacheApi(pb_grpc.CheckpointCacheServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, checkpoints: Checkpoints, upload_idle_seconds: float) -> None:
        self.checkpoints = checkpoints
        self.memory = checkpoints.memory
        self.upload_idle_seconds = upload_idle_seconds

    async def GetCacheInfo(
        self, request: pb.GetCacheInfoRequest, context: Context
    ) -> pb.GetCacheInfoResponse:
        return pb.GetCacheInfoResponse(
            shared_memory_dir=str(self.memory.root),
            node_id=self.memory.node_id,
            chunk_bytes=self.checkpoints.limits.chunk_bytes,
        )

    async def RegisterSegment(
        self, request: pb.RegisterSegmentRequest, context: Context
    ) -> pb.RegisterSegmentResponse:
        if not request.HasField("header"):
            raise InvalidArgument("header", "is required")
        header = pb.CheckpointHeader()
        header.CopyFrom(request.header)
        header.job_id = await caller_job(context, header.job_id, "header.job_id")
        header.crc32c = 0
        tier = await self.checkpoints.register(
            header_from_proto(header), header.SerializeToString(), request.segment_name
        )
        return pb.RegisterSegmentResponse(tier=TIER_TO_PROTO[tier])

    async def SaveCheckpoint(
        self, request_iterator: AsyncIterator[pb.SaveCheckpointRequest], context: Context
    ) -> pb.SaveCheckpointResponse:
        requests = idle_limited(aiter(request_iterator), self.upload_idle_seconds)
        first = await anext(requests, None)
        if first is None:
            raise InvalidArgument("header", "is required: the stream was empty")
        if first.WhichOneof("chunk") != "header":
            raise InvalidArgument("header", "must be the first message of the stream")
        header = pb.CheckpointHeader()
        header.CopyFrom(first.header)
        header.job_id = await caller_job(context, header.job_id, "header.job_id")
        header.shard_count = header.shard_count or 1
        tier = await self.checkpoints.save_stream(
            header_from_proto(header), header.SerializeToString(), _data_chunks(requests)
        )
        return pb.SaveCheckpointResponse(tier=TIER_TO_PROTO[tier])

    async def LocateCheckpoint(
        self, request: pb.LocateCheckpointRequest, context: Context
    ) -> pb.LocateCheckpointResponse:
        job_id = await caller_job(context, request.job_id, "job_id")
        located = await self.checkpoints.locate(job_id, request.checkpoint_id, request.shard_index)
        path = located.memory_path
        return pb.LocateCheckpointResponse(
            header=header_to_proto(located.header_blob, located.info),
            tier=TIER_TO_PROTO[located.tier],
            segment_path="" if path is None else self.memory.relative(path),
        )

    async def LoadCheckpoint(
        self, request: pb.LoadCheckpointRequest, context: Context
    ) -> AsyncIterator[pb.LoadCheckpointResponse]:
        job_id = await caller_job(context, request.job_id, "job_id")
        located, chunks = await self.checkpoints.load(
            job_id, request.checkpoint_id, request.shard_index
        )
        yield pb.LoadCheckpointResponse(header=header_to_proto(located.header_blob, located.info))
        try:
            async for chunk in chunks:
                yield pb.LoadCheckpointResponse(data=chunk, data_crc32c=checksum.checksum(chunk))
        except CorruptCheckpoint as error:
            await context.abort(grpc.StatusCode.DATA_LOSS, error.message)

    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        job_id = await caller_job(context, request.job_id, "job_id")
        infos = await self.checkpoints.list(job_id)
        return pb.ListCheckpointsResponse(checkpoints=[info_to_proto(info) for info in infos])

    async def DeleteCheckpoint(
        self, request: pb.DeleteCheckpointRequest, context: Context
    ) -> pb.DeleteCheckpointResponse:
        job_id = await caller_job(context, request.job_id, "job_id")
        await self.checkpoints.delete(job_id, request.checkpoint_id)
        return pb.DeleteCheckpointResponse()
