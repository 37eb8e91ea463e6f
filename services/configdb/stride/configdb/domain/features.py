"""The features of a job that warm start compares (DLRover-RM sec. 3 and Algorithm 1).

DLRover-RM finds similar past jobs "with metadata": the model, its size and the data it
trains on predict the resources a job ends up with far better than its name does. A
feature the submitter did not give is *unknown* (``None``), never zero, so that a missing
value is not mistaken for a tiny one. Extraction normalizes what differs only in spelling
(case, surrounding spaces), because "Wide-And-Deep" and "wide-and-deep " are the same model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class JobFeatures:
    """What warm start knows about a job before it runs; ``None`` means unknown.

    Categorical features are normalized names; numeric features are positive counts.
    """

    model_name: str | None = None
    """The model, e.g. ``wide-and-deep``: the same model has the same graph and cost per step."""
    model_family: str | None = None
    """The model family, e.g. ``dlrm``: related models scale alike."""
    dataset_name: str | None = None
    """The dataset: a job re-trained on the same data (e.g. daily) needs the same resources."""
    dataset_format: str | None = None
    """How the data is stored (``tfrecord``, ``stream``...): it changes the input cost."""
    record_count: int | None = None
    """Records per epoch: the amount of work."""
    batch_size: int | None = None
    """Global batch size: the work per step and the memory of each worker."""
    embedding_dim: int | None = None
    """Embedding dimension: with recommendation models it dominates PS memory."""
    parameter_count: int | None = None
    """Dense parameters: the size of the model on the PS and the gradient traffic."""

    @property
    def is_empty(self) -> bool:
        """True if no feature is known, so there is nothing to compare."""
        return all(value is None for value in vars(self).values())


def _name(value: str) -> str | None:
    normalized = " ".join(value.split()).casefold()
    return normalized or None


def _count(value: int) -> int | None:
    # proto3 cannot tell "0" from "not set"; zero and below are not real sizes either way.
    return value if value > 0 else None


def extract_features(
    *,
    model_name: str = "",
    model_family: str = "",
    dataset_name: str = "",
    dataset_format: str = "",
    record_count: int = 0,
    batch_size: int = 0,
    embedding_dim: int = 0,
    parameter_count: int = 0,
) -> JobFeatures:
    """The normalized features of a job from the raw fields of its spec.

    Empty strings and non-positive numbers become unknown; names are case-folded with
    their whitespace collapsed.
    """
    return JobFeatures(
        model_name=_name(model_name),
        model_family=_name(model_family),
        dataset_name=_name(dataset_name),
        dataset_format=_name(dataset_format),
        record_count=_count(record_count),
        batch_size=_count(batch_size),
        embedding_dim=_count(embedding_dim),
        parameter_count=_count(parameter_count),
    )
