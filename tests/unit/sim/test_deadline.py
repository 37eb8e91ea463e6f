"""Environment A: hand-computed Fig. 3, invariants on a real trace window, loader errors."""

from __future__ import annotations

import pytest

from stride.policy.elasticflow.curves import ScalingCurve
from stride.sim.deadline import POLICIES, DeadlineCluster, run_deadline
from stride.sim.engine import SimulationError
from stride.sim.traces import (
    CurveLibrary,
    TraceJob,
    TraceWindow,
    load_cluster_spec,
    load_curves,
    load_deadline_trace,
    parse_cluster_spec,
    parse_deadline_trace,
)
from stride.testing import SHARED_TRACES

TRACES = SHARED_TRACES
HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"


def _fig3() -> tuple[list[TraceJob], CurveLibrary]:
    """ElasticFlow Fig. 3: T(1) = 1, T(2) = 1.5; A and B need 3 units, deadlines 3 and 3.5.

    Times are scaled by 1,000 s so deadlines span whole 300 s admission slots.
    """
    curve = ScalingCurve((1, 2), (1.0 / 1000, 1.5 / 1000))
    library = CurveLibrary({("toy", 1): curve}, "fig3")
    jobs = [
        TraceJob("A", 0.0, 3.0, "toy", 1, 1, 3000.0, 3000.0),
        TraceJob("B", 0.0, 3.0, "toy", 1, 1, 3000.0, 3500.0),
    ]
    return jobs, library


def test_fig3_edf_misses_b_and_stride_meets_both() -> None:
    jobs, curves = _fig3()
    cluster = DeadlineCluster(2)
    edf = run_deadline(jobs, cluster, "edf", 0, curves, pause_seconds=0.0)
    # EDF gives A both workers: A ends at 2,000 s, B then runs alone from 2,000 to 4,000 s.
    assert edf.finish_times == pytest.approx({"A": 2000.0, "B": 4000.0})
    assert edf.met == 1
    stride = run_deadline(jobs, cluster, "stride", 0, curves, pause_seconds=0.0)
    # One worker each: both end at 3,000 s.
    assert stride.finish_times == pytest.approx({"A": 3000.0, "B": 3000.0})
    assert stride.met == 2 and stride.dsr == 1.0 and stride.dropped == ()
    assert stride.cluster_efficiency == pytest.approx(1.0)


def test_overhead_pauses_each_reallocation() -> None:
    jobs, curves = _fig3()
    result = run_deadline(jobs, DeadlineCluster(2), "edf", 0, curves, pause_seconds=10.0)
    # A pauses 10 s then runs 2,000 s on 2 GPUs; B then takes both, pauses 10 s, runs 2,000 s.
    assert result.finish_times == pytest.approx({"A": 2010.0, "B": 4020.0})
    assert result.scaling_events == 0


@pytest.fixture(scope="module")
def curves() -> CurveLibrary:
    return load_curves(TRACES / "throughputs_A100")


@pytest.fixture(scope="module")
def window() -> list[TraceJob]:
    return load_deadline_trace(TRACES / "itp-ef" / "195job.csv", TraceWindow(first_n=40))


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_invariants_on_a_real_window(
    policy: str, curves: CurveLibrary, window: list[TraceJob]
) -> None:
    cluster = DeadlineCluster.from_spec(load_cluster_spec(TRACES / "cluster_specs" / "n4g8.csv"))
    result = run_deadline(window, cluster, policy, 3, curves)
    assert result.peak_gpus_in_use <= cluster.num_gpus
    assert set(result.finish_times) == {job.job_id for job in window}
    for job_id, finish in result.finish_times.items():
        assert (finish is None) == (job_id in result.dropped)
    assert len(set(result.dropped)) == len(result.dropped)
    assert result.dsr is not None and 0.0 <= result.dsr <= 1.0
    assert 0.0 <= result.cluster_efficiency <= 1.0 + 1e-9
    if policy in ("edf", "gandiva"):
        assert result.dropped == ()
    if policy == "gandiva":
        assert result.dsr_lambda_lt_1 == 0.0  # non-elastic can never meet lambda < 1
    assert run_deadline(window, cluster, policy, 3, curves) == result


