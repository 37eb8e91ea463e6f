"""PS out-of-memory prediction from embedding growth (DLRover-RM sec. 5.3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.oom import (
    ALGORITHMS,
    GIB,
    InvalidMemorySamples,
    OomReply,
    OomRequest,
    PsMemoryCurve,
    fit_memory_growth,
    predict_oom,
)
from stride.policy.serialization import from_dict, to_dict

SAMPLES = tuple(float(s) for s in range(0, 1_000_001, 100_000))


def linear_curve(
    static_gib: float, gib_per_million: float, noise: float = 0.0, seed: int = 0
) -> PsMemoryCurve:
    """A synthetic growth curve: static part plus embedding rows proportional to samples."""
    rng = np.random.default_rng(seed)
    memory = [
        max(
            0.0,
            (static_gib + gib_per_million * s / 1e6) * GIB * (1 + noise * float(rng.normal())),
        )
        for s in SAMPLES
    ]
    return PsMemoryCurve(consumed_samples=SAMPLES, memory_bytes=tuple(memory))


def request(*curves: PsMemoryCurve, limit_gib: int = 16, total: int = 5_000_000) -> OomRequest:
    return OomRequest(
        curves=curves,
        ps_memory_limit_bytes=limit_gib * GIB,
        consumed_samples=1_000_000,
        total_samples=total,
        throughput=1000.0,
    )


def test_fit_recovers_a_linear_growth() -> None:
    static, growth = fit_memory_growth(linear_curve(4, 2))
    assert static == pytest.approx(4 * GIB)
    assert growth == pytest.approx(2 * GIB / 1e6)


def test_growth_that_crosses_the_limit_before_completion_is_predicted() -> None:
    # 4 GiB + 2 GiB per million samples reaches 16 GiB at 6 M: before the 8 M total.
    reply = predict_oom(request(linear_curve(4, 2), linear_curve(4, 2), total=8_000_000))
    assert reply.oom_predicted
    assert reply.first_oom_samples == pytest.approx(6_000_000)
    assert reply.seconds_until_oom == pytest.approx(5_000_000 / 1000.0)
    # Peak 4 + 16 = 20 GiB, plus 10% = 22 GiB.
    assert reply.forecasts[0].predicted_peak_bytes == pytest.approx(20 * GIB)
    assert reply.proposed_ps_memory_bytes == 22 * GIB
    # Total 40 GiB x 1.1 = 44 GiB over 16 GiB PS: 3 PS.
    assert reply.proposed_parameter_servers == 3


def test_growth_that_stays_under_the_limit_is_not_flagged() -> None:
    reply = predict_oom(request(linear_curve(4, 2), linear_curve(4, 2), total=5_000_000))
    assert not reply.oom_predicted
    assert reply.first_oom_samples is None
    assert reply.seconds_until_oom is None
    assert reply.proposed_ps_memory_bytes == 16 * GIB
    assert reply.proposed_parameter_servers == 2


def test_only_the_hot_ps_runs_out_and_an_even_repartition_may_suffice() -> None:
    hot = linear_curve(4, 3, noise=0.01, seed=1)
    cold = linear_curve(2, 0.5, noise=0.01, seed=2)
    reply = predict_oom(request(hot, cold, total=5_000_000))
    assert reply.oom_predicted
    assert reply.forecasts[0].oom_at_samples is not None
    assert reply.forecasts[1].oom_at_samples is None
    assert reply.forecasts[0].oom_at_samples == pytest.approx(4_000_000, rel=0.05)
    # Totals 19 + 4.5 = 23.5 GiB x 1.1 fit in two 16 GiB PS once evenly partitioned.
    assert reply.proposed_parameter_servers == 2
    assert reply.proposed_ps_memory_bytes >= math.ceil(19 * 1.1) * GIB


def test_a_ps_already_over_its_limit_is_flagged_now() -> None:
    reply = predict_oom(request(linear_curve(20, 0.0), limit_gib=16))
    assert reply.first_oom_samples == 1_000_000
    assert reply.seconds_until_oom == 0


def test_shrinking_memory_is_fitted_as_no_growth() -> None:
    falling = PsMemoryCurve(SAMPLES, tuple((10 - s / 1e6) * GIB for s in SAMPLES))
    static, growth = fit_memory_growth(falling)
    assert growth == 0
    assert static > 0


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: PsMemoryCurve((0.0, 1.0), (1.0,)), "memory_bytes"),
        (lambda: PsMemoryCurve((0.0,), (1.0,)), "consumed_samples"),
        (lambda: PsMemoryCurve((0.0, math.nan), (1.0, 2.0)), "consumed_samples[1]"),
        (lambda: PsMemoryCurve((0.0, 1.0), (1.0, -2.0)), "memory_bytes[1]"),
        (lambda: PsMemoryCurve((5.0, 5.0), (1.0, 2.0)), "consumed_samples"),
        (lambda: OomRequest((), 1, 0, 1), "curves"),
        (lambda: OomRequest((linear_curve(1, 1),), 0, 0, 1), "ps_memory_limit_bytes"),
        (lambda: OomRequest((linear_curve(1, 1),), GIB, -1, 1), "consumed_samples"),
        (lambda: OomRequest((linear_curve(1, 1),), GIB, 5, 4), "total_samples"),
        (lambda: OomRequest((linear_curve(1, 1),), GIB, 0, 4, throughput=0.0), "throughput"),
        (lambda: OomRequest((linear_curve(1, 1),), GIB, 0, 4, headroom=-0.1), "headroom"),
        (lambda: OomRequest((linear_curve(1, 1),), GIB, 0, 4, headroom=math.nan), "headroom"),
    ],
)
def test_bad_input_raises_naming_the_field(build: object, field: str) -> None:
    with pytest.raises(InvalidMemorySamples) as caught:
        build()  # type: ignore[operator]
    assert caught.value.field == field


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 64), st.floats(0, 8)),  # (static GiB, GiB per million)
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 64),
    st.integers(1_000_000, 50_000_000),
)
def test_proposals_always_hold_the_predicted_peak(
    shapes: list[tuple[float, float]], limit_gib: int, total: int
) -> None:
    curves = [linear_curve(static, growth) for static, growth in shapes]
    reply = predict_oom(request(*curves, limit_gib=limit_gib, total=total))
    limit = limit_gib * GIB
    peaks = [f.predicted_peak_bytes for f in reply.forecasts]
    # Growth is never negative, so a PS runs out before completion exactly when its peak
    # (its memory at completion) reaches the limit.
    if max(peaks) > limit * (1 + 1e-9):
        assert reply.oom_predicted
    if max(peaks) < limit * (1 - 1e-9):
        assert not reply.oom_predicted
    assert reply.proposed_ps_memory_bytes >= limit
    assert reply.proposed_parameter_servers >= len(curves)
    assert all(f.bytes_per_sample >= 0 and f.static_bytes >= 0 for f in reply.forecasts)
    if reply.oom_predicted:
        assert reply.proposed_ps_memory_bytes >= max(peaks)
        assert reply.proposed_parameter_servers * limit >= sum(peaks)
    else:
        assert max(peaks) < limit * (1 + 1e-9)


def test_oom_round_trips_and_runs_through_the_spec() -> None:
    oom_request = request(linear_curve(4, 2), linear_curve(4, 2), total=8_000_000)
    assert from_dict(OomRequest, to_dict(oom_request)) == oom_request
    (spec,) = ALGORITHMS
    assert spec.name == "dlrover-oom-predict"
    reply = spec.run_typed(oom_request)
    assert isinstance(reply, OomReply)
    assert from_dict(OomReply, to_dict(reply)) == reply
    assert spec.run_dict(to_dict(oom_request)) == to_dict(reply)
