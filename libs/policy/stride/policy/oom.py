"""OOM prediction for parameter servers: act before a growing embedding table kills a PS.

The embedding tables of a recommendation model grow while it trains: every new category
seen adds a row (DLRover-RM sec. 2.2). A PS that runs out of memory dies and takes the
job's progress since the last checkpoint with it, so DLRover-RM predicts the OOM instead of
reacting to it (sec. 5.3): embedding memory is ``M_emb = T D phi_cats``, the new categories
``Delta phi_cats`` are proportional to the samples consumed ``Psi_thp Delta t``, so each PS's
memory grows linearly in the samples the job has consumed. Fitting that line, DLRover-RM
checks "if PSes would exceed the memory capacity before the job completion" and, if so,
"scales the PSes with larger memory capacity" ahead of time.

This module fits, per PS, ``memory = static + growth x consumed_samples`` with both
coefficients non-negative (NNLS: memory does not shrink as a job consumes data, and a
negative static part is meaningless), extrapolates it to the job's last sample, and
proposes both remedies the optimizer can choose from: a larger PS memory, or more PS.

Choices where the paper is silent (each is tested):

- The fit is over all the given points with equal weight; the caller chooses the window.
  A table whose growth slows (fewer new categories later) is over-predicted by the line,
  which errs on the side of a spare GiB rather than a dead PS.
- :data:`DEFAULT_HEADROOM` = 10% is added to a proposal, for the noise of the fit and the
  transient memory of checkpointing.
- Proposed memory is rounded up to a whole GiB, the granularity pods are sized in.
- The proposed PS count assumes the predicted total memory is re-partitioned evenly over
  the new PS (DeepRec's even embedding distribution, which DLRover-RM adopts on PS scaling,
  sec. 4.3). It can equal the current count when the OOM comes only from an uneven
  partition: an even re-partition is then the remedy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import nnls

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec

__all__ = [
    "ALGORITHMS",
    "DEFAULT_HEADROOM",
    "InvalidMemorySamples",
    "OomReply",
    "OomRequest",
    "PsMemoryCurve",
    "PsMemoryForecast",
    "fit_memory_growth",
    "predict_oom",
]

GIB = 1024**3
DEFAULT_HEADROOM = 0.1
"""Fraction added on top of a predicted peak when proposing memory or a PS count."""
MAX_HEADROOM = 10.0
"""A headroom above 1000% is a unit mistake (percent given for a fraction), not a choice."""
OOM_ALGORITHM_NAME = "dlrover-oom-predict"


class InvalidMemorySamples(PolicyError):
    """Memory observations or job progress cannot be used for a prediction."""


def _finite_non_negative(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class PsMemoryCurve:
    """Memory of one PS observed as the job consumed samples: ``memory_bytes[i]`` when the
    job as a whole had consumed ``consumed_samples[i]`` samples."""

    consumed_samples: tuple[float, ...]
    memory_bytes: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.consumed_samples) != len(self.memory_bytes):
            raise InvalidMemorySamples(
                "memory_bytes",
                f"has {len(self.memory_bytes)} values but consumed_samples has "
                f"{len(self.consumed_samples)}",
            )
        if len(self.consumed_samples) < 2:
            raise InvalidMemorySamples(
                "consumed_samples", f"needs at least 2 points, got {len(self.consumed_samples)}"
            )
        for name in ("consumed_samples", "memory_bytes"):
            for index, value in enumerate(getattr(self, name)):
                if not _finite_non_negative(value):
                    raise InvalidMemorySamples(
                        f"{name}[{index}]", f"must be a finite number >= 0, got {value!r}"
                    )
        if len(set(self.consumed_samples)) < 2:
            raise InvalidMemorySamples(
                "consumed_samples", "needs at least 2 distinct values to show a growth"
            )


@dataclass(frozen=True)
class PsMemoryForecast:
    """The fitted growth of one PS and where it leads."""

    ps_index: int
    static_bytes: float
    """Fitted memory at zero consumed samples (parameters, optimizer state, initial table)."""
    bytes_per_sample: float
    """Fitted growth: embedding memory added per consumed sample (sec. 5.3)."""
    predicted_peak_bytes: float
    """Predicted memory when the job completes (at ``total_samples``)."""
    oom_at_samples: float | None
    """Consumed samples at which the PS reaches its limit, if before completion; the
    current count if the line is past the limit already; None if it never does."""


@dataclass(frozen=True)
class OomRequest:
    """Memory curves of a job's PS and how far the job still has to go."""

    curves: tuple[PsMemoryCurve, ...]
    """One curve per PS, in PS index order."""
    ps_memory_limit_bytes: int
    """Memory each PS has (its pod's limit)."""
    consumed_samples: int
    """Samples the job has consumed so far."""
    total_samples: int
    """Samples at which the job completes (steps x global batch, or epochs x records)."""
    throughput: float | None = None
    """Current samples/s, to turn samples-until-OOM into seconds; None to skip that."""
    headroom: float = DEFAULT_HEADROOM
    """Fraction added to a predicted peak when proposing memory or PS count."""

    def __post_init__(self) -> None:
        if not self.curves:
            raise InvalidMemorySamples("curves", "needs one curve per PS, got none")
        for index, curve in enumerate(self.curves):
            if not isinstance(curve, PsMemoryCurve):
                raise InvalidMemorySamples(f"curves[{index}]", "must be a PsMemoryCurve")
        limit = self.ps_memory_limit_bytes
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise InvalidMemorySamples(
                "ps_memory_limit_bytes", f"must be a whole number of bytes > 0, got {limit!r}"
            )
        for name in ("consumed_samples", "total_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidMemorySamples(name, f"must be a whole number >= 0, got {value!r}")
        if self.total_samples < self.consumed_samples:
            raise InvalidMemorySamples(
                "total_samples",
                f"{self.total_samples} is before consumed_samples {self.consumed_samples}",
            )
        if self.throughput is not None and not (
            _finite_non_negative(self.throughput) and self.throughput > 0
        ):
            raise InvalidMemorySamples(
                "throughput", f"must be a finite number > 0 samples/s, got {self.throughput!r}"
            )
        if not _finite_non_negative(self.headroom) or self.headroom > MAX_HEADROOM:
            raise InvalidMemorySamples(
                "headroom", f"must be a fraction in 0..{MAX_HEADROOM}, got {self.headroom!r}"
            )


@dataclass(frozen=True)
class OomReply:
    """Whether a PS is predicted to run out of memory before the job completes, and the
    two remedies (apply either)."""

    forecasts: tuple[PsMemoryForecast, ...]
    oom_predicted: bool
    first_oom_samples: float | None
    """The earliest ``oom_at_samples`` over the PS, None if no PS runs out."""
    seconds_until_oom: float | None
    """(first_oom_samples - consumed) / throughput, when both are known."""
    proposed_ps_memory_bytes: int
    """Memory per PS that holds the largest predicted peak plus headroom (whole GiB), and
    never less than the current limit."""
    proposed_parameter_servers: int
    """PS count whose even share of the predicted total, plus headroom, fits the current
    limit; never fewer than now."""


def fit_memory_growth(curve: PsMemoryCurve) -> tuple[float, float]:
    """(static_bytes, bytes_per_sample) of ``curve``: non-negative least squares."""
    samples = np.asarray(curve.consumed_samples, dtype=np.float64)
    memory = np.asarray(curve.memory_bytes, dtype=np.float64)
    # Scale both columns to order one so NNLS sees a well-conditioned problem.
    sample_scale = float(np.max(samples)) or 1.0
    memory_scale = float(np.max(memory)) or 1.0
    design = np.column_stack([np.ones_like(samples), samples / sample_scale])
    solution, _ = nnls(design, memory / memory_scale)
    static = float(solution[0]) * memory_scale
    growth = float(solution[1]) * memory_scale / sample_scale
    return static, growth


def _forecast(index: int, curve: PsMemoryCurve, request: OomRequest) -> PsMemoryForecast:
    static, growth = fit_memory_growth(curve)
    limit = float(request.ps_memory_limit_bytes)
    peak = static + growth * request.total_samples
    oom_at: float | None = None
    if static + growth * request.consumed_samples >= limit:
        oom_at = float(request.consumed_samples)
    elif growth > 0:
        crossing = (limit - static) / growth
        if crossing <= request.total_samples:
            oom_at = crossing
    return PsMemoryForecast(
        ps_index=index,
        static_bytes=static,
        bytes_per_sample=growth,
        predicted_peak_bytes=peak,
        oom_at_samples=oom_at,
    )


def _whole_gib_at_least(value: float) -> int:
    return math.ceil(value / GIB) * GIB


def predict_oom(request: OomRequest) -> OomReply:
    """Forecast every PS's memory to job completion and propose memory or PS ahead of an
    OOM (DLRover-RM sec. 5.3). See the module docstring for the model and its choices."""
    forecasts = tuple(_forecast(i, curve, request) for i, curve in enumerate(request.curves))
    crossings = [f.oom_at_samples for f in forecasts if f.oom_at_samples is not None]
    first = min(crossings) if crossings else None
    seconds: float | None = None
    if first is not None and request.throughput is not None:
        seconds = max(first - request.consumed_samples, 0.0) / request.throughput
    factor = 1.0 + request.headroom
    limit = request.ps_memory_limit_bytes
    peak = max(f.predicted_peak_bytes for f in forecasts)
    memory = limit if first is None else max(limit, _whole_gib_at_least(peak * factor))
    total = sum(f.predicted_peak_bytes for f in forecasts)
    current_count = len(request.curves)
    count = current_count
    if first is not None:
        count = max(current_count, math.ceil(total * factor / limit))
    return OomReply(
        forecasts=forecasts,
        oom_predicted=first is not None,
        first_oom_samples=first,
        seconds_until_oom=seconds,
        proposed_ps_memory_bytes=memory,
        proposed_parameter_servers=count,
    )


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=OOM_ALGORITHM_NAME,
        version=1,
        description=(
            "PS out-of-memory prediction from linear embedding growth in consumed samples, "
            "with memory and PS-count proposals (DLRover-RM sec. 5.3)"
        ),
        request_type=OomRequest,
        reply_type=OomReply,
        run=predict_oom,
    ),
)
"""This module's registered algorithms."""
