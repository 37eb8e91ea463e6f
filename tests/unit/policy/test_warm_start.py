"""Warm start (DLRover-RM Algorithm 1): similarity, top-k, exponential smoothing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy import warm_start
from stride.policy.cold_start import JobFeatures
from stride.policy.plans import Role
from stride.policy.serialization import from_dict, to_dict
from stride.policy.warm_start import (
    FEATURE_WEIGHTS,
    HistoricalJob,
    InvalidHistory,
    InvalidWarmStartRequest,
    ResourceConfiguration,
    WarmStartReply,
    WarmStartRequest,
    similarity,
)

from .strategies import job_features

GIB = 1024**3


def features(**changes: object) -> JobFeatures:
    values: dict[str, object] = {
        "model_name": "wide-and-deep",
        "record_count": 1_000_000,
        "batch_size": 512,
        "max_epochs": 2,
        "family": "wide-deep",
        "embedding_dim": 16,
    }
    values.update(changes)
    return JobFeatures(**values)  # type: ignore[arg-type]


def configuration(workers: int = 4, ps: int = 2, worker_cpu: float = 4.0) -> ResourceConfiguration:
    return ResourceConfiguration(
        worker_count=workers,
        worker_cpu=worker_cpu,
        worker_memory_bytes=8 * GIB,
        ps_count=ps,
        ps_cpu=8.0,
        ps_memory_bytes=16 * GIB,
    )


configurations = st.builds(
    ResourceConfiguration,
    worker_count=st.integers(1, 500),
    worker_cpu=st.floats(0.001, 256, allow_nan=False),
    worker_memory_bytes=st.integers(1, 2**40),
    ps_count=st.integers(0, 100),
    ps_cpu=st.floats(0.001, 256, allow_nan=False),
    ps_memory_bytes=st.integers(1, 2**40),
)


def test_feature_weights_sum_to_one() -> None:
    assert math.isclose(sum(FEATURE_WEIGHTS.values()), 1.0)


def test_similarity_is_one_for_identical_features_and_drops_with_distance() -> None:
    base = features()
    assert similarity(base, base) == pytest.approx(1.0)
    closer = similarity(base, features(batch_size=1024))
    farther = similarity(base, features(batch_size=4096))
    other_model = similarity(base, features(model_name="deepfm"))
    assert 1.0 > closer > farther
    assert other_model == pytest.approx(1.0 - FEATURE_WEIGHTS["model_name"])


def test_worked_example_smooths_least_to_most_similar() -> None:
    # Three neighbours with 2, 4 and 8 workers; the 8-worker one is identical to the new job,
    # the 2-worker one least similar. mu = 0.5: A_bar = 2, then 3, then 5.5 -> 6 workers.
    new = features()
    history = (
        HistoricalJob("least", features(model_name="deepfm", batch_size=4096), configuration(2)),
        HistoricalJob("middle", features(batch_size=1024), configuration(4)),
        HistoricalJob("same", features(), configuration(8, worker_cpu=2.0)),
    )
    reply = warm_start.run(WarmStartRequest(new, history, top_k=3, smoothing=0.5))
    assert [n.job_id for n in reply.neighbours] == ["least", "middle", "same"]
    assert reply.configuration.worker_count == 6
    assert reply.configuration.worker_cpu == pytest.approx(0.25 * 4 + 0.25 * 4 + 0.5 * 2)
    assert reply.plan.pod_count(Role.WORKER) == 6 and reply.plan.pod_count(Role.PS) == 2
    assert reply.plan.pod_count(Role.CHIEF) == 1
    assert reply.plan.algorithm == "dlrover-warm-start/1"


def test_top_k_drops_the_least_similar_and_min_similarity_filters() -> None:
    new = features()
    history = (
        HistoricalJob("far", features(model_name="x", family="y", batch_size=1), configuration(99)),
        HistoricalJob("near", features(), configuration(4)),
    )
    reply = warm_start.run(WarmStartRequest(new, history, top_k=1))
    assert [n.job_id for n in reply.neighbours] == ["near"]
    assert reply.configuration == configuration(4)
    with pytest.raises(InvalidHistory) as raised:
        warm_start.run(WarmStartRequest(features(model_name="z"), history[:1], min_similarity=0.9))
    assert raised.value.field == "history"


def test_empty_history_asks_for_a_cold_start() -> None:
    with pytest.raises(InvalidHistory, match="cold start"):
        warm_start.run(WarmStartRequest(features(), ()))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"top_k": 0}, "top_k"),
        ({"smoothing": 0.0}, "smoothing"),
        ({"smoothing": 1.0}, "smoothing"),
        ({"smoothing": float("nan")}, "smoothing"),
        ({"min_similarity": -0.1}, "min_similarity"),
    ],
)
def test_bad_parameters_are_refused(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidWarmStartRequest) as raised:
        WarmStartRequest(features(), (), **changes)  # type: ignore[arg-type]
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"worker_count": 0}, "worker_count"),
        ({"ps_count": -1}, "ps_count"),
        ({"worker_cpu": float("nan")}, "worker_cpu"),
        ({"ps_cpu": -2.0}, "ps_cpu"),
        ({"worker_memory_bytes": 0}, "worker_memory_bytes"),
    ],
)
def test_bad_configurations_are_refused(changes: dict[str, object], field: str) -> None:
    values: dict[str, object] = to_dict(configuration())
    values.update(changes)
    with pytest.raises(InvalidHistory) as raised:
        ResourceConfiguration(**values)  # type: ignore[arg-type]
    assert raised.value.field == field


def test_duplicate_job_ids_are_refused() -> None:
    job = HistoricalJob("a", features(), configuration())
    with pytest.raises(InvalidHistory) as raised:
        WarmStartRequest(features(), (job, job))
    assert raised.value.field == "history[1].job_id"


def test_request_and_reply_round_trip_through_dicts() -> None:
    request = WarmStartRequest(
        features(), (HistoricalJob("a", features(), configuration()),), top_k=3, smoothing=0.3
    )
    assert from_dict(WarmStartRequest, to_dict(request)) == request
    reply = warm_start.run(request)
    assert from_dict(WarmStartReply, to_dict(reply)) == reply
    spec = warm_start.ALGORITHMS[0]
    assert spec.run_dict(to_dict(request)) == to_dict(reply)


@settings(max_examples=150)
@given(
    new=job_features(),
    olds=st.lists(job_features(), min_size=1, max_size=8),
    shared=configurations,
    top_k=st.integers(1, 10),
    smoothing=st.floats(0.01, 0.99),
)
def test_identical_history_returns_that_configuration(
    new: JobFeatures,
    olds: list[JobFeatures],
    shared: ResourceConfiguration,
    top_k: int,
    smoothing: float,
) -> None:
    history = tuple(HistoricalJob(f"job-{i}", f, shared) for i, f in enumerate(olds))
    reply = warm_start.run(WarmStartRequest(new, history, top_k=top_k, smoothing=smoothing))
    assert reply.configuration == shared


@settings(max_examples=150)
@given(
    new=job_features(),
    jobs=st.lists(st.tuples(job_features(), configurations), min_size=1, max_size=8),
    top_k=st.integers(1, 10),
    smoothing=st.floats(0.01, 0.99),
    seed=st.randoms(use_true_random=False),
)
def test_result_is_order_invariant_and_within_the_neighbours_range(
    new: JobFeatures,
    jobs: list[tuple[JobFeatures, ResourceConfiguration]],
    top_k: int,
    smoothing: float,
    seed: object,
) -> None:
    history = [HistoricalJob(f"job-{i}", f, c) for i, (f, c) in enumerate(jobs)]
    reply = warm_start.run(WarmStartRequest(new, tuple(history), top_k, smoothing))
    shuffled = list(history)
    seed.shuffle(shuffled)  # type: ignore[attr-defined]
    assert warm_start.run(WarmStartRequest(new, tuple(shuffled), top_k, smoothing)) == reply

    assert len(reply.neighbours) == min(top_k, len(history))
    scores = [n.similarity for n in reply.neighbours]
    assert scores == sorted(scores)  # least similar first, most similar last
    used = {n.job_id for n in reply.neighbours}
    unused = [similarity(new, job.features) for job in history if job.job_id not in used]
    assert all(score <= scores[0] for score in unused)

    by_id = {job.job_id: job.configuration for job in history}
    chosen = [by_id[n.job_id] for n in reply.neighbours]
    result = reply.configuration
    assert min(c.worker_count for c in chosen) <= result.worker_count
    assert result.worker_count <= max(c.worker_count for c in chosen)
    low_cpu = min(c.ps_cpu for c in chosen)
    high_cpu = max(c.ps_cpu for c in chosen)
    assert low_cpu * (1 - 1e-12) <= result.ps_cpu <= high_cpu * (1 + 1e-12)
