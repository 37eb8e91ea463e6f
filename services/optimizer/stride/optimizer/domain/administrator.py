"""One administrator per job: it turns the job's lifecycle facts into optimization events
and versioned plans.

DLRover's Brain creates an administrator when a job is created, which "is monitoring this
job during the job's entire lifetime", starts optimization events "when predefined
conditions are met", and is removed when the job completes (sec. 4.3). Which algorithm runs
depends on the job's stage: no runtime information yet (cold start), sampling, model-based
optimization, then steady state with adjustments on trouble (sec. 4.2; DLRover-RM sec. 4).

Here an administrator is a value, and each fact is a pure function from the administrator
it finds (or None) to a :class:`Step`: the administrator after, the events raised and the
plans to publish. The service stores a step in one transaction. A fact that was already
applied yields an unchanged step, which is what makes redelivered messages harmless.

Transitions: admitted -> cold-start plan published (stage COLD_START); a closed metric
window -> the stage step's decision (SAMPLING, OPTIMIZING or STEADY; ``domain.tuning``);
an OOM kill -> the OOM rule's plan; an operator's plan -> an override; finished ->
FINISHED from any stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from stride import vocabulary
from stride.policy.plans import Plan
from stride.runtime.errors import InvalidArgument


class JobStage(Enum):
    """Where a job is in its optimization life (DLRover sec. 4.2)."""

    COLD_START = "cold_start"
    """No measurements yet; the first plan is the cold default (or, later, warm start)."""
    SAMPLING = "sampling"
    """One worker and a few PS run to measure the worker's and PS's CPU needs."""
    OPTIMIZING = "optimizing"
    """The throughput model is fitted and plans are chosen from it."""
    STEADY = "steady"
    """The plan holds; only trouble (straggler, hot PS, OOM) changes it."""
    FINISHED = "finished"
    """The job ended; the administrator is done."""


class RootCause(Enum):
    """Why the optimizer acted (DLRover sec. 4.3: "determine the root cause")."""

    COLD_START = "cold_start"
    SAMPLING_DONE = "sampling_done"
    STEADY_STATE = "steady_state"
    STRAGGLER = "straggler"
    HOT_PS = "hot_ps"
    IDLE_PS = "idle_ps"
    OOM = "oom"
    POD_FAILURE = "pod_failure"
    OVERRIDE = "override"
    SAMPLING = "sampling"
    """A sampling probe: one dimension moved by a factor of two to measure it."""
    MEMORY_SIZING = "memory_sizing"
    """Memory sized to what the pods were measured (or predicted) to use."""
    CONTENTION = "contention"
    """A plan held for capacity, granted later by the cluster's weighted greedy."""
    SHARE = "share"
    """Admission changed the job's share; the plan was fitted into it."""
    INPUT_QUEUE = "input_queue"
    """GoldMiner's tuner read the job's input queue and sized its data workers."""


_RUNNING = frozenset({JobStage.SAMPLING, JobStage.OPTIMIZING, JobStage.STEADY, JobStage.FINISHED})
NEXT_STAGES: dict[JobStage, frozenset[JobStage]] = {
    # The stage step decides each running stage from the job's samples (stride.policy.
    # stages): a warm-started job may skip sampling, a short one may never fit, and a job
    # whose plan changed shape may sample again. Only FINISHED is final.
    JobStage.COLD_START: _RUNNING,
    JobStage.SAMPLING: _RUNNING,
    JobStage.OPTIMIZING: _RUNNING,
    JobStage.STEADY: _RUNNING,
    JobStage.FINISHED: frozenset(),
}
"""The stage transitions an administrator allows."""


class StageError(Exception):
    """A transition the stage machine does not allow (a bug or an impossible fact order)."""


def check_job_id(job_id: str, field: str = "job_id") -> str:
    """Return ``job_id`` if it is a job id (:func:`stride.vocabulary.check_job_id`), else
    raise InvalidArgument naming ``field``."""
    return vocabulary.check_job_id(job_id, field, raise_as=InvalidArgument)


@dataclass(frozen=True)
class OptimizationEvent:
    """A fact about a job that the optimizer acted on."""

    event_id: str
    """Deterministic, derived from the fact (``<job_id>.admitted``), so a redelivered fact
    cannot raise a second event."""
    job_id: str
    stage: JobStage
    """The stage the job was in when the event was raised."""
    root_cause: RootCause
    detail: str
    created_at: datetime


@dataclass(frozen=True)
class VersionedPlan:
    """A plan as published for one job: numbered from 1, one higher each time."""

    job_id: str
    version: int
    plan: Plan
    created_at: datetime

    @property
    def message_id(self) -> str:
        """The bus de-duplication id: the same plan version always has the same id."""
        return f"{self.job_id}.plan.{self.version}"


