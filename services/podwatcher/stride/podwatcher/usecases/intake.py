"""Plans and admissions from the bus, recorded in batches: each newer plan queues its job
for a pass."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from stride.events.v1 import job_pb2, plan_pb2
from stride.podwatcher.adapters.convert import (
    plan_from_proto,
)
from stride.podwatcher.adapters.outbound import repository
from stride.podwatcher.adapters.outbound.repository import StoredJob
from stride.podwatcher.domain.cluster import PlanState
from stride.podwatcher.domain.plans import Arrival, classify_arrival, validate_plan
from stride.podwatcher.usecases.applying import Applying
from stride.podwatcher.usecases.common import (
    SIMULATED,
    JobNotAdmitted,
    _together_or_alone,
    now_utc,
)
from stride.runtime.errors import InvalidArgument

log = structlog.get_logger(__name__)


class Intake(Applying):
    """Records plans and admissions from the bus and queues their jobs."""

    async def receive_all(
        self, messages: Sequence[plan_pb2.ResourcePlan]
    ) -> list[Arrival | Exception]:
        """Validate and record plans that are their jobs' newest, then apply them: a
        fetched batch, in order; per plan, how it arrived or the error it met (an invalid
        plan :class:`InvalidArgument`, dead-lettered; a job not admitted
        :class:`JobNotAdmitted`, retried, then dead-lettered).

        The batch's plans are classified against what is stored and the newer ones stored
        in one transaction (a transaction per plan was most of the pod watcher's work
        under a stream of submissions, ``bench/submit_load.py``); if it fails, each alone,
        so a bad one fails alone. Then each newly recorded plan of a job with pods is
        applied; a simulated job's plan is recorded as applied."""
        outcomes: list[Arrival | Exception] = [Arrival.STALE] * len(messages)
        valid = []
        for index, message in enumerate(messages):
            try:
                validate_plan(plan_from_proto(message))
            except InvalidArgument as error:
                outcomes[index] = error
            else:
                valid.append(index)
        recorded = await _together_or_alone(
            "plans", [messages[index] for index in valid], self._record_plans
        )
        for index, result in zip(valid, recorded, strict=True):
            if isinstance(result, Exception):
                outcomes[index] = result
                continue
            arrival, job = result
            outcomes[index] = arrival
            if isinstance(arrival, Exception) or job is None:
                continue
            plan = messages[index]
            if job.state != "RUNNING":
                log.info("plan for an ended job ignored", job_id=plan.job_id, state=job.state)
            elif arrival is Arrival.STALE:
                log.warning("stale plan ignored", job_id=plan.job_id, version=plan.version)
            elif arrival is Arrival.DUPLICATE:
                log.info("plan already recorded", job_id=plan.job_id, version=plan.version)
            else:
                log.info(
                    "plan recorded", job_id=plan.job_id, version=plan.version, reason=plan.reason
                )
                if not job.spec.simulated:
                    self.queue.add(plan.job_id)
        return outcomes

    async def _record_plans(
        self, messages: Sequence[plan_pb2.ResourcePlan]
    ) -> list[tuple[Arrival | Exception, StoredJob | None]]:
        """Classify each plan (in order, so a later one of the same job is compared with
        an earlier one of the batch) and store the newer ones of running jobs, in one
        transaction. A plan of a job not admitted is :class:`JobNotAdmitted`."""
        if not messages:
            return []
        now = now_utc()
        found: list[tuple[Arrival | Exception, StoredJob | None]] = []
        accepted: list[tuple[plan_pb2.ResourcePlan, PlanState, str]] = []
        async with self.database.transaction() as session:
            ids = [message.job_id for message in messages]
            stored = await repository.get_jobs(session, ids)
            newest: dict[str, int | None] = dict(await repository.newest_versions(session, ids))
            for message in messages:
                job = stored.get(message.job_id)
                if job is None:
                    found.append(
                        (
                            JobNotAdmitted(
                                f"no admitted job {message.job_id!r}: plan v{message.version}"
                            ),
                            None,
                        )
                    )
                    continue
                arrival = classify_arrival(message.version, newest.get(message.job_id))
                if arrival is Arrival.NEWER and job.state == "RUNNING":
                    # A simulated job's plan is applied as it is recorded: it starts no pods.
                    simulated = job.spec.simulated
                    state = PlanState.APPLIED if simulated else PlanState.RECORDED
                    accepted.append((message, state, SIMULATED if simulated else ""))
                    newest[message.job_id] = message.version
                found.append((arrival, job))
            await repository.insert_plans(session, accepted, now)
        return found

    async def admitted_all(
        self, decisions: Sequence[job_pb2.AdmissionDecision]
    ) -> list[Exception | None]:
        """Store admitted jobs' specs (idempotent), a fetched batch; per decision, None or
        the error it met.

        The specs are stored in one transaction (a transaction per job was a third of the
        pod watcher's work under a stream of submissions, ``bench/submit_load.py``); if it
        fails, each alone, so a bad one fails alone. A job stored now has no plan yet (a
        plan of a job not stored is refused and retried, and applied when it is recorded);
        one stored before (a redelivery, after a crash perhaps) is queued for a pass."""
        outcomes: list[Exception | None] = [None] * len(decisions)
        valid = []
        for index, decision in enumerate(decisions):
            if decision.HasField("spec"):
                valid.append(index)
            else:
                outcomes[index] = InvalidArgument(
                    "spec", "an admitted job's decision must carry its spec"
                )
        created = await _together_or_alone(
            "admitted jobs", [decisions[index] for index in valid], self._store_jobs
        )
        for index, new in zip(valid, created, strict=True):
            job_id = decisions[index].job_id
            if isinstance(new, Exception):
                outcomes[index] = new
            elif new:
                log.info("job admitted", job_id=job_id)
            else:
                self.queue.add(job_id)
        return outcomes

    async def _store_jobs(self, decisions: Sequence[job_pb2.AdmissionDecision]) -> list[bool]:
        """Store the decisions' jobs not stored yet, in one transaction; per decision,
        whether it stored its job (False for one stored before, in the batch too)."""
        if not decisions:
            return []
        async with self.database.transaction() as session:
            new = await repository.insert_jobs(
                session, [(decision.job_id, decision.spec) for decision in decisions], now_utc()
            )
        created = []
        for decision in decisions:
            created.append(decision.job_id in new)
            new.discard(decision.job_id)
        return created
