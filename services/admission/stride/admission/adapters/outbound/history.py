"""What similar finished jobs measured, from the config DB (its gRPC ``FindSimilarJobs``):
the history admission warm-starts a job's scaling curve from when the job declares none
(DLRover-RM sec. 3: the Config DB; Algorithm 1 takes its top-k)."""

from __future__ import annotations

import math

import structlog

from stride.api.configdb.v1 import configdb_service_pb2 as configdb_pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as configdb_grpc
from stride.events.v1 import job_pb2, plan_pb2
from stride.policy.warm_start import MeasuredPoint, MeasuredRun
from stride.runtime import tls

log = structlog.get_logger(__name__)

CANDIDATES = 20
"""Similar jobs asked for: the blend keeps the five most similar that measured anything."""


class ConfigDbRuns:
    """Asks the config DB what the finished jobs most similar to a spec measured."""

    def __init__(self, address: str, timeout_seconds: float = 2.0) -> None:
        self.address = address
        self.timeout_seconds = timeout_seconds
        """Kept short: a submission waits for it, and without it the job is only planned
        without a curve (a deadline is then refused, saying to declare a profile)."""
        self._channel = tls.aio_channel(address, server="configdb", identity="admission")
        self._stub = configdb_grpc.ConfigDbServiceStub(self._channel)

    async def similar(self, spec: job_pb2.JobSpec) -> tuple[MeasuredRun, ...]:
        """The measured runs of jobs like ``spec``; raises grpc.aio.AioRpcError when the
        config DB cannot answer."""
        reply = await self._stub.FindSimilarJobs(
            configdb_pb.FindSimilarJobsRequest(spec=spec, k=CANDIDATES),
            timeout=self.timeout_seconds,
        )
        return tuple(run for match in reply.jobs if (run := measured_run(match)) is not None)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)


def measured_run(match: configdb_pb.SimilarJob) -> MeasuredRun | None:
    """A similar job's measurements: for each plan version it ran long enough to be
    profiled, its workers and PS, its global steps per second (samples per second over its
    batch size) and what all its pods held; None when it measured nothing usable."""
    record = match.record
    batch = record.spec.batch_size
    if batch <= 0:
        return None
    plans = {plan.version: plan for plan in record.plans}
    points = []
    for profile in record.profiles:
        plan = plans.get(profile.plan_version)
        if plan is None or profile.steps <= 0 or not profile.samples_per_second > 0:
            continue
        counts = {role.role: role.count for role in plan.roles}
        cpu = sum(_role_total(role)[0] for role in plan.roles)
        memory = sum(_role_total(role)[1] for role in plan.roles)
        rate = profile.samples_per_second / batch
        if not math.isfinite(rate) or cpu <= 0 or memory <= 0:
            continue
        points.append(
            MeasuredPoint(
                workers=counts.get(plan_pb2.ROLE_WORKER, 0),
                ps=counts.get(plan_pb2.ROLE_PS, 0),
                steps_per_second=rate,
                cpu=cpu,
                memory_bytes=memory,
            )
        )
    if not points:
        return None
    return MeasuredRun(record.job_id, float(match.similarity), tuple(points))


def _role_total(role: plan_pb2.RoleResources) -> tuple[float, int]:
    """Cores and bytes all pods of a role hold (per-pod overrides applied)."""
    overrides = {override.index: override for override in role.overrides}
    cpu, memory = 0.0, 0
    for index in range(role.count):
        override = overrides.get(index)
        cpu += override.cpu if override is not None and override.cpu > 0 else role.cpu
        memory += (
            override.memory_bytes
            if override is not None and override.memory_bytes > 0
            else role.memory_bytes
        )
    return cpu, memory
