"""The optimizer's bus consumers: jobs admitted (first plan), jobs finished, admission's
shares, pods OOM-killed, and the metrics the stage step decides on.

The bus has already checked that each payload's job id is its subject's (see ``Bus.consume``).
"""

from __future__ import annotations

from collections.abc import Sequence

from stride.bus.client import Delivery
from stride.events.v1 import job_pb2, metrics_pb2, pod_pb2
from stride.optimizer.usecases import Planning


class AdmittedHandler:
    """Creates each admitted job's administrator and plan 1: a fetched batch of admissions
    stored in one transaction, each alone if that fails (``Planning.admitted_all``)."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(
        self, batch: Sequence[tuple[job_pb2.AdmissionDecision, Delivery]]
    ) -> Sequence[BaseException | None]:
        return await self.planning.admitted_all(
            [decision for decision, _ in batch],
            [delivery.traced for _, delivery in batch],
        )


class FinishedHandler:
    """Moves the job's administrator to FINISHED when a job ends."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(self, event: job_pb2.JobFinished, delivery: Delivery) -> None:
        await self.planning.finished(event)


class ShareHandler:
    """Keeps the share admission grants the job; its plans stay within it."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(self, event: job_pb2.JobShare, delivery: Delivery) -> None:
        await self.planning.shared(event)


class PodFailedHandler:
    """Turns an OOM kill into the policy's OOM relaunch plan, once per failure event."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(self, event: pod_pb2.PodEvent, delivery: Delivery) -> None:
        # The failure's bus id (pod, kind, restart count) names it: a redelivery is the same.
        await self.planning.pod_failed(event, f"{event.job_id}.oom.{delivery.message_id}")


class MetricsHandler:
    """Applies a fetched batch of step windows or usage samples in one transaction; closed
    windows are decided on off the consumer (``Planning.due``)."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(
        self, batch: Sequence[tuple[metrics_pb2.StepMetrics | pod_pb2.UsageSample, Delivery]]
    ) -> Sequence[BaseException | None]:
        return await self.planning.measured([metric for metric, _ in batch])
