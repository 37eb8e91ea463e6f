"""Scaling curves: validation, concavity, the measured-table loader and the envelope."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.elasticflow.curves import (
    InvalidCurve,
    NonConcaveCurve,
    ScalingCurve,
    concave_envelope,
    curve_from_function,
    load_throughput_table,
    parse_throughput_table,
)
from stride.testing import SHARED_TRACES

TRACES = SHARED_TRACES


def test_throughput_rounds_down_to_an_allowed_size() -> None:
    curve = ScalingCurve((1, 2, 4), (1.0, 1.5, 2.0))
    assert [curve.usable(d) for d in range(6)] == [0, 1, 2, 2, 4, 4]
    assert [curve.throughput(d) for d in range(6)] == [0.0, 1.0, 1.5, 1.5, 2.0, 2.0]
    usable, values = curve.table(5)
    assert usable == [0, 1, 2, 2, 4, 4] and values == [0.0, 1.0, 1.5, 1.5, 2.0, 2.0]


@pytest.mark.parametrize(
    ("sizes", "throughputs", "field"),
    [
        ((), (), "curve.sizes"),
        ((1, 2), (1.0,), "curve.throughputs"),
        ((2, 1), (1.0, 2.0), "curve.sizes[1]"),
        ((0,), (1.0,), "curve.sizes[0]"),
        ((1, 2), (1.0, math.nan), "curve.throughputs[1]"),
        ((1, 2), (-1.0, 1.0), "curve.throughputs[0]"),
        ((1,), (math.inf,), "curve.throughputs[0]"),
    ],
)
def test_malformed_curves_name_the_field(
    sizes: tuple[int, ...], throughputs: tuple[float, ...], field: str
) -> None:
    with pytest.raises(InvalidCurve) as caught:
        ScalingCurve(sizes, throughputs)
    assert caught.value.field == field


def test_non_concave_curve_names_the_point() -> None:
    superlinear = ScalingCurve((1, 2, 4), (1.0, 1.5, 4.0))
    assert not superlinear.is_concave()
    with pytest.raises(NonConcaveCurve) as caught:
        superlinear.require_concave("jobs[3].curve")
    assert caught.value.field == "jobs[3].curve.throughputs[2]"
    decreasing = ScalingCurve((1, 2), (2.0, 1.0))
    with pytest.raises(NonConcaveCurve, match="must not decrease"):
        decreasing.require_concave()


def test_linear_curve_is_concave_despite_rounding() -> None:
    curve = ScalingCurve((1, 2, 4, 8), (0.1, 0.2, 0.4, 0.8000000000000002))
    assert curve.is_concave()


def test_parse_skips_unrunnable_cells_and_rejects_garbage() -> None:
    text = "global_batch_size,1,2,4\n64,1.0,1.5,nan\n128,2.0,,0\n256,,,\n"
    curves = parse_throughput_table(text)
    assert curves[64] == ScalingCurve((1, 2), (1.0, 1.5))
    assert curves[128] == ScalingCurve((1,), (2.0,))
    assert 256 not in curves
    with pytest.raises(InvalidCurve, match=r"t.csv:2\[2\]"):
        parse_throughput_table("global_batch_size,1,2\n64,1.0,abc\n", source="t.csv")
    with pytest.raises(InvalidCurve, match="header"):
        parse_throughput_table("batch,1,2\n64,1,2\n")
    with pytest.raises(InvalidCurve, match="empty"):
        parse_throughput_table("")


def test_envelope_of_measured_tables_is_concave_and_measured() -> None:
    files = sorted(TRACES.glob("throughputs_*/*.csv"))
    assert len(files) == 13
    for file in files:
        for curve in load_throughput_table(file).values():
            envelope = concave_envelope(curve)
            envelope.require_concave()
            measured = dict(zip(curve.sizes, curve.throughputs, strict=True))
            for size, value in zip(envelope.sizes, envelope.throughputs, strict=True):
                assert size & (size - 1) == 0
                assert measured[size] == value  # never a value that was not observed


def test_envelope_cuts_after_the_peak_and_drops_points_under_the_hull() -> None:
    # ncf on T4: fastest on 4 GPUs, noisy below.
    curve = ScalingCurve((1, 2, 4, 8), (46.9, 37.6, 56.3, 23.2))
    assert concave_envelope(curve) == ScalingCurve((1, 4), (46.9, 56.3))
    # A superlinear start drops the 1-device point: the job starts on 2.
    assert concave_envelope(ScalingCurve((1, 2, 4), (1.0, 3.0, 4.0))).sizes == (2, 4)
    assert concave_envelope(ScalingCurve((3, 4), (1.0, 2.0))).sizes == (4,)  # 3 is not 2^k
    with pytest.raises(InvalidCurve):
        concave_envelope(ScalingCurve((3,), (1.0,)))


def test_envelope_keeps_collinear_points() -> None:
    linear = ScalingCurve((1, 2, 4, 8), (1.0, 2.0, 4.0, 8.0))
    assert concave_envelope(linear) == linear  # a linear job may still run on one device


def test_curve_from_a_function_for_cpu_shares() -> None:
    curve = curve_from_function(lambda shares: 10 * math.sqrt(shares), range(1, 9))
    assert curve.is_concave() and curve.max_size == 8
    with pytest.raises(NonConcaveCurve):
        curve_from_function(lambda shares: float(shares**2), [1, 2, 3])


points = st.lists(
    st.tuples(st.integers(1, 64), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=8
)


@settings(max_examples=150, deadline=None)
@given(points)
def test_envelope_is_always_concave_and_below_nothing_measured(
    raw: list[tuple[int, float]],
) -> None:
    by_size = dict(raw)
    sizes = tuple(sorted(by_size))
    curve = ScalingCurve(sizes, tuple(by_size[size] for size in sizes))
    try:
        envelope = concave_envelope(curve, powers_of_two_only=False)
    except InvalidCurve:
        assert all(value == 0 for value in curve.throughputs)
        return
    assert envelope.is_concave()
    assert all(b > a for a, b in zip(envelope.throughputs, envelope.throughputs[1:], strict=False))
    assert set(envelope.sizes) <= set(sizes)
    # The fastest measured point survives: the envelope loses no peak speed.
    assert envelope.throughputs[-1] == max(curve.throughputs)
