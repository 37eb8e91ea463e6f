"""The agent's client of the checkpoint cache: saves and loads streamed straight through.

Chunks are forwarded as they arrive, never buffered whole, so the agent's memory does not
grow with the model. The agent fills in the job id; the trainer never names it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from stride.agent.adapters.outbound.upstream import UpstreamError
from stride.api.ckptcache.v1 import ckptcache_service_pb2 as pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as pb_grpc

UPSTREAM = "checkpoint cache"
JOB_METADATA_KEY = "stride-job-id"
"""The cache serves a job only its own checkpoints; this names the pod's job."""


class CheckpointClient:
    """Calls the checkpoint cache on behalf of one pod's job."""

    def __init__(self, channel: grpc.aio.Channel, address: str, job_id: str) -> None:
        self.stub = pb_grpc.CheckpointCacheServiceStub(channel)
        self.address = address
        self.job_id = job_id
        self.metadata = ((JOB_METADATA_KEY, job_id),)

    async def save(
        self, chunks: AsyncIterator[pb.SaveCheckpointRequest], timeout: float | None
    ) -> pb.SaveCheckpointResponse:
        """Stream a save through; the first chunk must already be the job's header."""
        try:
            return await self.stub.SaveCheckpoint(chunks, timeout=timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None

    async def load(
        self, checkpoint_id: str, timeout: float | None
    ) -> AsyncIterator[pb.LoadCheckpointResponse]:
        """Stream a load through, header first."""
        call = self.stub.LoadCheckpoint(
            pb.LoadCheckpointRequest(job_id=self.job_id, checkpoint_id=checkpoint_id),
            timeout=timeout,
            metadata=self.metadata,
        )
        try:
            async for chunk in call:
                yield chunk
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        finally:
            call.cancel()  # a no-op when the stream ended; stops the upstream if we did not
