"""``--model elasticflow``: ElasticFlow's published simulator's cost model, its baselines
calibrated to that simulator's own numbers, group admission, curve error and the bound."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stride.policy.elasticflow.curves import ScalingCurve
from stride.sim.deadline import (
    EF_MODEL_POLICIES,
    POLICIES,
    DeadlineCluster,
    physical_bound,
    run_deadline,
)
from stride.sim.deadline_rounds import ef_overhead
from stride.sim.engine import SimulationError
from stride.sim.traces import (
    CurveLibrary,
    TraceJob,
    load_cluster_spec,
    load_curves,
    load_deadline_trace,
)
from stride.testing import SHARED_TRACES

ELASTICFLOW_SIMULATOR = {
    "elasticflow": 0.749,
    "elasticflow-noac": 0.205,
    "edf": 0.087,
    "edf-ac": 0.323,
    "tiresias": 0.462,
    "themis": 0.410,
    "gandiva": 0.241,
}
"""DSR that pkusys/ElasticFlow's simulator itself gives on itp-ef/195job.csv, n16g8, A100
curves, ``--scheduling_slot=240`` (run unmodified: ef-accessctrl, ef, edf, edf-accessctrl,
dlas-gpu, themis, gandiva; see bench/ef_head_to_head.py)."""


def _toy(curve: ScalingCurve, *jobs: TraceJob) -> tuple[list[TraceJob], CurveLibrary]:
    return list(jobs), CurveLibrary({("toy", 64): curve}, "toy")


@pytest.fixture(scope="module")
def curves() -> CurveLibrary:
    return load_curves(SHARED_TRACES / "throughputs_A100")


@pytest.fixture(scope="module")
def testbed() -> tuple[list[TraceJob], DeadlineCluster]:
    jobs = load_deadline_trace(SHARED_TRACES / "itp-ef" / "195job.csv")
    spec = load_cluster_spec(SHARED_TRACES / "cluster_specs" / "n16g8.csv")
    return jobs, DeadlineCluster.from_spec(spec)


@pytest.mark.parametrize("policy", sorted(ELASTICFLOW_SIMULATOR))
def test_each_baseline_lands_within_0_03_of_elasticflows_simulator(
    policy: str, curves: CurveLibrary, testbed: tuple[list[TraceJob], DeadlineCluster]
) -> None:
    jobs, cluster = testbed
    result = run_deadline(jobs, cluster, policy, 0, curves, model="elasticflow", slot=240)
    assert result.model == "elasticflow"
    assert result.dsr == pytest.approx(ELASTICFLOW_SIMULATOR[policy], abs=0.03)


def test_stride_beats_elasticflow_on_the_testbed_trace_under_both_models(
    curves: CurveLibrary, testbed: tuple[list[TraceJob], DeadlineCluster]
) -> None:
    jobs, cluster = testbed
    for model in ("stride", "elasticflow"):
        runs = {
            name: run_deadline(jobs, cluster, name, 0, curves, model=model, slot=240)
            for name in ("stride", "elasticflow", "elasticflow-noac")
        }
        best = max(runs["elasticflow"].dsr or 0.0, runs["elasticflow-noac"].dsr or 0.0)
        assert (runs["stride"].dsr or 0.0) >= best, model
        assert (runs["stride"].admitted_hard_met or 0.0) >= 0.98, model


def test_rounds_merge_events_within_a_slot_and_hold_gpus_until_the_round() -> None:
    # One GPU at 1 it/s. A (100 it, due 1,000) arrives at 0; B (10 it, due 200) at 50.
    jobs, library = _toy(
        ScalingCurve((1,), (1.0,)),
        TraceJob("A", 0.0, 100.0, "toy", 64, 1, 100.0, 1000.0),
        TraceJob("B", 50.0, 10.0, "toy", 64, 1, 10.0, 200.0),
    )
    result = run_deadline(jobs, DeadlineCluster(1), "edf", 0, library, model="elasticflow", slot=60)
    # Round at 0: A runs, due at 100. B's arrival (50) falls within the slot, so the next
    # round is at 60: A has 40 it left, B (earlier deadline) takes the GPU and ends at 70.
    # The only event left (B's end) is not postponed: at 70 A resumes and ends at 110.
    assert result.finish_times == {"A": 110.0, "B": 70.0}
    assert [at for at, _ in result.gpu_usage] == [0.0, 60.0, 70.0, 110.0]
    ours = run_deadline(jobs, DeadlineCluster(1), "edf", 0, library, pause_seconds=0.0)
    assert ours.finish_times == {"A": 110.0, "B": 60.0}  # ours sees B at once


def test_overhead_per_round_follows_the_simulators_rule() -> None:
    assert ef_overhead(1, restart=False, cached=False, cluster_gpus=128) == 4.0
    assert ef_overhead(64, restart=False, cached=False, cluster_gpus=128) == 16.0
    assert ef_overhead(64, restart=False, cached=True, cluster_gpus=128) == 2.0
    assert ef_overhead(8, restart=True, cached=False, cluster_gpus=128) == 2 + 27 + 8
    assert ef_overhead(8, restart=True, cached=True, cluster_gpus=128) == 2.0
    assert ef_overhead(8, restart=True, cached=False, cluster_gpus=256) == 7 + 47 + 8
    # EDF-AC pays it every round: alone, a job's first round costs 4 s on a fresh range.
    jobs, library = _toy(
        ScalingCurve((1,), (1.0,)), TraceJob("A", 0.0, 100.0, "toy", 64, 1, 100.0, 1000.0)
    )
    charged = run_deadline(jobs, DeadlineCluster(1), "edf-ac", 0, library, model="elasticflow")
    free = run_deadline(jobs, DeadlineCluster(1), "edf", 0, library, model="elasticflow")
    assert charged.finish_times == {"A": 104.0} and free.finish_times == {"A": 100.0}


def test_elasticflow_admits_a_round_all_or_nothing_and_stride_per_job() -> None:
    # Two GPUs at 1 it/s each (2 it/s on both). Arriving together: F fits, G cannot
    # (300 it by 100 s even alone on both GPUs).
    jobs, library = _toy(
        ScalingCurve((1, 2), (1.0, 2.0)),
        TraceJob("F", 0.0, 100.0, "toy", 64, 1, 100.0, 400.0),
        TraceJob("G", 0.0, 300.0, "toy", 64, 1, 300.0, 100.0),
    )
    for model in ("stride", "elasticflow"):
        ef = run_deadline(jobs, DeadlineCluster(2), "elasticflow", 0, library, model=model)
        assert sorted(ef.dropped) == ["F", "G"] and ef.admitted == 0, model
        stride = run_deadline(jobs, DeadlineCluster(2), "stride", 0, library, model=model)
        assert stride.dropped == ("G",) and stride.met == 1, model
        assert stride.admitted_hard_met == 1.0 and stride.declined == 1
        noac = run_deadline(jobs, DeadlineCluster(2), "elasticflow-noac", 0, library, model=model)
        assert noac.dropped == () and noac.admitted == 2


def test_curve_error_is_seeded_and_hidden_from_the_policy() -> None:
    jobs, library = _toy(
        ScalingCurve((1,), (1.0,)),
        *(
            TraceJob(f"J{i}", 1000.0 * i, 100.0, "toy", 64, 1, 100.0, 1000.0 * i + 500)
            for i in range(4)
        ),
    )
    cluster = DeadlineCluster(1)
    exact = run_deadline(jobs, cluster, "edf", 7, library, pause_seconds=0.0)
    other_seed = run_deadline(jobs, cluster, "edf", 8, library, pause_seconds=0.0)
    assert dataclasses.replace(other_seed, seed=7) == exact  # the seed draws nothing here
    skewed = run_deadline(jobs, cluster, "edf", 7, library, pause_seconds=0.0, curve_error=0.2)
    assert skewed == run_deadline(
        jobs, cluster, "edf", 7, library, pause_seconds=0.0, curve_error=0.2
    )
    rng = np.random.default_rng(7)
    rng.random(len(jobs))  # the best-effort draw comes first
    speeds = 1.0 + rng.uniform(-0.2, 0.2, len(jobs))
    for index, job in enumerate(jobs):
        assert skewed.finish_times[job.job_id] == pytest.approx(
            job.submission_time + 100.0 / speeds[index]
        )
    assert skewed.curve_error == 0.2
    with pytest.raises(SimulationError, match="curve_error"):
        run_deadline(jobs, cluster, "edf", 7, library, curve_error=1.0)


def test_physical_bound_counts_jobs_that_fit_alone() -> None:
    jobs, library = _toy(
        ScalingCurve((1, 2), (1.0, 1.5)),
        TraceJob("ok", 0.0, 150.0, "toy", 64, 1, 150.0, 130.0),  # lambda < 1, 100 s on 2 GPUs
        TraceJob("late", 0.0, 150.0, "toy", 64, 1, 150.0, 90.0),  # lambda < 1: 100 s > 90 s
        TraceJob("easy", 0.0, 100.0, "toy", 64, 1, 100.0, 200.0),  # lambda 2
    )
    bound = physical_bound(jobs, DeadlineCluster(2), library, pause_seconds=20.0)
    assert bound.lambda_ge_1 == 1.0 and bound.lambda_lt_1 == 0.5
    assert bound.all == pytest.approx(2 / 3)
    tighter = physical_bound(jobs, DeadlineCluster(2), library, pause_seconds=40.0)
    assert tighter.lambda_lt_1 == 0.0
    ef = physical_bound(jobs, DeadlineCluster(2), library, model="elasticflow")
    assert ef.lambda_lt_1 == 0.5  # 100 s + 6 s of overhead on 2 GPUs


def test_policy_names_and_bad_options_are_named() -> None:
    assert {"elasticflow", "elasticflow-noac"} <= set(POLICIES)
    assert set(ELASTICFLOW_SIMULATOR) | {"stride", "chronus"} == set(EF_MODEL_POLICIES)
    jobs, library = _toy(
        ScalingCurve((1,), (1.0,)), TraceJob("A", 0.0, 100.0, "toy", 64, 1, 100.0, 1000.0)
    )
    with pytest.raises(SimulationError, match="model: unknown 'pollux'"):
        run_deadline(jobs, DeadlineCluster(1), "edf", 0, library, model="pollux")
    with pytest.raises(SimulationError, match="slot: must be finite and > 0"):
        run_deadline(jobs, DeadlineCluster(1), "edf", 0, library, model="elasticflow", slot=0)


def test_stride_replans_guarantees_on_measured_speed() -> None:
    from stride.policy.elasticflow.guarantees import DeadlineView, GuaranteePolicy, JobView

    curve = ScalingCurve((1, 2, 4), (1.0, 2.0, 4.0))
    job = JobView("J", curve, 300.0, 1000.0, 0.0, 1, 1, 0.0, 300.0)
    trusted = GuaranteePolicy().minimum_shares(DeadlineView(0.0, 4, (job,), 0.0))
    slower = dataclasses.replace(job, measured_speed=0.25)
    measured = GuaranteePolicy().minimum_shares(DeadlineView(0.0, 4, (slower,), 0.0))
    # 300 iterations in three 300 s slots take one GPU on the curve; at a quarter of its
    # speed the same work is 1,200 of the curve's iterations: two GPUs.
    assert trusted == {"J": 1} and measured == {"J": 2}


def test_gandiva_packs_a_node_then_queues_behind_it() -> None:
    # One 8-GPU node, nine 1-GPU jobs of 100 s arriving together. Gandiva opens a node set
    # for the first, packs the next six (a set takes jobs while one more keeps its use
    # count below its capacity of 8), time-slices the eighth onto it (it still runs: the
    # first 8 of a set run) and queues the ninth behind them. Rounds come with arrivals,
    # then every slot: the first eight end at 100 s (their exact end is recorded), the
    # round at 120 s frees the node and the ninth ends at 220 s.
    jobs, library = _toy(
        ScalingCurve((1,), (1.0,)),
        *(TraceJob(f"J{i}", 0.0, 100.0, "toy", 64, 1, 100.0, 1000.0) for i in range(9)),
    )
    cluster = DeadlineCluster(8, fanouts=(1, 1, 8))
    result = run_deadline(jobs, cluster, "gandiva", 0, library, model="elasticflow", slot=60)
    assert result.finish_times == {**{f"J{i}": 100.0 for i in range(8)}, "J8": 220.0}
