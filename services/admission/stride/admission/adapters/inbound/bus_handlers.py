"""Admission's bus consumers: it learns here that jobs finished, what nodes there are, and
what each running job's plan holds."""

from __future__ import annotations

from stride.admission.share_requests import ShareRequests
from stride.admission.usecases import Submissions
from stride.bus.client import Delivery
from stride.events.v1 import cluster_pb2, job_pb2, plan_pb2


class FinishedHandler:
    """Moves a job to its terminal state when ``stride.jobs.v1.finished.<job>`` arrives."""

    def __init__(self, submissions: Submissions) -> None:
        self.submissions = submissions

    async def __call__(self, event: job_pb2.JobFinished, delivery: Delivery) -> None:
        await self.submissions.finished(event)


class InventoryHandler:
    """Takes the cluster's capacity from ``stride.cluster.v1.nodes.<cluster>``."""

    def __init__(self, submissions: Submissions) -> None:
        self.submissions = submissions

    async def __call__(self, event: cluster_pb2.NodeInventory, delivery: Delivery) -> None:
        await self.submissions.inventory(event)


class PlanHandler:
    """Records what each running job's plan holds from ``stride.plans.v1.<job>``."""

    def __init__(self, requests: ShareRequests) -> None:
        self.requests = requests

    async def __call__(self, plan: plan_pb2.ResourcePlan, delivery: Delivery) -> None:
        await self.requests.planned(plan)
