"""Environment C (GoldMiner data workers): simulator invariants and a hand-computed case."""

from __future__ import annotations

import pytest

from stride.sim.dataworkers import (
    DATAWORKER_POLICIES,
    DataWorkerCluster,
    DataWorkerJob,
    generate_dataworker_jobs,
    jct_gain,
    run_dataworkers,
    tune_job,
)
from stride.sim.engine import SimulationError

SMALL_CLUSTER = DataWorkerCluster(nodes=2, gpus_per_node=8, cpus_per_node=64)
ONE_NODE = DataWorkerCluster(nodes=1, gpus_per_node=8, cpus_per_node=64)


def _job(
    job_id: str, submit: float, steps: float, training: float, preprocessing: float, gpus: int = 1
) -> DataWorkerJob:
    return DataWorkerJob(
        job_id=job_id,
        submit_time=submit,
        gpus=gpus,
        steps=steps,
        training_cpu_per_gpu=training,
        preprocessing_cpu_per_gpu=preprocessing,
    )


@pytest.mark.parametrize("policy", DATAWORKER_POLICIES)
def test_allocations_never_exceed_capacity(policy: str) -> None:
    result = run_dataworkers(30, SMALL_CLUSTER, policy, seed=3, window_s=3600.0)
    assert 0 < result.peak_gpus_used <= SMALL_CLUSTER.total_gpus
    assert 0 < result.peak_cpus_used <= SMALL_CLUSTER.total_cpus


@pytest.mark.parametrize("policy", DATAWORKER_POLICIES)
def test_every_job_ends_exactly_once(policy: str) -> None:
    jobs = generate_dataworker_jobs(30, seed=5, window_s=3600.0)
    result = run_dataworkers(30, SMALL_CLUSTER, policy, seed=5, jobs=jobs)
    assert [o.job_id for o in result.outcomes] == [job.job_id for job in jobs]
    for job, outcome in zip(jobs, result.outcomes, strict=True):
        assert job.submit_time <= outcome.start_time < outcome.end_time
        # Nobody runs faster than one step per second (the ideal speed).
        assert outcome.end_time - outcome.start_time >= job.steps - 1e-6


@pytest.mark.parametrize("policy", ["no-dw-tuned", "fixed-dw", "goldminer-srtf"])
def test_same_seed_same_result(policy: str) -> None:
    first = run_dataworkers(25, SMALL_CLUSTER, policy, seed=11, window_s=3600.0)
    again = run_dataworkers(25, SMALL_CLUSTER, policy, seed=11, window_s=3600.0)
    other = run_dataworkers(25, SMALL_CLUSTER, policy, seed=12, window_s=3600.0)
    assert first == again
    assert first.outcomes == again.outcomes
    assert first.outcomes != other.outcomes


def test_tuner_finds_training_and_data_worker_size() -> None:
    # m = 1 training CPU, 15 pre-processing CPUs: data workers scale linearly up to the
    # 8-CPU container, and the training worker shrinks to the 1 CPU it needs.
    tuned = tune_job(_job("a", 0.0, 3600.0, 1.0, 15.0), ONE_NODE)
    assert not tuned.fell_back
    assert tuned.training_worker_cpu == 1
    assert tuned.data_worker_size == 8


def test_hand_computed_single_job() -> None:
    # Best-fit ratio 16 CPUs per GPU. With the hardware ratio (8) pre-processing halves the
    # throughput: 3600 steps take 7200 s. Tuned ratio, fixed and elastic data workers all
    # reach full speed (1 step/s): 3600 s, twice as fast as the hardware ratio.
    jobs = [_job("a", 0.0, 3600.0, 1.0, 15.0)]
    expected = {
        "no-dw-hw": 7200.0,
        "no-dw-tuned": 3600.0,
        "fixed-dw": 3600.0,
        "goldminer-maxtp": 3600.0,
        "goldminer-srtf": 3600.0,
        "goldminer-fair": 3600.0,
    }
    for policy, jct in expected.items():
        result = run_dataworkers(1, ONE_NODE, policy, seed=0, jobs=jobs)
        assert result.avg_jct_s == pytest.approx(jct), policy
        assert result.makespan_s == pytest.approx(jct), policy
        assert result.avg_queuing_s == 0.0


def test_hand_computed_fragmentation_queues_tuned_ratio_only() -> None:
    # Two machines of 2 GPUs and 32 CPUs. Under the tuned ratio, a (20 CPUs) goes to node 0
    # and b (20) to node 1, leaving 12 CPUs on each: c (14) fits neither and waits until a
    # ends at 1000 s, then runs 1000..2000. JCTs 1000, 999 + 1 = 1000, 1998; makespan 2000.
    # GoldMiner needs 1 training CPU per job and 19 + 19 + 13 data-worker CPUs: 54 <= 64,
    # so all three run at full speed at once: JCT 1000 each, makespan 1002.
    cluster = DataWorkerCluster(nodes=2, gpus_per_node=2, cpus_per_node=32)
    jobs = [
        _job("a", 0.0, 1000.0, 1.0, 19.0),
        _job("b", 1.0, 1000.0, 1.0, 19.0),
        _job("c", 2.0, 1000.0, 1.0, 13.0),
    ]
    tuned = run_dataworkers(3, cluster, "no-dw-tuned", seed=0, jobs=jobs)
    assert tuned.avg_jct_s == pytest.approx((1000.0 + 1000.0 + 1998.0) / 3)
    assert tuned.avg_queuing_s == pytest.approx(998.0 / 3)
    assert tuned.makespan_s == pytest.approx(2000.0)
    for policy in ("goldminer-maxtp", "goldminer-srtf", "goldminer-fair"):
        elastic = run_dataworkers(3, cluster, policy, seed=0, jobs=jobs)
        assert elastic.avg_queuing_s == 0.0
        assert elastic.avg_jct_s == pytest.approx(1000.0)
        assert elastic.makespan_s == pytest.approx(1002.0)
        assert jct_gain(elastic, tuned) == pytest.approx(3998.0 / 3000.0)


def test_bad_input_is_named() -> None:
    with pytest.raises(SimulationError, match="policy_name"):
        run_dataworkers(3, ONE_NODE, "no-such-policy", seed=0)
    with pytest.raises(SimulationError, match="gpus 16 exceeds"):
        run_dataworkers(1, ONE_NODE, "no-dw-hw", seed=0, jobs=[_job("x", 0, 10, 1, 1, 16)])
    with pytest.raises(SimulationError, match="num_jobs"):
        run_dataworkers(0, ONE_NODE, "no-dw-hw", seed=0)
    with pytest.raises(SimulationError, match=r"cluster\.nodes"):
        DataWorkerCluster(nodes=0)
    with pytest.raises(SimulationError, match="steps"):
        _job("y", 0.0, 0.0, 1.0, 1.0)


def test_a_job_that_can_never_progress_is_an_error_not_a_hang() -> None:
    # 64 GPUs on the 64-GPU testbed: GoldMiner's tuned training workers (8 CPUs per GPU)
    # take all 512 CPUs, so no data worker can exist and the job would never progress.
    job = DataWorkerJob("big", 0.0, 64, 38_383.0, 1.08, 44.04)
    with pytest.raises(SimulationError, match=r"\['big'\] can never progress under goldminer"):
        run_dataworkers(1, policy_name="goldminer-srtf", seed=0, jobs=[job])
    # Without data workers it is slow but finishes.
    assert run_dataworkers(1, policy_name="no-dw-tuned", seed=0, jobs=[job]).num_jobs == 1
