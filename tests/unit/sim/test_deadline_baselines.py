"""Environment A's baselines and buddy placement on hand-computed tiny traces."""

from __future__ import annotations

import pytest

from stride.policy.elasticflow.curves import ScalingCurve
from stride.policy.elasticflow.placement import (
    DeviceAllocation,
    PlacementRequest,
    Topology,
    buddy,
)
from stride.sim.deadline import DeadlineCluster, run_deadline
from stride.sim.traces import (
    CurveLibrary,
    TraceJob,
    TraceWindow,
    load_cluster_spec,
    load_curves,
    load_deadline_trace,
)
from stride.testing import SHARED_TRACES

# One iteration per 1,000 s on one GPU, 1.5 per 1,000 s on two.
CURVES = CurveLibrary({("toy", 1): ScalingCurve((1, 2), (1.0 / 1000, 1.5 / 1000))}, "toy")


def _job(job_id: str, at: float, iterations: float, deadline: float, gpus: int = 1) -> TraceJob:
    return TraceJob(job_id, at, iterations, "toy", 1, gpus, iterations * 1000.0, deadline)


def test_tiresias_demotes_after_the_first_threshold_and_lets_the_newcomer_run() -> None:
    jobs = [_job("A", 0.0, 10.0, 20000.0), _job("B", 1000.0, 2.0, 20000.0)]
    result = run_deadline(jobs, DeadlineCluster(1), "tiresias", 0, CURVES, pause_seconds=0.0)
    # A holds the GPU until its attained service reaches 3,600 GPU-s (queue 0 is FIFO, so
    # B waits); then B (queue 0) preempts A (queue 1) and runs 2,000 s; A resumes at 5,600.
    assert result.finish_times == pytest.approx({"A": 12000.0, "B": 5600.0})
    assert result.scaling_events == 2  # A preempted, A resumed


def test_themis_re_leases_to_the_most_unfair_job() -> None:
    jobs = [_job("A", 0.0, 10.0, 20000.0), _job("B", 100.0, 2.0, 20000.0)]
    result = run_deadline(jobs, DeadlineCluster(1), "themis", 0, CURVES, pause_seconds=0.0)
    # At the 1,200 s lease: rho(A) = (1200 + 8800) / (10000 x 2) = 0.5 and
    # rho(B) = (1100 + 2000) / (2000 x 2) = 0.775, so B takes the GPU and ends at 3,200;
    # A resumes then with 8,800 s left.
    assert result.finish_times == pytest.approx({"A": 12000.0, "B": 3200.0})


def test_chronus_admits_what_edf_can_schedule_and_demotes_the_rest() -> None:
    jobs = [
        _job("A", 0.0, 3.0, 3000.0),
        _job("B", 0.0, 3.0, 3000.0),
        _job("C", 0.0, 1.0, 2000.0),
    ]
    result = run_deadline(jobs, DeadlineCluster(2), "chronus", 0, CURVES, pause_seconds=0.0)
    # C first in EDF would push B past 3,000 s, so C is demoted to best effort and runs after.
    assert result.finish_times == pytest.approx({"A": 3000.0, "B": 3000.0, "C": 4000.0})
    assert result.met == 2 and result.dropped == ()


def test_non_elastic_baselines_never_meet_a_deadline_tighter_than_the_trace_duration() -> None:
    jobs = [_job("A", 0.0, 3.0, 2500.0)]  # lambda < 1 on its trace size of 1 GPU
    for policy in ("tiresias", "themis", "chronus", "gandiva"):
        result = run_deadline(jobs, DeadlineCluster(2), policy, 0, CURVES, pause_seconds=0.0)
        assert result.met == 0, policy
    stride = run_deadline(jobs, DeadlineCluster(2), "stride", 0, CURVES, pause_seconds=0.0)
    assert stride.met == 1  # elastic: 2 GPUs finish in 2,000 s


def test_buddy_eviction_moves_only_the_jobs_inside_one_block() -> None:
    topology = Topology((2, 4))
    occupied = (
        DeviceAllocation("a", (0,)),
        DeviceAllocation("b", (4,)),
        DeviceAllocation("c", (2, 3)),
        DeviceAllocation("d", (6, 7)),
    )
    reply = buddy(PlacementRequest(topology, "new", 2, occupied))
    # Devices 1 and 5 are free but no aligned pair is: empty [0, 1] by moving a alone.
    assert reply.placed and reply.devices == (0, 1)
    assert reply.migrations == (DeviceAllocation("a", (5,)),)


def test_stride_places_with_buddy_on_a_power_of_two_tree_and_counts_otherwise() -> None:
    curves = load_curves(SHARED_TRACES / "throughputs_A100")
    window = load_deadline_trace(SHARED_TRACES / "itp-ef" / "195job.csv", TraceWindow(first_n=60))
    spec = load_cluster_spec(SHARED_TRACES / "cluster_specs" / "n4g8.csv")
    placed = run_deadline(window, DeadlineCluster.from_spec(spec), "stride", 0, curves)
    counted = run_deadline(window, DeadlineCluster(32), "stride", 0, curves)
    assert placed.placement == "buddy" and counted.placement == "counted"
    assert counted.migrations == 0
    # Migration pauses cost progress, never correctness: same jobs end, within capacity.
    assert set(placed.finish_times) == set(counted.finish_times)
    assert placed.peak_gpus_in_use <= 32
    assert DeadlineCluster(160 * 8, fanouts=(1, 160, 8)).buddy_topology() is None


def test_cluster_fanouts_must_match_the_gpu_count() -> None:
    from stride.sim.engine import SimulationError

    with pytest.raises(SimulationError, match=r"cluster.fanouts: \(1, 2, 8\) hold 16 GPUs"):
        DeadlineCluster(32, fanouts=(1, 2, 8))
