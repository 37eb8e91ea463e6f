"""Admission's job API, as the operator calls it for ``StrideJob``\\ s.

The pod watcher calls as itself (its certificate: the ``podwatcher`` identity), and
admission lets that identity submit, read and cancel only the jobs of Kubernetes tenants
(users ``k8s.<namespace>``, :mod:`stride.vocabulary.tenants`): whom a StrideJob belongs to
was decided by the API server's RBAC, which is the only identity the operator vouches for.
"""

from __future__ import annotations

import grpc

from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.events.v1 import job_pb2
from stride.runtime import tls

CALL_SECONDS = 15.0
FINAL = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)
"""Refusals a retry would meet again (a rate limit or an outage is retried)."""


class Refused(Exception):
    """Admission refused the submission for good; the message is admission's."""


class AdmissionClient:
    """SubmitJob, GetJob and CancelJob over a channel of the pod watcher's identity."""

    def __init__(self, address: str) -> None:
        self._channel = tls.aio_channel(address, server="admission", identity="podwatcher")
        self._stub = pb_grpc.AdmissionServiceStub(self._channel)

    async def submit(self, spec: job_pb2.JobSpec, request_id: str) -> pb.Job:
        """Submit (idempotent on ``request_id``: the StrideJob's uid); :class:`Refused` for
        a spec or submitter admission will never take."""
        try:
            response = await self._stub.SubmitJob(
                pb.SubmitJobRequest(spec=spec, request_id=request_id), timeout=CALL_SECONDS
            )
        except grpc.aio.AioRpcError as error:
            if error.code() in FINAL:
                raise Refused(error.details() or error.code().name) from None
            raise
        return response.job

    async def get(self, job_id: str) -> pb.Job:
        response = await self._stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=CALL_SECONDS)
        return response.job

    async def cancel(self, job_id: str) -> None:
        try:
            await self._stub.CancelJob(pb.CancelJobRequest(job_id=job_id), timeout=CALL_SECONDS)
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                raise

    async def close(self) -> None:
        await self._channel.close(None)
