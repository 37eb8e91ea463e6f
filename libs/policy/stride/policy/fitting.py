"""Online fitting of the throughput model: non-negative parameters at least RMSLE.

DLRover-RM measures each running job's iteration time and, "at a fixed interval", refits
the alphas and betas of its throughput model "minimizing the root mean squared logarithmic
error (RMSLE) between the theoretical model and the actual data (by employing Non-Negative
Least Squares (NNLS))", with every parameter "bound to remain non-negative" (sec. 4.3,
stage 2; sec. 6, Fig. 11). The optimizer needs those parameters before it can search for a
better plan, so this module turns ``(configuration, measured throughput)`` samples into
:class:`~stride.policy.throughput.ThroughputParameters`.

How NNLS minimizes a *logarithmic* error
----------------------------------------
The model is linear in its parameters once written for the iteration time::

    T_iter(config) = x(config) . theta,   x = (m/lambda_w, w/(p lambda_p), m D/p, sync_ms, 1)
    theta = (alpha_grad, alpha_upd, alpha_emb, alpha_sync, beta_sum)

(:func:`~stride.policy.throughput.feature_row`; the four betas only ever appear as their
sum). A measured throughput gives ``t = w m / Psi``, and because ``log Psi_pred - log Psi =
log t - log T_pred``, the RMSLE of the throughputs is the RMS of ``log(x . theta) - log t``.
That is not linear in theta, but its Gauss-Newton linearization around the current
prediction ``q = x . theta_k`` is::

    log(x . theta) - log t  ~=  (x / q) . theta - (1 + log(t / q))

so each step is a plain NNLS problem, ``min ||A theta - b||, theta >= 0`` with rows
``A_i = x_i / q_i`` and ``b_i = 1 + log(t_i / q_i)`` (:func:`scipy.optimize.nnls`). NNLS
keeps every iterate non-negative, and a step that does not lower the RMSLE is halved
towards the previous iterate (a convex combination, so still non-negative) until it does:
the RMSLE never increases. The start is the relative-error NNLS (rows ``x_i / t_i``,
``b_i = 1``), the same linearization taken at the data, or the best constant model
(``beta_sum`` = geometric mean of ``t``) if that one predicts a zero time somewhere.
Columns are scaled to a unit maximum before each solve, since ``m D / p`` is in the
thousands where ``w / (p lambda_p)`` is below one.

Choices where the paper is silent (each is tested):

- RMSLE uses ``log`` rather than ``log(1 + .)``: throughputs are samples/s, far above one,
  and the plain logarithm makes the error a pure relative one that does not depend on the
  unit of throughput.
- The fitted ``beta_sum`` is split evenly over the four betas
  (:meth:`~stride.policy.throughput.ThroughputParameters.with_beta_sum`).
- A regressor that is zero in every sample (``D = 0`` for a model without embeddings,
  ``M = 0`` when the model size is unknown) leaves its alpha at exactly 0.
- At least :data:`MIN_SAMPLES` samples are required; identical samples are accepted and
  give some non-negative least-RMSLE solution among the many that exist.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec
from stride.policy.throughput import (
    MILLISECONDS_PER_SECOND,
    Configuration,
    ThroughputParameters,
    feature_row,
)

__all__ = [
    "ALGORITHMS",
    "MIN_SAMPLES",
    "FitReply",
    "FitRequest",
    "InvalidSamples",
    "fit_throughput_model",
    "rmsle",
    "run_fit",
]

FloatArray = npt.NDArray[np.float64]

MIN_SAMPLES = 5
"""The model has five identifiable coefficients (four alphas and the sum of the betas), so
fewer samples cannot pin it down even when they differ."""
MAX_ITERATIONS = 50
"""Gauss-Newton steps; it converges in well under ten on the paper's model."""
RELATIVE_TOLERANCE = 1e-9
"""Stop once a step lowers the RMSLE by less than this fraction."""
MAX_STEP_HALVINGS = 30


class InvalidSamples(PolicyError):
    """The samples to fit cannot be used: too few, mismatched, NaN or non-positive."""


def _validate(
    configurations: Sequence[Configuration],
    throughputs: Sequence[float],
    minimum: int = MIN_SAMPLES,
) -> None:
    if len(configurations) != len(throughputs):
        raise InvalidSamples(
            "throughputs",
            f"has {len(throughputs)} values but configurations has {len(configurations)}",
        )
    if len(configurations) < minimum:
        raise InvalidSamples(
            "configurations", f"needs at least {minimum} samples, got {len(configurations)}"
        )
    for index, config in enumerate(configurations):
        if not isinstance(config, Configuration):
            raise InvalidSamples(f"configurations[{index}]", "must be a Configuration")
    for index, value in enumerate(throughputs):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InvalidSamples(
                f"throughputs[{index}]", f"must be a finite number > 0 samples/s, got {value!r}"
            )


def _design(configurations: Sequence[Configuration]) -> FloatArray:
    rows = [(*feature_row(config), 1.0) for config in configurations]
    return np.asarray(rows, dtype=np.float64)


