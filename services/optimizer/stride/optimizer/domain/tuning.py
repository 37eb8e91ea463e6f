"""From a closed metric window to the job's next plan: the stage step's request, and its
reply as a versioned plan with an explanation.

The stage step (:mod:`stride.policy.stages`) sizes a job in whole cores and GiB for its
workers and PS; a plan has per-role CPU and memory and also a chief and data workers. The
conversions here keep everything the step does not decide (chief, data workers, the
algorithm's name) as the current plan has it.

Departures (each because the live job gives less than the simulator's spec):

- The model's size for eq. 5's sync term is ``4 x model.parameter_count`` bytes (float32)
  when the spec gives a count, else :data:`DEFAULT_MODEL_BYTES`: the fit absorbs a wrong
  constant in ``alpha_sync``.
- A hot-PS re-partition is recorded as an optimization event but changes no plan: the
  plan message has no re-partition order yet, and a plan with the same pods is not a
  change the pod watcher applies.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from datetime import datetime

from stride.optimizer.domain.administrator import (
    Administrator,
    JobStage,
    OptimizationEvent,
    RootCause,
    StageError,
    Step,
)
from stride.policy.cold_start import JobFeatures
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.stages import (
    ALGORITHM,
    JobShape,
    Pods,
    Stage,
    StageReply,
)

GIB = 1024**3
DEFAULT_MODEL_BYTES = 5e7
"""Model bytes when the spec gives no parameter count (a 12.5 M-parameter dense part)."""

STAGE_OF_REPLY = {
    Stage.COLD_START: JobStage.COLD_START,
    Stage.WARM_START: JobStage.COLD_START,
    Stage.SAMPLING: JobStage.SAMPLING,
    Stage.OPTIMIZING: JobStage.OPTIMIZING,
    Stage.STEADY: JobStage.STEADY,
}


def pods_of(plan: Plan) -> Pods | None:
    """The plan's workers and PS in whole cores and GiB (rounded up), or None when it has
    no worker or no PS (the stage step sizes PS jobs only)."""
    workers, ps = plan.role(Role.WORKER), plan.role(Role.PS)
    if workers is None or ps is None or workers.count < 1 or ps.count < 1:
        return None

    def cores(cpu: float) -> int:
        return max(1, math.ceil(cpu - 1e-9))

    def gib(memory: int) -> int:
        return max(1, math.ceil(memory / GIB))

    return Pods(
        workers.count,
        cores(max(c for c, _ in workers.pod_sizes())),
        gib(max(m for _, m in workers.pod_sizes())),
        ps.count,
        cores(max(c for c, _ in ps.pod_sizes())),
        gib(max(m for _, m in ps.pod_sizes())),
    )


def with_pods(plan: Plan, pods: Pods, reason: str, algorithm: str = ALGORITHM) -> Plan:
    """``plan`` with its workers and PS sized as ``pods`` (overrides dropped); other roles
    as they are."""
    sized = {
        Role.WORKER: RoleResources(
            Role.WORKER, pods.workers, float(pods.worker_cpu), pods.worker_mem_gib * GIB
        ),
        Role.PS: RoleResources(Role.PS, pods.ps, float(pods.ps_cpu), pods.ps_mem_gib * GIB),
    }
    roles = [sized.get(resources.role, resources) for resources in plan.roles]
    return Plan(roles=tuple(roles), reason=reason, algorithm=algorithm)


def shape_of(features: JobFeatures, parameter_count: int) -> JobShape:
    """What eq. 1-6 need of the job, from its admitted spec."""
    total = (
        features.max_steps * features.batch_size
        if features.max_steps > 0
        else features.record_count * features.max_epochs
    )
    model_bytes = 4.0 * parameter_count if parameter_count > 0 else DEFAULT_MODEL_BYTES
    return JobShape(features.batch_size, features.embedding_dim, model_bytes, float(total))


@dataclass(frozen=True)
class Explanation:
    """Why a plan was chosen (``stride explain``; gRPC ``GetPlanExplanation``)."""

    algorithm: str
    stage: str
    root_cause: str
    detail: str
    samples_used: int = 0
    """Throughput samples the decision saw."""
    sample_count: int = 0
    """Samples the job has had in all."""
    fit_rmsle: float = -1.0
    predicted_throughput: float = -1.0
    predicted_current: float = -1.0
    cost: float = -1.0
    bound: str = ""
    """The constraint that bound the choice (capacity, quota, OOM margin), if one did."""
    fallback: str = ""
    """Set when the algorithm failed and the stage heuristic decided instead."""

    def to_json(self) -> str:
        """As stored beside the plan."""
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Explanation:
        """As stored by :meth:`to_json`."""
        return Explanation(**json.loads(text))


def root_cause_of(reply: StageReply, first_fit: bool) -> RootCause:
    """The optimization event's root cause for a stage-step decision."""
    if reply.stage is Stage.SAMPLING:
        return RootCause.SAMPLING
    if reply.root_cause.startswith("OOM") or reply.root_cause.startswith("PS OOM"):
        return RootCause.OOM
    if reply.root_cause.startswith("hot PS"):
        return RootCause.HOT_PS
    if reply.root_cause.startswith("model"):
        return RootCause.SAMPLING_DONE if first_fit else RootCause.STEADY_STATE
    return RootCause.MEMORY_SIZING


