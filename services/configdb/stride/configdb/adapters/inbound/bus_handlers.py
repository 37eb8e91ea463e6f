"""Configdb's bus consumers: it hears of jobs being submitted, planned and finished, and of
what they measure (step windows, pod usage)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Generic, TypeVar

from stride.bus.client import Delivery
from stride.configdb.adapters.convert import usage_from_proto, window_from_proto
from stride.configdb.domain.profiles import StepWindow, UsageSample
from stride.configdb.usecases import JobHistory
from stride.events.v1 import job_pb2, metrics_pb2, plan_pb2, pod_pb2
from stride.runtime.errors import InvalidArgument

M = TypeVar("M", job_pb2.JobSubmitted, plan_pb2.ResourcePlan, job_pb2.JobFinished)


class EventsHandler(Generic[M]):
    """Stores a fetched batch of job events (submitted, plans or finished) in one
    transaction; one that cannot be stored fails alone (``JobHistory._together``)."""

    def __init__(
        self, store_all: Callable[[Sequence[M]], Awaitable[Sequence[Exception | None]]]
    ) -> None:
        self.store_all: Callable[[Sequence[M]], Awaitable[Sequence[Exception | None]]]
        self.store_all = store_all

    async def __call__(self, batch: Sequence[tuple[M, Delivery]]) -> Sequence[BaseException | None]:
        outcomes: Sequence[BaseException | None] = await self.store_all([e for e, _ in batch])
        return outcomes


class MetricsHandler:
    """Stores a fetched batch of step windows or usage samples in one transaction."""

    def __init__(self, history: JobHistory) -> None:
        self.history = history

    async def __call__(
        self, batch: Sequence[tuple[metrics_pb2.StepMetrics | pod_pb2.UsageSample, Delivery]]
    ) -> Sequence[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(batch)
        items: list[tuple[int, tuple[StepWindow, datetime] | tuple[UsageSample, datetime]]] = []
        for index, (event, _) in enumerate(batch):
            try:
                if isinstance(event, metrics_pb2.StepMetrics):
                    items.append((index, window_from_proto(event)))
                else:
                    items.append((index, usage_from_proto(event)))
            except InvalidArgument as error:
                outcomes[index] = error
        stored = await self.history.measured([item for _, item in items])
        for (index, _), outcome in zip(items, stored, strict=True):
            outcomes[index] = outcome
        return outcomes