def _iteration_times_ms(
    configurations: Sequence[Configuration], throughputs: Sequence[float]
) -> FloatArray:
    samples_per_iteration = np.asarray(
        [config.workers * config.batch_size for config in configurations], dtype=np.float64
    )
    return samples_per_iteration * MILLISECONDS_PER_SECOND / np.asarray(throughputs, np.float64)


def _log_rmse(design: FloatArray, theta: FloatArray, log_times: FloatArray) -> float:
    predicted = design @ theta
    if not np.all(predicted > 0):
        return math.inf
    return float(np.sqrt(np.mean((np.log(predicted) - log_times) ** 2)))


def _scaled_nnls(matrix: FloatArray, target: FloatArray) -> FloatArray:
    scale = np.max(np.abs(matrix), axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(matrix / scale, target)
    return np.asarray(solution / scale, dtype=np.float64)


def _solve(design: FloatArray, times: FloatArray) -> tuple[FloatArray, float, int]:
    """Non-negative theta at least log error; returns (theta, rmsle, iterations)."""
    log_times = np.log(times)
    constant = np.zeros(design.shape[1])
    constant[-1] = float(np.exp(np.mean(log_times)))
    theta = _scaled_nnls(design / times[:, None], np.ones_like(times))
    error = _log_rmse(design, theta, log_times)
    constant_error = _log_rmse(design, constant, log_times)
    if constant_error <= error:
        theta, error = constant, constant_error
    iterations = 0
    while iterations < MAX_ITERATIONS:
        iterations += 1
        predicted = design @ theta
        proposal = _scaled_nnls(design / predicted[:, None], 1.0 + log_times - np.log(predicted))
        step = 1.0
        for _ in range(MAX_STEP_HALVINGS):
            candidate = theta + step * (proposal - theta)
            candidate_error = _log_rmse(design, candidate, log_times)
            if candidate_error <= error:
                break
            step /= 2.0
        else:
            break
        improvement = error - candidate_error
        theta, error = np.maximum(candidate, 0.0), candidate_error
        if improvement <= RELATIVE_TOLERANCE * max(error, 1e-12):
            break
    return theta, error, iterations


def fit_throughput_model(
    configurations: Sequence[Configuration], throughputs: Sequence[float]
) -> tuple[ThroughputParameters, float, int]:
    """Fit the model to measured throughputs (samples/s); see the module docstring.

    Returns the non-negative parameters, their RMSLE on the samples and the number of
    Gauss-Newton steps taken. Raises :class:`InvalidSamples` naming the bad field.
    """
    _validate(configurations, throughputs)
    design = _design(configurations)
    theta, error, iterations = _solve(design, _iteration_times_ms(configurations, throughputs))
    alpha_grad, alpha_upd, alpha_emb, alpha_sync, beta_sum = (float(v) for v in theta)
    params = ThroughputParameters.with_beta_sum(
        alpha_grad=alpha_grad,
        alpha_upd=alpha_upd,
        alpha_emb=alpha_emb,
        alpha_sync=alpha_sync,
        beta_sum=beta_sum,
    )
    return params, error, iterations


def rmsle(
    params: ThroughputParameters,
    configurations: Sequence[Configuration],
    throughputs: Sequence[float],
) -> float:
    """sqrt(mean((log Psi_pred - log Psi)^2)) over the samples; inf if a prediction is
    infinite (parameters that predict a zero iteration time)."""
    _validate(configurations, throughputs, minimum=1)
    theta = np.asarray(
        [
            params.alpha_grad,
            params.alpha_upd,
            params.alpha_emb,
            params.alpha_sync,
            params.beta_sum,
        ]
    )
    times = _iteration_times_ms(configurations, throughputs)
    return _log_rmse(_design(configurations), theta, np.log(times))


# --- The registered fit -----------------------------------------------------------------

FIT_ALGORITHM_NAME = "dlrover-throughput-fit"


@dataclass(frozen=True)
class FitRequest:
    """Samples of one job: ``throughputs[i]`` (samples/s) was measured under
    ``configurations[i]``."""

    configurations: tuple[Configuration, ...]
    throughputs: tuple[float, ...]

    def __post_init__(self) -> None:
        _validate(self.configurations, self.throughputs)


@dataclass(frozen=True)
class FitReply:
    """The fitted model and how well it fits."""

    params: ThroughputParameters
    rmsle: float
    """RMSLE of the fitted model on the request's samples."""
    iterations: int
    """Gauss-Newton steps taken (0 if the start was already optimal)."""
    sample_count: int


def run_fit(request: FitRequest) -> FitReply:
    """The registry entry point of ``dlrover-throughput-fit``."""
    params, error, iterations = fit_throughput_model(request.configurations, request.throughputs)
    return FitReply(
        params=params,
        rmsle=error,
        iterations=iterations,
        sample_count=len(request.configurations),
    )


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=FIT_ALGORITHM_NAME,
        version=1,
        description=(
            "Non-negative least-RMSLE fit of the 8-parameter throughput model by "
            "Gauss-Newton NNLS steps (DLRover-RM sec. 4.3 online model fitting, eq. 1-6)"
        ),
        request_type=FitRequest,
        reply_type=FitReply,
        run=run_fit,
    ),
)
"""This module's registered algorithms."""
