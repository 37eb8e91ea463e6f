"""The agent's client of the shard dispatcher: shards, progress and dataset calls.

Shards are leased through :mod:`stride.shardclient` (the dispatcher's session stream, with
the registration token and each shard's lease number): the agent remembers the lease of
every shard it handed to its trainer, so a report on a shard the dispatcher has since
handed to someone else is refused as stale instead of counted. If the dispatcher fences
the token (the pod was declared lost, or the dispatcher lost its registration), the client
registers again; every shard the old token held is void, which is right: the trainer's
current shard has been handed out again. The blocking client runs on worker threads.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from stride.agent.adapters.outbound.upstream import UpstreamError
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.events.v1 import shard_pb2
from stride.runtime import tls
from stride.shardclient import LeasedShard, RetryPolicy, Revoked
from stride.shardclient import ShardClient as SessionClient
from stride.vocabulary import echo

log = structlog.get_logger(__name__)

UPSTREAM = "dispatcher"


def _to_proto(shard: LeasedShard) -> shard_pb2.Shard:
    return shard_pb2.Shard(
        shard_id=shard.shard_id,
        epoch=shard.epoch,
        start=shard.start,
        end=shard.end,
        indices=shard.indices,
        partition=shard.partition,
        offset=shard.offset,
    )


class ShardClient:
    """Calls the dispatcher on behalf of one pod."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        address: str,
        job_id: str,
        worker: str,
        timeout: float,
        token: tls.Token | None = None,
    ) -> None:
        """``token``: the pod's job token, sent on the session stream as on ``channel``."""
        self.stub = pb_grpc.DispatcherServiceStub(channel)
        self.address = address
        self.job_id = job_id
        self.worker = worker
        self.timeout = timeout
        # The session client retries an unreachable dispatcher for up to ``timeout`` (a
        # restart rides through), then the trainer hears UNAVAILABLE naming it.
        self.sessions = SessionClient(
            address,
            job_id,
            worker,
            timeout=timeout,
            retry=RetryPolicy(give_up_after=timeout),
            identity="agent",
            token=token,
        )
        self.leased: dict[tuple[str, int], LeasedShard] = {}

    def close(self) -> None:
        """Close the session stream and its channel."""
        self.sessions.close()

    def _wrap(self, error: grpc.RpcError) -> UpstreamError:
        return UpstreamError(UPSTREAM, self.address, error.code(), error.details() or "")

    async def next_shard(
        self, dataset: str, done: int | None = None, wait: bool = True
    ) -> tuple[shard_pb2.Shard | None, bool]:
        """The next shard of ``dataset`` and whether the data has ended, completing the
        shard ``done`` first in the same dispatcher call.

        While other workers still hold the last shards the dispatcher says "retry later"
        (one of them may come back); with ``wait`` the agent waits here, so the trainer sees
        a shard or the end; without, it answers (None, False) at once.
        """
        finished = None
        if done is not None:
            finished = self.leased.get((dataset, done))
            if finished is None:
                raise self._not_leased(dataset, done)
        while True:
            try:
                reply = await asyncio.to_thread(self.sessions.get_shard, dataset, finished)
            except Revoked as revoked:
                # The token was fenced and the client registered again: every shard it held
                # is void. A finished one was not counted: the trainer must hear that.
                log.warning("dispatcher refused the token; registered again", reason=str(revoked))
                self._forget(dataset)
                if finished is not None:
                    raise UpstreamError(
                        UPSTREAM, self.address, grpc.StatusCode.FAILED_PRECONDITION, str(revoked)
                    ) from None
                continue
            except grpc.RpcError as error:
                raise self._wrap(error) from None
            if finished is not None:
                self.leased.pop((dataset, finished.shard_id), None)
                finished = None
            if reply.shard is not None:
                self.leased[(dataset, reply.shard.shard_id)] = reply.shard
                return _to_proto(reply.shard), False
            if reply.end_of_data:
                return None, True
            if not wait:
                return None, False
            await asyncio.sleep(max(reply.retry_after, 0.05))

    def _not_leased(self, dataset: str, shard_id: int) -> UpstreamError:
        return UpstreamError(
            UPSTREAM,
            self.address,
            grpc.StatusCode.FAILED_PRECONDITION,
            f"shard {shard_id} of {echo(dataset)} is not leased to pod {self.worker!r} "
            "(never handed to it, already done, or taken back); ask for the next shard",
        )

    def _forget(self, dataset: str) -> None:
        for key in [key for key in self.leased if key[0] == dataset]:
            del self.leased[key]

    async def report(self, dataset: str, shard_id: int, offset: int, done: bool) -> None:
        """A heartbeat with the offset reached, or the shard's completion, under its lease."""
        shard = self.leased.get((dataset, shard_id))
        if shard is None:
            raise self._not_leased(dataset, shard_id)
        try:
            if done:
                await asyncio.to_thread(self.sessions.report_done, shard)
                del self.leased[(dataset, shard_id)]
            else:
                await asyncio.to_thread(self.sessions.report_progress, shard, offset)
        except Revoked as revoked:
            self.leased.pop((dataset, shard_id), None)
            raise UpstreamError(
                UPSTREAM, self.address, grpc.StatusCode.FAILED_PRECONDITION, str(revoked)
            ) from None
        except grpc.RpcError as error:
            raise self._wrap(error) from None

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

    async def fetch_batches(self, dataset: str, max_batches: int) -> pb.FetchBatchesResponse:
        """Data-worker mode: index batches with step ids, leased to this pod."""
        try:
            reply: pb.FetchBatchesResponse = await self.stub.FetchBatches(
                pb.FetchBatchesRequest(
                    job_id=self.job_id,
                    dataset=dataset,
                    data_worker=self.worker,
                    max_batches=max_batches,
                ),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        return reply

    async def report_consumed(self, dataset: str, step_id: int) -> int:
        """Data-worker mode: every step up to ``step_id`` was trained; the last consumed."""
        try:
            reply = await self.stub.ReportConsumed(
                pb.ReportConsumedRequest(job_id=self.job_id, dataset=dataset, step_id=step_id),
                timeout=self.timeout,
            )
        except grpc.aio.AioRpcError as error:
            raise UpstreamError.wrap(UPSTREAM, self.address, error) from None
        return int(reply.consumed_step)
