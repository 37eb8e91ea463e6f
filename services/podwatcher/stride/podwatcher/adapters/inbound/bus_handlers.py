"""The podwatcher's bus consumers: admitted jobs, resource plans, jobs that ended
elsewhere (a cancel), and the chief's answers to control commands."""

from __future__ import annotations

from collections.abc import Sequence

from stride.bus.client import Delivery
from stride.events.v1 import control_pb2, job_pb2, plan_pb2
from stride.podwatcher.usecases import PodWatcher


class AdmittedHandler:
    """Stores admitted jobs' specs from ``stride.jobs.v1.admitted.<job>``: a fetched batch
    in one transaction, each alone if that fails (``PodWatcher.admitted_all``)."""

    def __init__(self, pods: PodWatcher) -> None:
        self.pods = pods

    async def __call__(
        self, batch: Sequence[tuple[job_pb2.AdmissionDecision, Delivery]]
    ) -> Sequence[BaseException | None]:
        return await self.pods.admitted_all([decision for decision, _ in batch])


class PlanHandler:
    """Records and applies plans on ``stride.plans.v1.<job>``, a fetched batch in one
    transaction (``PodWatcher.receive_all``); invalid plans dead-letter, plans for a job
    not admitted (yet) are retried, then dead-lettered."""

    def __init__(self, pods: PodWatcher) -> None:
        self.pods = pods

    async def __call__(
        self, batch: Sequence[tuple[plan_pb2.ResourcePlan, Delivery]]
    ) -> Sequence[BaseException | None]:
        outcomes = await self.pods.receive_all([plan for plan, _ in batch])
        return [outcome if isinstance(outcome, Exception) else None for outcome in outcomes]


class FinishedHandler:
    """Removes the pods of a job that ended (``stride.jobs.v1.finished.<job>``)."""

    def __init__(self, pods: PodWatcher) -> None:
        self.pods = pods

    async def __call__(self, event: job_pb2.JobFinished, delivery: Delivery) -> None:
        await self.pods.job_finished(event)


class AckHandler:
    """Finishes a cluster change once the chief confirms it (``stride.control.v1.<job>.ack``)."""

    def __init__(self, pods: PodWatcher) -> None:
        self.pods = pods

    async def __call__(self, ack: control_pb2.ControlAck, delivery: Delivery) -> None:
        await self.pods.acked(ack)
