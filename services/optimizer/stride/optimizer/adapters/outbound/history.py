"""Similar finished jobs from the config DB (its gRPC ``FindSimilarJobs``), as the warm
start's history (DLRover-RM sec. 3: the Config DB; Algorithm 1 takes its top-k)."""

from __future__ import annotations

import math

import structlog

from stride.api.configdb.v1 import configdb_service_pb2 as configdb_pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as configdb_grpc
from stride.events.v1 import job_pb2, plan_pb2
from stride.optimizer.adapters.convert import features_from_spec
from stride.policy.stages import MEMORY_HEADROOM
from stride.policy.warm_start import HistoricalJob, ResourceConfiguration
from stride.runtime import tls
from stride.runtime.errors import InvalidArgument

log = structlog.get_logger(__name__)

CANDIDATES = 100
"""Similar jobs asked for (the API's most): the warm start ranks them again by its own
similarity and blends its top five, as the simulator's warm start does over its history."""


class ConfigDbHistory:
    """Asks the config DB for the finished jobs most similar to a spec."""

    def __init__(self, address: str, timeout_seconds: float = 5.0) -> None:
        self.address = address
        self.timeout_seconds = timeout_seconds
        self._channel = tls.aio_channel(address, server="configdb", identity="optimizer")
        self._stub = configdb_grpc.ConfigDbServiceStub(self._channel)

    async def similar(self, spec: job_pb2.JobSpec) -> tuple[HistoricalJob, ...]:
        """Finished, succeeded jobs like ``spec`` with their final configuration; raises
        grpc.aio.AioRpcError when the config DB cannot answer."""
        reply = await self._stub.FindSimilarJobs(
            configdb_pb.FindSimilarJobsRequest(spec=spec, k=CANDIDATES),
            timeout=self.timeout_seconds,
        )
        found = []
        for match in reply.jobs:
            job = history_entry(match.record)
            if job is not None:
                found.append(job)
        return tuple(found)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)


def measured_memory(record: configdb_pb.JobRecord, role: int) -> int | None:
    """Bytes one pod of ``role`` was measured to need over the whole job (its largest
    resident memory in any usage sample, with the stage step's headroom), or None when no
    usage of the role was recorded."""
    peaks = [
        usage.memory_used_max_bytes
        for profile in record.profiles
        for usage in profile.roles
        if usage.role == role and usage.samples > 0 and usage.memory_used_max_bytes > 0
    ]
    return math.ceil(max(peaks) * MEMORY_HEADROOM) if peaks else None


def history_entry(record: configdb_pb.JobRecord) -> HistoricalJob | None:
    """A past job as the warm start's history: its features and the configuration it
    finished with (its last plan), or None when it cannot be one (no worker or PS, or a
    spec the planner refuses).

    Memory is what the job was measured to need (:func:`measured_memory`), where its runtime
    profile has usage, not what its last plan held: a short job that never resized would
    otherwise hand its user's over-provisioning to every similar job (``stride sim --env
    dlrm`` keeps its history the same way). The busiest PS's peak stands for every PS."""
    if not record.plans:
        return None
    final = max(record.plans, key=lambda plan: plan.version)
    roles = {role.role: role for role in final.roles}
    workers, ps = roles.get(plan_pb2.ROLE_WORKER), roles.get(plan_pb2.ROLE_PS)
    if workers is None or workers.count < 1 or ps is None or ps.count < 1:
        return None
    try:
        features = features_from_spec(record.spec)
        return HistoricalJob(
            record.job_id,
            features,
            ResourceConfiguration(
                worker_count=workers.count,
                worker_cpu=workers.cpu,
                worker_memory_bytes=measured_memory(record, plan_pb2.ROLE_WORKER)
                or workers.memory_bytes,
                ps_count=ps.count,
                ps_cpu=ps.cpu,
                ps_memory_bytes=measured_memory(record, plan_pb2.ROLE_PS) or ps.memory_bytes,
            ),
        )
    except (InvalidArgument, ValueError) as error:
        log.info("past job not usable for warm start", job_id=record.job_id, why=str(error))
        return None
