"""Warm start: a new job's first plan from the plans that worked for similar past jobs.

A cold start (:mod:`stride.policy.cold_start`) makes every job climb from a sampling
configuration to a good one, one scaling step at a time. DLRover-RM's pre-scaling stage
(sec. 4.3, stage 1, Algorithm 1) skips most of the climb: it finds the top-k historical jobs
most similar to the new one in the Config DB, ranks them by similarity, and blends their final
configurations with exponential smoothing (eq. 10) so that the most similar job weighs most.
The paper reports initial configurations within 92 % (workers) and 85 % (PS) of the final ones
and 26 % less scaling time than a cold start (sec. 6, Fig. 9).

Algorithm 1, as implemented here:

1. score every historical job against the new one (:func:`similarity`), per feature, then as
   a weighted mean (the paper "calculates the similarity in each type of feature");
2. keep the ``k`` best, ordered from least to most similar: ``A^0 .. A^{k-1}``, so that
   ``A^{k-1}`` is the most similar job (the paper's convention);
3. ``A_bar^0 = A^0`` and ``A_bar^i = mu·A^i + (1-mu)·A_bar^{i-1}`` for i = 1..k-1 (eq. 10);
4. return ``A_bar^{k-1}``, counts and memory rounded to whole numbers.

Choices where the paper is silent (each tested):

- The paper gives no similarity function. Stride compares each feature of
  :class:`~stride.policy.cold_start.JobFeatures`: names exactly (same model, same family),
  sizes by ratio ``min/max`` (a batch of 512 is as close to 1024 as 1024 to 2048), and weighs
  them by :data:`FEATURE_WEIGHTS`.
- The paper gives no ``k`` and no ``mu``: :data:`DEFAULT_TOP_K` = 5 and
  :data:`DEFAULT_SMOOTHING` = 0.5 (so the most similar job carries half the weight).
- Ties in similarity are broken by job id (the smaller id counts as more similar), so the
  result does not depend on the order of the history.
- Eq. 10 is evaluated as ``A_bar^{i-1} + mu·(A^i - A_bar^{i-1})``: the same value in exact
  arithmetic, and it returns a configuration unchanged when every neighbour has it (the
  textbook form can be off by one ulp there).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stride.policy.cold_start import CHIEF_CPU, CHIEF_MEMORY_BYTES, JobFeatures
from stride.policy.errors import PolicyError
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.registry import AlgorithmSpec
from stride.vocabulary import check_cpu, check_memory_bytes, check_pod_count

ALGORITHM_NAME = "dlrover-warm-start"
"""Registered name of the algorithm."""
ALGORITHM_VERSION = 1
"""Bump when the similarity or the defaults change."""
ALGORITHM = f"{ALGORITHM_NAME}/{ALGORITHM_VERSION}"
"""``name/version`` as stored in every plan this module makes."""

DEFAULT_TOP_K = 5
"""Neighbours blended (Algorithm 1's k; no value in the paper). Five is enough for the
smoothing to damp one odd neighbour and few enough that weakly similar jobs carry little
weight: with mu = 0.5 the five weights are 1/16, 1/16, 1/8, 1/4, 1/2."""
DEFAULT_SMOOTHING = 0.5
"""Smoothing factor mu of eq. 10 (0 < mu < 1; no value in the paper): the most similar job
gets weight mu, the next mu(1-mu), and so on."""

FEATURE_WEIGHTS: dict[str, float] = {
    "model_name": 0.35,
    "family": 0.15,
    "embedding_dim": 0.15,
    "batch_size": 0.15,
    "record_count": 0.10,
    "total_steps": 0.10,
}
"""Weight of each feature's similarity (they sum to 1). The model decides the per-sample
compute and the PS traffic (eq. 2-5), so its name weighs most; family and embedding
dimension stand in for it when names differ (eq. 5 depends on D); the batch size m enters
eq. 2 and 5 directly; data size and steps decide how long resources are held, not their
shape, so they weigh least."""


class InvalidHistory(PolicyError):
    """The history to warm-start from is unusable (empty, duplicated ids, bad values)."""


class InvalidWarmStartRequest(PolicyError):
    """A warm-start parameter is out of range (k < 1, mu outside (0, 1), ...)."""


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class ResourceConfiguration:
    """A job's PS/worker configuration, the ``A`` of Algorithm 1 (DLRover-RM Table 3)."""

    worker_count: int
    """Workers, w; at least one."""
    worker_cpu: float
    """CPU cores per worker, lambda_w; positive."""
    worker_memory_bytes: int
    """Memory per worker in bytes; positive."""
    ps_count: int
    """Parameter servers, p; zero for a job without PS."""
    ps_cpu: float
    """CPU cores per PS, lambda_p; positive (kept even when ps_count is 0, as in a Plan)."""
    ps_memory_bytes: int
    """Memory per PS in bytes; positive."""

    def __post_init__(self) -> None:
        check_pod_count(self.worker_count, "worker_count", minimum=1, raise_as=InvalidHistory)
        check_pod_count(self.ps_count, "ps_count", raise_as=InvalidHistory)
        check_cpu(self.worker_cpu, "worker_cpu", positive=True, raise_as=InvalidHistory)
        check_cpu(self.ps_cpu, "ps_cpu", positive=True, raise_as=InvalidHistory)
        check_memory_bytes(
            self.worker_memory_bytes, "worker_memory_bytes", positive=True, raise_as=InvalidHistory
        )
        check_memory_bytes(
            self.ps_memory_bytes, "ps_memory_bytes", positive=True, raise_as=InvalidHistory
        )

    def as_vector(self) -> tuple[float, ...]:
        """The six components, in field order, as floats (for smoothing)."""
        return (
            float(self.worker_count),
            float(self.worker_cpu),
            float(self.worker_memory_bytes),
            float(self.ps_count),
            float(self.ps_cpu),
            float(self.ps_memory_bytes),
        )


@dataclass(frozen=True)
class HistoricalJob:
    """One finished (or long-running) job in the Config DB: its features and the
    configuration it ended with (DLRover-RM sec. 3, "Config DB")."""

    job_id: str
    features: JobFeatures
    configuration: ResourceConfiguration

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise InvalidHistory("job_id", "is required")
        if not isinstance(self.features, JobFeatures):
            raise InvalidHistory("features", f"must be JobFeatures, got {type(self.features)}")
        if not isinstance(self.configuration, ResourceConfiguration):
            raise InvalidHistory(
                "configuration",
                f"must be a ResourceConfiguration, got {type(self.configuration).__name__}",
            )


def _ratio(left: float, right: float) -> float:
    """``min/max`` of two non-negative sizes: 1 when equal (both zero included), 0 when one
    is zero and the other is not."""
    if left == right:
        return 1.0
    return min(left, right) / max(left, right)


def feature_similarities(new: JobFeatures, old: JobFeatures) -> dict[str, float]:
    """Similarity in [0, 1] of each feature of :data:`FEATURE_WEIGHTS` ("the similarity in
    each type of feature", Algorithm 1). An unknown (empty) family matches nothing."""
    return {
        "model_name": 1.0 if new.model_name == old.model_name else 0.0,
        "family": 1.0 if new.family and new.family == old.family else 0.0,
        "embedding_dim": _ratio(new.embedding_dim, old.embedding_dim),
        "batch_size": _ratio(new.batch_size, old.batch_size),
        "record_count": _ratio(new.record_count, old.record_count),
        "total_steps": _ratio(new.total_steps, old.total_steps),
    }


def similarity(new: JobFeatures, old: JobFeatures) -> float:
    """Weighted mean of :func:`feature_similarities`, in [0, 1]; 1 for identical features
    with a known family (an empty family scores 0 on that feature)."""
    parts = feature_similarities(new, old)
    return math.fsum(FEATURE_WEIGHTS[name] * parts[name] for name in FEATURE_WEIGHTS)


@dataclass(frozen=True)
class Neighbour:
    """A historical job used by a warm start, and how similar it was."""

    job_id: str
    similarity: float


@dataclass(frozen=True)
class WarmStartRequest:
    """The executor's request type for ``dlrover-warm-start``."""

    features: JobFeatures
    """The new job's features."""
    history: tuple[HistoricalJob, ...]
    """Candidate neighbours (the Config DB's answer to a similar-jobs query); ids unique."""
    top_k: int = DEFAULT_TOP_K
    """k of Algorithm 1; fewer are used when the history is shorter."""
    smoothing: float = DEFAULT_SMOOTHING
    """mu of eq. 10, strictly between 0 and 1."""
    min_similarity: float = 0.0
    """Ignore history less similar than this (0 keeps all, as the paper does). A caller that
    prefers a cold start over a warm start from unrelated jobs raises it."""

    def __post_init__(self) -> None:
        if not isinstance(self.features, JobFeatures):
            raise InvalidWarmStartRequest(
                "features", f"must be JobFeatures, got {type(self.features).__name__}"
            )
        object.__setattr__(self, "history", tuple(self.history))
        seen: set[str] = set()
        for position, job in enumerate(self.history):
            if not isinstance(job, HistoricalJob):
                raise InvalidHistory(
                    f"history[{position}]", f"must be a HistoricalJob, got {type(job).__name__}"
                )
            if job.job_id in seen:
                raise InvalidHistory(
                    f"history[{position}].job_id", f"{job.job_id!r} appears more than once"
                )
            seen.add(job.job_id)
        if not _is_integer(self.top_k) or self.top_k < 1:
            raise InvalidWarmStartRequest(
                "top_k", f"must be a whole number >= 1, got {self.top_k!r}"
            )
        if not _is_number(self.smoothing) or not 0 < self.smoothing < 1:
            raise InvalidWarmStartRequest(
                "smoothing",
                f"must be strictly between 0 and 1 (Algorithm 1), got {self.smoothing!r}",
            )
        if not _is_number(self.min_similarity) or not 0 <= self.min_similarity <= 1:
            raise InvalidWarmStartRequest(
                "min_similarity", f"must be in [0, 1], got {self.min_similarity!r}"
            )


@dataclass(frozen=True)
class WarmStartReply:
    """The warm-start configuration, its plan, and the neighbours it came from."""

    configuration: ResourceConfiguration
    """``A_bar^{k-1}`` with counts and memory rounded half up to whole numbers."""
    neighbours: tuple[Neighbour, ...]
    """``A^0 .. A^{k-1}`` as blended: least similar first, most similar last."""
    plan: Plan
    """The configuration as a plan: a chief (cold-start size), the PS and the workers."""


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def top_neighbours(
    features: JobFeatures,
    history: tuple[HistoricalJob, ...],
    top_k: int,
    min_similarity: float = 0.0,
) -> list[tuple[HistoricalJob, float]]:
    """The ``top_k`` most similar jobs at or above ``min_similarity``, least similar first
    (Algorithm 1, lines 2-4). Ties go by job id, the smaller id counting as more similar."""
    scored = [(job, similarity(features, job.features)) for job in history]
    scored = [(job, score) for job, score in scored if score >= min_similarity]
    # Most similar first, then smaller id first; keep k, then reverse to A^0..A^{k-1}.
    scored.sort(key=lambda pair: (-pair[1], pair[0].job_id))
    return list(reversed(scored[:top_k]))


def smooth(configurations: list[ResourceConfiguration], smoothing: float) -> tuple[float, ...]:
    """Eq. 10 over ``A^0 .. A^{k-1}``: the smoothed vector ``A_bar^{k-1}`` (unrounded)."""
    if not configurations:
        raise InvalidHistory("history", "no configuration to smooth")
    smoothed = list(configurations[0].as_vector())
    for configuration in configurations[1:]:
        for index, value in enumerate(configuration.as_vector()):
            # A_bar + mu (A - A_bar), not mu A + (1 - mu) A_bar: equal inputs come back exactly.
            smoothed[index] += smoothing * (value - smoothed[index])
    return tuple(smoothed)


def warm_start(request: WarmStartRequest) -> WarmStartReply:
    """Algorithm 1 (DLRover-RM sec. 4.3): the smoothed configuration of the top-k similar
    jobs. Raises :class:`InvalidHistory` when no historical job qualifies."""
    neighbours = top_neighbours(
        request.features, request.history, request.top_k, request.min_similarity
    )
    if not neighbours:
        problem = (
            "is empty"
            if not request.history
            else f"has no job with similarity >= {request.min_similarity}"
        )
        raise InvalidHistory("history", f"{problem}; use a cold start")
    vector = smooth([job.configuration for job, _ in neighbours], request.smoothing)
    worker_count, worker_cpu, worker_memory, ps_count, ps_cpu, ps_memory = vector
    # A convex combination stays inside the neighbours' ranges, so rounding keeps each value
    # valid (>= 1 worker, >= 1 byte) and the constructor re-checks anyway.
    configuration = ResourceConfiguration(
        worker_count=max(1, _round_half_up(worker_count)),
        worker_cpu=worker_cpu,
        worker_memory_bytes=max(1, _round_half_up(worker_memory)),
        ps_count=_round_half_up(ps_count),
        ps_cpu=ps_cpu,
        ps_memory_bytes=max(1, _round_half_up(ps_memory)),
    )
    plan = Plan(
        roles=(
            RoleResources(Role.CHIEF, 1, CHIEF_CPU, CHIEF_MEMORY_BYTES),
            RoleResources(
                Role.PS, configuration.ps_count, configuration.ps_cpu, configuration.ps_memory_bytes
            ),
            RoleResources(
                Role.WORKER,
                configuration.worker_count,
                configuration.worker_cpu,
                configuration.worker_memory_bytes,
            ),
        ),
        reason=f"warm start from {len(neighbours)} similar job(s)",
        algorithm=ALGORITHM,
    )
    return WarmStartReply(
        configuration=configuration,
        neighbours=tuple(Neighbour(job.job_id, score) for job, score in neighbours),
        plan=plan,
    )


def run(request: WarmStartRequest) -> WarmStartReply:
    """The registry entry point: :func:`warm_start`."""
    return warm_start(request)


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=ALGORITHM_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "Warm-start plan: top-k similar historical jobs blended by exponential smoothing "
            "(DLRover-RM sec. 4.3, Algorithm 1, eq. 10)"
        ),
        request_type=WarmStartRequest,
        reply_type=WarmStartReply,
        run=run,
    ),
)
"""The algorithms this module registers."""


