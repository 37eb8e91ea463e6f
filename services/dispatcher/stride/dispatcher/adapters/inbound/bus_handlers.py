"""Pod lifecycle events from the podwatcher: a failed or deleted worker pod is a lost worker.

DLRover sec. 5.2: when a worker fails, its DOING shards go back to TODO. The podwatcher
publishes ``stride.pods.v1.<job_id>.failed`` and ``.deleted`` on the STRIDE_PODS stream;
this handler marks the pod's worker lost, which fences its token and requeues its shards.

Idempotent: marking a worker lost twice changes nothing, and an event older than the
worker's current registration (a redelivery, or a pod restarted under the same name) is
ignored, so it never fences the new incarnation. The bus acks after the commit.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from stride.bus.client import Delivery
from stride.dispatcher.usecases import ShardDispatcher
from stride.events.v1 import plan_pb2, pod_pb2

log = structlog.get_logger(__name__)

GONE_PHASES = frozenset({pod_pb2.POD_PHASE_FAILED, pod_pb2.POD_PHASE_DELETED})
SHARD_ROLES = frozenset({plan_pb2.ROLE_WORKER, plan_pb2.ROLE_CHIEF, plan_pb2.ROLE_UNSPECIFIED})
"""Roles that may hold shards; parameter servers and data workers never register."""


class PodEventHandler:
    """Marks the worker of a failed or deleted pod lost; frees a gone data worker's steps."""

    def __init__(self, dispatcher: ShardDispatcher) -> None:
        self.dispatcher = dispatcher

    async def __call__(self, event: pod_pb2.PodEvent, delivery: Delivery) -> None:
        if event.phase not in GONE_PHASES or not event.job_id or not event.pod_name:
            return
        occurred = (
            event.occurred_at.ToDatetime(tzinfo=UTC)
            if event.HasField("occurred_at")
            else datetime.now(UTC)
        )
        if event.role == plan_pb2.ROLE_DATA_WORKER:
            await self.dispatcher.data_worker_gone(event.job_id, event.pod_name, occurred)
            return
        if event.role not in SHARD_ROLES:
            return
        requeued = await self.dispatcher.pod_gone(event.job_id, event.pod_name, occurred)
        if requeued is not None:
            log.info(
                "pod gone; worker marked lost",
                job_id=event.job_id,
                worker=event.pod_name,
                requeued=requeued,
                subject=delivery.subject,
            )
