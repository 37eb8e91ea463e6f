"""The pod API (``stride.api.podwatcher.v1.PodWatcherService``) over :class:`PodWatcher`.

Who may call (:data:`ACCESS`): any user may list nodes and read the pods and logs of their
own jobs (the owner is the admitted spec's user, which admission took from the submitter's
token); admins see every job and drain and restore nodes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from typing_extensions import override

from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as pb_grpc
from stride.podwatcher.adapters.convert import node_to_proto, pod_to_proto, recorded_plan_to_proto
from stride.podwatcher.usecases import PodWatcher
from stride.runtime import auth
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import check_job_id, check_pod_name

Context = grpc.aio.ServicerContext[Any, Any]

MAX_TAIL_LINES = 10_000
"""The most lines one GetPodLogs call sends first; more is a bulk export, not a look."""
DEFAULT_TAIL_LINES = 100


SERVICE = pb.DESCRIPTOR.services_by_name["PodWatcherService"].full_name
ACCESS = auth.rules(
    SERVICE,
    {
        "GetJobPods": auth.rule(users=True),
        "ListNodes": auth.rule(users=True),
        "DrainNode": auth.rule(admins=True),
        "RestoreNode": auth.rule(admins=True),
        "GetPodLogs": auth.rule(users=True),
    },
)


class PodWatcherApi(pb_grpc.PodWatcherServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, pods: PodWatcher, enforcement: str) -> None:
        self.pods = pods
        self.enforcement = enforcement

    async def _visible(self, job_id: str) -> str:
        """``job_id`` once the caller may see it (its owner, or an admin)."""
        check_job_id(job_id, raise_as=InvalidArgument)
        if not auth.current().admin:
            owner = await self.pods.job_owner(job_id)
            auth.require_owner(job_id, owner, "this podwatcher runs no such job")
        return job_id

    @override
    async def GetJobPods(
        self, request: pb.GetJobPodsRequest, context: Context
    ) -> pb.GetJobPodsResponse:
        stored, views = await self.pods.job_pods(await self._visible(request.job_id))
        return pb.GetJobPodsResponse(
            plan=recorded_plan_to_proto(stored),
            pods=[pod_to_proto(view.pod, view.usage, view.address) for view in views],
        )

    @override
    async def ListNodes(
        self, request: pb.ListNodesRequest, context: Context
    ) -> pb.ListNodesResponse:
        views = await self.pods.nodes()
        return pb.ListNodesResponse(
            nodes=[
                node_to_proto(
                    view.node,
                    self.enforcement,
                    view.cpu_allocated,
                    view.memory_allocated_bytes,
                    view.drained,
                )
                for view in views
            ]
        )

    @override
    async def DrainNode(
        self, request: pb.DrainNodeRequest, context: Context
    ) -> pb.DrainNodeResponse:
        evicted = await self.pods.drain(request.name)
        return pb.DrainNodeResponse(evicted_pods=evicted)

    @override
    async def RestoreNode(
        self, request: pb.RestoreNodeRequest, context: Context
    ) -> pb.RestoreNodeResponse:
        await self.pods.restore(request.name)
        return pb.RestoreNodeResponse()

    @override
    async def GetPodLogs(
        self, request: pb.GetPodLogsRequest, context: Context
    ) -> AsyncIterator[pb.GetPodLogsResponse]:
        job_id = await self._visible(request.job_id)
        if request.pod_name:
            check_pod_name(request.pod_name, "pod_name", raise_as=InvalidArgument)
        if not 0 <= request.tail_lines <= MAX_TAIL_LINES:
            raise InvalidArgument(
                "tail_lines", f"must be between 0 and {MAX_TAIL_LINES}, got {request.tail_lines}"
            )
        tail = request.tail_lines or DEFAULT_TAIL_LINES
        async for pod_name, lines in self.pods.logs(job_id, request.pod_name, tail, request.follow):
            if lines:
                yield pb.GetPodLogsResponse(pod_name=pod_name, lines=lines)
