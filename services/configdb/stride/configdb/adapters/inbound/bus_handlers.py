"""Configdb's bus consumers: it hears of jobs being submitted, planned and finished, and of
what they measure (step windows, pod usage)."""

from __future__ import annotations

from stride.bus.client import Delivery
from stride.configdb.adapters.convert import usage_from_proto, window_from_proto
from stride.configdb.usecases import JobHistory
from stride.events.v1 import job_pb2, metrics_pb2, plan_pb2, pod_pb2


class SubmittedHandler:
    """Creates (or completes) a job's record on ``stride.jobs.v1.submitted.<job>``."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    async def __call__(self, event: job_pb2.JobSubmitted, delivery: Delivery) -> None:
        await self.history.submitted(event)


class PlanHandler:
    """Appends a plan version to the job's record on ``stride.plans.v1.<job>``."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    async def __call__(self, plan: plan_pb2.ResourcePlan, delivery: Delivery) -> None:
        await self.history.plan_made(plan)


class FinishedHandler:
    """Records the outcome on ``stride.jobs.v1.finished.<job>``."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    async def __call__(self, event: job_pb2.JobFinished, delivery: Delivery) -> None:
        await self.history.finished(event)


class StepMetricsHandler:
    """Stores a step window on ``stride.metrics.v1.<job>.steps``."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    async def __call__(self, event: metrics_pb2.StepMetrics, delivery: Delivery) -> None:
        window, reported_at = window_from_proto(event)
        await self.history.steps_measured(window, reported_at)


class UsageHandler:
    """Stores a pod's usage sample on ``stride.pods.v1.<job>.usage``."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    async def __call__(self, event: pod_pb2.UsageSample, delivery: Delivery) -> None:
        sample, sampled_at = usage_from_proto(event)
        await self.history.usage_sampled(sample, sampled_at)
