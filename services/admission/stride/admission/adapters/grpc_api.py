"""The job API (``stride.api.admission.v1.AdmissionService``) over :class:`Submissions`."""

from __future__ import annotations

from typing import Any

import grpc

from stride.admission.adapters.convert import timestamp
from stride.admission.adapters.repository import StoredJob
from stride.admission.submissions import Submissions
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.runtime.errors import InvalidArgument

Context = grpc.aio.ServicerContext[Any, Any]


def job_to_proto(job: StoredJob) -> pb.Job:
    """The API form of a stored job."""
    message = pb.Job(
        job_id=job.job_id,
        spec=job.spec,
        state=pb.JobState.Value(f"JOB_STATE_{job.state}"),
        submitted_at=timestamp(job.submitted_at),
    )
    if job.decision is not None:
        message.decision.CopyFrom(job.decision)
    return message


class AdmissionApi(pb_grpc.AdmissionServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, submissions: Submissions) -> None:
        self.submissions = submissions

    async def SubmitJob(
        self, request: pb.SubmitJobRequest, context: Context
    ) -> pb.SubmitJobResponse:
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "is required")
        job = await self.submissions.submit(request.spec, request.request_id)
        return pb.SubmitJobResponse(job=job_to_proto(job))

    async def GetJob(self, request: pb.GetJobRequest, context: Context) -> pb.GetJobResponse:
        return pb.GetJobResponse(job=job_to_proto(await self.submissions.get(request.job_id)))

    async def ListJobs(self, request: pb.ListJobsRequest, context: Context) -> pb.ListJobsResponse:
        jobs = await self.submissions.list(request.user, request.page_size)
        return pb.ListJobsResponse(jobs=[job_to_proto(job) for job in jobs])

    async def CancelJob(
        self, request: pb.CancelJobRequest, context: Context
    ) -> pb.CancelJobResponse:
        return pb.CancelJobResponse(job=job_to_proto(await self.submissions.cancel(request.job_id)))
