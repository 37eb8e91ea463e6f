"""Share requests: the optimizer asks for more than a job's share, and admission decides.

DESIGN ("who owns which decision"): admission owns the share, the optimizer the plan, and
"when the optimizer wants more, it says so, and admission decides". A request is a job's
wanted plan, whole (chief and data workers included), with its eq. 8 gain, or an OOM fix
marked as safety. Admission decides it against the cluster's free cores and memory: its
capacity less what every running job holds, which is the job's newest plan (from the
optimizer's ``stride.plans.v1`` events) or, when larger, the reservation that keeps a
guaranteed job's deadline. The decision is :func:`stride.policy.contention.answer` on
arrival and :func:`stride.policy.contention.settle` (DLRover-RM's weighted greedy, safety
first) over the queued requests whenever capacity frees: the functions ``stride sim --env
dlrm`` decides its claims with.

A granted request raises the job's share to the wanted plan (``JobShare.granted``) until the
job ends or asks again; the share event goes out in the same transaction as the answer.

Departures, on purpose: a grant is a floor on the share outside ElasticFlow's units, so a
deadline admitted later is planned on units a grant may already hold (the grant only ever
takes capacity that no guaranteed reservation held when it was made).
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime
from typing import Any

import structlog

from stride.admission.adapters.convert import spec_from_proto
from stride.admission.adapters.outbound import repository
from stride.admission.domain.ledger import Pool
from stride.admission.usecases import GRANTED, QUEUED, REFUSED, Submissions
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.events.v1 import plan_pb2
from stride.policy.contention import Answer, InvalidClaim, ShareRequest, answer, settle
from stride.policy.elasticflow.units import GIB
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound
from stride.vocabulary import check_job_id
from stride.vocabulary.jobspec import ResourceKind

log = structlog.get_logger(__name__)


def plan_holds(plan: plan_pb2.ResourcePlan) -> tuple[float, float]:
    """Cores and GiB a plan's pods hold together, every role counted, a pod with an
    override (a bigger hot PS, say) at its own size."""
    cpu = memory = 0.0
    for role in plan.roles:
        cpu += role.count * role.cpu
        memory += role.count * role.memory_bytes
        sized = {o.index: o for o in role.overrides if 0 <= o.index < role.count}
        for override in sized.values():
            if override.cpu > 0:
                cpu += override.cpu - role.cpu
            if override.memory_bytes > 0:
                memory += override.memory_bytes - role.memory_bytes
    return float(cpu), float(memory) / GIB


def request_of(message: pb.RequestShareRequest) -> ShareRequest:
    """The request checked: InvalidArgument names the bad field."""
    check_job_id(message.job_id, raise_as=InvalidArgument)
    if message.plan_version < 0:
        raise InvalidArgument(
            "plan_version",
            f"must be 0 (no plan yet) or a plan's version, got {message.plan_version}",
        )
    for name in ("held", "wanted"):
        if not message.HasField(name):
            raise InvalidArgument(name, "is required (the job's whole plan: cpu, memory_bytes)")
    try:
        return ShareRequest(
            job_id=message.job_id,
            held_cpu=message.held.cpu,
            held_memory_gib=message.held.memory_bytes / GIB,
            wanted_cpu=message.wanted.cpu,
            wanted_memory_gib=message.wanted.memory_bytes / GIB,
            throughput_now=message.throughput_now,
            throughput_wanted=message.throughput_wanted,
            remaining_samples=message.remaining_samples,
            pause_seconds=message.pause_seconds,
            safety=message.safety,
            cause=message.cause[:500],
        )
    except InvalidClaim as error:
        field = {
            "held_cpu": "held.cpu",
            "held_memory_gib": "held.memory_bytes",
            "wanted_cpu": "wanted.cpu",
            "wanted_memory_gib": "wanted.memory_bytes",
        }.get(error.field, error.field)
        raise InvalidArgument(field, error.problem) from None


class ShareRequests:
    """Decides share requests and settles the queued ones when capacity frees."""

    def __init__(self, submissions: Submissions) -> None:
        self.submissions = submissions
        self.database = submissions.database

    def _free(
        self, pool: Pool, held: dict[str, repository.Holding], now: float
    ) -> tuple[float, float, float, float]:
        """(free cores, free GiB, capacity cores, capacity GiB) of the CPU pool: each
        running job holds its newest plan or its guaranteed reservation, whichever is
        larger."""
        unit = self.submissions.cluster.unit
        unit_gib = unit.memory_bytes / GIB
        capacity_cpu, capacity_memory = pool.capacity * unit.cpu, pool.capacity * unit_gib
        reserved = pool.minimum_shares(now)
        # A running job whose plan admission has not heard of yet holds its share.
        unseen = {
            job_id: entry.units + pool.headroom.get(job_id, 0) + pool.granted.get(job_id, 0)
            for job_id, entry in pool.entries.items()
            if entry.units and job_id not in held
        }
        used_cpu = used_memory = 0.0
        for job_id in set(held) | set(reserved) | set(unseen):
            holding = held.get(job_id)
            units = max(reserved.get(job_id, 0), unseen.get(job_id, 0))
            used_cpu += max(holding.cpu if holding else 0.0, units * unit.cpu)
            used_memory += max(holding.memory_gib if holding else 0.0, units * unit_gib)
        return (
            capacity_cpu - used_cpu,
            capacity_memory - used_memory,
            capacity_cpu,
            capacity_memory,
        )

    async def request(self, message: pb.RequestShareRequest) -> pb.RequestShareResponse:
        """Decide one request (module docstring); the answer and, when granted, the new
        share are stored and published in one transaction."""
        wanted = request_of(message)
        job_id, version = message.job_id, int(message.plan_version)
        async with self.submissions.changing():
            # Read (or rebuilt from storage) before the transaction, in a session of its own.
            pool = await self.submissions.pool(ResourceKind.CPU)
            async with self.database.transaction() as session:
                reply = await self._decide(session, pool, wanted, version)
        self.submissions.outbox.notify()  # relays the share the grant published
        log.info(
            "share request decided",
            job_id=job_id,
            safety=wanted.safety,
            granted=reply.granted,
            queued=reply.queued,
            reason=reply.reason,
        )
        return reply

    async def _decide(
        self, session: Any, pool: Pool, wanted: ShareRequest, version: int
    ) -> pb.RequestShareResponse:
        """:meth:`request` in its transaction."""
        job_id = wanted.job_id
        job = await repository.get_job(session, job_id, for_update=True)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        if job.state != "ADMITTED":
            raise FailedPrecondition(
                f"job {job_id} is {job.state.lower()}, not running: it has no share to raise"
            )
        if spec_from_proto(job.spec).kind is not ResourceKind.CPU:
            raise FailedPrecondition(f"job {job_id}'s share is its GPUs, not cores")
        entry = pool.entries.get(job_id)
        if entry is None or not entry.units:
            raise FailedPrecondition(
                f"job {job_id} has no share from admission (no curve, or none now)"
            )
        stored = await repository.get_request(session, job_id)
        if stored is not None and stored.plan_version > version:
            return await self._reply(session, job_id, stored.state, stored.reason)
        await repository.put_holding(
            session, job_id, version, wanted.held_cpu, wanted.held_memory_gib
        )
        held = await repository.all_holdings(session)
        moment = self.submissions.clock()
        now = moment.timestamp()
        verdict = answer(wanted, *self._free(pool, held, now))
        if verdict.granted:
            verdict = self._hold_units(pool, wanted, now) or verdict
        state = _state(verdict)
        await repository.put_request(
            session,
            job_id,
            version,
            state,
            dataclasses.asdict(wanted),
            verdict.reason,
            moment,
        )
        if verdict.granted:
            await self._publish(session, pool, [job_id], f"share request {verdict.reason}", moment)
        return await self._reply(session, job_id, state, verdict.reason)

    def _needed_units(self, request: ShareRequest) -> int:
        """The CPU units ``request``'s wanted plan needs (cores or memory, whichever is
        more)."""
        unit = self.submissions.cluster.unit
        cores = request.wanted_cpu / unit.cpu
        memory = request.wanted_memory_gib * GIB / unit.memory_bytes
        return max(0, math.ceil(max(cores, memory) - 1e-9))

    def _hold_units(self, pool: Pool, request: ShareRequest, now: float) -> Answer | None:
        """Hold the granted job to the units its wanted plan needs (the pool takes them out
        of what it divides); an answer that queues the request instead when guaranteed
        reservations hold those units now. None: held."""
        entry = pool.entries[request.job_id]
        needed = max(entry.units if entry.deadline is not None else 0, self._needed_units(request))
        room = pool.room(request.job_id, now)
        if needed > room:
            return Answer(
                False,
                True,
                f"queued: the plan needs {needed} CPU units, and other jobs' grants and "
                f"guaranteed reservations leave {room}; decided again when capacity frees",
            )
        pool.hold(request.job_id, needed)
        return None

    async def _publish(
        self, session: Any, pool: Pool, granted: list[str], reason: str, moment: datetime
    ) -> None:
        """Re-divide the pool around the granted units and publish the shares that changed,
        the granted jobs' always."""
        changed = pool.round(moment.timestamp())
        for job_id in granted:
            changed.setdefault(job_id, pool.entries[job_id].units)
        await self.submissions.publish_shares(
            session, ResourceKind.CPU, pool, changed, reason, moment
        )

    async def _reply(
        self, session: Any, job_id: str, state: str, reason: str
    ) -> pb.RequestShareResponse:
        job = await repository.get_job(session, job_id)
        reply = pb.RequestShareResponse(granted=state == GRANTED, queued=state == QUEUED)
        reply.reason = reason
        if job is not None and job.share is not None:
            reply.share.CopyFrom(job.share)
        return reply

    async def planned(self, plan: plan_pb2.ResourcePlan) -> None:
        """The optimizer published a plan: record what the job holds now; a job that holds
        less than before frees capacity for the queued requests."""
        check_job_id(plan.job_id, raise_as=InvalidArgument)
        cpu, memory = plan_holds(plan)
        if not (math.isfinite(cpu) and math.isfinite(memory)) or cpu < 0 or memory < 0:
            raise InvalidArgument("roles", "hold a negative or non-finite amount")
        async with self.database.transaction() as session:
            shrank = await self._record_holding(session, plan, cpu, memory)
        if not shrank:
            return
        # Only a job that holds less frees capacity: then the queued requests are settled,
        # under the pools' lock (a plan that grows or stays takes no lock at all).
        async with self.submissions.changing():
            pool = await self.submissions.pool(ResourceKind.CPU)
            async with self.database.transaction() as session:
                await self.settle(session, pool, f"{plan.job_id} shrank", self.submissions.clock())
        self.submissions.outbox.notify()

    async def _record_holding(
        self, session: Any, plan: plan_pb2.ResourcePlan, cpu: float, memory: float
    ) -> bool:
        """:meth:`planned` in its transaction: whether the job now holds less while
        requests are queued."""
        job_id = plan.job_id
        job = await repository.get_job(session, job_id)
        if job is None or job.state != "ADMITTED":
            return False  # not running here (ended, queued, or never known)
        before = (await repository.holdings_of(session, [job_id])).get(job_id)
        if not await repository.put_holding(session, job_id, plan.version, cpu, memory):
            return False
        asked = await repository.get_request(session, job_id)
        if (
            asked is not None
            and asked.state == QUEUED
            and asked.plan_version < plan.version
            and cpu
        ):
            # The optimizer went on with another plan that runs pods: the request is void
            # (a job that waits for its request runs none).
            await repository.put_request(
                session,
                job_id,
                asked.plan_version,
                REFUSED,
                asked.request,
                f"void: plan v{plan.version} replaced the plan it was made from",
                self.submissions.clock(),
            )
        shrank = before is not None and (cpu < before.cpu or memory < before.memory_gib)
        return shrank and bool(await repository.requests_in(session, [QUEUED]))

    async def settle(self, session: Any, pool: Pool, reason: str, moment: datetime) -> int:
        """Grant the queued requests that the free capacity now holds (safety first, then
        the weighted greedy), publishing each granted job's new share; returns how many."""
        queued = await repository.requests_in(session, [QUEUED])
        if not queued:
            return 0
        held = await repository.all_holdings(session)
        requests = []
        for row in queued:
            holding = held.get(row.job_id)
            request = ShareRequest(**row.request)
            if holding is not None:
                request = request.holding(holding.cpu, holding.memory_gib)
            requests.append(request)
        free_cpu, free_memory, _, _ = self._free(pool, held, moment.timestamp())
        settlement = settle(requests, free_cpu, free_memory)
        granted: list[str] = []
        versions = {row.job_id: row.plan_version for row in queued}
        now = moment.timestamp()
        for grant in settlement.granted:
            job_id = grant.claim.job_id
            entry = pool.entries.get(job_id)
            if entry is None or not entry.units or self._hold_units(pool, grant.claim, now):
                continue
            why = f"granted when {reason}: {grant.why}, rank {grant.rank} of {len(requests)}"
            await repository.put_request(
                session,
                job_id,
                versions[job_id],
                GRANTED,
                dataclasses.asdict(grant.claim),
                why,
                moment,
            )
            granted.append(job_id)
        if granted:
            await self._publish(session, pool, granted, f"queued share request ({reason})", moment)
            log.info("queued share requests granted", jobs=granted, why=reason)
        return len(granted)


def _state(verdict: Answer) -> str:
    if verdict.granted:
        return GRANTED
    return QUEUED if verdict.queued else REFUSED
