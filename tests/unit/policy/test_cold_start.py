"""The cold-start plan: DLRover's sampling configuration with Stride's documented defaults."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.policy import cold_start
from stride.policy.cold_start import ColdStartRequest, JobFeatures, cold_start_plan
from stride.policy.errors import InvalidFeatures
from stride.policy.plans import Plan, Role

from .strategies import job_features


def features(**changes: object) -> JobFeatures:
    values: dict[str, object] = {
        "model_name": "wide-and-deep",
        "record_count": 100_000,
        "batch_size": 512,
        "max_epochs": 2,
    }
    values.update(changes)
    return JobFeatures(**values)  # type: ignore[arg-type]


def test_dense_model_samples_with_one_worker_one_ps_and_a_chief() -> None:
    plan = cold_start_plan(features())
    assert plan.reason == "cold start" and plan.algorithm == "cold-start-plan/1"
    assert [(r.role, r.count) for r in plan.roles] == [
        (Role.CHIEF, 1),
        (Role.PS, 1),
        (Role.WORKER, 1),
    ]
    worker = plan.role(Role.WORKER)
    assert worker is not None and worker.cpu == cold_start.WORKER_CPU
    assert plan.role(Role.DATA_WORKER) is None


def test_model_with_embeddings_gets_a_few_ps() -> None:
    plan = cold_start_plan(features(embedding_dim=16, family="dlrm"))
    assert plan.pod_count(Role.PS) == cold_start.PS_COUNT_WITH_EMBEDDINGS == 2
    assert plan.pod_count(Role.WORKER) == 1


def test_defaults_are_clamped_to_the_largest_pod() -> None:
    plan = cold_start_plan(features(), max_pod_cpu=2)
    assert {r.role: r.cpu for r in plan.roles} == {Role.CHIEF: 1.0, Role.PS: 2.0, Role.WORKER: 2.0}


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True])
def test_bad_max_pod_cpu_is_refused(bad: float) -> None:
    with pytest.raises(InvalidFeatures) as raised:
        cold_start_plan(features(), max_pod_cpu=bad)
    assert raised.value.field == "max_pod_cpu"
    with pytest.raises(InvalidFeatures):
        ColdStartRequest(features(), max_pod_cpu=bad)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model_name": ""}, "model_name"),
        ({"record_count": 0}, "record_count"),
        ({"batch_size": -1}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"max_epochs": 0}, "max_steps"),
        ({"max_steps": 10}, "max_steps"),
        ({"max_steps": -1, "max_epochs": 0}, "max_steps"),
        ({"embedding_dim": -8}, "embedding_dim"),
    ],
)
def test_bad_features_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidFeatures) as raised:
        features(**changes)
    assert raised.value.field == field


def test_total_steps_counts_partial_last_batches() -> None:
    assert features(record_count=1000, batch_size=300, max_epochs=2).total_steps == 8
    assert features(max_epochs=0, max_steps=77).total_steps == 77


@given(job_features(), st.none() | st.floats(min_value=0.01, max_value=256))
def test_cold_start_always_yields_a_valid_placeable_plan(
    job: JobFeatures, max_pod_cpu: float | None
) -> None:
    plan = cold_start_plan(job, max_pod_cpu)
    assert isinstance(plan, Plan)
    # Rebuilding runs every validation rule again.
    assert Plan(roles=plan.roles, reason=plan.reason, algorithm=plan.algorithm) == plan
    assert plan.pod_count(Role.WORKER) == 1
    assert plan.pod_count(Role.PS) in (1, 2)
    for resources in plan.roles:
        assert resources.cpu > 0 and resources.memory_bytes > 0
        if max_pod_cpu is not None:
            assert resources.cpu <= max_pod_cpu
