"""The pod API (``stride.api.podwatcher.v1.PodWatcherService``) over :class:`PlanRecords`."""

from __future__ import annotations

from typing import Any

import grpc
from typing_extensions import override

from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as pb_grpc
from stride.podwatcher.adapters.convert import node_to_proto, pod_to_proto, recorded_plan_to_proto
from stride.podwatcher.usecases import PlanRecords
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import check_job_id

Context = grpc.aio.ServicerContext[Any, Any]


class PodWatcherApi(pb_grpc.PodWatcherServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, records: PlanRecords) -> None:
        self.records = records

    @override
    async def GetJobPods(
        self, request: pb.GetJobPodsRequest, context: Context
    ) -> pb.GetJobPodsResponse:
        stored, pods = await self.records.job_pods(
            check_job_id(request.job_id, raise_as=InvalidArgument)
        )
        return pb.GetJobPodsResponse(
            plan=recorded_plan_to_proto(stored), pods=[pod_to_proto(pod) for pod in pods]
        )

    @override
    async def ListNodes(
        self, request: pb.ListNodesRequest, context: Context
    ) -> pb.ListNodesResponse:
        nodes = await self.records.nodes()
        return pb.ListNodesResponse(nodes=[node_to_proto(node) for node in nodes])
