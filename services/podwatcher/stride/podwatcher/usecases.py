"""The podwatcher's use cases: accept plans, hand the newest to the backend, show pods.

A plan is validated, then stored as RECORDED only if its version is above the newest one
the job has ("newer version wins", :mod:`stride.podwatcher.domain.plans`); the check and
the insert share one transaction, so a redelivered or stale plan changes nothing. After
the commit the backend is asked to apply it, and its answer (or its error, as FAILED) is
stored. A crash between the commit and the answer leaves the plan RECORDED; re-applying
such plans on start belongs to the backend issues, which make ``apply`` do something.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog

from stride.db.engine import Database
from stride.events.v1 import plan_pb2
from stride.podwatcher.adapters.convert import plan_from_proto
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.backends.base import Backend
from stride.podwatcher.adapters.outbound.repository import StoredPlan
from stride.podwatcher.domain.cluster import Application, Node, PlanState, Pod
from stride.podwatcher.domain.plans import Arrival, classify_arrival, validate_plan
from stride.runtime.errors import InvalidArgument, NotFound

log = structlog.get_logger(__name__)


class PlanRecords:
    """Accepts plans against the database and applies the newest through a backend."""

    def __init__(self, database: Database, backend: Backend) -> None:
        self.database = database
        self.backend = backend

    async def receive(self, message: plan_pb2.ResourcePlan) -> Arrival:
        """Validate and record a plan if it is the job's newest; returns what it was.

        Raises :class:`InvalidArgument` (dead-lettered on the bus) for an invalid plan.
        """
        plan = plan_from_proto(message)
        validate_plan(plan)
        now = datetime.now(UTC)
        async with self.database.transaction() as session:
            newest = await repository.newest_version(session, plan.job_id)
            arrival = classify_arrival(plan.version, newest)
            if arrival is Arrival.NEWER:
                await repository.insert_plan(session, message, PlanState.RECORDED, now)
        if arrival is Arrival.STALE:
            log.warning(
                "stale plan ignored", job_id=plan.job_id, version=plan.version, newest=newest
            )
            return arrival
        if arrival is Arrival.DUPLICATE:
            log.info("plan already recorded", job_id=plan.job_id, version=plan.version)
            return arrival
        log.info("plan recorded", job_id=plan.job_id, version=plan.version, reason=plan.reason)
        try:
            application = await self.backend.apply(plan)
        except Exception as error:
            log.exception("backend failed to apply plan", job_id=plan.job_id, version=plan.version)
            application = Application(PlanState.FAILED, f"{type(error).__name__}: {error}")
        if application.state is not PlanState.RECORDED or application.message:
            async with self.database.transaction() as session:
                await repository.set_state(
                    session,
                    plan.job_id,
                    plan.version,
                    application.state,
                    application.message[:2000],
                    datetime.now(UTC),
                )
        return arrival

    async def job_pods(self, job_id: str) -> tuple[StoredPlan, list[Pod]]:
        """The job's newest plan and its pods, or NotFound if it has no plan."""
        if not job_id:
            raise InvalidArgument("job_id", "is required")
        async with self.database.sessions() as session:
            stored = await repository.newest_plan(session, job_id)
        if stored is None:
            raise NotFound(f"no plan recorded for job {job_id!r}")
        return stored, await self.backend.list_pods(job_id)

    async def nodes(self) -> list[Node]:
        """The backend's nodes."""
        return await self.backend.nodes()
