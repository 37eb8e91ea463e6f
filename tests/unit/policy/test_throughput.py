"""The DLRover-RM throughput model (eq. 1-6), resource cost (eq. 7) and gain (eq. 8)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.errors import PolicyError
from stride.policy.serialization import from_dict, to_dict
from stride.policy.throughput import (
    ALGORITHMS,
    GIB,
    PAPER_PARAMETERS,
    Configuration,
    DegenerateModel,
    InvalidConfiguration,
    InvalidParameters,
    PredictReply,
    PredictRequest,
    ResourcePrices,
    ScalingOverhead,
    ThroughputParameters,
    iteration_time,
    overhead_seconds,
    resource_cost,
    run_predict,
    throughput,
    throughput_gain,
)

BASE = Configuration(
    workers=8,
    parameter_servers=4,
    worker_cpu=16.0,
    ps_cpu=8.0,
    batch_size=512,
    worker_memory_bytes=16 * GIB,
    ps_memory_bytes=32 * GIB,
    embedding_dim=8,
    model_bytes=1e8,
    bandwidth_bytes_per_second=1.25e9,
)


def only(**alphas: float) -> ThroughputParameters:
    values = dict.fromkeys(
        (
            "alpha_grad",
            "beta_grad",
            "alpha_upd",
            "beta_upd",
            "alpha_emb",
            "beta_emb",
            "alpha_sync",
            "beta_sync",
        ),
        0.0,
    )
    values.update(alphas)
    return ThroughputParameters(**values)


def test_worked_example_with_the_papers_coefficients() -> None:
    # m/lambda_w = 32, w/(p lambda_p) = 0.25, m D/p = 1024, (M/p)/(B/w) = 0.16 s = 160 ms.
    parts = iteration_time(PAPER_PARAMETERS, BASE)
    assert parts.grad_ms == pytest.approx(3.48 * 32 + 2.45 / 4)
    assert parts.update_ms == pytest.approx(2.36 * 0.25 + 2.45 / 4)
    assert parts.embedding_ms == pytest.approx(2.45 * 1024 + 2.45 / 4)
    assert parts.sync_ms == pytest.approx(0.68 * 160 + 2.45 / 4)
    total = 3.48 * 32 + 2.36 * 0.25 + 2.45 * 1024 + 0.68 * 160 + 2.45
    assert parts.total_ms == pytest.approx(total)
    assert parts.computation_ms + parts.communication_ms == pytest.approx(total)
    assert throughput(PAPER_PARAMETERS, BASE) == pytest.approx(8 * 512 * 1000 / total)


@pytest.mark.parametrize(
    ("params", "change", "faster"),
    [
        (only(alpha_grad=1.0), {"worker_cpu": 32.0}, True),  # eq. 2: more worker cores
        (only(alpha_upd=1.0), {"ps_cpu": 16.0}, True),  # eq. 3: more PS cores
        (only(alpha_upd=1.0), {"parameter_servers": 8}, True),  # eq. 3: more PS
        (only(alpha_emb=1.0), {"parameter_servers": 8}, True),  # eq. 5: lookups spread
        (only(alpha_sync=1.0), {"parameter_servers": 8}, True),  # eq. 4
        (only(alpha_grad=1.0, beta_sync=1.0), {"worker_cpu": 32.0}, True),
        (only(alpha_grad=1.0), {"parameter_servers": 8}, False),  # eq. 2 ignores PS
    ],
)
def test_each_term_scales_as_its_equation_says(
    params: ThroughputParameters, change: dict[str, float], faster: bool
) -> None:
    before = throughput(params, BASE)
    after = throughput(params, replace(BASE, **change))  # type: ignore[arg-type]
    assert (after > before * 1.0001) is faster


def test_grad_only_model_scales_linearly_in_workers() -> None:
    params = only(alpha_grad=2.0)
    assert throughput(params, replace(BASE, workers=16)) == pytest.approx(
        2 * throughput(params, BASE)
    )


def test_update_bound_model_saturates_in_workers() -> None:
    # T_upd grows with w, so w m / T_upd stops growing: adding workers is pointless.
    params = only(alpha_upd=1.0)
    assert throughput(params, replace(BASE, workers=64)) == pytest.approx(throughput(params, BASE))


def test_zero_iteration_time_raises_instead_of_infinity() -> None:
    with pytest.raises(DegenerateModel) as caught:
        throughput(only(), BASE)
    assert caught.value.field == "params"
    with pytest.raises(DegenerateModel):
        throughput(only(alpha_emb=1.0), replace(BASE, embedding_dim=0))


@pytest.mark.parametrize("name", ["alpha_grad", "beta_sync", "alpha_emb"])
@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf])
def test_parameters_must_be_finite_and_non_negative(name: str, value: float) -> None:
    with pytest.raises(InvalidParameters) as caught:
        replace(PAPER_PARAMETERS, **{name: value})
    assert caught.value.field == name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("workers", 0),
        ("workers", 2.5),
        ("parameter_servers", 0),
        ("worker_cpu", 0.0),
        ("worker_cpu", math.nan),
        ("ps_cpu", -1.0),
        ("batch_size", 0),
        ("embedding_dim", -1),
        ("model_bytes", -1.0),
        ("bandwidth_bytes_per_second", 0.0),
        ("worker_memory_bytes", -1),
        ("ps_memory_bytes", True),
    ],
)
def test_configuration_rejects_bad_values_naming_the_field(name: str, value: object) -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        replace(BASE, **{name: value})  # type: ignore[arg-type]
    assert caught.value.field == name
    assert isinstance(caught.value, PolicyError)


def test_beta_sum_is_split_evenly() -> None:
    params = ThroughputParameters.with_beta_sum(
        alpha_grad=1, alpha_upd=2, alpha_emb=3, alpha_sync=4, beta_sum=8
    )
    assert (params.beta_grad, params.beta_upd, params.beta_emb, params.beta_sync) == (2, 2, 2, 2)
    assert params.beta_sum == 8
    with pytest.raises(InvalidParameters) as caught:
        ThroughputParameters.with_beta_sum(
            alpha_grad=1, alpha_upd=2, alpha_emb=3, alpha_sync=4, beta_sum=-1
        )
    assert caught.value.field == "beta_sum"


# --- Eq. 7 ------------------------------------------------------------------------------


def test_resource_cost_prices_cpu_and_memory() -> None:
    prices = ResourcePrices(cpu_per_core=2.0, memory_per_gib=0.5)
    # 8 x 16 + 4 x 8 = 160 cores; 8 x 16 + 4 x 32 = 256 GiB.
    assert resource_cost(BASE, prices) == pytest.approx(160 * 2.0 + 256 * 0.5)


def test_resource_cost_of_a_change_counts_only_the_additional_resources() -> None:
    prices = ResourcePrices(cpu_per_core=1.0, memory_per_gib=0.0)
    grown = replace(BASE, workers=10)
    assert resource_cost(grown, prices, current=BASE) == pytest.approx(2 * 16)
    assert resource_cost(BASE, prices, current=grown) == pytest.approx(-2 * 16)
    assert resource_cost(BASE, prices, current=BASE) == 0


def test_resource_prices_reject_negative() -> None:
    with pytest.raises(PolicyError) as caught:
        ResourcePrices(cpu_per_core=-1.0)
    assert caught.value.field == "cpu_per_core"


# --- Eq. 8 ------------------------------------------------------------------------------


def test_gain_without_overhead_is_the_throughput_difference() -> None:
    grown = replace(BASE, workers=16)
    gain = throughput_gain(
        PAPER_PARAMETERS, BASE, grown, horizon_seconds=600, overhead=ScalingOverhead(0, 0, 0)
    )
    assert gain == pytest.approx(
        throughput(PAPER_PARAMETERS, grown) - throughput(PAPER_PARAMETERS, BASE)
    )


def test_gain_subtracts_the_samples_lost_to_the_pause() -> None:
    grown = replace(BASE, parameter_servers=8)
    overhead = ScalingOverhead(ps_change_seconds=60, worker_resize_seconds=30)
    new = throughput(PAPER_PARAMETERS, grown)
    old = throughput(PAPER_PARAMETERS, BASE)
    gain = throughput_gain(PAPER_PARAMETERS, BASE, grown, horizon_seconds=600, overhead=overhead)
    assert gain == pytest.approx((new - old) - new * 60 / 600)
    # Over a short horizon the pause eats the gain: the change is not worth it.
    short = throughput_gain(PAPER_PARAMETERS, BASE, grown, horizon_seconds=60, overhead=overhead)
    assert short == pytest.approx(-old)


def test_overhead_takes_the_largest_applicable_pause() -> None:
    overhead = ScalingOverhead(
        ps_change_seconds=60, worker_resize_seconds=30, worker_count_seconds=5
    )
    assert overhead_seconds(BASE, BASE, overhead) == 0
    assert overhead_seconds(BASE, replace(BASE, workers=9), overhead) == 5
    assert overhead_seconds(BASE, replace(BASE, worker_cpu=8.0), overhead) == 30
    assert overhead_seconds(BASE, replace(BASE, ps_cpu=4.0, worker_cpu=8.0), overhead) == 60


def test_gain_rejects_a_non_positive_horizon() -> None:
    with pytest.raises(PolicyError) as caught:
        throughput_gain(PAPER_PARAMETERS, BASE, BASE, horizon_seconds=0)
    assert caught.value.field == "horizon_seconds"


configurations = st.builds(
    Configuration,
    workers=st.integers(1, 256),
    parameter_servers=st.integers(1, 64),
    worker_cpu=st.floats(0.1, 64),
    ps_cpu=st.floats(0.1, 64),
    batch_size=st.integers(1, 8192),
    embedding_dim=st.integers(0, 512),
    model_bytes=st.floats(0, 1e10),
)


@settings(max_examples=150, deadline=None)
@given(configurations)
def test_paper_model_throughput_is_positive_and_finite(config: Configuration) -> None:
    value = throughput(PAPER_PARAMETERS, config)
    assert 0 < value < math.inf


@settings(max_examples=100, deadline=None)
@given(configurations, st.floats(1.01, 4))
def test_more_worker_cpu_never_slows_a_job(config: Configuration, factor: float) -> None:
    faster = replace(config, worker_cpu=config.worker_cpu * factor)
    assert throughput(PAPER_PARAMETERS, faster) >= throughput(PAPER_PARAMETERS, config)


# --- Registered prediction --------------------------------------------------------------


def test_predict_round_trips_and_runs_through_the_spec() -> None:
    request = PredictRequest(PAPER_PARAMETERS, (BASE, replace(BASE, workers=4)))
    assert from_dict(PredictRequest, to_dict(request)) == request
    (spec,) = ALGORITHMS
    reply = spec.run_typed(request)
    assert isinstance(reply, PredictReply)
    assert from_dict(PredictReply, to_dict(reply)) == reply
    assert reply.throughputs[0] == pytest.approx(throughput(PAPER_PARAMETERS, BASE))
    assert spec.run_dict(to_dict(request)) == to_dict(reply)


def test_predict_names_the_configuration_that_is_degenerate() -> None:
    request = PredictRequest(only(alpha_emb=1.0), (BASE, replace(BASE, embedding_dim=0)))
    with pytest.raises(DegenerateModel) as caught:
        run_predict(request)
    assert caught.value.field == "configurations[1]"


def test_predict_rejects_no_configurations() -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        PredictRequest(PAPER_PARAMETERS, ())
    assert caught.value.field == "configurations"
