"""Share requests, the optimizer's side: the port they go through (admission's
``RequestShare``) and :class:`ShareAsking`, which asks (see
:mod:`stride.optimizer.domain.requests`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from stride.db.engine import Database, Session
from stride.events.v1 import job_pb2
from stride.optimizer.adapters.convert import share_values
from stride.optimizer.adapters.outbound import repository
from stride.optimizer.domain.requests import (
    cut_to_cores,
    plan_totals,
    share_request,
    shrunk_into,
)
from stride.optimizer.domain.tuning import with_pods
from stride.policy.contention import Claim, ShareBound, ShareRequest
from stride.policy.plans import Plan

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ShareAnswer:
    """Admission's answer to a share request."""

    granted: bool
    queued: bool
    reason: str
    share: job_pb2.JobShare | None = None
    """The job's share after the decision (the raised one when granted)."""


class ShareAsker(Protocol):
    """Where share requests go (admission's API)."""

    async def ask(self, plan_version: int, request: ShareRequest) -> ShareAnswer: ...


BoundOf = Callable[[Session, str], Awaitable[ShareBound | None]]
"""The most a job may hold now (admission's share of it), read in a session."""


class ShareAsking:
    """The optimizer's side of share requests (:mod:`stride.optimizer.domain.requests`):
    asks admission for a plan beyond the job's share, and stores the share it raises."""

    def __init__(
        self,
        database: Database,
        shares: ShareAsker | None,
        bound: BoundOf,
        enforce_shares: bool = True,
    ) -> None:
        self.database = database
        self.shares = shares
        self.bound = bound
        self.enforce_shares = enforce_shares

    async def ask(
        self, version: int, held: Plan, wanted: Plan, claim: Claim | None
    ) -> ShareAnswer | None:
        """Ask admission for a share that holds ``wanted`` when the job's share does not
        (None: nothing was asked); a raised share is stored before the caller decides, so
        the plan goes out in the same decision. No answer is an answer too: the plan is
        held, and the reason says admission could not be asked."""
        if self.shares is None or claim is None:
            return None
        return await self._beyond(await self._bound(claim.job_id), version, held, wanted, claim)

    async def ask_for_fix(
        self, version: int, held: Plan, fix: Plan, claim: Claim | None
    ) -> tuple[Plan, Claim | None, ShareAnswer | None]:
        """:meth:`ask` for an OOM fix, first cut to the job's cores (workers first; memory is
        never cut): what it needs of admission is memory, and a fix that asked for cores too
        would wait for them. Returns the fix and its claim as cut, and the answer."""
        if claim is None:
            return fix, claim, None
        bound = await self._bound(claim.job_id)
        if bound is not None and (cut := cut_to_cores(fix, bound.cpu)) is not None:
            fix = with_pods(fix, cut, fix.reason, fix.algorithm)
            claim = replace(claim, wanted=cut)
        if self.shares is None:
            return fix, claim, None
        return fix, claim, await self._beyond(bound, version, held, fix, claim)

    async def _bound(self, job_id: str) -> ShareBound | None:
        async with self.database.sessions() as session:
            return await self.bound(session, job_id)

    async def _beyond(
        self, bound: ShareBound | None, version: int, held: Plan, wanted: Plan, claim: Claim
    ) -> ShareAnswer | None:
        want = plan_totals(wanted)
        if bound is None or bound.holds(*want):
            return None
        return await self._request(version, share_request(claim, plan_totals(held), want))

    async def first(self, job_id: str, share: dict[str, Any], plan: Plan) -> Plan:
        """Plan 1 when it does not fit the share the admission decision carried even with
        its cores cut (memory per pod is never cut): ask admission for the memory, the job
        holding nothing yet. Plan 1 is cut to the share's cores either way; not granted, the
        caller publishes it with the answer in its reason."""
        if self.shares is None or not self.enforce_shares:
            return plan
        bound = ShareBound(share["cpu"], share["memory_gib"])
        if share["cpu"] <= 0 or share["memory_gib"] <= 0 or bound.holds(*plan_totals(plan)):
            return plan
        if shrunk_into(bound, plan) is not None:  # fitted by the caller, cores cut
            return plan
        cut = cut_to_cores(plan, share["cpu"])
        wanted = with_pods(plan, cut, "-", plan.algorithm) if cut is not None else plan
        cpu, memory = plan_totals(wanted)
        request = ShareRequest(
            job_id,
            0.0,
            0.0,
            cpu,
            memory,
            0.0,
            0.0,
            0.0,
            0.0,
            safety=True,
            cause="plan 1: its pods need this memory to start",
        )
        answer = await self._request(0, request)  # no plan yet
        if answer.granted:
            return wanted
        # Not granted: plan 1 goes out within the share's cores; its memory is what its pods
        # need to start, which admission counts once the plan is out.
        return replace(
            wanted, reason=f"{plan.reason}; beyond the admission share: admission {answer.reason}"
        )

    async def _request(self, version: int, request: ShareRequest) -> ShareAnswer:
        """Send ``request`` to admission; store the raised share when it is granted."""
        assert self.shares is not None
        try:
            answer = await self.shares.ask(version, request)
        except Exception as error:  # admission down or slow: the plan is held, not lost
            log.warning("share request unanswered", job_id=request.job_id, error=str(error))
            return ShareAnswer(False, False, f"admission did not answer ({type(error).__name__})")
        if answer.granted and answer.share is not None:
            async with self.database.transaction() as session:
                await repository.put_share(
                    session, {**share_values(answer.share), "updated_at": datetime.now(UTC)}
                )
        log.info(
            "share requested",
            job_id=request.job_id,
            safety=request.safety,
            granted=answer.granted,
            queued=answer.queued,
            reason=answer.reason,
        )
        return answer
