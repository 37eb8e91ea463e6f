"""Contended plans: who gets the cores and memory that free up, and how a plan is kept
within the share admission grants.

A job's stage step (:mod:`stride.policy.stages`) picks the job's next pods alone. When the
cluster (or the job's share) cannot hold them, the growth is not simply dropped and
retried at the job's next tick, which would hand freed capacity to whichever job happens to
tick first. It becomes a **claim**, kept until the job's next decision replaces it or the
job ends. Whenever capacity frees (a job finishes, or a plan shrinks), the open claims are
**settled together** by DLRover-RM's cluster-level weighted greedy (sec. 4.3, eq. 11-14,
:func:`stride.policy.selection.select`): every claim is scored by resource efficiency
(throughput gain over resource cost, eq. 11) weighted by its job's remaining time (eq. 14,
rho = 2.5: short jobs first), and taken from the best score down while it fits.

Departures from the paper, on purpose:

- **One candidate per job: the stage step's own choice.** The paper's round offers the
  selection each job's whole NSGA-II front. Here the per-job step already picked the job's
  best point of its front (the cheapest within 10 % of the fastest, or the sampling probe
  it needs), and the selection arbitrates between jobs. :mod:`stride.policy.cluster_round`
  keeps the whole-front round (benchmarked, served by the executor pool).
- **Safety first.** A claim that raises memory above a predicted or measured peak (the OOM
  rule, or OOM prediction) averts a failure rather than buying speed: such claims are
  granted before any other, shortest remaining time first, as the OOM relaunch rule of
  DLRover-RM sec. 5.3 is not something a job should lose to a faster one.
- **Unfitted claims are priced linearly.** A sampling probe has no fitted model behind it:
  its throughput is the measured one scaled by the cores it adds (the optimistic linear
  guess; the probe exists to measure the truth).
- **Settled when capacity frees, not on a fixed period.** Claims that fit when made are
  granted at once (nothing is contended); the selection runs on the events that change the
  free capacity, which is when it can change an outcome.

The simulator (``stride sim --env dlrm``) and the live optimizer call these functions with
the same inputs (the stage step's request and reply), so both decide alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Generic, Protocol, TypeVar

from stride.policy.errors import PolicyError
from stride.policy.selection import (
    DEFAULT_EPSILON,
    DEFAULT_RHO,
    Candidate,
    JobCandidates,
    SelectionRequest,
    select,
)
from stride.policy.stages import (
    GIB_PRICE,
    JobShape,
    Pods,
    Reason,
    StageReply,
    StageRequest,
    configuration,
)
from stride.policy.throughput import overhead_seconds

HORIZON_SECONDS = 600.0
"""H of eq. 8: how long a new plan is expected to run before the next decision (capped by
the job's remaining time); the same horizon as :mod:`stride.policy.cluster_round`."""
_EPS = 1e-9


class InvalidClaim(PolicyError):
    """A claim or a share is invalid: a negative resource, a non-finite throughput."""


def _check_amounts(owner: object, *names: str) -> None:
    """InvalidClaim naming the first of ``owner``'s ``names`` that is negative or not finite."""
    for name in names:
        value = getattr(owner, name)
        if not math.isfinite(value) or value < 0:
            raise InvalidClaim(name, f"must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Claim:
    """One job's wish for pods the cluster could not give when it was decided."""

    job_id: str
    held: Pods
    """The pods the job runs now (the claim is void once they change)."""
    wanted: Pods
    throughput_now: float
    """Samples/s of the held pods (fitted model, else measured)."""
    throughput_wanted: float
    """Samples/s expected of the wanted pods."""
    remaining_samples: float
    pause_seconds: float
    """Training the change would cost (:func:`stride.policy.throughput.overhead_seconds`)."""
    safety: bool = False
    """Raises memory to avert an OOM kill: granted before any claim for speed."""
    cause: str = ""
    """The stage step's reason for the wanted pods."""

    def __post_init__(self) -> None:
        _check_amounts(
            self, "throughput_now", "throughput_wanted", "remaining_samples", "pause_seconds"
        )

    @property
    def extra_cpu(self) -> float:
        """Cores the claim adds to what the job holds (negative: it frees some)."""
        return float(self.wanted.cpu - self.held.cpu)

    @property
    def extra_memory_gib(self) -> float:
        """GiB the claim adds to what the job holds (negative: it frees some)."""
        return float(self.wanted.memory_gib - self.held.memory_gib)

    def candidate(self) -> Candidate:
        """The claim as the weighted greedy's candidate (eq. 7, 8, 11)."""
        return growth_candidate(
            self.held,
            self.wanted,
            self.throughput_now,
            self.throughput_wanted,
            self.remaining_samples,
            self.pause_seconds,
        )


@dataclass(frozen=True)
class ShareRequest:
    """A claim as admission decides it (DESIGN: "when the optimizer wants more, it says so,
    and admission decides"): the job's whole plans in cores and GiB, chief and data workers
    included, since admission counts what pods hold, not what the stage step sizes. The
    optimizer makes it of its claim (:meth:`of`) and the simulator of its own, and both
    are decided by :func:`answer` and :func:`settle`, the same functions."""

    job_id: str
    held_cpu: float
    """Cores the job's pods hold now (0 while it waits for its request, pods released)."""
    held_memory_gib: float
    wanted_cpu: float
    wanted_memory_gib: float
    throughput_now: float
    throughput_wanted: float
    remaining_samples: float
    pause_seconds: float
    safety: bool = False
    cause: str = ""

    def __post_init__(self) -> None:
        _check_amounts(
            self,
            "held_cpu",
            "held_memory_gib",
            "wanted_cpu",
            "wanted_memory_gib",
            "throughput_now",
            "throughput_wanted",
            "remaining_samples",
            "pause_seconds",
        )

    @classmethod
    def of(
        cls, claim: Claim, other_cpu: float = 0.0, other_memory_gib: float = 0.0
    ) -> ShareRequest:
        """``claim`` with ``other_cpu`` cores and ``other_memory_gib`` GiB of pods outside
        its PS and workers (a chief, data workers), which it keeps as they are."""
        return cls(
            job_id=claim.job_id,
            held_cpu=claim.held.cpu + other_cpu,
            held_memory_gib=claim.held.memory_gib + other_memory_gib,
            wanted_cpu=claim.wanted.cpu + other_cpu,
            wanted_memory_gib=claim.wanted.memory_gib + other_memory_gib,
            throughput_now=claim.throughput_now,
            throughput_wanted=claim.throughput_wanted,
            remaining_samples=claim.remaining_samples,
            pause_seconds=claim.pause_seconds,
            safety=claim.safety,
            cause=claim.cause,
        )

    def holding(self, cpu: float, memory_gib: float) -> ShareRequest:
        """The same request from a job that now holds ``cpu`` cores and ``memory_gib`` GiB
        (its pods released while it waits, say)."""
        return replace(self, held_cpu=cpu, held_memory_gib=memory_gib)

    @property
    def extra_cpu(self) -> float:
        return self.wanted_cpu - self.held_cpu

    @property
    def extra_memory_gib(self) -> float:
        return self.wanted_memory_gib - self.held_memory_gib

    def candidate(self) -> Candidate:
        """The request as the weighted greedy's candidate (eq. 7, 8, 11)."""
        return _candidate(
            self.extra_cpu,
            self.extra_memory_gib,
            self.throughput_now,
            self.throughput_wanted,
            self.remaining_samples,
            self.pause_seconds,
        )


def growth_candidate(
    held: Pods,
    wanted: Pods,
    speed_now: float,
    speed_wanted: float,
    remaining_samples: float,
    pause_seconds: float,
) -> Candidate:
    """A move from ``held`` to ``wanted`` as a selection candidate: its increments of cores
    and GiB as resources, eq. 8's throughput gain over the horizon (the pause costs the new
    speed for its length), eq. 7's cost of the increments (a move that frees as much as it
    takes is priced at the smallest unit, so eq. 11 stays defined)."""
    return _candidate(
        float(wanted.cpu - held.cpu),
        float(wanted.memory_gib - held.memory_gib),
        speed_now,
        speed_wanted,
        remaining_samples,
        pause_seconds,
    )


def _candidate(
    extra_cpu: float,
    extra_memory: float,
    speed_now: float,
    speed_wanted: float,
    remaining_samples: float,
    pause_seconds: float,
) -> Candidate:
    """:func:`growth_candidate` of a move that adds ``extra_cpu`` cores and
    ``extra_memory`` GiB."""
    horizon = (
        min(HORIZON_SECONDS, remaining_samples / speed_now) if speed_now > 0 else HORIZON_SECONDS
    )
    horizon = max(horizon, 1.0)
    gain = (speed_wanted - speed_now) - speed_wanted * min(pause_seconds, horizon) / horizon
    extra_cost = extra_cpu + GIB_PRICE * extra_memory
    return Candidate(
        resources=(max(0.0, extra_cpu), max(0.0, extra_memory)),
        throughput=float(speed_wanted),
        throughput_gain=float(gain),
        resource_cost=float(max(extra_cost, GIB_PRICE)),
    )


def claim_of(job_id: str, request: StageRequest, reply: StageReply) -> Claim | None:
    """The claim the stage step's ``reply`` makes for the job of ``request`` (None when the
    reply keeps the pods). Only the step's inputs and outputs are read, so the simulator
    and the live optimizer make the same claim from the same decision."""
    wanted = reply.pods
    if wanted is None or wanted == request.pods:
        return None
    held = request.pods
    shape: JobShape = request.shape
    measured = [s.throughput for s in request.samples if s.pods == held]
    if reply.predicted_current > 0:
        now = reply.predicted_current
    elif measured:
        now = measured[-1]
    elif request.samples:
        now = request.samples[-1].throughput
    else:
        now = 0.0
    if reply.predicted_throughput > 0 and reply.predicted_current > 0:
        later = reply.predicted_throughput
    else:
        later = now * max(wanted.cpu, 1) / max(held.cpu, 1)
    safety = request.reason is Reason.OOM or reply.bound == "OOM margin"
    if not safety and wanted.cpu <= held.cpu and wanted.ps_mem_gib > held.ps_mem_gib:
        # Memory alone raised above the predicted peak (the OOM rule's or prediction's).
        safety = (wanted.workers, wanted.ps) == (held.workers, held.ps)
    pause = overhead_seconds(configuration(held, shape), configuration(wanted, shape))
    return Claim(
        job_id=job_id,
        held=held,
        wanted=wanted,
        throughput_now=max(0.0, now),
        throughput_wanted=max(0.0, later),
        remaining_samples=max(0.0, shape.total_samples - request.consumed),
        pause_seconds=pause,
        safety=safety,
        cause=reply.root_cause,
    )


class Contender(Protocol):
    """What :func:`settle` reads of a claim or a share request."""

    @property
    def job_id(self) -> str: ...
    @property
    def safety(self) -> bool: ...
    @property
    def throughput_now(self) -> float: ...
    @property
    def throughput_wanted(self) -> float: ...
    @property
    def remaining_samples(self) -> float: ...
    @property
    def extra_cpu(self) -> float: ...
    @property
    def extra_memory_gib(self) -> float: ...
    def candidate(self) -> Candidate: ...


C = TypeVar("C", bound=Contender)


@dataclass(frozen=True)
class Grant(Generic[C]):
    """A claim the settlement took."""

    claim: C
    rank: int
    """1 for the first taken."""
    score: float
    """RE x WG of eq. 11-14 (0 for a safety claim, which is not scored)."""
    why: str


@dataclass(frozen=True)
class Settlement(Generic[C]):
    """What one settlement granted, and what it left open."""

    granted: tuple[Grant[C], ...]
    left: tuple[C, ...]
    free_cpu: float
    """Cores free after the grants."""
    free_memory_gib: float


def _check_free(free_cpu: float, free_memory_gib: float) -> None:
    for name, value in (("free_cpu", free_cpu), ("free_memory_gib", free_memory_gib)):
        if not math.isfinite(value):
            raise InvalidClaim(name, f"must be finite, got {value!r}")


def settle(
    claims: Iterable[C],
    free_cpu: float,
    free_memory_gib: float,
    rho: float = DEFAULT_RHO,
) -> Settlement[C]:
    """Grant the open claims that fit in the free capacity: safety claims first (shortest
    remaining time first), then the weighted greedy over the rest (module docstring).
    Every grant's increments fit in what is free when it is taken; what a shrinking claim
    would free is not lent to others in the same settlement (so no settlement can
    overcommit). The outcome does not depend on the order ``claims`` come in."""
    _check_free(free_cpu, free_memory_gib)
    pending = sorted(claims, key=lambda claim: claim.job_id)
    seen: set[str] = set()
    for claim in pending:
        if claim.job_id in seen:
            raise InvalidClaim("claims", f"two claims of job {claim.job_id!r}")
        seen.add(claim.job_id)
    cpu, memory = free_cpu, free_memory_gib
    granted: list[Grant[C]] = []
    taken: set[str] = set()

    def fits(claim: C) -> bool:
        return (
            max(0.0, claim.extra_cpu) <= cpu + _EPS
            and max(0.0, claim.extra_memory_gib) <= memory + _EPS
        )

    def take(claim: C, score: float, why: str) -> None:
        nonlocal cpu, memory
        cpu -= max(0.0, claim.extra_cpu)
        memory -= max(0.0, claim.extra_memory_gib)
        taken.add(claim.job_id)
        granted.append(Grant(claim, len(granted) + 1, score, why))

    safety = sorted(
        (c for c in pending if c.safety),
        key=lambda c: (c.remaining_samples / max(c.throughput_now, _EPS), c.job_id),
    )
    for claim in safety:
        if fits(claim):
            take(claim, 0.0, "OOM safety: memory above the peak goes before any speed-up")
    # A claim expected to be no faster than nothing has no gain: never granted.
    rest = [c for c in pending if not c.safety and c.throughput_wanted > 0]
    if rest:
        # A growth may need only one of the two (cores alone, memory alone), and an
        # increment that fits to the last bit must not be lost to rounding: the selection
        # gets what is free with the same tolerance as ``fits``.
        selection = select(
            SelectionRequest(
                capacity=(max(cpu, 0.0) + _EPS, max(memory, 0.0) + _EPS),
                jobs=tuple(
                    JobCandidates(c.job_id, c.remaining_samples, (c.candidate(),)) for c in rest
                ),
                resource_names=("cpu", "memory_gib"),
                rho=rho,
                epsilon=DEFAULT_EPSILON,
            )
        )
        by_job = {c.job_id: c for c in rest}
        for plan in sorted(selection.selected, key=lambda p: (-p.score, p.job_id)):
            claim = by_job[plan.job_id]
            if fits(claim):
                take(
                    claim,
                    plan.score,
                    f"weighted greedy (eq. 11-14, rho {rho:g}): score {plan.score:.3g} "
                    f"among {len(rest)} open claim(s)",
                )
    left = tuple(c for c in pending if c.job_id not in taken)
    return Settlement(tuple(granted), left, cpu, memory)


@dataclass(frozen=True)
class Answer:
    """Admission's answer to a share request (:func:`answer`)."""

    granted: bool
    queued: bool
    """Refused for now and kept: decided again (by :func:`settle`) when capacity frees."""
    reason: str


def answer(
    request: ShareRequest,
    free_cpu: float,
    free_memory_gib: float,
    capacity_cpu: float,
    capacity_memory_gib: float,
) -> Answer:
    """Decide one share request on arrival: granted when its increments fit in what is
    free (the settlement of it alone: a growth whose gain does not pay is not granted),
    refused for good when the whole cluster could not hold the wanted plan, else queued
    until capacity frees. The live admission service and the simulator both call this."""
    kind = "the OOM fix" if request.safety else "the growth"
    need = (
        f"{kind} needs {max(request.extra_cpu, 0):g} more cores and "
        f"{max(request.extra_memory_gib, 0):g} more GiB"
    )
    if (
        request.wanted_cpu > capacity_cpu + _EPS
        or request.wanted_memory_gib > capacity_memory_gib + _EPS
    ):
        return Answer(
            False,
            False,
            f"refused: the plan needs {request.wanted_cpu:g} cores and "
            f"{request.wanted_memory_gib:g} GiB, more than the cluster's {capacity_cpu:g} "
            f"cores and {capacity_memory_gib:g} GiB",
        )
    settlement = settle([request], free_cpu, free_memory_gib)
    free = f"{max(free_cpu, 0):g} cores and {max(free_memory_gib, 0):g} GiB are free"
    if settlement.granted:
        return Answer(True, False, f"granted: {need}, {free}")
    if request.extra_cpu <= free_cpu + _EPS and request.extra_memory_gib <= free_memory_gib + _EPS:
        return Answer(False, False, f"refused: {need} and {free}, but its gain does not pay")
    return Answer(False, True, f"queued: {need}, {free}; decided again when capacity frees")


# --- Shares -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ShareBound:
    """The most a job may hold: admission's share of it (DESIGN: admission owns the share,
    the optimizer plans within it)."""

    cpu: float
    memory_gib: float

    def __post_init__(self) -> None:
        for name in ("cpu", "memory_gib"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidClaim(f"share.{name}", f"must be a finite number >= 0, got {value!r}")

    def holds(self, cpu: float, memory_gib: float) -> bool:
        """Whether ``cpu`` cores and ``memory_gib`` GiB are within the share."""
        return cpu <= self.cpu + _EPS and memory_gib <= self.memory_gib + _EPS

    def excess(self, cpu: float, memory_gib: float) -> str:
        """Why ``cpu`` and ``memory_gib`` do not fit ('' when they do)."""
        if self.holds(cpu, memory_gib):
            return ""
        return (
            f"admission share: the plan needs {cpu:g} cores and {memory_gib:g} GiB, "
            f"the job's share is {self.cpu:g} cores and {self.memory_gib:g} GiB"
        )


def within_share(
    pods: Pods, share: ShareBound, extra_cpu: float = 0.0, extra_memory_gib: float = 0.0
) -> Pods | None:
    """``pods`` shrunk into ``share`` (with ``extra_cpu`` cores and ``extra_memory_gib`` GiB
    of pods outside ``pods``, such as a chief, counted against it), or None when even one
    worker and the PS do not fit. Workers go first (the data is resharded dynamically, so
    fewer workers lose nothing), then cores per worker, then cores per PS; memory per pod
    is never cut (that is what OOM kills are made of), so a share too small for the PS's
    memory cannot be met by shrinking and returns None."""

    def fits(candidate: Pods) -> bool:
        return share.holds(candidate.cpu + extra_cpu, candidate.memory_gib + extra_memory_gib)

    current = pods
    while not fits(current):
        if current.workers > 1:
            current = replace(current, workers=current.workers - 1)
        elif current.worker_cpu > 1:
            current = replace(current, worker_cpu=current.worker_cpu - 1)
        elif current.ps_cpu > 1:
            current = replace(current, ps_cpu=current.ps_cpu - 1)
        else:
            return None
    return current
