"""Admission's ``RequestShare``: the optimizer asks for more than a job's share (DESIGN:
"when the optimizer wants more, it says so, and admission decides"), as its own verified
identity over mutual TLS."""

from __future__ import annotations

import math

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as admission_grpc
from stride.events.v1 import job_pb2
from stride.optimizer.share_asking import ShareAnswer
from stride.policy.contention import ShareRequest
from stride.runtime import tls

GIB = 1024**3


def _share(cpu: float, memory_gib: float) -> job_pb2.ResourceShare:
    return job_pb2.ResourceShare(cpu=cpu, memory_bytes=math.ceil(memory_gib * GIB))


class AdmissionShares:
    """Sends share requests to admission and reads its answers."""

    def __init__(self, address: str, timeout_seconds: float = 5.0) -> None:
        self.address = address
        self.timeout_seconds = timeout_seconds
        self._channel = tls.aio_channel(address, server="admission", identity="optimizer")
        self._stub = admission_grpc.AdmissionServiceStub(self._channel)

    async def ask(self, plan_version: int, request: ShareRequest) -> ShareAnswer:
        """Admission's answer; raises grpc.aio.AioRpcError when it cannot give one."""
        reply = await self._stub.RequestShare(
            admission_pb.RequestShareRequest(
                job_id=request.job_id,
                plan_version=plan_version,
                held=_share(request.held_cpu, request.held_memory_gib),
                wanted=_share(request.wanted_cpu, request.wanted_memory_gib),
                safety=request.safety,
                throughput_now=request.throughput_now,
                throughput_wanted=request.throughput_wanted,
                remaining_samples=request.remaining_samples,
                pause_seconds=request.pause_seconds,
                cause=request.cause,
            ),
            timeout=self.timeout_seconds,
        )
        return ShareAnswer(
            granted=reply.granted,
            queued=reply.queued,
            reason=reply.reason,
            share=reply.share if reply.HasField("share") else None,
        )

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)