@dataclass(frozen=True)
class Administrator:
    """The optimizer's state for one job."""

    job_id: str
    stage: JobStage
    plan_version: int = 0
    """Version of the newest published plan; 0 while there is none."""

    def advance(self, stage: JobStage) -> Administrator:
        """The administrator in ``stage``; raises StageError if the move is not allowed."""
        if stage is self.stage:
            return self
        if stage not in NEXT_STAGES[self.stage]:
            raise StageError(
                f"job {self.job_id}: {self.stage.value} -> {stage.value} is not allowed"
            )
        return replace(self, stage=stage)

    def publish(self, plan: Plan, now: datetime) -> tuple[Administrator, VersionedPlan]:
        """Number ``plan`` as the job's next version."""
        if self.stage is JobStage.FINISHED:
            raise StageError(f"job {self.job_id} has finished; it gets no more plans")
        version = self.plan_version + 1
        return replace(self, plan_version=version), VersionedPlan(self.job_id, version, plan, now)


@dataclass(frozen=True)
class Step:
    """What one fact changes: the administrator before and after, events and new plans."""

    before: Administrator | None
    after: Administrator | None
    events: tuple[OptimizationEvent, ...] = ()
    plans: tuple[VersionedPlan, ...] = ()

    @property
    def changed(self) -> bool:
        """False when the fact was already applied (or changes nothing): store nothing."""
        return self.before != self.after or bool(self.events) or bool(self.plans)


def admitted_event_id(job_id: str) -> str:
    """The id of the event raised when ``job_id`` is admitted."""
    return f"{job_id}.admitted"


def on_admitted(
    existing: Administrator | None, job_id: str, cold_start: Plan, now: datetime
) -> Step:
    """A job was admitted: create its administrator and publish ``cold_start`` as plan v1
    (the plan the adjust port's cold-start algorithm proposed).

    If the job already has an administrator, the admission was seen before (redelivery), or
    the job finished before its admission arrived (the two come through different consumers,
    so their order is not guaranteed): either way there is nothing to do.
    """
    if existing is not None:
        return Step(existing, existing)
    administrator = Administrator(job_id, JobStage.COLD_START)
    event = OptimizationEvent(
        event_id=admitted_event_id(job_id),
        job_id=job_id,
        stage=JobStage.COLD_START,
        root_cause=RootCause.COLD_START,
        detail="admitted with no history: cold-start sampling plan",
        created_at=now,
    )
    administrator, plan = administrator.publish(cold_start, now)
    return Step(None, administrator, (event,), (plan,))


def on_finished(existing: Administrator | None, job_id: str) -> Step:
    """A job ended: its administrator stops. Idempotent.

    A job not seen yet gets a FINISHED administrator, so an admission that arrives late
    does not start a plan for a job that is already over.
    """
    if existing is None:
        return Step(None, Administrator(job_id, JobStage.FINISHED))
    return Step(existing, existing.advance(JobStage.FINISHED))


def on_manual_scale(
    existing: Administrator | None,
    job_id: str,
    plan: Plan,
    request_id: str,
    detail: str,
    now: datetime,
) -> Step:
    """An operator's manual plan (``stride scale``, DLRover's ScalePlan): published as the
    job's next version and recorded as an override. Raises StageError for a finished job."""
    if existing is None:
        raise StageError(f"job {job_id} has no administrator")
    if existing.stage is JobStage.FINISHED:
        raise StageError(f"job {job_id} has finished; it gets no more plans")
    event = OptimizationEvent(
        event_id=f"{job_id}.override.{request_id}",
        job_id=job_id,
        stage=existing.stage,
        root_cause=RootCause.OVERRIDE,
        detail=detail,
        created_at=now,
    )
    administrator, versioned = existing.publish(plan, now)
    return Step(existing, administrator, (event,), (versioned,))


def on_pod_failure(
    existing: Administrator | None,
    job_id: str,
    plan: Plan | None,
    event_id: str,
    detail: str,
    now: datetime,
    hold: str = "",
) -> Step:
    """A pod was OOM-killed: ``plan`` (the policy's OOM rule, or None if it changes nothing)
    becomes the next version, unless ``hold`` says why it cannot (the cluster has no room
    for it): then only the event is recorded, naming the hold. ``event_id`` is derived from
    the failure, so a redelivered failure finds its event and changes nothing (the caller
    checks that first)."""
    if existing is None or existing.stage is JobStage.FINISHED or plan is None:
        return Step(existing, existing)
    event = OptimizationEvent(
        event_id=event_id,
        job_id=job_id,
        stage=existing.stage,
        root_cause=RootCause.OOM,
        detail=f"{detail}; held: {hold}" if hold else detail,
        created_at=now,
    )
    if hold:
        return Step(existing, existing, (event,))
    administrator, versioned = existing.publish(plan, now)
    return Step(existing, administrator, (event,), (versioned,))
