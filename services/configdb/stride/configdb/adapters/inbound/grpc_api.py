"""The Config DB API (``stride.api.configdb.v1.ConfigDbService``) over :class:`JobHistory`.

Who may call (:data:`ACCESS`): a user reads the record of their own job (``stride status``);
admins read every record; admission and the optimizer find similar past jobs (warm start),
as admins may.
"""

from __future__ import annotations

from typing import Any

import grpc
from typing_extensions import override

from stride.api.configdb.v1 import configdb_service_pb2 as pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as pb_grpc
from stride.configdb.adapters.convert import record_to_proto
from stride.configdb.usecases import JobHistory
from stride.runtime import auth
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import check_job_id

Context = grpc.aio.ServicerContext[Any, Any]


SERVICE = pb.DESCRIPTOR.services_by_name["ConfigDbService"].full_name
ACCESS = auth.rules(
    SERVICE,
    {
        "GetJobRecord": auth.rule(users=True),
        "ListJobRecords": auth.rule(admins=True),
        "FindSimilarJobs": auth.rule("admission", "optimizer", admins=True),
    },
)


class ConfigDbApi(pb_grpc.ConfigDbServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    @override
    async def GetJobRecord(
        self, request: pb.GetJobRecordRequest, context: Context
    ) -> pb.GetJobRecordResponse:
        record = await self.history.get(check_job_id(request.job_id, raise_as=InvalidArgument))
        owner = record.spec.user if record.spec is not None else ""
        auth.require_owner(request.job_id, owner, "no such record")
        return pb.GetJobRecordResponse(record=record_to_proto(record))

    @override
    async def ListJobRecords(
        self, request: pb.ListJobRecordsRequest, context: Context
    ) -> pb.ListJobRecordsResponse:
        records = await self.history.recent(request.page_size)
        return pb.ListJobRecordsResponse(records=[record_to_proto(r) for r in records])

    @override
    async def FindSimilarJobs(
        self, request: pb.FindSimilarJobsRequest, context: Context
    ) -> pb.FindSimilarJobsResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        found = await self.history.find_similar(request.spec, request.k)
        return pb.FindSimilarJobsResponse(
            jobs=[
                pb.SimilarJob(record=record_to_proto(record), similarity=similarity)
                for record, similarity in found
            ]
        )
