"""The trainer-facing API (``stride.api.agent.v1.AgentService``).

Each method checks what the agent itself knows (field names in errors are the agent
request's own), then forwards. Refusals from the dispatcher or the cache reach the trainer
with their original status code.

Who may call (:data:`ACCESS`): a holder of a job token for the agent's own job (the trainer
in its pod), or an admin; the server refuses a token for any other job
(``create_host(only_job=...)``). The agent forwards upstream with its own copy of that token.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import fields
from typing import Any

import grpc

from stride.agent.domain.control import ControlAction, ControlCommand
from stride.agent.domain.steps import InputQueue, StepWindow
from stride.agent.usecases import PodAgent, UpstreamError
from stride.api.agent.v1 import agent_service_pb2 as pb
from stride.api.agent.v1 import agent_service_pb2_grpc as pb_grpc
from stride.api.ckptcache.v1 import ckptcache_service_pb2 as ckpt_pb
from stride.events.v1 import control_pb2
from stride.runtime import auth
from stride.runtime.errors import InvalidArgument

Context = grpc.aio.ServicerContext[Any, Any]

SERVICE = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
ACCESS = auth.rules(
    SERVICE,
    {
        method.name: auth.rule(admins=True, jobs=True)
        for method in pb.DESCRIPTOR.services_by_name["AgentService"].methods
    },
)

ACTION_TO_PROTO = {
    ControlAction.PAUSE: control_pb2.CONTROL_ACTION_PAUSE,
    ControlAction.RESUME: control_pb2.CONTROL_ACTION_RESUME,
    ControlAction.STOP: control_pb2.CONTROL_ACTION_STOP,
    ControlAction.RECONFIGURE: control_pb2.CONTROL_ACTION_RECONFIGURE,
}
ACTION_FROM_PROTO = {value: action for action, value in ACTION_TO_PROTO.items()}


def command_from_proto(command: control_pb2.ControlCommand) -> ControlCommand:
    """A command from the bus in domain terms; InvalidArgument for an unspecified action."""
    action = ACTION_FROM_PROTO.get(command.action)
    if action is None:
        raise InvalidArgument("action", f"unknown control action {command.action}")
    paused_at = command.paused_at.ToMicroseconds() / 1e6 if command.HasField("paused_at") else 0.0
    return ControlCommand(
        action,
        command.reason,
        command.plan_version,
        command.cluster_json,
        paused_at,
        command.checkpoint_id,
    )


def _check_dataset(dataset: str) -> None:
    if not dataset:
        raise InvalidArgument("dataset", "is required")


MAX_DETAILS = 1024
"""Status messages are cut to this, as the server's interceptor cuts its own: an upstream's
message may echo a huge request field, and gRPC refuses metadata over 16 KiB."""


async def relay(context: Context, error: UpstreamError) -> None:
    """End the trainer's call with the upstream's status (raises AbortError)."""
    details = error.details
    if len(details) > MAX_DETAILS:
        details = details[: MAX_DETAILS - 3] + "..."
    await context.abort(error.code, details)


class AgentApi(pb_grpc.AgentServiceServicer):
    """gRPC servicer for the trainer in the same pod."""

    def __init__(self, agent: PodAgent) -> None:
        self.job_id = agent.job_id
        self.shards = agent.shards
        self.checkpoints = agent.checkpoints
        self.steps = agent.steps
        self.control = agent.control
        self.acks = agent.acks

    async def NextShard(
        self, request: pb.NextShardRequest, context: Context
    ) -> pb.NextShardResponse:
        _check_dataset(request.dataset)
        done = request.done_shard_id if request.HasField("done_shard_id") else None
        if done is not None and done < 0:
            raise InvalidArgument("done_shard_id", f"must not be negative, got {done}")
        try:
            shard, end_of_data = await self.shards.next_shard(
                request.dataset, done=done, wait=not request.no_wait
            )
        except UpstreamError as error:
            await relay(context, error)
            raise
        if shard is None:
            return pb.NextShardResponse(end_of_data=end_of_data)
        return pb.NextShardResponse(shard=shard, end_of_data=end_of_data)

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: Context
    ) -> pb.ReportProgressResponse:
        _check_dataset(request.dataset)
        try:
            await self.shards.report(
                request.dataset, request.shard_id, request.offset, request.done
            )
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.ReportProgressResponse()

    async def ReportSteps(
        self, request: pb.ReportStepsRequest, context: Context
    ) -> pb.ReportStepsResponse:
        await self.steps.report(
            StepWindow(
                global_step=request.global_step,
                steps=request.steps,
                step_seconds=request.step_seconds,
                samples_per_second=request.samples_per_second,
                plan_version=request.plan_version,
                input_queue=(
                    InputQueue(
                        **{f.name: getattr(request.input_queue, f.name) for f in fields(InputQueue)}
                    )
                    if request.HasField("input_queue")
                    else None
                ),
            )
        )
        return pb.ReportStepsResponse()

    async def SaveCheckpoint(
        self, request_iterator: AsyncIterator[pb.SaveCheckpointRequest], context: Context
    ) -> pb.SaveCheckpointResponse:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None:
            raise InvalidArgument("chunk.header", "is required: the stream was empty")
        if first.chunk.WhichOneof("chunk") != "header":
            raise InvalidArgument("chunk.header", "must be the first message of the stream")
        header = ckpt_pb.CheckpointHeader()
        header.CopyFrom(first.chunk.header)
        if header.job_id and header.job_id != self.job_id:
            raise InvalidArgument(
                "chunk.header.job_id",
                f"{header.job_id!r} is not this pod's job {self.job_id!r}; leave it empty",
            )
        header.job_id = self.job_id

        async def upstream() -> AsyncIterator[ckpt_pb.SaveCheckpointRequest]:
            yield ckpt_pb.SaveCheckpointRequest(header=header)
            async for request in requests:
                yield request.chunk

        try:
            reply = await self.checkpoints.save(upstream(), context.time_remaining())
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.SaveCheckpointResponse(tier=reply.tier)

    async def LoadCheckpoint(
        self, request: pb.LoadCheckpointRequest, context: Context
    ) -> AsyncIterator[pb.LoadCheckpointResponse]:
        try:
            async for chunk in self.checkpoints.load(
                request.checkpoint_id, context.time_remaining()
            ):
                yield pb.LoadCheckpointResponse(chunk=chunk)
        except UpstreamError as error:
            await relay(context, error)

    async def WatchControl(
        self, request: pb.WatchControlRequest, context: Context
    ) -> AsyncIterator[pb.WatchControlResponse]:
        async with self.control.subscribe() as queue:
            # Initial metadata tells the client the watch is in place before any command.
            await context.send_initial_metadata(())
            while True:
                command = await queue.get()
                yield pb.WatchControlResponse(
                    action=ACTION_TO_PROTO[command.action],
                    reason=command.reason,
                    plan_version=command.plan_version,
                    cluster_json=command.cluster_json,
                    paused_at=command.paused_at,
                    checkpoint_id=command.checkpoint_id,
                )
                if command.action is ControlAction.STOP:
                    return

    async def CreateDataset(
        self, request: pb.CreateDatasetRequest, context: Context
    ) -> pb.CreateDatasetResponse:
        _check_dataset(request.dataset)
        try:
            created = await self.shards.create_dataset(request.dataset, request.parameters)
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.CreateDatasetResponse(created=created)

    async def GetDatasetState(
        self, request: pb.GetDatasetStateRequest, context: Context
    ) -> pb.GetDatasetStateResponse:
        _check_dataset(request.dataset)
        try:
            state = await self.shards.dataset_state(request.dataset)
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.GetDatasetStateResponse(state=state)

    async def SnapshotShards(
        self, request: pb.SnapshotShardsRequest, context: Context
    ) -> pb.SnapshotShardsResponse:
        _check_dataset(request.dataset)
        try:
            snapshot = await self.shards.snapshot(request.dataset)
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.SnapshotShardsResponse(snapshot=snapshot)

    async def RestoreShards(
        self, request: pb.RestoreShardsRequest, context: Context
    ) -> pb.RestoreShardsResponse:
        _check_dataset(request.dataset)
        if not request.snapshot:
            raise InvalidArgument("snapshot", "is required: a snapshot from SnapshotShards")
        try:
            restored = await self.shards.restore(request.dataset, request.snapshot)
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.RestoreShardsResponse(restored=restored)

    async def FetchBatches(
        self, request: pb.FetchBatchesRequest, context: Context
    ) -> pb.FetchBatchesResponse:
        _check_dataset(request.dataset)
        if not 1 <= request.max_batches <= 1024:
            raise InvalidArgument(
                "max_batches", f"must be between 1 and 1024, got {request.max_batches}"
            )
        try:
            reply = await self.shards.fetch_batches(request.dataset, request.max_batches)
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.FetchBatchesResponse(reply=reply)

    async def ReportConsumed(
        self, request: pb.ReportConsumedRequest, context: Context
    ) -> pb.ReportConsumedResponse:
        _check_dataset(request.dataset)
        if request.step_id < 0:
            raise InvalidArgument("step_id", f"must not be negative, got {request.step_id}")
        try:
            consumed = await self.shards.report_consumed(request.dataset, request.step_id)
        except UpstreamError as error:
            await relay(context, error)
            raise
        return pb.ReportConsumedResponse(consumed_step=consumed)

    async def AckControl(
        self, request: pb.AckControlRequest, context: Context
    ) -> pb.AckControlResponse:
        if request.action not in ACTION_FROM_PROTO:
            raise InvalidArgument("action", "must be PAUSE, RESUME, STOP or RECONFIGURE")
        if request.plan_version < 0:
            raise InvalidArgument(
                "plan_version", f"must not be negative, got {request.plan_version}"
            )
        if not math.isfinite(request.paused_seconds) or request.paused_seconds < 0:
            raise InvalidArgument(
                "paused_seconds",
                f"must be a finite, non-negative number, got {request.paused_seconds}",
            )
        await self.acks.publish(
            control_pb2.ControlAck(
                action=request.action,
                plan_version=request.plan_version,
                ok=request.ok,
                message=request.message[:4000],
                checkpoint_id=request.checkpoint_id,
                paused_seconds=request.paused_seconds,
            )
        )
        return pb.AckControlResponse()
