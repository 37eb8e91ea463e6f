"""Environment C (GoldMiner data workers): simulator invariants and a hand-computed case."""

from __future__ import annotations

import csv

import pytest

from stride.sim import dataworkers
from stride.sim.dataworkers import (
    DATAWORKER_POLICIES,
    DataWorkerCluster,
    DataWorkerJob,
    data_workers_pay,
    generate_dataworker_jobs,
    jct_gain,
    run_dataworkers,
    trace_dataworker_jobs,
    tune_job,
)
from stride.sim.engine import SimulationError
from stride.sim.traces import TraceWindow, load_raw_trace, parse_raw_trace
from stride.testing import SHARED_TRACES

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


def test_the_synthetic_draw_is_unchanged() -> None:
    # Recorded results (bench/results/sim/dataworkers-100) depend on this exact draw.
    jobs = generate_dataworker_jobs(100, seed=1)
    assert (jobs[0].gpus, jobs[0].steps) == (2, 8189.8024136689)
    assert jobs[0].training_cpu_per_gpu == 1.8687957744490609
    assert jobs[0].preprocessing_cpu_per_gpu == 8.573013080198503
    assert jobs[99].training_cpu_per_gpu == 1.7240321159207121
    assert jobs[99].preprocessing_cpu_per_gpu == 3.9278588010147297


# Cluster01 from 2,419,200 s to 2,476,800 s (hours 672-688 of the trace): five jobs, two of
# them on 64 GPUs.
CLUSTER01 = SHARED_TRACES / "itp-raw" / "cluster01.csv"
WINDOW = TraceWindow(2_419_200.0, 2_476_800.0)


def test_trace_jobs_are_the_window_rows_rebased() -> None:
    with CLUSTER01.open() as file:
        rows = [
            row
            for row in csv.DictReader(file)
            if 2_419_200 <= int(row["submission_time"]) < 2_476_800
        ]
    jobs = trace_dataworker_jobs(load_raw_trace(CLUSTER01, WINDOW), seed=1)
    first = int(rows[0]["submission_time"])
    assert first == 2_427_284 and len(jobs) == 5
    assert [job.job_id for job in jobs] == [row["job_id"] for row in rows]
    assert [job.submit_time for job in jobs] == [
        int(row["submission_time"]) - first for row in rows
    ]
    assert [job.gpus for job in jobs] == [64, 64, 8, 8, 8]
    assert [job.steps for job in jobs] == [float(row["duration"]) for row in rows]
    # CPU demands: the synthetic rule, seeded; three of five jobs CPU-intensive.
    assert sum(job.cpu_intensive for job in jobs) == 3
    assert all(1.0 <= job.training_cpu_per_gpu <= 3.0 for job in jobs)
    assert all(4.0 <= job.best_fit_ratio <= 64.0 for job in jobs)
    assert trace_dataworker_jobs(load_raw_trace(CLUSTER01, WINDOW), seed=1) == jobs
    assert trace_dataworker_jobs(load_raw_trace(CLUSTER01, WINDOW), seed=2) != jobs


def test_a_job_too_large_for_data_workers_falls_back_to_local_preprocessing() -> None:
    # 64 GPUs on the 64-GPU testbed, 44 pre-processing CPUs per GPU: its tuned training
    # workers (1 CPU each: the tuner's 5% tolerances) leave 448 CPUs, which give it
    # 448 / 2,819 of full speed, less than 95% of 8 local CPUs per GPU. It falls back to
    # those, as the hardware-ratio baseline runs it: 38,383 steps at 8 / 45.12 steps/s.
    job = DataWorkerJob("big", 0.0, 64, 38_383.0, 1.08, 44.04)
    assert tune_job(job, DataWorkerCluster()).training_worker_cpu == 1
    for policy in ("goldminer-srtf", "no-dw-hw"):
        result = run_dataworkers(1, policy_name=policy, seed=0, jobs=[job])
        assert result.avg_jct_s == pytest.approx(38_383.0 * 45.12 / 8), policy
        assert result.fallback_jobs == (1 if policy == "goldminer-srtf" else 0)


def test_a_job_started_when_no_data_worker_could_pay_falls_back() -> None:
    # One node (8 GPU, 64 CPU); a and b: 4 GPUs, m = 7.9, r = 133.1 (tuned: 8-CPU training
    # workers, as 7 would lose 11%). a starts alone: the 32 CPUs beside its training workers
    # give it 32 / 532.4 of full speed, above 95% of its local speed at 8 CPUs per GPU
    # (8 / 141), so it uses data workers. When b starts at 1 s no CPU is left for data
    # workers, so b runs locally at 8 / 141 (17,625 s); a gets no data-worker CPU until b
    # ends, then 32 again.
    tuned = tune_job(_job("a", 0.0, 1000.0, 7.9, 133.1, gpus=4), ONE_NODE)
    assert (tuned.training_worker_cpu, tuned.fell_back) == (8, False)
    assert data_workers_pay(_job("a", 0.0, 1000.0, 7.9, 133.1, gpus=4), tuned, 32)
    assert not data_workers_pay(_job("a", 0.0, 1000.0, 7.9, 133.1, gpus=4), tuned, 0)
    jobs = [_job(name, float(at), 1000.0, 7.9, 133.1, gpus=4) for name, at in (("a", 0), ("b", 1))]
    result = run_dataworkers(2, ONE_NODE, "goldminer-srtf", seed=0, jobs=jobs)
    a, b = result.outcomes
    assert b.end_time == pytest.approx(1.0 + 1000.0 * 141 / 8)
    assert a.end_time == pytest.approx(b.end_time + (1000.0 - 32 / 532.4) * 532.4 / 32)
    assert result.fallback_jobs == 1


def test_a_run_that_can_never_progress_is_an_error_not_a_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Without the fallback test the 64-GPU job's training workers (8 CPUs each: its own
    # ops need 7.9) hold every CPU and it never progresses: the simulator names it instead
    # of re-allocating forever.
    monkeypatch.setattr(dataworkers, "data_workers_pay", lambda job, tuned, spare: True)
    job = DataWorkerJob("big", 0.0, 64, 38_383.0, 7.9, 37.22)
    with pytest.raises(SimulationError, match=r"\['big'\] can never progress under goldminer"):
        run_dataworkers(1, policy_name="goldminer-srtf", seed=0, jobs=[job])


def test_raw_trace_rows_are_checked_and_named() -> None:
    header = "job_id,submission_time,duration,num_gpu\n"
    assert [job.num_gpu for job in parse_raw_trace(header + "a,5,600,2\nb,1,700,4\n")] == [4, 2]
    for text, message in (
        ("job_id,submission_time,num_gpu\na,0,1\n", "trace:1 duration: is missing"),
        (header + "a,0,600,1.5\n", "trace:2 num_gpu: must be a whole number > 0"),
        (header + "a,0,-1,1\n", "trace:2 duration: must be > 0"),
        (header + "a,0,600,1\na,1,600,1\n", "trace:3 job_id: must be unique"),
        (header + "a,x,600,1\n", "trace:2 submission_time: is not a number"),
    ):
        with pytest.raises(SimulationError, match=message):
            parse_raw_trace(text)
