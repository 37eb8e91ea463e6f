"""The shard API (``stride.api.dispatcher.v1.DispatcherService``) over :class:`ShardDispatcher`.

Who may call (:data:`ACCESS`): a pod's agent and trainer with their job token, which names
the only job whose datasets, workers and shards they may touch (another job's answers
PERMISSION_DENIED, whatever ``job_id`` the request says); admins (user tokens) may call
everything for any job (``stride shards``); the pod watcher may fence a lost worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import grpc
import structlog
from google.protobuf.duration_pb2 import Duration
from opentelemetry import trace

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.dispatcher.adapters.convert import (
    parameters_from_proto,
    parameters_to_proto,
    shard_to_proto,
)
from stride.dispatcher.domain.queue import Grant
from stride.dispatcher.usecases import (
    DoneReport,
    ShardDispatcher,
    WorkerRef,
)
from stride.runtime import auth
from stride.runtime.errors import InvalidArgument, StrideError
from stride.runtime.grpc_server import bounded_message, status_for

Context = grpc.aio.ServicerContext[Any, Any]
log = structlog.get_logger(__name__)
_tracer = trace.get_tracer(__name__)


SERVICE = pb.DESCRIPTOR.services_by_name["DispatcherService"].full_name
_JOB = auth.rule(admins=True, jobs=True)
_JOB_OR_OPERATOR = auth.rule(auth.OPERATOR, admins=True, jobs=True)
"""Reads of a job's datasets: its pods, and the pod watcher (a StrideJob's progress)."""
ACCESS = auth.rules(
    SERVICE,
    {
        "CreateDataset": _JOB,
        "RegisterWorker": _JOB,
        "GetShard": _JOB,
        "ReportProgress": _JOB,
        "ShardSession": _JOB,
        "ReportShardDone": _JOB,
        "ReportShardFailed": _JOB,
        "GetDatasetState": _JOB_OR_OPERATOR,
        "ListDatasets": _JOB_OR_OPERATOR,
        "SnapshotShards": _JOB,
        "RestoreShards": _JOB,
        "MarkWorkerLost": auth.rule("podwatcher", admins=True, jobs=True),
        "FetchBatches": _JOB,
        "ReportConsumed": _JOB,
    },
)


def _own(job_id: str, field: str = "job_id") -> str:
    """``job_id``, once the caller may touch it (a job token only its own job)."""
    auth.current().require_job(job_id, field)
    return job_id


def _worker_ref(request: Any) -> WorkerRef:
    if not request.HasField("worker"):
        raise InvalidArgument("worker", "is required")
    ref = request.worker
    return WorkerRef(_own(ref.job_id, "worker.job_id"), ref.dataset, ref.worker, ref.incarnation)


def _lease(value: int, field: str = "lease") -> int | None:
    if value < 0:
        raise InvalidArgument(field, f"must not be negative, got {value}")
    return value or None


def _duration(value: timedelta) -> Duration:
    duration = Duration()
    duration.FromTimedelta(value)
    return duration


class DispatcherApi(pb_grpc.DispatcherServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, dispatcher: ShardDispatcher, retry_after: timedelta) -> None:
        self.dispatcher = dispatcher
        self.retry_after = retry_after
        self._session_calls: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "get_shard": self._get_shard,
            "progress": self._progress,
            "done": self._done,
            "failed": self._failed,
        }

    async def CreateDataset(
        self, request: pb.CreateDatasetRequest, context: Context
    ) -> pb.CreateDatasetResponse:
        if not request.HasField("parameters"):
            raise InvalidArgument("parameters", "is required")
        created = await self.dispatcher.create_dataset(
            _own(request.job_id), request.dataset, parameters_from_proto(request.parameters)
        )
        return pb.CreateDatasetResponse(created=created)

    async def RegisterWorker(
        self, request: pb.RegisterWorkerRequest, context: Context
    ) -> pb.RegisterWorkerResponse:
        incarnation = await self.dispatcher.register_worker(_own(request.job_id), request.worker)
        return pb.RegisterWorkerResponse(
            incarnation=incarnation, lease=_duration(self.dispatcher.lease_duration)
        )

    async def GetShard(self, request: pb.GetShardRequest, context: Context) -> pb.GetShardResponse:
        return await self._get_shard(request)

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Context
    ) -> pb.ReportProgressResponse:
        return await self._progress(request)

    async def ReportShardDone(
        self, request: pb.ReportShardDoneRequest, context: Context
    ) -> pb.ReportShardDoneResponse:
        return await self._done(request)

    async def ReportShardFailed(
        self, request: pb.ReportShardFailedRequest, context: Context
    ) -> pb.ReportShardFailedResponse:
        return await self._failed(request)

    async def ShardSession(
        self, requests: AsyncIterator[pb.ShardSessionRequest], context: Context
    ) -> AsyncIterator[pb.ShardSessionResponse]:
        """Answer each call in order; a refused call answers a SessionError, the stream
        stays open. Anything else (a bug) ends the stream with INTERNAL via the interceptor."""
        async for request in requests:
            yield await self._session_answer(request)

    async def _session_answer(self, request: pb.ShardSessionRequest) -> pb.ShardSessionResponse:
        kind = request.WhichOneof("call")
        with _tracer.start_as_current_span(f"ShardSession/{kind}") as span:
            try:
                if kind is None:
                    raise InvalidArgument(
                        "call", "is required: one of get_shard, progress, done, failed"
                    )
                # Each call's answer goes in the response field of the same name.
                answer = await self._session_calls[kind](getattr(request, kind))
                return pb.ShardSessionResponse(sequence=request.sequence, **{kind: answer})
            except StrideError as error:
                code = status_for(error)
                # Bounded like a unary call's status message, so both say the same.
                message = bounded_message(error.message)
                span.set_attribute("rpc.grpc.status_code", code.value[0])
                log.info("session call rejected", call=kind, code=code.name, error=message)
                return pb.ShardSessionResponse(
                    sequence=request.sequence,
                    error=pb.SessionError(code=code.value[0], message=message),
                )

    async def _get_shard(self, request: pb.GetShardRequest) -> pb.GetShardResponse:
        done = request.done_shard_id if request.HasField("done_shard_id") else None
        # Their number and max_shards are checked by the use case, which names the field.
        reports = [
            DoneReport(item.shard_id, _lease(item.lease, f"done_shards[{index}].lease"))
            for index, item in enumerate(request.done_shards)
        ]
        grant = await self.dispatcher.get_shard(
            _worker_ref(request),
            done,
            _lease(request.done_lease, "done_lease"),
            done=reports,
            max_shards=request.max_shards or 1,
        )
        if grant.shard is not None:
            return pb.GetShardResponse(
                shard=shard_to_proto(grant.shard, grant.parameters),
                straggler=grant.straggler,
                lease=grant.shard.leases,
                more_shards=[
                    pb.ShardLease(shard=shard_to_proto(shard, grant.parameters), lease=shard.leases)
                    for shard in grant.more
                ],
            )
        if grant.why_none is Grant.END_OF_DATA:
            return pb.GetShardResponse(end_of_data=True)
        return pb.GetShardResponse(retry_later=True, retry_after=_duration(self.retry_after))

    async def _progress(self, request: pb.ReportProgressRequest) -> pb.ReportProgressResponse:
        await self.dispatcher.report_progress(
            _worker_ref(request),
            request.shard_id,
            request.offset,
            _lease(request.lease),
            request.renew_held,
        )
        return pb.ReportProgressResponse()

    async def _done(self, request: pb.ReportShardDoneRequest) -> pb.ReportShardDoneResponse:
        await self.dispatcher.report_done(
            _worker_ref(request), request.shard_id, _lease(request.lease)
        )
        return pb.ReportShardDoneResponse()

    async def _failed(self, request: pb.ReportShardFailedRequest) -> pb.ReportShardFailedResponse:
        await self.dispatcher.report_failed(
            _worker_ref(request), request.shard_id, request.reason, _lease(request.lease)
        )
        return pb.ReportShardFailedResponse()

    async def GetDatasetState(
        self, request: pb.GetDatasetStateRequest, context: Context
    ) -> pb.GetDatasetStateResponse:
        state = await self.dispatcher.dataset_state(_own(request.job_id), request.dataset)
        return pb.GetDatasetStateResponse(
            epoch=state.counts.epoch,
            todo=state.counts.todo,
            doing=state.counts.doing,
            done=state.counts.done,
            finished=state.counts.finished,
            consumed_step=state.consumed_step,
            steps_in_flight=(
                None if state.consumed_step is None else self.dispatcher.steps_in_flight
            ),
            workers=[
                pb.WorkerProgress(
                    worker=w.worker,
                    shard_ids=w.shard_ids,
                    records_consumed=w.records_consumed,
                    rate=w.rate,
                    straggler=w.straggler,
                )
                for w in state.workers
            ],
        )

    async def ListDatasets(
        self, request: pb.ListDatasetsRequest, context: Context
    ) -> pb.ListDatasetsResponse:
        stored = await self.dispatcher.list_datasets(_own(request.job_id))
        return pb.ListDatasetsResponse(
            datasets=[
                pb.DatasetSummary(dataset=d.dataset, parameters=parameters_to_proto(d.parameters))
                for d in stored
            ]
        )

    async def FetchBatches(
        self, request: pb.FetchBatchesRequest, context: Context
    ) -> pb.FetchBatchesResponse:
        batches, end, consumed = await self.dispatcher.fetch_batches(
            _own(request.job_id), request.dataset, request.data_worker, request.max_batches
        )
        return pb.FetchBatchesResponse(
            batches=[
                pb.IndexBatch(step_id=b.step_id, epoch=b.epoch, indices=b.indices) for b in batches
            ],
            end_of_data=end,
            consumed_step=consumed,
        )

    async def ReportConsumed(
        self, request: pb.ReportConsumedRequest, context: Context
    ) -> pb.ReportConsumedResponse:
        consumed = await self.dispatcher.report_consumed(
            _own(request.job_id), request.dataset, request.step_id
        )
        return pb.ReportConsumedResponse(consumed_step=consumed)

    async def SnapshotShards(
        self, request: pb.SnapshotShardsRequest, context: Context
    ) -> pb.SnapshotShardsResponse:
        snapshot = await self.dispatcher.snapshot(_own(request.job_id), request.dataset)
        return pb.SnapshotShardsResponse(
            snapshot=snapshot.data,
            snapshot_id=snapshot.snapshot_id,
            done=snapshot.done,
            doing=snapshot.doing,
        )

    async def RestoreShards(
        self, request: pb.RestoreShardsRequest, context: Context
    ) -> pb.RestoreShardsResponse:
        snapshot_id, revoked = await self.dispatcher.restore(
            _own(request.job_id), request.dataset, request.snapshot
        )
        return pb.RestoreShardsResponse(snapshot_id=snapshot_id, revoked=revoked)

    async def MarkWorkerLost(
        self, request: pb.MarkWorkerLostRequest, context: Context
    ) -> pb.MarkWorkerLostResponse:
        requeued = await self.dispatcher.mark_worker_lost(_own(request.job_id), request.worker)
        return pb.MarkWorkerLostResponse(requeued=requeued)