# --- a scaling curve from similar jobs' measurements (admission's warm start) -------------


@dataclass(frozen=True)
class MeasuredPoint:
    """One configuration a past job ran, and how fast: what admission's curve is built of."""

    workers: int
    ps: int
    steps_per_second: float
    cpu: float
    """Cores the job held in all at this configuration (chief and data workers included)."""
    memory_bytes: int


@dataclass(frozen=True)
class MeasuredRun:
    """A similar finished job: its id, how similar, and the configurations it measured."""

    job_id: str
    similarity: float
    points: tuple[MeasuredPoint, ...]


def blended_points(
    runs: Sequence[MeasuredRun],
    top_k: int = DEFAULT_TOP_K,
    smoothing: float = DEFAULT_SMOOTHING,
) -> tuple[tuple[MeasuredPoint, ...], tuple[str, ...]]:
    """The points of a new job's warm-start curve, and the runs they came from.

    Algorithm 1 (DLRover-RM sec. 4.3) blends the final configurations of the top-k similar
    jobs; admission needs a curve, so it blends what they *measured* instead: the ``top_k``
    runs with points, least similar first (ties by job id, as :func:`top_neighbours`), and
    per configuration (workers, PS) its speed smoothed by eq. 10 over the runs that measured
    it, the most similar last, with that run's sizes. Departure: the paper blends
    configurations, not measurements; a configuration only one run measured keeps that
    run's speed. Runs with no point, or a point that is not a positive finite speed, are
    skipped; none left gives no point."""
    if not 0 < smoothing < 1:
        raise InvalidWarmStartRequest("smoothing", f"must be in (0, 1), got {smoothing}")
    if top_k < 1:
        raise InvalidWarmStartRequest("top_k", f"must be >= 1, got {top_k}")
    usable = []
    for run in runs:
        points = tuple(
            point
            for point in run.points
            if point.workers >= 1
            and point.ps >= 0
            and math.isfinite(point.steps_per_second)
            and point.steps_per_second > 0
            and math.isfinite(point.cpu)
            and point.cpu > 0
            and point.memory_bytes > 0
        )
        if points and math.isfinite(run.similarity):
            usable.append(MeasuredRun(run.job_id, run.similarity, points))
    usable.sort(key=lambda run: (-run.similarity, run.job_id))
    chosen = list(reversed(usable[:top_k]))  # least similar first, as A^0 .. A^{k-1}
    blended: dict[tuple[int, int], MeasuredPoint] = {}
    for run in chosen:
        for point in run.points:
            key = (point.workers, point.ps)
            earlier = blended.get(key)
            if earlier is None:
                blended[key] = point
                continue
            rate = earlier.steps_per_second + smoothing * (
                point.steps_per_second - earlier.steps_per_second
            )
            blended[key] = MeasuredPoint(
                point.workers, point.ps, rate, point.cpu, point.memory_bytes
            )
    ordered = tuple(blended[key] for key in sorted(blended))
    return ordered, tuple(run.job_id for run in reversed(chosen))
