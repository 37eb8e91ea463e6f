"""The shard API (``stride.api.dispatcher.v1.DispatcherService``) over :class:`ShardDispatcher`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.dispatcher.adapters.convert import parameters_from_proto, shard_to_proto
from stride.dispatcher.dispatching import ShardDispatcher, WorkerRef
from stride.runtime.errors import InvalidArgument

Context = grpc.aio.ServicerContext[Any, Any]

NOT_YET = "arrives with the shard dispatcher issue (leases, fencing and snapshots)"


def _worker_ref(request: Any) -> WorkerRef:
    if not request.HasField("worker"):
        raise InvalidArgument("worker", "is required")
    ref = request.worker
    return WorkerRef(ref.job_id, ref.dataset, ref.worker, ref.incarnation)


def _duration(value: timedelta) -> Duration:
    duration = Duration()
    duration.FromTimedelta(value)
    return duration


class DispatcherApi(pb_grpc.DispatcherServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, dispatcher: ShardDispatcher) -> None:
        self.dispatcher = dispatcher

    async def CreateDataset(
        self, request: pb.CreateDatasetRequest, context: Context
    ) -> pb.CreateDatasetResponse:
        if not request.HasField("parameters"):
            raise InvalidArgument("parameters", "is required")
        created = await self.dispatcher.create_dataset(
            request.job_id, request.dataset, parameters_from_proto(request.parameters)
        )
        return pb.CreateDatasetResponse(created=created)

    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: Context
    ) -> pb.RegisterWorkerResponse:
        incarnation = await self.dispatcher.register_worker(request.job_id, request.worker)
        return pb.RegisterWorkerResponse(
            incarnation=incarnation, lease=_duration(self.dispatcher.lease_duration)
        )

    async def GetShard(self, request: pb.GetShardRequest, context: Context) -> pb.GetShardResponse:
        shard = await self.dispatcher.get_shard(_worker_ref(request))
        if shard is None:
            return pb.GetShardResponse(end_of_data=True)
        return pb.GetShardResponse(shard=shard_to_proto(shard))

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Context
    ) -> pb.ReportProgressResponse:
        await self.dispatcher.report_progress(
            _worker_ref(request), request.shard_id, request.offset
        )
        return pb.ReportProgressResponse()

    async def ReportShardDone(
        self, request: pb.ReportShardDoneRequest, context: Context
    ) -> pb.ReportShardDoneResponse:
        await self.dispatcher.report_done(_worker_ref(request), request.shard_id)
        return pb.ReportShardDoneResponse()

    async def ReportShardFailed(
        self, request: pb.ReportShardFailedRequest, context: Context
    ) -> pb.ReportShardFailedResponse:
        await self.dispatcher.report_failed(_worker_ref(request), request.shard_id, request.reason)
        return pb.ReportShardFailedResponse()

    async def GetDatasetState(
        self, request: pb.GetDatasetStateRequest, context: Context
    ) -> pb.GetDatasetStateResponse:
        state = await self.dispatcher.dataset_state(request.job_id, request.dataset)
        return pb.GetDatasetStateResponse(
            epoch=state.counts.epoch,
            todo=state.counts.todo,
            doing=state.counts.doing,
            done=state.counts.done,
            finished=state.counts.finished,
            workers=[
                # Rates and straggler judgement arrive with the shard dispatcher issue.
                pb.WorkerProgress(
                    worker=w.worker, shard_ids=w.shard_ids, records_consumed=w.records_consumed
                )
                for w in state.workers
            ],
        )

    async def SnapshotShards(
        self, request: pb.SnapshotShardsRequest, context: Context
    ) -> pb.SnapshotShardsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"SnapshotShards {NOT_YET}")
        raise AssertionError("abort raises")  # pragma: no cover

    async def RestoreShards(
        self, request: pb.RestoreShardsRequest, context: Context
    ) -> pb.RestoreShardsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"RestoreShards {NOT_YET}")
        raise AssertionError("abort raises")  # pragma: no cover

    async def MarkWorkerLost(
        self, request: pb.MarkWorkerLostRequest, context: Context
    ) -> pb.MarkWorkerLostResponse:
        requeued = await self.dispatcher.mark_worker_lost(request.job_id, request.worker)
        return pb.MarkWorkerLostResponse(requeued=requeued)