def on_stage_reply(
    existing: Administrator,
    current: Plan,
    reply: StageReply,
    event_id: str,
    explanation: Explanation,
    first_fit: bool,
    hold_reason: str,
    now: datetime,
) -> tuple[Step, Explanation | None]:
    """A stage-step decision applied to the job's administrator: its stage moves, and when
    the pods change (and ``hold_reason`` is empty) the new pods are the next plan version.
    A decision that changes no pods raises no event; a held one raises its event with the
    hold named, so ``stride explain`` shows why nothing moved."""
    stage = STAGE_OF_REPLY[reply.stage]
    if stage is JobStage.OPTIMIZING and reply.pods is None:
        stage = JobStage.STEADY
    administrator = existing.advance(stage)
    if reply.pods is None and not reply.repartition:
        return Step(existing, administrator), None
    cause = root_cause_of(reply, first_fit)
    detail = reply.root_cause
    if hold_reason:
        detail = f"{detail}; held: {hold_reason}"
    event = OptimizationEvent(event_id, existing.job_id, stage, cause, detail, now)
    if reply.pods is None or hold_reason:
        return Step(existing, administrator, (event,)), None
    plan = with_pods(current, reply.pods, f"{stage.value}: {reply.root_cause}")
    administrator, versioned = administrator.publish(plan, now)
    return Step(existing, administrator, (event,), (versioned,)), replace(
        explanation, stage=stage.value, root_cause=cause.value
    )


def has_pods(plan: Plan) -> bool:
    """Whether ``plan`` runs any pod (a suspended job's plan runs none)."""
    return any(resources.count for resources in plan.roles)


def without_pods(plan: Plan, reason: str) -> Plan:
    """``plan`` with no pod in any role (a suspension): the sizes stay, so the plan that
    resumes the job can be read off the one before it."""
    roles = tuple(replace(resources, count=0, overrides=()) for resources in plan.roles)
    return Plan(roles=roles, reason=reason, algorithm=plan.algorithm)


def on_share_plan(
    existing: Administrator,
    plan: Plan,
    event_id: str,
    explanation: Explanation,
    now: datetime,
) -> tuple[Step, Explanation]:
    """A plan admission's share decided (a suspension when the share went to zero, the
    resumption when it came back) as the job's next plan version, with its event. The
    stage stays where the job's last decision put it."""
    if existing.stage is JobStage.FINISHED:
        raise StageError(f"job {existing.job_id} has finished; it gets no more plans")
    event = OptimizationEvent(
        event_id, existing.job_id, existing.stage, RootCause.SHARE, explanation.detail, now
    )
    administrator, versioned = existing.publish(plan, now)
    return Step(existing, administrator, (event,), (versioned,)), replace(
        explanation, stage=existing.stage.value, root_cause=RootCause.SHARE.value
    )


def on_replanned(
    existing: Administrator,
    current: Plan,
    pods: Pods,
    cause: RootCause,
    event_id: str,
    explanation: Explanation,
    now: datetime,
) -> tuple[Step, Explanation]:
    """Pods decided outside a window's stage step (a held claim granted by the cluster's
    weighted greedy, or a plan fitted into a new share) as the job's next plan version,
    with its event. The stage stays where the job's last decision put it."""
    if existing.stage is JobStage.FINISHED:
        raise StageError(f"job {existing.job_id} has finished; it gets no more plans")
    event = OptimizationEvent(
        event_id, existing.job_id, existing.stage, cause, explanation.detail, now
    )
    plan = with_pods(current, pods, f"{cause.value}: {explanation.detail}")
    administrator, versioned = existing.publish(plan, now)
    return Step(existing, administrator, (event,), (versioned,)), replace(
        explanation, stage=existing.stage.value, root_cause=cause.value
    )
