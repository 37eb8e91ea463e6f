"""The agent's client of the shard dispatcher: registration, shards and progress.

The agent registers its pod once and sends the incarnation token on every call. If the
dispatcher fences the token (the pod was declared lost, or the dispatcher lost its
registration), the next NextShard registers again. A new token releases every shard the old
one held, which is right: the trainer's current shard is void once the dispatcher has
re-issued it.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from stride.agent.adapters.outbound.upstream import UpstreamError
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.events.v1 import shard_pb2

log = structlog.get_logger(__name__)

UPSTREAM = "dispatcher"


class ShardClient:
    """Calls the dispatcher on behalf of one pod."""

    def __init__(
        self, channel: grpc.aio.Channel, address: str, job_id: str, worker: str, timeout: float
    ) -> None:
        self.stub = pb_grpc.DispatcherServiceStub(channel)
        self.address = address
        self.job_id = job_id
        self.worker = worker
        self.timeout = timeout
        self.incarnation: int | None = None
        self._registering = asyncio.Lock()

    async def _register(self, stale: int | None) -> int:
        async with self._registering:
            # Another call may have registered while this one waited for the lock.
            if self.incarnation is not None and self.incarnation != stale:
                return self.incarnation
            try:
                reply = await self.stub.RegisterWorker(
                    pb.RegisterWorkerRequest(job_id=self.job_id, worker=self.worker),
                    timeout=self.timeout,
                )
            except grpc.aio.AioRpcError as error:
                raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
            self.incarnation = int(reply.incarnation)
            log.info(
                "registered with the dispatcher", worker=self.worker, incarnation=self.incarnation
            )
            return self.incarnation

    def _ref(self, dataset: str, incarnation: int) -> pb.WorkerRef:
        return pb.WorkerRef(
            job_id=self.job_id, dataset=dataset, worker=self.worker, incarnation=incarnation
        )

    async def next_shard(self, dataset: str) -> tuple[shard_pb2.Shard | None, bool]:
        """The next shard of ``dataset`` and whether the data has ended.

        While other workers still hold the last shards the dispatcher says "retry later"
        (one of them may come back); wait here, so the trainer sees a shard or the end.
        """
        while True:
            shard, end_of_data, retry_after = await self._next_shard(dataset)
            if shard is not None or end_of_data or retry_after is None:
                return shard, end_of_data
            await asyncio.sleep(retry_after)

    async def _next_shard(self, dataset: str) -> tuple[shard_pb2.Shard | None, bool, float | None]:
        incarnation = self.incarnation or await self._register(None)
        try:
            reply = await self._get(dataset, incarnation)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
            log.warning(
                "dispatcher refused the token; registering again",
                incarnation=incarnation,
                reason=error.details(),
            )
            incarnation = await self._register(incarnation)
            try:
                reply = await self._get(dataset, incarnation)
            except grpc.aio.AioRpcError as retry_error:
                raise UpstreamError.wrap(UPSTREAM, self.address, retry_error) from None
        retry_after = (
            max(reply.retry_after.ToTimedelta().total_seconds(), 0.05)
            if reply.retry_later
            else None
        )
        return (reply.shard if reply.HasField("shard") else None), reply.end_of_data, retry_after

    async def _get(self, dataset: str, incarnation: int) -> pb.GetShardResponse:
        return await self.stub.GetShard(
            pb.GetShardRequest(worker=self._ref(dataset, incarnation)), timeout=self.timeout
        )

    async def report(self, dataset: str, shard_id: int, offset: int, done: bool) -> None:
        """A heartbeat with the offset reached, or the shard's completion."""
        incarnation = self.incarnation or await self._register(None)
        ref = self._ref(dataset, incarnation)
        try:
            if done:
                await self.stub.ReportShardDone(
                    pb.ReportShardDoneRequest(worker=ref, shard_id=shard_id), timeout=self.timeout
                )
            else:
                await self.stub.ReportProgress(
                    pb.ReportProgressRequest(worker=ref, shard_id=shard_id, offset=offset),
                    timeout=self.timeout,
                )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None

    async def create_dataset(self, dataset: str, parameters: pb.DatasetParameters) -> bool:
        """Create the job's dataset (False: it existed with these parameters)."""
        try:
            reply = await self.stub.CreateDataset(
                pb.CreateDatasetRequest(job_id=self.job_id, dataset=dataset, parameters=parameters),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        return bool(reply.created)

    async def dataset_state(self, dataset: str) -> pb.GetDatasetStateResponse:
        """The dataset's progress."""
        try:
            reply: pb.GetDatasetStateResponse = await self.stub.GetDatasetState(
                pb.GetDatasetStateRequest(job_id=self.job_id, dataset=dataset),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        return reply

    async def snapshot(self, dataset: str) -> pb.SnapshotShardsResponse:
        """The dataset's shard state, to keep with a checkpoint."""
        try:
            reply: pb.SnapshotShardsResponse = await self.stub.SnapshotShards(
                pb.SnapshotShardsRequest(job_id=self.job_id, dataset=dataset),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        return reply

    async def restore(self, dataset: str, snapshot: bytes) -> pb.RestoreShardsResponse:
        """Put the dataset's shards back to ``snapshot``."""
        try:
            reply: pb.RestoreShardsResponse = await self.stub.RestoreShards(
                pb.RestoreShardsRequest(job_id=self.job_id, dataset=dataset, snapshot=snapshot),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        return reply
