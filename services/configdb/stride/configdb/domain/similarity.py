"""Top-k similar past jobs for warm start (DLRover-RM Algorithm 1, lines 2-4).

Algorithm 1 "calculates the similarity in each type of feature and then gets the top-k
similar job configurations"; the paper leaves the measure open. Stride's measure:

- **Per feature.** A categorical feature (model name, family, dataset name, format) scores
  1 if equal, else 0. A numeric feature (records, batch size, embedding dimension,
  parameter count) scores ``min(a, b) / max(a, b)``, which equals ``exp(-|ln a - ln b|)``:
  it depends only on the ratio, so 1,000 vs 2,000 records is as far apart as 1M vs 2M,
  the way resource needs scale; it is 1 only for equal values and tends to 0 as they diverge.
- **Unknown values.** A feature unknown in *both* jobs is left out (no evidence either
  way). A feature known in only one scores 0 (what is known differs).
- **Overall.** The weighted mean of the per-feature scores over the features compared,
  with :class:`FeatureWeights`. It lies in [0, 1], is symmetric, and is exactly 1.0 when
  the features are identical, so an identical past job always ranks first.

Only finished jobs that **succeeded**, whose spec is known and that got at least one plan
are candidates (:func:`is_warm_start_candidate`): their plans are configurations that
carried a job of this kind to the end. A failed job's last plan may be what failed it (an
OOM kill), a cancelled job may never have left its sampling stage, a running job's plan is
not final, and a job without a plan has no configuration to start from. Candidates that
share nothing with the query (similarity 0) are not returned.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from enum import Enum

from stride.configdb.domain.features import JobFeatures


@dataclass(frozen=True)
class FeatureWeights:
    """How much each feature counts in the overall similarity (relative; any positive scale).

    The model's identity dominates because the same model has the same graph, cost per step
    and memory per replica (DLRover-RM collects similar jobs "with model metadata" first).
    Embedding dimension is next: in recommendation models the embedding tables are most of
    the PS memory. The data and batch sizes set how much work there is. The dataset format
    only shifts the input cost a little.
    """

    model_name: float = 3.0
    model_family: float = 1.0
    dataset_name: float = 1.0
    dataset_format: float = 0.5
    record_count: float = 1.0
    batch_size: float = 1.0
    embedding_dim: float = 2.0
    parameter_count: float = 1.0

    def __post_init__(self) -> None:
        for item in fields(self):
            weight = getattr(self, item.name)
            if not weight >= 0:
                raise ValueError(f"{item.name}: weight must not be negative, got {weight}")


DEFAULT_WEIGHTS = FeatureWeights()

_CATEGORICAL = ("model_name", "model_family", "dataset_name", "dataset_format")
_NUMERIC = ("record_count", "batch_size", "embedding_dim", "parameter_count")


def ratio_similarity(a: int, b: int) -> float:
    """``min(a, b) / max(a, b)`` for positive ``a`` and ``b``: 1.0 when equal, towards 0 apart."""
    if a <= 0 or b <= 0:
        raise ValueError(f"sizes must be positive, got {a} and {b}")
    return min(a, b) / max(a, b)


def similarity(a: JobFeatures, b: JobFeatures, weights: FeatureWeights = DEFAULT_WEIGHTS) -> float:
    """The similarity of two jobs' features in [0, 1]; see the module docstring for the measure."""
    total = 0.0
    weighted = 0.0
    for name in (*_CATEGORICAL, *_NUMERIC):
        weight: float = getattr(weights, name)
        left, right = getattr(a, name), getattr(b, name)
        if weight == 0 or (left is None and right is None):
            continue
        if left is None or right is None:
            score = 0.0
        elif name in _CATEGORICAL:
            score = 1.0 if left == right else 0.0
        else:
            score = ratio_similarity(left, right)
        total += weight
        weighted += weight * score
    if total == 0:
        # Nothing compared: equal (all unknown on both sides) or incomparable.
        return 1.0 if a == b else 0.0
    return min(1.0, weighted / total)


class Outcome(Enum):
    """How a recorded job ended."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


@dataclass(frozen=True)
class PastJob:
    """A recorded job as warm start sees it; ``features`` is None until its spec is known."""

    job_id: str
    features: JobFeatures | None
    outcome: Outcome | None
    finished_at: datetime | None
    plan_count: int


@dataclass(frozen=True)
class Match:
    """A candidate and how similar it is to the query."""

    job_id: str
    similarity: float


def is_warm_start_candidate(job: PastJob) -> bool:
    """True for a finished, succeeded job with a known spec and at least one plan."""
    return (
        job.outcome is Outcome.SUCCEEDED
        and job.finished_at is not None
        and job.features is not None
        and job.plan_count > 0
    )


def rank_similar(
    query: JobFeatures,
    history: Iterable[PastJob],
    k: int,
    weights: FeatureWeights = DEFAULT_WEIGHTS,
) -> list[Match]:
    """The ``k`` candidates most similar to ``query``, most similar first.

    Non-candidates and candidates with similarity 0 are skipped. Ties go to the job that
    finished most recently (it ran on the cluster and code closest to today's), then to
    the smaller job id, so the order is deterministic.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    scored: list[tuple[float, datetime, str]] = []
    for job in history:
        features, finished_at = job.features, job.finished_at
        if features is None or finished_at is None or not is_warm_start_candidate(job):
            continue
        score = similarity(query, features, weights)
        if score > 0:
            scored.append((score, finished_at, job.job_id))
    scored.sort(key=lambda item: (-item[0], -item[1].timestamp(), item[2]))
    return [Match(job_id, score) for score, _, job_id in scored[:k]]
