"""The executor's direct API (``stride.api.executor.v1.ExecutorService``), for tools.

Who may call (:data:`ACCESS`): admins (the optimizer reaches the pool over the bus).
"""

from __future__ import annotations

from typing import Any

import grpc

from stride.api.executor.v1 import executor_service_pb2 as pb
from stride.api.executor.v1 import executor_service_pb2_grpc as pb_grpc
from stride.executor.usecases import AlgorithmFailed, AlgorithmRunner
from stride.policy.registry import NAME_PATTERN
from stride.runtime import auth
from stride.runtime.errors import InvalidArgument
from stride.runtime.grpc_server import bounded_message
from stride.vocabulary import echo

Context = grpc.aio.ServicerContext[Any, Any]


SERVICE = pb.DESCRIPTOR.services_by_name["ExecutorService"].full_name
ACCESS = auth.rules(
    SERVICE, {"RunAlgorithm": auth.rule(admins=True), "ListAlgorithms": auth.rule(admins=True)}
)


class ExecutorApi(pb_grpc.ExecutorServiceServicer):
    """gRPC servicer; InvalidArgument and NotFound are mapped by the server's interceptor."""

    def __init__(self, runner: AlgorithmRunner) -> None:
        self.runner = runner

    async def RunAlgorithm(
        self, request: pb.RunAlgorithmRequest, context: Context
    ) -> pb.RunAlgorithmResponse:
        if not request.HasField("request"):
            raise InvalidArgument("request", "is required")
        name = request.request.algorithm
        if name and not NAME_PATTERN.match(name):
            # No algorithm can be registered under it: a malformed name, not NOT_FOUND.
            raise InvalidArgument(
                "algorithm", f"{echo(name)} is not an algorithm name ({NAME_PATTERN.pattern})"
            )
        try:
            reply = await self.runner.run(request.request)
        except AlgorithmFailed as error:
            # The interceptor would hide the message behind "see the server log"; the
            # algorithm's own error is what a tool's user needs here.
            await context.abort(grpc.StatusCode.INTERNAL, bounded_message(error.message))
        return pb.RunAlgorithmResponse(reply=reply)

    async def ListAlgorithms(
        self, request: pb.ListAlgorithmsRequest, context: Context
    ) -> pb.ListAlgorithmsResponse:
        by_name: dict[str, pb.AlgorithmInfo] = {}
        for spec in self.runner.algorithms():  # by name, then version ascending
            info = by_name.setdefault(spec.name, pb.AlgorithmInfo(name=spec.name))
            info.versions.append(spec.version)
            info.description = spec.description  # the newest version's
        return pb.ListAlgorithmsResponse(algorithms=list(by_name.values()))
