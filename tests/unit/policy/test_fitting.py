"""Online fitting of the throughput model (DLRover-RM sec. 4.3): non-negative, least RMSLE."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from stride.policy.fitting import (
    ALGORITHMS,
    MIN_SAMPLES,
    FitReply,
    FitRequest,
    InvalidSamples,
    fit_throughput_model,
    rmsle,
)
from stride.policy.serialization import from_dict, to_dict
from stride.policy.throughput import (
    PAPER_PARAMETERS,
    Configuration,
    ThroughputParameters,
    throughput,
)

NOISE_SIGMA = 0.05
"""Multiplicative measurement noise: throughput x exp(N(0, 0.05)), about 5%."""


def random_configurations(rng: np.random.Generator, count: int) -> list[Configuration]:
    """Configurations spread log-uniformly over the ranges of the paper's testbed."""

    def log_uniform(low: float, high: float) -> float:
        return float(np.exp(rng.uniform(np.log(low), np.log(high))))

    return [
        Configuration(
            workers=int(rng.integers(1, 33)),
            parameter_servers=int(rng.integers(1, 9)),
            worker_cpu=log_uniform(1, 32),
            ps_cpu=log_uniform(0.5, 16),
            batch_size=int(log_uniform(8, 512)),
            embedding_dim=int(rng.integers(1, 17)),
            model_bytes=log_uniform(1e6, 2e8),
        )
        for _ in range(count)
    ]


def measured(
    params: ThroughputParameters, configs: list[Configuration], rng: np.random.Generator
) -> list[float]:
    return [
        throughput(params, config) * float(np.exp(rng.normal(0.0, NOISE_SIGMA)))
        for config in configs
    ]


def coefficients(params: ThroughputParameters) -> dict[str, float]:
    return {
        "alpha_grad": params.alpha_grad,
        "alpha_upd": params.alpha_upd,
        "alpha_emb": params.alpha_emb,
        "alpha_sync": params.alpha_sync,
        "beta_sum": params.beta_sum,
    }


def test_noise_free_data_recovers_the_papers_coefficients_exactly() -> None:
    configs = random_configurations(np.random.default_rng(0), 50)
    truth = [throughput(PAPER_PARAMETERS, config) for config in configs]
    params, error, _ = fit_throughput_model(configs, truth)
    assert error < 1e-8
    for name, value in coefficients(params).items():
        assert value == pytest.approx(coefficients(PAPER_PARAMETERS)[name], rel=1e-6), name


# Relative tolerances for 400 samples with 5% noise. The widths follow from how much each
# term contributes to the iteration time in these configurations (measured over 40 seeds,
# worst case in brackets): T_grad, T_emb and T_sync are tens to thousands of ms (4%, 1%,
# 3%), T_upd is a few ms (18%), and the betas add 2.45 ms in all (40%): a term that is a
# small part of every measurement is only loosely pinned down by noisy throughputs.
TOLERANCES = {
    "alpha_grad": 0.06,
    "alpha_upd": 0.25,
    "alpha_emb": 0.02,
    "alpha_sync": 0.05,
    "beta_sum": 0.5,
}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_noisy_data_recovers_the_papers_coefficients(seed: int) -> None:
    rng = np.random.default_rng(seed)
    configs = random_configurations(rng, 400)
    params, error, iterations = fit_throughput_model(
        configs, measured(PAPER_PARAMETERS, configs, rng)
    )
    truth = coefficients(PAPER_PARAMETERS)
    for name, value in coefficients(params).items():
        assert value == pytest.approx(truth[name], rel=TOLERANCES[name]), name
    # The residual is the noise, no more: the model is right and the fit found it.
    assert error == pytest.approx(NOISE_SIGMA, rel=0.15)
    assert 1 <= iterations < 20
    # Held out: configurations never seen, against the noise-free truth.
    held_out = random_configurations(rng, 200)
    truth_held_out = [throughput(PAPER_PARAMETERS, config) for config in held_out]
    assert rmsle(params, held_out, truth_held_out) < 0.02


def test_fit_reaches_the_least_rmsle_a_general_optimizer_finds() -> None:
    rng = np.random.default_rng(7)
    configs = random_configurations(rng, 100)
    speeds = measured(PAPER_PARAMETERS, configs, rng)
    params, error, _ = fit_throughput_model(configs, speeds)

    def objective(theta: np.ndarray) -> float:
        candidate = ThroughputParameters.with_beta_sum(
            alpha_grad=theta[0],
            alpha_upd=theta[1],
            alpha_emb=theta[2],
            alpha_sync=theta[3],
            beta_sum=theta[4],
        )
        return rmsle(candidate, configs, speeds)

    start = np.asarray(list(coefficients(params).values()))
    reference = minimize(objective, start, method="L-BFGS-B", bounds=[(0, None)] * 5)
    assert error <= float(reference.fun) + 1e-7
    assert error == pytest.approx(rmsle(params, configs, speeds))


def test_a_term_absent_from_every_sample_gets_a_zero_alpha() -> None:
    rng = np.random.default_rng(11)
    dense = [replace(c, embedding_dim=0, model_bytes=0.0) for c in random_configurations(rng, 60)]
    params, _, _ = fit_throughput_model(dense, measured(PAPER_PARAMETERS, dense, rng))
    assert params.alpha_emb == 0
    assert params.alpha_sync == 0
    assert params.alpha_grad == pytest.approx(3.48, rel=0.1)


