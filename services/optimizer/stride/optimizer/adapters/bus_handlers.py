"""The optimizer's bus consumers: jobs admitted (first plan) and jobs finished."""

from __future__ import annotations

from stride.bus import subjects
from stride.bus.client import Delivery, PermanentError
from stride.events.v1 import job_pb2
from stride.optimizer.planning import Planning


class AdmittedHandler:
    """Creates the job's administrator and plan 1 on ``stride.jobs.v1.admitted.<job>``."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(self, decision: job_pb2.AdmissionDecision, delivery: Delivery) -> None:
        expected = subjects.job_decision("admitted", decision.job_id) if decision.job_id else None
        if expected is not None and delivery.subject != expected:
            # A payload about another job than its subject says is a producer bug.
            raise PermanentError(
                f"job_id {decision.job_id!r} does not match subject {delivery.subject}"
            )
        await self.planning.admitted(decision)


class FinishedHandler:
    """Moves the job's administrator to FINISHED on ``stride.jobs.v1.finished.<job>``."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def __call__(self, event: job_pb2.JobFinished, delivery: Delivery) -> None:
        if event.job_id and delivery.subject != subjects.job_finished(event.job_id):
            raise PermanentError(
                f"job_id {event.job_id!r} does not match subject {delivery.subject}"
            )
        await self.planning.finished(event)
