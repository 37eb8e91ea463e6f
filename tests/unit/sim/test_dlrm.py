"""Invariants and a hand-computed case for environment B (DLRM jobs on CPUs)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stride.policy.throughput import PAPER_PARAMETERS, throughput
from stride.sim.dlrm import (
    POLICIES,
    RESTART_SECONDS,
    DlrmJobSpec,
    Pods,
    _config,
    generate_jobs,
    grid_throughput,
    run_dlrm,
    simulate,
)
from stride.sim.engine import SimulationError
from stride.testing import SHARED_TRACES

COVS = SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"


def _spec(total_samples: float) -> DlrmJobSpec:
    return DlrmJobSpec(
        job_id=0,
        submit_time=10.0,
        params=PAPER_PARAMETERS,
        batch_size=128,
        embedding_dim=4,
        model_bytes=1e7,
        total_samples=total_samples,
        hot_factor=1.0,
        straggler_cov=0.0,
        worker_mem_need_gib=2.0,
        ps_static_gib=2.0,
        embedding_final_gib=4.0,
        request=Pods(4, 8, 4, 2, 8, 8),
        model_name="dlrm-0",
    )


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_capacity_and_each_job_ends_once(policy: str) -> None:
    result = run_dlrm(40, 700, 4000, policy, 3, COVS)
    assert result.peak_cpu <= 700
    assert result.peak_memory_gib <= 4000
    assert result.ends == (1,) * 40
    assert result.completed + result.failed == 40
    assert 0.0 <= result.cpu_utilization <= 1.0
    assert 0.0 <= result.memory_utilization <= 1.0


def test_same_seed_same_result() -> None:
    assert run_dlrm(30, 700, 4000, "stride", 5, COVS) == run_dlrm(30, 700, 4000, "stride", 5, COVS)


def test_hand_computed_static_job() -> None:
    spec = _spec(1.0)
    speed = throughput(PAPER_PARAMETERS, _config(spec.request, spec))
    one_hour = speed * 3600.0
    result = simulate([_spec(one_hour)], 100, 100, "static", 0)
    # Submitted at 10 s, placed at once, 120 s of pod start + init, then one hour of training.
    assert result.jcts[0] == pytest.approx(RESTART_SECONDS + 3600.0)
    assert result.completion_rate == 1.0
    assert result.oom_kills == 0
    assert result.scaling_events == 0


def test_under_provisioned_ps_memory_is_oom_killed_under_static() -> None:
    spec = _spec(1e6)
    small = DlrmJobSpec(**{**spec.__dict__, "request": Pods(4, 8, 4, 2, 8, 3)})
    # Peak per PS = (2 + 4) / 2 = 3 GiB... so 3 GiB is just enough; 2 GiB is not.
    tight = DlrmJobSpec(**{**spec.__dict__, "request": Pods(4, 8, 4, 2, 8, 2)})
    assert simulate([small], 100, 100, "static", 0).oom_kills == 0
    failed = simulate([tight], 100, 100, "static", 0)
    assert failed.failed == 1
    assert failed.oom_kills == 3
    assert math.isnan(failed.jcts[0])


def test_grid_throughput_matches_policy_model() -> None:
    spec = _spec(1.0)
    pods = Pods(6, 4, 4, 3, 2, 8)
    value = grid_throughput(
        PAPER_PARAMETERS,
        spec,
        1.0,
        np.array([6.0]),
        np.array([4.0]),
        np.array([3.0]),
        np.array([2.0]),
    )
    assert float(value[0]) == pytest.approx(throughput(PAPER_PARAMETERS, _config(pods, spec)))


def test_population_is_over_provisioned() -> None:
    jobs = generate_jobs(200, np.random.default_rng(0), (0.05, 0.3))
    # Tuned configurations use far fewer cores than requested for most jobs.
    result = simulate(jobs, 10_000, 100_000, "static", 0)
    assert result.cpu_utilization < 0.5


def test_bad_input() -> None:
    with pytest.raises(SimulationError, match="policy_name"):
        run_dlrm(2, 700, 4000, "optimus", 0, COVS)
    with pytest.raises(SimulationError, match="exceeds the cluster"):
        simulate([_spec(1e6)], 10, 100, "static", 0)