def test_identical_samples_give_a_usable_model() -> None:
    config = random_configurations(np.random.default_rng(3), 1)[0]
    params, error, _ = fit_throughput_model([config] * 6, [100.0] * 6)
    assert error < 1e-9
    assert throughput(params, config) == pytest.approx(100.0)


# --- Bad input --------------------------------------------------------------------------

CONFIGS = random_configurations(np.random.default_rng(5), 6)


@pytest.mark.parametrize(
    ("throughputs", "field"),
    [
        ([1.0, 2.0, math.nan, 4.0, 5.0, 6.0], "throughputs[2]"),
        ([1.0, 2.0, 3.0, -4.0, 5.0, 6.0], "throughputs[3]"),
        ([0.0, 2.0, 3.0, 4.0, 5.0, 6.0], "throughputs[0]"),
        ([1.0, 2.0, 3.0, 4.0, 5.0, math.inf], "throughputs[5]"),
        ([1.0, 2.0, 3.0, 4.0, 5.0], "throughputs"),
    ],
)
def test_bad_throughputs_raise_naming_the_field(throughputs: list[float], field: str) -> None:
    with pytest.raises(InvalidSamples) as caught:
        fit_throughput_model(CONFIGS, throughputs)
    assert caught.value.field == field
    with pytest.raises(InvalidSamples) as caught_request:
        FitRequest(tuple(CONFIGS), tuple(throughputs))
    assert caught_request.value.field == field


def test_too_few_samples_raise() -> None:
    with pytest.raises(InvalidSamples) as caught:
        fit_throughput_model(CONFIGS[: MIN_SAMPLES - 1], [1.0] * (MIN_SAMPLES - 1))
    assert caught.value.field == "configurations"
    assert str(MIN_SAMPLES) in caught.value.problem


def test_a_non_configuration_raises_naming_its_index() -> None:
    with pytest.raises(InvalidSamples) as caught:
        fit_throughput_model([*CONFIGS[:5], "w=4"], [1.0] * 6)  # type: ignore[list-item]
    assert caught.value.field == "configurations[5]"


def test_rmsle_rejects_mismatched_and_empty_samples() -> None:
    with pytest.raises(InvalidSamples):
        rmsle(PAPER_PARAMETERS, CONFIGS, [1.0])
    with pytest.raises(InvalidSamples):
        rmsle(PAPER_PARAMETERS, [], [])
    with pytest.raises(InvalidSamples) as caught:
        rmsle(PAPER_PARAMETERS, CONFIGS[:2], [1.0, -1.0])
    assert caught.value.field == "throughputs[1]"


# --- Properties -------------------------------------------------------------------------

sample_configurations = st.builds(
    Configuration,
    workers=st.integers(1, 64),
    parameter_servers=st.integers(1, 16),
    worker_cpu=st.sampled_from([0.5, 1.0, 4.0, 32.0]),
    ps_cpu=st.sampled_from([0.5, 2.0, 16.0]),
    batch_size=st.sampled_from([1, 64, 512, 4096]),
    embedding_dim=st.sampled_from([0, 0, 8, 64]),
    model_bytes=st.sampled_from([0.0, 1e6, 1e9]),
)
speeds = st.floats(1e-3, 1e7, allow_nan=False, allow_infinity=False)


@st.composite
def sample_sets(draw: st.DrawFn) -> tuple[list[Configuration], list[float]]:
    count = draw(st.integers(MIN_SAMPLES, 30))
    if draw(st.booleans()):
        # Degenerate: few distinct configurations repeated, unrelated throughputs.
        pool = draw(st.lists(sample_configurations, min_size=1, max_size=2))
        configs = [draw(st.sampled_from(pool)) for _ in range(count)]
    else:
        configs = draw(st.lists(sample_configurations, min_size=count, max_size=count))
    return configs, draw(st.lists(speeds, min_size=count, max_size=count))


@settings(max_examples=150, deadline=None)
@given(sample_sets())
def test_fitted_parameters_are_never_negative(
    samples: tuple[list[Configuration], list[float]],
) -> None:
    configs, throughputs = samples
    params, error, _ = fit_throughput_model(configs, throughputs)
    assert all(value >= 0 for value in coefficients(params).values())
    assert math.isfinite(error)
    assert error == pytest.approx(rmsle(params, configs, throughputs), abs=1e-9)
    # Never worse than the best constant-time model, where the fit may start.
    log_times = np.log(
        [c.workers * c.batch_size * 1000.0 / s for c, s in zip(configs, throughputs, strict=True)]
    )
    constant = float(np.sqrt(np.mean((log_times - log_times.mean()) ** 2)))
    assert error <= constant + 1e-9
    for config in configs:
        assert 0 < throughput(params, config) < math.inf


# --- Registered fit ---------------------------------------------------------------------


def test_fit_round_trips_and_runs_through_the_spec() -> None:
    rng = np.random.default_rng(9)
    configs = random_configurations(rng, 20)
    request = FitRequest(tuple(configs), tuple(measured(PAPER_PARAMETERS, configs, rng)))
    assert from_dict(FitRequest, to_dict(request)) == request
    (spec,) = ALGORITHMS
    assert spec.name == "dlrover-throughput-fit"
    reply = spec.run_typed(request)
    assert isinstance(reply, FitReply)
    assert reply.sample_count == 20
    assert from_dict(FitReply, to_dict(reply)) == reply
    assert spec.run_dict(to_dict(request)) == to_dict(reply)
