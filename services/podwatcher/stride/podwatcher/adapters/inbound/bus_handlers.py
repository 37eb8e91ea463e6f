"""The podwatcher's bus consumers: it learns here of new resource plans."""

from __future__ import annotations

from stride.bus.client import Delivery
from stride.events.v1 import plan_pb2
from stride.podwatcher.usecases import PlanRecords


class PlanHandler:
    """Records (and applies) a plan on ``stride.plans.v1.<job>``; invalid plans dead-letter."""

    def __init__(self, records: PlanRecords) -> None:
        self.records = records

    async def __call__(self, plan: plan_pb2.ResourcePlan, delivery: Delivery) -> None:
        await self.records.receive(plan)
