"""The warm-start similarity measure and top-k ranking (DLRover-RM Algorithm 1)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.configdb.domain.features import JobFeatures, extract_features
from stride.configdb.domain.similarity import (
    FeatureWeights,
    Outcome,
    PastJob,
    is_warm_start_candidate,
    rank_similar,
    ratio_similarity,
    similarity,
)

NOW = datetime(2025, 1, 1, tzinfo=UTC)

WIDE_DEEP = extract_features(
    model_name="wide-and-deep",
    model_family="dlrm",
    dataset_name="criteo",
    dataset_format="tfrecord",
    record_count=1_000_000,
    batch_size=512,
    embedding_dim=16,
    parameter_count=2_000_000,
)

names = st.none() | st.sampled_from(["wide-and-deep", "dlrm", "resnet", "criteo", "csv"])
counts = st.none() | st.integers(min_value=1, max_value=10**12)
features_strategy = st.builds(
    JobFeatures,
    model_name=names,
    model_family=names,
    dataset_name=names,
    dataset_format=names,
    record_count=counts,
    batch_size=counts,
    embedding_dim=counts,
    parameter_count=counts,
)


def past(
    job_id: str,
    features: JobFeatures | None,
    outcome: Outcome | None = Outcome.SUCCEEDED,
    finished_at: datetime | None = NOW,
    plan_count: int = 1,
) -> PastJob:
    return PastJob(job_id, features, outcome, finished_at, plan_count)


def test_identical_features_have_similarity_one() -> None:
    assert similarity(WIDE_DEEP, WIDE_DEEP) == 1.0


@given(features_strategy)
def test_any_features_are_identical_to_themselves(features: JobFeatures) -> None:
    assert similarity(features, features) == 1.0


@given(features_strategy, features_strategy)
def test_similarity_is_symmetric_and_between_zero_and_one(a: JobFeatures, b: JobFeatures) -> None:
    assert 0.0 <= similarity(a, b) <= 1.0
    assert similarity(a, b) == pytest.approx(similarity(b, a))


@given(features_strategy, st.lists(features_strategy, max_size=20))
def test_an_identical_past_job_ranks_first(query: JobFeatures, others: list[JobFeatures]) -> None:
    # The identical job finished earliest, so only its similarity can put it first.
    history = [past(f"other-{i}", f, finished_at=NOW) for i, f in enumerate(others)]
    history.append(past("zz-identical", query, finished_at=NOW - timedelta(days=30)))
    ranked = rank_similar(query, history, k=len(history))
    position = [m.job_id for m in ranked].index("zz-identical")
    assert ranked[position].similarity == 1.0
    # Only jobs exactly as similar (identical features too, finished later) may come before it.
    assert all(m.similarity == 1.0 for m in ranked[:position])


def test_identical_job_ranks_first_among_near_misses() -> None:
    history = [
        past("bigger-batch", replace(WIDE_DEEP, batch_size=1024)),
        past("other-family", replace(WIDE_DEEP, model_family="two-tower")),
        past("identical", WIDE_DEEP, finished_at=NOW - timedelta(days=90)),
        past("other-model", replace(WIDE_DEEP, model_name="deepfm")),
    ]
    ranked = rank_similar(WIDE_DEEP, history, k=4)
    assert [m.job_id for m in ranked] == [
        "identical",
        "bigger-batch",
        "other-family",
        "other-model",
    ]
    assert ranked[0].similarity == 1.0
    assert all(m.similarity < 1.0 for m in ranked[1:])


def test_numeric_similarity_depends_on_the_ratio_only() -> None:
    assert ratio_similarity(1_000, 2_000) == ratio_similarity(1_000_000, 2_000_000) == 0.5
    assert ratio_similarity(7, 7) == 1.0
    with pytest.raises(ValueError):
        ratio_similarity(0, 3)


def test_closer_sizes_are_more_similar() -> None:
    near = similarity(WIDE_DEEP, replace(WIDE_DEEP, record_count=900_000))
    far = similarity(WIDE_DEEP, replace(WIDE_DEEP, record_count=100_000))
    assert 1.0 > near > far > 0.0


def test_model_name_outweighs_batch_size() -> None:
    other_model = similarity(WIDE_DEEP, replace(WIDE_DEEP, model_name="deepfm"))
    other_batch = similarity(WIDE_DEEP, replace(WIDE_DEEP, batch_size=256))
    assert other_model < other_batch


def test_unknown_in_both_is_left_out_and_known_in_one_counts_as_different() -> None:
    only_name = JobFeatures(model_name="m")
    assert similarity(only_name, JobFeatures(model_name="m")) == 1.0
    assert similarity(only_name, JobFeatures(model_name="m", batch_size=8)) == pytest.approx(
        3.0 / 4.0
    )
    assert similarity(JobFeatures(model_name="a"), JobFeatures(model_name="b")) == 0.0


def test_weights_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        FeatureWeights(batch_size=-1.0)


@pytest.mark.parametrize(
    ("job", "candidate"),
    [
        (past("ok", WIDE_DEEP), True),
        (past("failed", WIDE_DEEP, outcome=Outcome.FAILED), False),
        (past("cancelled", WIDE_DEEP, outcome=Outcome.CANCELLED), False),
        (past("running", WIDE_DEEP, outcome=None, finished_at=None), False),
        (past("no-plan", WIDE_DEEP, plan_count=0), False),
        (past("placeholder", None), False),
    ],
)
def test_only_finished_succeeded_jobs_with_a_spec_and_a_plan_are_candidates(
    job: PastJob, candidate: bool
) -> None:
    assert is_warm_start_candidate(job) is candidate
    assert bool(rank_similar(WIDE_DEEP, [job], k=1)) is candidate


def test_ranking_keeps_k_and_breaks_ties_by_recency_then_id() -> None:
    history = [
        past("b-old", WIDE_DEEP, finished_at=NOW - timedelta(days=2)),
        past("c-new", WIDE_DEEP, finished_at=NOW),
        past("a-old", WIDE_DEEP, finished_at=NOW - timedelta(days=2)),
    ]
    assert [m.job_id for m in rank_similar(WIDE_DEEP, history, k=3)] == ["c-new", "a-old", "b-old"]
    assert [m.job_id for m in rank_similar(WIDE_DEEP, history, k=1)] == ["c-new"]


def test_jobs_sharing_nothing_are_not_returned() -> None:
    history = [past("unrelated", JobFeatures(model_name="resnet"))]
    assert rank_similar(JobFeatures(model_name="bert"), history, k=3) == []


def test_k_must_be_positive() -> None:
    with pytest.raises(ValueError):
        rank_similar(WIDE_DEEP, [], k=0)
