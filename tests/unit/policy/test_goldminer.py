"""GoldMiner data-worker scheduling: the job-level tuner against a simulated pipeline, and the
cluster-level MaxTP / SRTF / Fair allocation with its invariants."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy import goldminer
from stride.policy.errors import PolicyError
from stride.policy.goldminer import (
    AllocationPolicy,
    ClusterAllocationReply,
    ClusterAllocationRequest,
    InvalidAllocationInput,
    InvalidTuningInput,
    JobThroughputCurve,
    PipelineConfiguration,
    QueueObservation,
    TunerConfig,
    TunerReply,
    TunerRequest,
    TunerState,
    TuningAction,
    TuningPhase,
    allocate_data_worker_cpus,
    allocate_data_worker_cpus_by_resorting,
    tune_step,
)
from stride.policy.registry import Registry
from stride.policy.serialization import from_dict, to_dict

# ----------------------------------------------------------------------------------------
# A simulated data pipeline (the tuner's environment)
# ----------------------------------------------------------------------------------------

QUEUE_CAPACITY = 16


@dataclass(frozen=True)
class SimulatedJob:
    """A job whose data side and training side have simple, known speeds.

    - a data-worker process with c CPUs makes ``per_cpu_rate`` batches/s per CPU up to
      ``linear_cpus``, then ``sublinear_factor`` of that per further CPU;
    - the training worker fetches (DWRecv, on its CPUs) at most ``fetch_rate_per_cpu`` per
      CPU, so fetching limits the enqueue rate; the GPU trains at most ``gpu_rate``;
    - ``transfer_efficiency`` models the data-transfer cost that can make data workers lose;
    - without data workers, pre-processing runs on the training CPUs at ``local_rate_per_cpu``.
    """

    per_cpu_rate: float = 10.0
    linear_cpus: int = 8
    sublinear_factor: float = 0.3
    gpu_rate: float = 220.0
    fetch_rate_per_cpu: float = 80.0
    transfer_efficiency: float = 1.0
    local_rate_per_cpu: float = 9.0

    def worker_rate(self, cpus: int) -> float:
        linear = min(cpus, self.linear_cpus)
        extra = max(0, cpus - self.linear_cpus)
        return self.per_cpu_rate * (linear + self.sublinear_factor * extra)

    def observe(self, configuration: PipelineConfiguration) -> QueueObservation:
        training_cpu = configuration.training_worker_cpu
        if not configuration.uses_data_workers:
            throughput = min(self.gpu_rate, self.local_rate_per_cpu * training_cpu)
            return QueueObservation(throughput=throughput, training_cpu_utilization=1.0)
        produced = (
            configuration.data_workers
            * self.worker_rate(configuration.data_worker_cpu)
            * self.transfer_efficiency
        )
        fetch_capacity = self.fetch_rate_per_cpu * training_cpu
        enqueue = min(produced, fetch_capacity)
        throughput = min(enqueue, self.gpu_rate)
        return QueueObservation(
            throughput=throughput,
            enqueue_rate=enqueue,
            dequeue_rate=self.gpu_rate,
            queue_length=float(QUEUE_CAPACITY) if enqueue >= self.gpu_rate else 0.0,
            queue_capacity=QUEUE_CAPACITY,
            training_cpu_utilization=min(1.0, produced / fetch_capacity),
        )

    def throughput(self, configuration: PipelineConfiguration) -> float:
        return self.observe(configuration).throughput


DEFAULT_CONFIG = TunerConfig()


def drive(
    job: SimulatedJob, config: TunerConfig = DEFAULT_CONFIG, limit: int = 5_000
) -> tuple[TunerReply, list[TunerReply]]:
    """Run the tuner against ``job`` until it converges; every reply goes over the wire."""
    spec = {s.name: s for s in goldminer.ALGORITHMS}["goldminer-tune-step"]
    reply = tune_step(TunerRequest(config=config))
    replies = [reply]
    for _ in range(limit):
        if reply.converged:
            return reply, replies
        request = TunerRequest(config, reply.state, job.observe(reply.configuration))
        # Round-trip both ways, as the executor would.
        plain = spec.run_dict(to_dict(request))
        reply = from_dict(TunerReply, plain)
        replies.append(reply)
    raise AssertionError(f"tuner did not converge in {limit} steps")


# ----------------------------------------------------------------------------------------
# Job level: worked examples
# ----------------------------------------------------------------------------------------


def test_resnet18_walkthrough_of_section_5_5() -> None:
    # Sec. 5.5: linear speedup up to the container's 8 CPUs, three data workers in total,
    # a drop at 2 training CPUs, and the training worker rolled back to and fixed at 3.
    final, replies = drive(SimulatedJob())
    assert final.configuration == PipelineConfiguration(3, 8, 3)
    assert not final.state.fell_back
    assert final.state.size_throughputs == tuple(10.0 * c for c in range(1, 9))
    actions = [reply.action for reply in replies]
    assert actions[0] is TuningAction.PROFILE_BASELINE
    assert actions.count(TuningAction.GROW_DATA_WORKER) == 8
    assert actions.count(TuningAction.ADD_DATA_WORKER) == 2
    assert actions[-1] is TuningAction.ROLL_BACK
    shrinks = [
        r.configuration.training_worker_cpu for r in replies if r.action.name.startswith("S")
    ]
    assert shrinks == [7, 6, 5, 4, 3, 2]
    assert final.state.baseline_throughput == 72.0


def test_queue_ideal_while_growing_the_data_worker_stops_at_that_size() -> None:
    final, replies = drive(SimulatedJob(gpu_rate=45.0))
    # 5 CPUs make 50 >= 45 batches/s: the queue is ideal, no more data workers.
    assert final.configuration.data_workers == 1
    assert final.configuration.data_worker_cpu == 5
    assert TuningAction.ADD_DATA_WORKER not in [r.action for r in replies]
    # One training CPU fetches 80 >= 45: shrinking never drops, it stops at 1 CPU.
    assert final.configuration.training_worker_cpu == 1
    assert final.action is TuningAction.KEEP


def test_sublinear_speedup_keeps_the_largest_linear_size() -> None:
    final, _ = drive(SimulatedJob(linear_cpus=4, gpu_rate=100.0))
    # CPU 5 adds 3 < 0.9 * 10: size 4; then 3 x 40 >= 100 is ideal; 1 training CPU (80)
    # drops throughput, so it rolls back to 2.
    assert final.configuration == PipelineConfiguration(3, 4, 2)


def test_sublinear_edge_uses_the_papers_linear_threshold() -> None:
    # A 5th CPU that adds exactly 90% of the first CPU's throughput is still linear.
    config = TunerConfig()
    state = TunerState(
        TuningPhase.DATA_WORKER_SIZE,
        PipelineConfiguration(1, 5, 8),
        baseline_throughput=1.0,
        size_throughputs=(10.0, 20.0, 30.0, 40.0),
    )
    linear = tune_step(TunerRequest(config, state, QueueObservation(throughput=49.0)))
    assert linear.action is TuningAction.GROW_DATA_WORKER
    assert linear.configuration.data_worker_cpu == 6
    sublinear = tune_step(TunerRequest(config, state, QueueObservation(throughput=48.9)))
    assert sublinear.action is TuningAction.ADD_DATA_WORKER
    assert sublinear.configuration == PipelineConfiguration(2, 4, 8)
    assert sublinear.state.reference_throughput == 40.0


def test_data_workers_that_do_not_help_fall_back_to_the_original_mode() -> None:
    # Transfer eats 70% of what data workers make (the paper's fast CV models), and the
    # scheduler grants at most two: 48 steps/s against a 160 baseline.
    job = SimulatedJob(transfer_efficiency=0.3, local_rate_per_cpu=20.0, gpu_rate=200.0)
    final, _ = drive(job, TunerConfig(max_data_workers=2))
    assert final.state.fell_back
    assert final.action is TuningAction.FALL_BACK
    assert final.configuration == PipelineConfiguration(0, 0, 8)
    assert final.state.baseline_throughput == 160.0


def test_comparable_performance_threshold_keeps_data_workers_at_95_percent() -> None:
    config = TunerConfig()
    state = TunerState(
        TuningPhase.DATA_WORKER_SIZE,
        PipelineConfiguration(1, 1, 8),
        baseline_throughput=100.0,
    )

    def ideal(throughput: float) -> QueueObservation:
        return QueueObservation(throughput=throughput, enqueue_rate=95.0, dequeue_rate=95.0)

    kept = tune_step(TunerRequest(config, state, ideal(95.0)))
    assert not kept.state.fell_back and kept.action is TuningAction.SHRINK_TRAINING_WORKER
    lost = tune_step(TunerRequest(config, state, ideal(94.9)))
    assert lost.state.fell_back and lost.configuration == PipelineConfiguration(0, 0, 8)


def test_busy_training_worker_is_grown_when_data_workers_show_diminishing_returns() -> None:
    # Fetching at 12 batches/s per training CPU caps 8 CPUs at 96 < 200 (the GPU).
    final, replies = drive(SimulatedJob(fetch_rate_per_cpu=12.0, gpu_rate=200.0))
    actions = [r.action for r in replies]
    assert TuningAction.GROW_TRAINING_WORKER in actions
    assert final.configuration.training_worker_cpu > 8
    assert final.configuration.data_workers >= 3
    job = SimulatedJob(fetch_rate_per_cpu=12.0, gpu_rate=200.0)
    assert job.throughput(final.configuration) >= 0.95 * 200.0


def test_idle_training_worker_gives_back_a_data_worker_that_did_not_help() -> None:
    # Transfer-bound with an idle trainer (fetch is plentiful): a second worker adds 0.
    config = TunerConfig()
    state = TunerState(
        TuningPhase.DATA_WORKER_COUNT,
        PipelineConfiguration(2, 8, 8),
        baseline_throughput=10.0,
        reference_throughput=80.0,
        last_action=TuningAction.ADD_DATA_WORKER,
    )
    observation = QueueObservation(throughput=85.0, training_cpu_utilization=0.2)
    reply = tune_step(TunerRequest(config, state, observation))
    assert reply.converged and reply.configuration == PipelineConfiguration(1, 8, 8)


def test_converged_state_is_kept() -> None:
    final, _ = drive(SimulatedJob())
    again = tune_step(TunerRequest(TunerConfig(), final.state, QueueObservation(throughput=1.0)))
    assert again.converged and again.action is TuningAction.KEEP
    assert again.configuration == final.configuration


# ----------------------------------------------------------------------------------------
# Job level: properties
# ----------------------------------------------------------------------------------------

simulated_jobs = st.builds(
    SimulatedJob,
    per_cpu_rate=st.floats(0.5, 50),
    linear_cpus=st.integers(1, 12),
    sublinear_factor=st.floats(0, 0.95),
    gpu_rate=st.floats(1, 1000),
    fetch_rate_per_cpu=st.floats(1, 200),
    transfer_efficiency=st.floats(0.05, 1),
    local_rate_per_cpu=st.floats(0.1, 100),
)
tuner_configs = st.builds(
    TunerConfig,
    initial_training_worker_cpu=st.integers(1, 8),
    data_worker_container_cpu=st.integers(1, 12),
    max_data_workers=st.integers(1, 12),
    max_training_worker_cpu=st.just(16),
)


@settings(max_examples=150, deadline=None)
@given(simulated_jobs, tuner_configs)
def test_tuner_converges_within_limits_and_never_loses_to_the_baseline(
    job: SimulatedJob, config: TunerConfig
) -> None:
    final, replies = drive(job, config, limit=2_000)
    for reply in replies:
        configuration = reply.configuration
        assert configuration.data_worker_cpu <= config.data_worker_container_cpu
        assert configuration.data_workers <= config.max_data_workers
        assert 1 <= configuration.training_worker_cpu <= config.max_training_worker_cpu
    baseline = job.throughput(PipelineConfiguration(0, 0, config.initial_training_worker_cpu))
    assert final.state.baseline_throughput == baseline
    if final.state.fell_back:
        assert not final.configuration.uses_data_workers
    else:
        # Kept data workers are comparable to the baseline (training-worker shrinking may
        # give up at most its own tolerance on top).
        kept = job.throughput(final.configuration)
        assert kept >= 0.95 * 0.95 * baseline - 1e-9


# ----------------------------------------------------------------------------------------
# Job level: bad input
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: QueueObservation(throughput=math.nan), "throughput"),
        (lambda: QueueObservation(throughput=-1.0), "throughput"),
        (lambda: QueueObservation(throughput=1.0, enqueue_rate=math.inf), "enqueue_rate"),
        (lambda: QueueObservation(throughput=1.0, queue_capacity=0), "queue_capacity"),
        (lambda: QueueObservation(throughput=1, queue_length=3, queue_capacity=2), "queue_length"),
        (
            lambda: QueueObservation(throughput=1.0, training_cpu_utilization=1.5),
            "training_cpu_utilization",
        ),
        (lambda: PipelineConfiguration(-1, 0, 8), "data_workers"),
        (lambda: PipelineConfiguration(1, -2, 8), "data_worker_cpu"),
        (lambda: PipelineConfiguration(1, 0, 8), "data_worker_cpu"),
        (lambda: PipelineConfiguration(0, 0, 0), "training_worker_cpu"),
        (lambda: TunerConfig(initial_training_worker_cpu=-8), "initial_training_worker_cpu"),
        (lambda: TunerConfig(data_worker_container_cpu=0), "data_worker_container_cpu"),
        (lambda: TunerConfig(linear_speedup_efficiency=math.nan), "linear_speedup_efficiency"),
        (lambda: TunerConfig(max_training_worker_cpu=4), "max_training_worker_cpu"),
        (
            lambda: TunerState(TuningPhase.BASELINE, PipelineConfiguration(1, 1, 8)),
            "configuration.data_workers",
        ),
        (
            lambda: TunerState(TuningPhase.DATA_WORKER_SIZE, PipelineConfiguration(1, 3, 8)),
            "size_throughputs",
        ),
        (
            lambda: TunerRequest(
                state=TunerState(TuningPhase.BASELINE, PipelineConfiguration(0, 0, 8))
            ),
            "observation",
        ),
        (
            lambda: TunerRequest(
                state=TunerState(
                    TuningPhase.DATA_WORKER_SIZE,
                    PipelineConfiguration(1, 9, 8),
                    size_throughputs=(1.0,) * 8,
                ),
                observation=QueueObservation(throughput=1.0),
            ),
            "state.configuration.data_worker_cpu",
        ),
    ],
)
def test_bad_tuning_input_names_the_field(build: Any, field: str) -> None:
    with pytest.raises(InvalidTuningInput) as raised:
        build()
    assert raised.value.field == field


def test_bad_tuning_input_from_the_wire_names_the_path() -> None:
    start = to_dict(tune_step(TunerRequest()))
    request = {"state": start["state"], "observation": {"throughput": -3.0}}
    with pytest.raises(PolicyError) as raised:
        from_dict(TunerRequest, request)
    assert raised.value.field == "observation.throughput"


# ----------------------------------------------------------------------------------------
# Cluster level: worked examples
# ----------------------------------------------------------------------------------------


def request(policy: AllocationPolicy, budget: int, *jobs: JobThroughputCurve) -> Any:
    return ClusterAllocationRequest(policy=policy, cpu_budget=budget, jobs=tuple(jobs))


def cpus_by_job(reply: ClusterAllocationReply) -> dict[str, int]:
    return {a.job_id: a.data_worker_cpu for a in reply.allocations}


def test_maxtp_prefers_scaling_efficiency_times_gpus() -> None:
    small = JobThroughputCurve("small", (0.0, 10.0, 20.0, 30.0), gpus=1)
    big = JobThroughputCurve("big", (0.0, 6.0, 12.0, 18.0), gpus=4)  # 24 per CPU x GPU
    reply = allocate_data_worker_cpus(request(AllocationPolicy.MAX_TP, 4, small, big))
    assert cpus_by_job(reply) == {"small": 1, "big": 3}
    assert reply.cpu_used == 4
    assert reply.total_throughput == pytest.approx(10.0 + 4 * 18.0)


def test_srtf_prefers_short_jobs() -> None:
    short = JobThroughputCurve("short", (1.0, 2.0, 3.0), remaining_steps=100)
    long = JobThroughputCurve("long", (1.0, 2.0, 3.0), remaining_steps=10_000)
    reply = allocate_data_worker_cpus(request(AllocationPolicy.SRTF, 2, short, long))
    assert cpus_by_job(reply) == {"short": 2, "long": 0}


def test_srtf_metric_is_remaining_time_times_resources() -> None:
    # n(c+1)/t(c+1): a = 100*1/2 = 50, b = 60*1/1.1 = 54.5 -> a first; then a = 100*2/3 = 66.7
    # loses to b = 54.5.
    a = JobThroughputCurve("a", (1.0, 2.0, 3.0), remaining_steps=100)
    b = JobThroughputCurve("b", (1.0, 1.1, 1.2), remaining_steps=60)
    reply = allocate_data_worker_cpus(request(AllocationPolicy.SRTF, 2, a, b))
    assert cpus_by_job(reply) == {"a": 1, "b": 1}


def test_fair_equalizes_normalized_throughput() -> None:
    fast = JobThroughputCurve("fast", (0.0, 50.0, 100.0, 150.0, 200.0))
    slow = JobThroughputCurve("slow", (0.0, 10.0, 20.0, 30.0, 40.0))
    reply = allocate_data_worker_cpus(request(AllocationPolicy.FAIR, 4, fast, slow))
    normalized = {a.job_id: a.normalized_throughput for a in reply.allocations}
    assert cpus_by_job(reply) == {"fast": 2, "slow": 2}
    assert normalized == {"fast": 0.5, "slow": 0.5}
    maxtp = allocate_data_worker_cpus(request(AllocationPolicy.MAX_TP, 4, fast, slow))
    assert cpus_by_job(maxtp) == {"fast": 4, "slow": 0}


def test_optimistic_extrapolation_to_the_ideal_throughput() -> None:
    # Measured up to 2 CPUs; the paper assumes the next step gains what the last did.
    job = JobThroughputCurve("j", (0.0, 10.0, 18.0), ideal_throughput=40.0)
    assert [job.throughput_at(c) for c in range(6)] == [0.0, 10.0, 18.0, 26.0, 34.0, 40.0]
    reply = allocate_data_worker_cpus(request(AllocationPolicy.MAX_TP, 100, job))
    assert reply.cpu_used == 5 and reply.allocations[0].normalized_throughput == 1.0


def test_saturated_jobs_are_skipped_and_budget_may_stay_unused() -> None:
    flat = JobThroughputCurve("flat", (5.0, 5.0))
    short = JobThroughputCurve("short", (0.0, 1.0))
    reply = allocate_data_worker_cpus(request(AllocationPolicy.FAIR, 10, flat, short))
    assert cpus_by_job(reply) == {"flat": 0, "short": 1}
    assert reply.cpu_used == 1
    empty = allocate_data_worker_cpus(request(AllocationPolicy.FAIR, 10))
    assert empty.allocations == () and empty.cpu_used == 0


def test_cpus_are_packed_into_data_workers_of_the_tuned_size() -> None:
    job = JobThroughputCurve("j", tuple(float(c) for c in range(21)), max_data_worker_cpu=8)
    reply = allocate_data_worker_cpus(request(AllocationPolicy.MAX_TP, 19, job))
    assert reply.allocations[0].data_worker_sizes == (8, 8, 3)
    unbounded = replace(job, max_data_worker_cpu=0)
    reply = allocate_data_worker_cpus(request(AllocationPolicy.MAX_TP, 19, unbounded))
    assert reply.allocations[0].data_worker_sizes == (19,)


def test_a_job_gets_no_more_cpus_than_its_bound_and_the_rest_go_to_others() -> None:
    bounded = JobThroughputCurve("a", (0.0, 3.0), ideal_throughput=30.0, max_cpu=2)
    other = JobThroughputCurve("b", (0.0, 1.0), ideal_throughput=30.0)
    reply = allocate_data_worker_cpus(request(AllocationPolicy.MAX_TP, 6, bounded, other))
    assert cpus_by_job(reply) == {"a": 2, "b": 4}
    assert bounded.has_room(1) and not bounded.has_room(2)
    reference = goldminer.allocate_data_worker_cpus_by_resorting(
        request(AllocationPolicy.MAX_TP, 6, bounded, other)
    )
    assert reference == reply
    nothing = replace(bounded, max_cpu=0)
    reply = allocate_data_worker_cpus(request(AllocationPolicy.FAIR, 6, nothing, other))
    assert cpus_by_job(reply) == {"a": 0, "b": 6}


def test_a_linear_curve_rises_by_its_rate_per_cpu_to_the_ideal() -> None:
    curve = goldminer.linear_curve("j", 0.25, 1.0, remaining_steps=7, max_data_worker_cpu=2)
    assert [curve.throughput_at(c) for c in range(6)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert (curve.ideal, curve.remaining_steps, curve.max_data_worker_cpu) == (1.0, 7, 2)
    # One CPU already above the training workers' rate: the first CPU reaches it.
    fast = goldminer.linear_curve("f", 3.0, 1.0)
    assert fast.throughputs == (0.0, 1.0) and not fast.has_room(1)


# ----------------------------------------------------------------------------------------
# Cluster level: properties
# ----------------------------------------------------------------------------------------


@st.composite
def concave_curves(draw: st.DrawFn, job_id: str) -> JobThroughputCurve:
    start = draw(st.floats(0, 50))
    gains = sorted(draw(st.lists(st.floats(0, 20), min_size=0, max_size=12)), reverse=True)
    points = [start]
    for gain in gains:
        points.append(points[-1] + gain)
    ideal = draw(st.one_of(st.none(), st.floats(0, 100).map(lambda extra: points[-1] + extra)))
    return JobThroughputCurve(
        job_id=job_id,
        throughputs=tuple(points),
        gpus=draw(st.integers(1, 8)),
        remaining_steps=draw(st.integers(1, 10**6)),
        ideal_throughput=ideal,
        max_data_worker_cpu=draw(st.integers(0, 8)),
    )


@st.composite
def instances(draw: st.DrawFn) -> tuple[int, tuple[JobThroughputCurve, ...]]:
    count = draw(st.integers(0, 8))
    jobs = tuple(draw(concave_curves(f"job-{index}")) for index in range(count))
    return draw(st.integers(1, 60)), jobs


def total(reply: ClusterAllocationReply, jobs: tuple[JobThroughputCurve, ...]) -> float:
    by_id = {job.job_id: job for job in jobs}
    return sum(by_id[a.job_id].gpus * a.throughput for a in reply.allocations)


@settings(max_examples=120, deadline=None)
@given(instances())
def test_allocations_respect_the_budget_and_maxtp_wins_on_throughput(
    instance: tuple[int, tuple[JobThroughputCurve, ...]],
) -> None:
    budget, jobs = instance
    replies = {
        policy: allocate_data_worker_cpus(request(policy, budget, *jobs))
        for policy in AllocationPolicy
    }
    for reply in replies.values():
        assert reply.cpu_used == sum(a.data_worker_cpu for a in reply.allocations) <= budget
        for allocation, job in zip(reply.allocations, jobs, strict=True):
            assert sum(allocation.data_worker_sizes) == allocation.data_worker_cpu
            assert allocation.throughput == job.throughput_at(allocation.data_worker_cpu)
        assert reply.total_throughput == pytest.approx(total(reply, jobs))
    best = replies[AllocationPolicy.MAX_TP].total_throughput
    for policy in (AllocationPolicy.SRTF, AllocationPolicy.FAIR):
        assert best >= replies[policy].total_throughput - 1e-6 * max(1.0, best)


@settings(max_examples=100, deadline=None)
@given(instances())
def test_fair_leaves_no_job_served_ahead_of_a_less_served_one(
    instance: tuple[int, tuple[JobThroughputCurve, ...]],
) -> None:
    # Fair's certificate: the last CPU each job received raised it to a normalized
    # throughput no higher than what the next CPU would give any job that still has room.
    budget, jobs = instance
    reply = allocate_data_worker_cpus(request(AllocationPolicy.FAIR, budget, *jobs))
    served = [
        job.throughput_at(a.data_worker_cpu) / job.ideal
        for job, a in zip(jobs, reply.allocations, strict=True)
        if a.data_worker_cpu > 0
    ]
    waiting = [
        job.throughput_at(a.data_worker_cpu + 1) / job.ideal
        for job, a in zip(jobs, reply.allocations, strict=True)
        if job.throughput_at(a.data_worker_cpu + 1) > job.throughput_at(a.data_worker_cpu)
    ]
    if served and waiting:
        assert max(served) <= min(waiting) + 1e-12
    if waiting:  # a job still had room, so the budget was spent in full
        assert reply.cpu_used == budget


@settings(max_examples=100, deadline=None)
@given(instances(), st.randoms(use_true_random=False), st.sampled_from(list(AllocationPolicy)))
def test_allocation_is_invariant_to_job_order_and_matches_the_resorting_reference(
    instance: tuple[int, tuple[JobThroughputCurve, ...]], random: Any, policy: AllocationPolicy
) -> None:
    budget, jobs = instance
    shuffled = list(jobs)
    random.shuffle(shuffled)
    original = allocate_data_worker_cpus(request(policy, budget, *jobs))
    permuted = allocate_data_worker_cpus(request(policy, budget, *shuffled))
    assert cpus_by_job(original) == cpus_by_job(permuted)
    reference = allocate_data_worker_cpus_by_resorting(request(policy, budget, *jobs))
    assert reference == original


@settings(max_examples=100, deadline=None)
@given(instances(), st.lists(st.one_of(st.none(), st.integers(0, 12)), min_size=8, max_size=8))
def test_bounded_jobs_stay_within_their_bounds_and_match_the_resorting_reference(
    instance: tuple[int, tuple[JobThroughputCurve, ...]], bounds: list[int | None]
) -> None:
    budget, jobs = instance
    bounded = tuple(replace(job, max_cpu=bound) for job, bound in zip(jobs, bounds, strict=False))
    for policy in AllocationPolicy:
        reply = allocate_data_worker_cpus(request(policy, budget, *bounded))
        for job, allocation in zip(bounded, reply.allocations, strict=True):
            assert job.max_cpu is None or allocation.data_worker_cpu <= job.max_cpu
        assert reply == allocate_data_worker_cpus_by_resorting(request(policy, budget, *bounded))


# ----------------------------------------------------------------------------------------
# Cluster level: bad input
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: JobThroughputCurve("j", ()), "throughputs"),
        (lambda: JobThroughputCurve("j", (1.0, math.nan)), "throughputs[1]"),
        (lambda: JobThroughputCurve("j", (-1.0,)), "throughputs[0]"),
        (lambda: JobThroughputCurve("j", (2.0, 1.0)), "throughputs[1]"),
        (lambda: JobThroughputCurve("j", (0.0, 1.0, 3.0)), "throughputs[2]"),
        (lambda: JobThroughputCurve("", (1.0,)), "job_id"),
        (lambda: JobThroughputCurve("j", (1.0,), gpus=0), "gpus"),
        (lambda: JobThroughputCurve("j", (1.0,), remaining_steps=-1), "remaining_steps"),
        (lambda: JobThroughputCurve("j", (1.0, 2.0), ideal_throughput=1.5), "ideal_throughput"),
        (lambda: JobThroughputCurve("j", (1.0,), max_data_worker_cpu=-4), "max_data_worker_cpu"),
        (lambda: JobThroughputCurve("j", (1.0,), max_cpu=-1), "max_cpu"),
        (lambda: JobThroughputCurve("j", (1.0,), max_cpu=1.5), "max_cpu"),  # type: ignore[arg-type]
        (lambda: request(AllocationPolicy.FAIR, 0), "cpu_budget"),
        (lambda: request(AllocationPolicy.FAIR, -5), "cpu_budget"),
        (lambda: request(AllocationPolicy.FAIR, 10**9), "cpu_budget"),
        (
            lambda: request(
                AllocationPolicy.FAIR,
                4,
                JobThroughputCurve("j", (1.0,)),
                JobThroughputCurve("j", (2.0,)),
            ),
            "jobs[1].job_id",
        ),
        (
            lambda: request(AllocationPolicy.SRTF, 4, JobThroughputCurve("j", (1.0, 2.0))),
            "jobs[0].remaining_steps",
        ),
    ],
)
def test_bad_allocation_input_names_the_field(build: Any, field: str) -> None:
    with pytest.raises(InvalidAllocationInput) as raised:
        build()
    assert raised.value.field == field


def test_bad_allocation_input_from_the_wire_names_the_path() -> None:
    plain = {
        "policy": "maxtp",
        "cpu_budget": 4,
        "jobs": [{"job_id": "a", "throughputs": [0.0, 1.0]}, {"job_id": "b", "throughputs": []}],
    }
    with pytest.raises(PolicyError) as raised:
        from_dict(ClusterAllocationRequest, plain)
    assert raised.value.field == "jobs[1].throughputs"


# ----------------------------------------------------------------------------------------
# Registration and the wire
# ----------------------------------------------------------------------------------------


def test_algorithms_register_and_round_trip() -> None:
    registry = Registry()
    for spec in goldminer.ALGORITHMS:
        registry.register(spec)
    assert {s.qualified_name for s in registry.list()} == {
        "goldminer-tune-step/1",
        "goldminer-cluster-allocation/1",
    }
    allocation = request(
        AllocationPolicy.SRTF,
        5,
        JobThroughputCurve("a", (1.0, 3.0, 4.0), gpus=2, remaining_steps=10, ideal_throughput=9),
        JobThroughputCurve("b", (0.0, 1.0), remaining_steps=3, max_data_worker_cpu=2),
    )
    assert from_dict(ClusterAllocationRequest, to_dict(allocation)) == allocation
    reply = registry.get("goldminer-cluster-allocation").run_typed(allocation)
    assert from_dict(ClusterAllocationReply, to_dict(reply)) == reply
    plain = registry.get("goldminer-cluster-allocation").run_dict(to_dict(allocation))
    assert from_dict(ClusterAllocationReply, plain) == reply

    tuner = registry.get("goldminer-tune-step")
    first = tuner.run_typed(TunerRequest())
    step = TunerRequest(TunerConfig(), first.state, QueueObservation(throughput=7.0))
    assert from_dict(TunerRequest, to_dict(step)) == step
    assert from_dict(TunerReply, tuner.run_dict(to_dict(step))) == tuner.run_typed(step)
