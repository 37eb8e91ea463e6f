"""Converting specs to features and plans to their wire form."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stride.events.v1 import job_pb2, optimization_pb2, plan_pb2
from stride.optimizer.adapters.convert import event_to_proto, features_from_spec, plan_to_proto
from stride.optimizer.domain.administrator import VersionedPlan, on_admitted
from stride.policy.cold_start import JobFeatures, cold_start_plan
from stride.policy.plans import Plan, PodOverride, Role, RoleResources
from stride.runtime.errors import InvalidArgument

NOW = datetime(2026, 1, 2, tzinfo=UTC)


def spec(**termination: int) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="j",
        user="u",
        model=job_pb2.ModelReference(
            name="dlrm-x", family="dlrm", embedding_dim=16, entrypoint="a:b"
        ),
        dataset=job_pb2.DatasetSpec(name="d", record_count=1000),
        batch_size=10,
        termination=job_pb2.Termination(**(termination or {"max_epochs": 2})),
    )


def test_features_come_from_the_spec() -> None:
    assert features_from_spec(spec()) == JobFeatures(
        model_name="dlrm-x",
        family="dlrm",
        embedding_dim=16,
        record_count=1000,
        batch_size=10,
        max_epochs=2,
    )


def test_feature_errors_name_the_spec_field() -> None:
    with pytest.raises(InvalidArgument) as raised:
        features_from_spec(spec(max_epochs=0))
    # The shared rules name the pair, as admission does at submit.
    assert raised.value.field == "spec.termination"
    negative = spec()
    negative.model.embedding_dim = -7
    with pytest.raises(InvalidArgument) as raised:
        features_from_spec(negative)
    assert raised.value.field == "spec.model.embedding_dim"
    broken = spec()
    broken.batch_size = 0
    with pytest.raises(InvalidArgument) as raised:
        features_from_spec(broken)
    assert raised.value.field == "spec.batch_size"


def test_plans_and_events_convert_field_by_field() -> None:
    plan = Plan(
        roles=(
            RoleResources(Role.PS, 2, 4.0, 1024, (PodOverride(1, 8.0, 2048),)),
            RoleResources(Role.DATA_WORKER, 1, 0.5, 512),
        ),
        reason="hot PS ps-1",
        algorithm="hot-ps/1",
    )
    message = plan_to_proto(VersionedPlan("job-1", 3, plan, NOW))
    assert message == plan_pb2.ResourcePlan(
        job_id="job-1",
        version=3,
        reason="hot PS ps-1",
        algorithm="hot-ps/1",
        created_at=message.created_at,
        roles=[
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_PS,
                count=2,
                cpu=4.0,
                memory_bytes=1024,
                overrides=[plan_pb2.PodOverride(index=1, cpu=8.0, memory_bytes=2048)],
            ),
            plan_pb2.RoleResources(
                role=plan_pb2.ROLE_DATA_WORKER, count=1, cpu=0.5, memory_bytes=512
            ),
        ],
    )
    assert message.created_at.ToDatetime(tzinfo=UTC) == NOW
    step = on_admitted(None, "job-1", cold_start_plan(features_from_spec(spec())), NOW)
    event = event_to_proto(step.events[0])
    assert event.stage == optimization_pb2.JOB_STAGE_COLD_START
    assert event.root_cause == optimization_pb2.ROOT_CAUSE_COLD_START