def test_stride_beats_edf_and_gandiva(curves: CurveLibrary, window: list[TraceJob]) -> None:
    cluster = DeadlineCluster(32)
    met = {name: run_deadline(window, cluster, name, 1, curves).met for name in POLICIES}
    assert met["stride"] >= met["edf"] and met["stride"] >= met["gandiva"]


def test_best_effort_fraction_is_seeded(curves: CurveLibrary, window: list[TraceJob]) -> None:
    cluster = DeadlineCluster(32)
    first = run_deadline(window, cluster, "stride", 5, curves, best_effort_fraction=0.5)
    again = run_deadline(window, cluster, "stride", 5, curves, best_effort_fraction=0.5)
    assert first == again
    assert first.best_effort_jct is not None and first.deadline_jobs < len(window)


def test_loader_errors_name_file_line_and_field(curves: CurveLibrary) -> None:
    with pytest.raises(SimulationError, match=r"t\.csv:3 num_iteration: is not a number"):
        parse_deadline_trace(HEADER + "a,0,10,bert,100,64,1,50\nb,1,x,bert,100,64,1,50\n", "t.csv")
    with pytest.raises(SimulationError, match=r"t\.csv:2 deadline: .* is not after"):
        parse_deadline_trace(HEADER + "a,10,10,bert,5,64,1,50\n", "t.csv")
    with pytest.raises(SimulationError, match=r"t\.csv:2 batch_size"):
        parse_deadline_trace(HEADER + "a,0,10,bert,100,6.5,1,50\n", "t.csv")
    with pytest.raises(SimulationError, match=r"t\.csv:1 header"):
        parse_deadline_trace("x,y\n1,2\n", "t.csv")
    with pytest.raises(SimulationError, match=r"window: keeps no job"):
        parse_deadline_trace(HEADER + "a,0,10,bert,100,64,1,50\n", "t.csv", TraceWindow(end=0))
    with pytest.raises(SimulationError, match=r"s\.csv:2 num_gpu_p_node"):
        parse_cluster_spec(
            "num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n1,2,0,4,8\n",
            "s.csv",
        )
    unknown = parse_deadline_trace(HEADER + "a,0,10,alexnet,100,64,1,50\n", "t.csv")
    with pytest.raises(SimulationError, match=r"t\.csv:2 model_name: unknown model 'alexnet'"):
        run_deadline(unknown, DeadlineCluster(8), "stride", 0, curves)
    big = parse_deadline_trace(HEADER + "a,0,10,bert,100,64,16,50\n", "t.csv")
    with pytest.raises(SimulationError, match=r"t\.csv:2 num_gpu: 16 exceeds"):
        run_deadline(big, DeadlineCluster(8), "gandiva", 0, curves)
    with pytest.raises(SimulationError, match="policy_name"):
        run_deadline(big, DeadlineCluster(8), "pollux", 0, curves)


def test_philly_and_windows_load() -> None:
    jobs = load_deadline_trace(
        TRACES / "philly-vc" / "philly_103959.csv", TraceWindow(start=0, end=1e6)
    )
    assert jobs[0].submission_time == 0.0
    assert all(job.deadline is not None and job.iterations > 0 for job in jobs)


@pytest.mark.parametrize("incremental", [True, False])
def test_fig3_and_invariants_hold_for_both_admission_paths(
    incremental: bool, curves: CurveLibrary, window: list[TraceJob]
) -> None:
    jobs, toy = _fig3()
    stride = run_deadline(
        jobs, DeadlineCluster(2), "stride", 0, toy, pause_seconds=0.0, incremental=incremental
    )
    assert stride.finish_times == pytest.approx({"A": 3000.0, "B": 3000.0})
    cluster = DeadlineCluster(32)
    result = run_deadline(window, cluster, "stride", 2, curves, incremental=incremental)
    assert result.peak_gpus_in_use <= cluster.num_gpus
    for job_id, finish in result.finish_times.items():
        assert (finish is None) == (job_id in result.dropped)
    assert run_deadline(window, cluster, "stride", 2, curves, incremental=incremental) == result
