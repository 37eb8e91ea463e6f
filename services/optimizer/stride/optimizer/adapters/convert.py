"""Conversions between the bus and API protobufs and the optimizer's domain and policy types."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.optimizer.domain.administrator import (
    JobStage,
    OptimizationEvent,
    RootCause,
    VersionedPlan,
    check_job_id,
)
from stride.policy.cold_start import JobFeatures
from stride.policy.errors import InvalidFeatures
from stride.policy.plans import Plan, PodOverride, Role, RoleResources
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import InvalidWord
from stride.vocabulary.jobspec import JobSpec, validate

STAGE_TO_PROTO = {
    JobStage.COLD_START: optimization_pb2.JOB_STAGE_COLD_START,
    JobStage.SAMPLING: optimization_pb2.JOB_STAGE_SAMPLING,
    JobStage.OPTIMIZING: optimization_pb2.JOB_STAGE_OPTIMIZING,
    JobStage.STEADY: optimization_pb2.JOB_STAGE_STEADY,
    JobStage.FINISHED: optimization_pb2.JOB_STAGE_FINISHED,
}

ROOT_CAUSE_TO_PROTO = {
    RootCause.COLD_START: optimization_pb2.ROOT_CAUSE_COLD_START,
    RootCause.SAMPLING_DONE: optimization_pb2.ROOT_CAUSE_SAMPLING_DONE,
    RootCause.STEADY_STATE: optimization_pb2.ROOT_CAUSE_STEADY_STATE,
    RootCause.STRAGGLER: optimization_pb2.ROOT_CAUSE_STRAGGLER,
    RootCause.HOT_PS: optimization_pb2.ROOT_CAUSE_HOT_PS,
    RootCause.IDLE_PS: optimization_pb2.ROOT_CAUSE_IDLE_PS,
    RootCause.OOM: optimization_pb2.ROOT_CAUSE_OOM,
    RootCause.POD_FAILURE: optimization_pb2.ROOT_CAUSE_POD_FAILURE,
    RootCause.OVERRIDE: optimization_pb2.ROOT_CAUSE_OVERRIDE,
    RootCause.SAMPLING: optimization_pb2.ROOT_CAUSE_SAMPLING,
    RootCause.MEMORY_SIZING: optimization_pb2.ROOT_CAUSE_MEMORY_SIZING,
    RootCause.CONTENTION: optimization_pb2.ROOT_CAUSE_CONTENTION,
    RootCause.SHARE: optimization_pb2.ROOT_CAUSE_SHARE,
    RootCause.INPUT_QUEUE: optimization_pb2.ROOT_CAUSE_INPUT_QUEUE,
}

ROLE_TO_PROTO = {
    Role.PS: plan_pb2.ROLE_PS,
    Role.WORKER: plan_pb2.ROLE_WORKER,
    Role.DATA_WORKER: plan_pb2.ROLE_DATA_WORKER,
    Role.CHIEF: plan_pb2.ROLE_CHIEF,
}

_SPEC_FIELD_BY_FEATURE = {
    "model_name": "spec.model.name",
    "family": "spec.model.family",
    "embedding_dim": "spec.model.embedding_dim",
    "record_count": "spec.dataset.record_count",
    "batch_size": "spec.batch_size",
    "max_steps": "spec.termination.max_steps",
    "max_epochs": "spec.termination.max_epochs",
}
"""Where each feature comes from in a JobSpec, so an error names the spec's field."""


def timestamp(moment: datetime) -> Timestamp:
    """A protobuf Timestamp of an aware datetime."""
    value = Timestamp()
    value.FromDatetime(moment)
    return value


