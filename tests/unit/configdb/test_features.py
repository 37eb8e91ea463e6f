"""Feature extraction: normalization and unknown values."""

from __future__ import annotations

from stride.configdb.domain.features import JobFeatures, extract_features


def test_names_are_case_folded_and_whitespace_collapsed() -> None:
    features = extract_features(model_name="  Wide-And  Deep ", model_family="DLRM")
    assert features.model_name == "wide-and deep"
    assert features.model_family == "dlrm"


def test_empty_and_non_positive_values_are_unknown() -> None:
    features = extract_features(
        model_name="   ", dataset_name="", record_count=0, batch_size=-3, embedding_dim=0
    )
    assert features == JobFeatures()
    assert features.is_empty


def test_positive_counts_are_kept() -> None:
    features = extract_features(
        record_count=100_000, batch_size=512, embedding_dim=16, parameter_count=1_000_000
    )
    assert (features.record_count, features.batch_size) == (100_000, 512)
    assert (features.embedding_dim, features.parameter_count) == (16, 1_000_000)
    assert not features.is_empty
