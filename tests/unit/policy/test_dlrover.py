"""DLRover's throughput model, eq. 10-11 plan (Table 1) and sample/optimize/adjust stages."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy import dlrover
from stride.policy.dlrover import (
    Action,
    AdjustReply,
    AdjustRequest,
    DLRoverInputError,
    DLRoverLimits,
    InitialPlanReply,
    InitialPlanRequest,
    PodObservation,
    Stage,
    ThroughputModel,
    adjust,
    initial_plan,
    job_throughput,
    sampling_plan,
)
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.serialization import from_dict, to_dict

GIB = 1024**3


def model(**changes: float) -> ThroughputModel:
    values: dict[str, float] = {
        "batch_size": 512,
        "io_seconds": 0.01,
        "compute_work": 2.0,
        "update_work": 1.0,
        "core_rate": 10.0,
        "w_hat": 2.5,
        "s_hat": 5.7,
    }
    values.update(changes)
    return ThroughputModel(**values)  # type: ignore[arg-type]


def test_throughput_is_the_sum_of_per_worker_rates_of_eq_1() -> None:
    m = model()
    one = 512 / (0.01 + 2.0 / (10 * 2.0) + 1.0 / (10 * 5.0))
    assert job_throughput(m, [2.0, 2.0], 5.0) == pytest.approx(2 * one)


def test_cpu_beyond_what_is_used_buys_nothing() -> None:
    m = model()
    assert job_throughput(m, [2.5], 5.7) == job_throughput(m, [32.0], 100.0)
    assert job_throughput(m, [2.0], 5.7) < job_throughput(m, [2.5], 5.7)


@given(st.integers(1, 40), st.floats(0.1, 40), st.floats(0.1, 200))
@settings(max_examples=100)
def test_throughput_grows_with_workers_cores_and_ps(workers: int, cpu: float, ps: float) -> None:
    m = model()
    base = job_throughput(m, [cpu] * workers, ps)
    assert job_throughput(m, [cpu] * (workers + 1), ps) > base
    assert job_throughput(m, [cpu * 1.5] * workers, ps) >= base
    assert job_throughput(m, [cpu] * workers, ps * 1.5) >= base


@pytest.mark.parametrize(
    ("name", "w_hat", "s_hat", "workers", "worker_cpu", "ps_count", "measured_w", "measured_s"),
    [
        # Table 1, C_total = 200. The sample row's "s_total" column is s^ (what all PS used
        # with one worker); the optimize row's w^ and s_total are re-measured *use* after the
        # plan ran, so they are bounds, not outputs, of eq. 10-11.
        ("W&D", 2.5, 5.7, 24, 3.0, 8, 2.3, 85.1),
        ("xDFM", 19.4, 3.1, 8, 20.0, 2, 18.3, 27.4),
    ],
)
def test_table_1_rows_are_reproduced(
    name: str,
    w_hat: float,
    s_hat: float,
    workers: int,
    worker_cpu: float,
    ps_count: int,
    measured_w: float,
    measured_s: float,
) -> None:
    reply = initial_plan(InitialPlanRequest(w_hat, s_hat, 4 * GIB, 4 * GIB))
    assert (reply.worker_count, reply.worker_cpu, reply.ps_count) == (workers, worker_cpu, ps_count)
    assert reply.s_total == pytest.approx(200 - workers * w_hat)  # eq. 11: 140 and 44.8
    assert reply.ps_count == math.floor(reply.s_total / 16)
    assert reply.ps_cpu == 16.0
    assert reply.plan.total_cpu() <= 200
    ps = reply.plan.role(Role.PS)
    assert ps is not None
    assert measured_w <= worker_cpu and measured_s <= ps.count * ps.cpu, name


@given(st.floats(0.1, 32), st.floats(0.1, 64), st.floats(10, 5000))
@settings(max_examples=200)
def test_initial_plan_fits_c_total_and_keeps_ps_unsaturated_in_the_model(
    w_hat: float, s_hat: float, c_total: float
) -> None:
    limits = DLRoverLimits(c_total=c_total)
    try:
        reply = initial_plan(InitialPlanRequest(w_hat, s_hat, GIB, GIB, limits))
    except DLRoverInputError as error:
        assert error.field == "limits.c_total"
        assert c_total < math.ceil(w_hat) + 1 or c_total < w_hat + s_hat
        return
    assert reply.plan.total_cpu() <= c_total + 1e-9
    assert reply.worker_cpu >= w_hat and reply.ps_count >= 1 and reply.worker_count >= 1
    assert reply.s_total >= reply.worker_count * s_hat - 1e-9  # eq. 4 in the model
    assert reply.worker_count * (w_hat + s_hat) <= c_total + 1e-9  # eq. 8


def test_initial_plan_rejects_bad_input_by_field() -> None:
    with pytest.raises(DLRoverInputError, match=r"w_hat"):
        InitialPlanRequest(float("nan"), 1.0, GIB, GIB)
    with pytest.raises(DLRoverInputError, match=r"s_hat"):
        InitialPlanRequest(1.0, -1.0, GIB, GIB)
    with pytest.raises(DLRoverInputError, match=r"w_hat: must be <= c_max"):
        InitialPlanRequest(40.0, 1.0, GIB, GIB)
    with pytest.raises(DLRoverInputError, match=r"limits.c_total"):
        initial_plan(InitialPlanRequest(3.0, 3.0, GIB, GIB, DLRoverLimits(c_total=4)))
    with pytest.raises(DLRoverInputError, match=r"limits.idle_threshold"):
        DLRoverLimits(idle_threshold=0.95)
    with pytest.raises(DLRoverInputError, match=r"limits.ps_cpu"):
        DLRoverLimits(ps_cpu=64)


def pods(*uses: float, oom: int | None = None, memory: int = 0) -> tuple[PodObservation, ...]:
    return tuple(
        PodObservation(i, use, memory, oom_killed=(i == oom)) for i, use in enumerate(uses)
    )


def job_plan(workers: int, worker_cpu: float, ps: int, ps_cpu: float) -> Plan:
    return Plan(
        roles=(
            RoleResources(Role.PS, ps, ps_cpu, 4 * GIB),
            RoleResources(Role.WORKER, workers, worker_cpu, 4 * GIB),
        ),
        reason="test",
        algorithm="test/1",
    )


def test_sample_plan_is_one_worker_and_a_few_ps_at_c_max() -> None:
    plan = sampling_plan()
    assert plan.pod_count(Role.WORKER) == 1 and plan.pod_count(Role.PS) == 2
    assert {r.cpu for r in plan.roles} == {32.0}


def test_worker_oom_doubles_worker_memory() -> None:
    reply = adjust(AdjustRequest(Stage.SAMPLE, sampling_plan(), pods(3.0, oom=0), pods(1, 1)))
    assert reply.action is Action.WORKER_OOM and reply.stage is Stage.SAMPLE
    assert reply.plan is not None
    worker = reply.plan.role(Role.WORKER)
    assert worker is not None and worker.memory_bytes == 8 * GIB


def test_ps_oom_doubles_the_ps_count() -> None:
    reply = adjust(AdjustRequest(Stage.SAMPLE, sampling_plan(), pods(3.0), pods(1, 1, oom=1)))
    assert reply.action is Action.PS_OOM and reply.plan is not None
    assert reply.plan.pod_count(Role.PS) == 4


def test_saturated_ps_in_sampling_gets_more_cpu() -> None:
    plan = job_plan(1, 32, 2, 4)
    reply = adjust(AdjustRequest(Stage.SAMPLE, plan, pods(3.0), pods(3.7, 1.0)))
    assert reply.action is Action.ADD_PS_CPU and reply.plan is not None
    ps = reply.plan.role(Role.PS)
    assert ps is not None and (ps.count, ps.cpu) == (2, 8.0)
    at_max = adjust(AdjustRequest(Stage.SAMPLE, job_plan(1, 32, 2, 32), pods(3.0), pods(31, 1)))
    assert at_max.plan is not None and at_max.plan.pod_count(Role.PS) == 4


def test_sampling_ends_in_the_eq_10_11_plan() -> None:
    # W&D in Table 1: the worker used 2.5 cores, all PS together 5.7.
    reply = adjust(AdjustRequest(Stage.SAMPLE, job_plan(1, 32, 2, 32), pods(2.5), pods(3.0, 2.7)))
    assert reply.action is Action.OPTIMIZE and reply.stage is Stage.OPTIMIZE
    assert reply.s_hat == pytest.approx(5.7) and reply.plan is not None
    assert reply.plan.pod_count(Role.WORKER) == 24 and reply.plan.pod_count(Role.PS) == 8


def test_optimize_scales_workers_to_s_total_over_s_hat_within_c_total() -> None:
    plan = job_plan(24, 3, 8, 16)  # 128 PS cores
    workers = tuple(PodObservation(i, 2.3, 3 * GIB) for i in range(24))
    reply = adjust(AdjustRequest(Stage.OPTIMIZE, plan, workers, pods(*[10.0] * 8), s_hat=5.7))
    assert reply.action is Action.SCALE_WORKERS and reply.stage is Stage.ADJUST
    assert reply.plan is not None
    worker = reply.plan.role(Role.WORKER)
    assert worker is not None
    assert worker.count == math.floor(128 / 5.7) == 22
    assert worker.cpu == 3.0 and worker.memory_bytes == 3 * GIB


def test_hot_ps_is_replaced_by_a_bigger_one() -> None:
    # W&D after optimize: 24 workers, 8 PS of 16 cores; PS-2 is saturated.
    plan = job_plan(24, 3, 8, 16)
    ps_use = pods(10, 10, 15, 10, 10, 10, 10, 10.5)  # 85.5 in all, Table 1: 85.1
    reply = adjust(AdjustRequest(Stage.ADJUST, plan, pods(*[2.3] * 24), ps_use, s_hat=5.7))
    assert reply.action is Action.HOT_PS and reply.plan is not None
    ps = reply.plan.role(Role.PS)
    assert ps is not None and ps.count == 8
    expected = min(15 / sum(p.cpu_used for p in ps_use) * 5.7 * 24, 32)
    assert [(o.index, o.cpu) for o in ps.overrides] == [(2, math.ceil(expected))]
    assert ps.overrides[0].cpu == 24  # the paper's W&D replacement: 15 / 85.5 * 5.7 * 24


def test_idle_ps_adds_workers_capped_by_sqrt_k() -> None:
    # xDFM after optimize: 8 workers, 2 PS of 16 cores, PS barely used.
    plan = job_plan(8, 20, 2, 16)
    request = AdjustRequest(Stage.ADJUST, plan, pods(*[18.3] * 8), pods(6, 6), s_hat=3.1)
    reply = adjust(request)
    s_hat = 12 / 8
    assert reply.action is Action.IDLE_PS and reply.s_hat == pytest.approx(s_hat)
    assert reply.plan is not None
    assert reply.plan.pod_count(Role.WORKER) == math.floor(min(32 / s_hat, 32))
    capped = AdjustRequest(
        Stage.ADJUST, plan, pods(*[18.3] * 8), pods(6, 6), 3.1, DLRoverLimits(worker_cap_k=100)
    )
    capped_reply = adjust(capped)
    assert capped_reply.plan is not None and capped_reply.plan.pod_count(Role.WORKER) == 10


def test_steady_job_gets_no_new_plan() -> None:
    plan = job_plan(8, 20, 2, 16)
    reply = adjust(AdjustRequest(Stage.ADJUST, plan, pods(*[18.3] * 8), pods(12, 12), 3.1))
    assert reply == AdjustReply(Action.NONE, Stage.ADJUST, None, 3.1)


def test_adjust_rejects_inconsistent_observations() -> None:
    with pytest.raises(DLRoverInputError, match=r"^workers: has 2 observations"):
        AdjustRequest(Stage.SAMPLE, sampling_plan(), pods(1, 1), pods(1, 1))
    with pytest.raises(DLRoverInputError, match=r"ps\[1\].cpu_used"):
        AdjustRequest(Stage.SAMPLE, sampling_plan(), pods(1), pods(1, float("nan")))
    with pytest.raises(DLRoverInputError, match=r"s_hat: is required"):
        AdjustRequest(Stage.ADJUST, sampling_plan(), pods(1), pods(1, 1))
    with pytest.raises(DLRoverInputError, match=r"sample longer"):
        adjust(AdjustRequest(Stage.SAMPLE, sampling_plan(), pods(0), pods(0, 0)))


@given(
    st.sampled_from(list(Stage)),
    st.lists(st.floats(0, 40), min_size=1, max_size=30),
    st.lists(st.floats(0, 40), min_size=1, max_size=8),
    st.floats(0.5, 10),
)
@settings(max_examples=150)
def test_adjust_keeps_ps_and_workers_and_respects_c_max(
    stage: Stage, worker_use: list[float], ps_use: list[float], s_hat: float
) -> None:
    plan = job_plan(len(worker_use), 32, len(ps_use), 16)
    request = AdjustRequest(stage, plan, pods(*worker_use), pods(*ps_use), s_hat)
    try:
        reply = adjust(request)
    except DLRoverInputError as error:
        assert error.field in ("workers", "ps", "w_hat", "limits.c_total")
        return
    if reply.plan is None:
        return
    assert reply.plan.pod_count(Role.PS) >= 1 and reply.plan.pod_count(Role.WORKER) >= 1
    for resources in reply.plan.roles:
        assert all(cpu <= 32 for cpu, _ in resources.pod_sizes())


def test_requests_and_replies_round_trip() -> None:
    initial = InitialPlanRequest(2.5, 5.7, GIB, 2 * GIB)
    assert from_dict(InitialPlanRequest, to_dict(initial)) == initial
    initial_reply = initial_plan(initial)
    assert from_dict(InitialPlanReply, to_dict(initial_reply)) == initial_reply
    request = AdjustRequest(
        Stage.ADJUST, job_plan(8, 20, 2, 16), pods(*[18.3] * 8), pods(6, 6), 3.1
    )
    assert from_dict(AdjustRequest, to_dict(request)) == request
    reply = adjust(request)
    assert from_dict(AdjustReply, to_dict(reply)) == reply


def test_algorithms_are_registrable() -> None:
    names = [spec.qualified_name for spec in dlrover.ALGORITHMS]
    assert names == ["dlrover-initial-plan/1", "dlrover-adjust/1"]
    spec = dlrover.ALGORITHMS[0]
    out = spec.run_dict(
        {"w_hat": 19.4, "s_hat": 3.1, "worker_memory_bytes": GIB, "ps_memory_bytes": GIB}
    )
    assert out["worker_count"] == 8 and out["ps_count"] == 2


def test_vanishing_measured_use_is_refused_not_overflowed() -> None:
    # Found by hypothesis: denormal w^ and s^ made C_total / (w^ + s^) infinite.
    with pytest.raises(DLRoverInputError, match=r"^w_hat: .*more than"):
        initial_plan(InitialPlanRequest(5e-324, 5e-324, GIB, GIB))


def test_adjust_with_underflowing_ps_use_does_not_divide_by_zero() -> None:
    # Found by hypothesis: ADJUST stage, two idle workers, PS use 5e-324.
    test_adjust_keeps_ps_and_workers_and_respects_c_max.hypothesis.inner_test(  # type: ignore[attr-defined]
        stage=dlrover.Stage.ADJUST, worker_use=[0.0, 0.0], ps_use=[5e-324], s_hat=1.0
    )
