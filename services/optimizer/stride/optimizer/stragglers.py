"""Stragglers the dispatcher found, recorded on their job as optimization events.

The dispatcher judges each job's workers by their progress rates, and a worker far below
its peers' median gets smaller shards (DLRover-RM sec. 5.1); it publishes StragglerDetected
when it flags one. The remedy is the smaller shards: the plan is not changed for one slow
worker (its pods are sized for the job, and the stage step sees the job's throughput, which
the smaller shards protect). What the optimizer adds is the record: the fact becomes an
optimization event with root cause STRAGGLER, beside the job's other events, so a user who
asks why the job runs as it does (``ListOptimizationEvents``, ``stride explain``) reads
"worker X is a straggler at 12% of its peers' median rate; it gets smaller shards".

Idempotent: the event's id is derived from the bus message's, so a redelivery finds it
stored and changes nothing.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime

import structlog

from stride.db.engine import Database
from stride.events.v1 import shard_pb2
from stride.optimizer.adapters.convert import event_to_proto
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.domain.administrator import (
    JobStage,
    OptimizationEvent,
    RootCause,
    check_job_id,
)
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import check_pod_name

log = structlog.get_logger(__name__)

MAX_EVENT_ID_LENGTH = 200
"""The events table's ``event_id`` width (a message id naming a long pod may not fit)."""


def straggler_event_id(job_id: str, message_id: str) -> str:
    """The optimization event's id for the bus message ``message_id``: the message id itself
    (the dispatcher's names the job, worker, incarnation and moment), or, where it does not
    fit, the job and a digest of it."""
    if message_id.startswith(f"{job_id}.") and len(message_id) <= MAX_EVENT_ID_LENGTH:
        return message_id
    digest = hashlib.sha256(message_id.encode()).hexdigest()[:32]
    return f"{job_id}.straggler.{digest}"


def straggler_detail(worker: str, rate: float, peer_median_rate: float) -> str:
    """What the event says, e.g. "worker w-3 is a straggler at 12% of its peers' median
    rate (41.2 against 343 records/s); it gets smaller shards"."""
    share = rate / peer_median_rate if peer_median_rate > 0 else 0.0
    return (
        f"worker {worker} is a straggler at {share:.0%} of its peers' median rate "
        f"({rate:.3g} against {peer_median_rate:.3g} records/s); it gets smaller shards"
    )


class StragglerEvents:
    """Records the dispatcher's StragglerDetected on the job (see the module docstring)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    async def detected(self, event: shard_pb2.StragglerDetected, message_id: str) -> bool:
        """Record ``event`` once per bus message; False when nothing was recorded: a
        redelivery, a job the optimizer does not know (a dispatcher used without admission),
        or a finished one. Raises InvalidArgument for a malformed event."""
        job_id = check_job_id(event.job_id)
        check_pod_name(event.worker, "worker", raise_as=InvalidArgument)
        for field in ("rate", "peer_median_rate"):
            value = getattr(event, field)
            if not math.isfinite(value) or value < 0:
                raise InvalidArgument(field, f"must be a finite rate of at least 0, got {value}")
        event_id = straggler_event_id(job_id, message_id)
        detected_at = (
            event.detected_at.ToDatetime(tzinfo=UTC)
            if event.HasField("detected_at")
            else datetime.now(UTC)
        )
        async with self.database.transaction() as session:
            administrator = await repository.get_administrator(session, job_id)
            if administrator is None or administrator.stage is JobStage.FINISHED:
                log.info(
                    "straggler not recorded: no running job here",
                    job_id=job_id,
                    worker=event.worker,
                )
                return False
            recorded = OptimizationEvent(
                event_id=event_id,
                job_id=job_id,
                stage=administrator.stage,
                root_cause=RootCause.STRAGGLER,
                detail=straggler_detail(event.worker, event.rate, event.peer_median_rate),
                created_at=detected_at,
            )
            stored = await repository.insert_events(session, [event_to_proto(recorded)])
        if stored:
            log.info("straggler recorded", job_id=job_id, worker=event.worker, event_id=event_id)
        return bool(stored)