def features_from_spec(spec: job_pb2.JobSpec) -> JobFeatures:
    """The static features of an admitted spec; InvalidArgument names the spec's field.

    The spec is judged by the same rules admission applied at submit
    (:func:`stride.vocabulary.jobspec.validate`, without the clock: a deadline may pass
    while a job waits), so a spec admission accepted is always planned.
    """
    try:
        validate(JobSpec.from_message(spec), None)
    except InvalidWord as error:
        raise InvalidArgument(error.field, error.problem) from None
    try:
        return JobFeatures(
            model_name=spec.model.name,
            family=spec.model.family,
            embedding_dim=spec.model.embedding_dim,
            record_count=spec.dataset.record_count,
            batch_size=spec.batch_size,
            max_steps=spec.termination.max_steps,
            max_epochs=spec.termination.max_epochs,
        )
    except InvalidFeatures as error:
        raise InvalidArgument(
            _SPEC_FIELD_BY_FEATURE.get(error.field, "spec"), error.problem
        ) from None


def plan_to_proto(versioned: VersionedPlan) -> plan_pb2.ResourcePlan:
    """The bus and API form of a published plan."""
    plan = versioned.plan
    return plan_pb2.ResourcePlan(
        job_id=versioned.job_id,
        version=versioned.version,
        reason=plan.reason,
        algorithm=plan.algorithm,
        created_at=timestamp(versioned.created_at),
        roles=[
            plan_pb2.RoleResources(
                role=ROLE_TO_PROTO[resources.role],
                count=resources.count,
                cpu=resources.cpu,
                memory_bytes=resources.memory_bytes,
                overrides=[
                    plan_pb2.PodOverride(index=o.index, cpu=o.cpu, memory_bytes=o.memory_bytes)
                    for o in resources.overrides
                ],
            )
            for resources in plan.roles
        ],
    )


def event_to_proto(event: OptimizationEvent) -> optimization_pb2.OptimizationEvent:
    """The API form of an optimization event."""
    return optimization_pb2.OptimizationEvent(
        event_id=event.event_id,
        job_id=event.job_id,
        stage=STAGE_TO_PROTO[event.stage],
        root_cause=ROOT_CAUSE_TO_PROTO[event.root_cause],
        detail=event.detail,
        created_at=timestamp(event.created_at),
    )


ROLE_FROM_PROTO = {value: role for role, value in ROLE_TO_PROTO.items()}


def plan_from_proto(message: plan_pb2.ResourcePlan) -> Plan:
    """A published plan back in policy terms (for the next decision about it)."""
    return Plan(
        roles=tuple(
            RoleResources(
                role=ROLE_FROM_PROTO[resources.role],
                count=resources.count,
                cpu=resources.cpu,
                memory_bytes=resources.memory_bytes,
                overrides=tuple(
                    PodOverride(o.index, o.cpu, o.memory_bytes) for o in resources.overrides
                ),
            )
            for resources in message.roles
        ),
        reason=message.reason,
        algorithm=message.algorithm,
    )


GIB_BYTES = 1024**3


def share_values(event: job_pb2.JobShare, path: str = "") -> dict[str, Any]:
    """A share event's stored form, checked: InvalidArgument names the bad field (under
    ``path``, when the share came inside another message)."""
    job_id = check_job_id(event.job_id, f"{path}job_id")
    if event.version < 1:
        raise InvalidArgument(f"{path}version", f"must be >= 1, got {event.version}")
    amounts = {
        "share.cpu": float(event.share.cpu),
        "share.memory_bytes": event.share.memory_bytes / GIB_BYTES,
        "minimum.cpu": float(event.minimum.cpu),
        "minimum.memory_bytes": event.minimum.memory_bytes / GIB_BYTES,
    }
    for name, value in amounts.items():
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(f"{path}{name}", f"must be a finite number >= 0, got {value!r}")
    return {
        "job_id": job_id,
        "version": int(event.version),
        "cpu": amounts["share.cpu"],
        "memory_gib": amounts["share.memory_bytes"],
        "minimum_cpu": amounts["minimum.cpu"],
        "minimum_memory_gib": amounts["minimum.memory_bytes"],
        "guaranteed": bool(event.guaranteed),
        "reason": event.reason,
    }
