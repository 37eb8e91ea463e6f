"""The cluster round: exact fronts, the weighted greedy within free capacity, bad input."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.cluster_round import (
    ALGORITHM_NAME,
    ChooseRequest,
    FrontsRequest,
    InvalidRound,
    RoundJob,
    RoundRequest,
    choose,
    cluster_round,
    job_front,
    job_fronts,
)
from stride.policy.registry import default_registry
from stride.policy.serialization import from_dict, to_dict
from stride.policy.stages import (
    GIB_PRICE,
    Pods,
    Sample,
    SearchSpace,
    grid,
    grid_throughput,
    model_throughput,
    per_ps,
)
from stride.sim.dlrm import _shape, generate_jobs, load_straggler_covs
from stride.testing import SHARED_TRACES

COVS = SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"
SPACE = SearchSpace()
START = Pods(1, 4, 4, 1, 4, 8)


def population(count: int, seed: int = 3) -> list[RoundJob]:
    specs = generate_jobs(count, np.random.default_rng(seed), load_straggler_covs(COVS))
    return [
        RoundJob(
            job_id=f"job-{spec.job_id}",
            shape=_shape(spec),
            params=spec.params,
            pods=START,
            remaining_samples=spec.total_samples,
            worker_mem_gib=4,
            ps_total_gib=8.0,
            core_limit=200,
        )
        for spec in specs
    ]


def test_the_front_is_exactly_the_non_dominated_grid_points_faster_than_now() -> None:
    (job,) = population(1)
    front = job_front(job, SPACE)
    params = job.params
    assert params is not None
    w, lw, p, lp = grid(SPACE)
    speed = grid_throughput(params, job.shape, 1.0, w, lw, p, lp)
    memory = w * job.worker_mem_gib + p * np.array([per_ps(job.ps_total_gib, int(n)) for n in p])
    cost = w * lw + p * lp + GIB_PRICE * memory
    now = model_throughput(params, job.shape, job.pods)
    feasible = (w * lw + p * lp <= job.core_limit) & (speed > now)
    assert front.pods, "a one-worker job can always go faster on the grid"
    for pods, candidate in zip(front.pods, front.candidates, strict=True):
        mine = pods.cpu + GIB_PRICE * pods.memory_gib
        assert candidate.throughput == pytest.approx(model_throughput(params, job.shape, pods))
        dominated = feasible & (cost <= mine) & (speed > candidate.throughput * (1 + 1e-12))
        assert not dominated.any()
    # Every feasible point is matched or beaten by a front point at no more cost.
    costs = np.array([q.cpu + GIB_PRICE * q.memory_gib for q in front.pods])
    speeds = np.array([c.throughput for c in front.candidates])
    for index in np.flatnonzero(feasible):
        assert ((costs <= cost[index] + 1e-9) & (speeds >= speed[index] * (1 - 1e-12))).any()


def test_with_room_for_all_every_job_takes_its_best_scoring_candidate() -> None:
    jobs = population(6)
    reply = cluster_round(RoundRequest(tuple(jobs), free_cpu=10_000, free_memory_gib=100_000))
    assert [c.job_id for c in reply.choices] == [j.job_id for j in jobs]
    for job, choice in zip(jobs, reply.choices, strict=True):
        assert choice.pods is not None and choice.bound == "" and job.params is not None
        assert choice.pods.cpu <= job.core_limit
        assert choice.predicted_throughput > model_throughput(job.params, job.shape, job.pods)
    assert reply.objective == pytest.approx(sum(c.score for c in reply.choices))


def test_under_contention_the_job_closer_to_its_end_chooses_first() -> None:
    """rho = 2.5 weighs a job by (remaining time)^-2.5: of two identical jobs, the one with
    a tenth of the samples left scores 10^2.5 higher, so it gets what it would get alone,
    and the other makes do with what is left (here less than the short one took)."""
    (job,) = population(1)
    short = replace(job, job_id="short", remaining_samples=job.remaining_samples / 10)
    long = replace(job, job_id="long")
    free = 12.0
    alone = cluster_round(RoundRequest((short,), free_cpu=free, free_memory_gib=1_000))
    reply = cluster_round(RoundRequest((long, short), free_cpu=free, free_memory_gib=1_000))
    by_id = {c.job_id: c for c in reply.choices}
    assert by_id["short"] == alone.choices[0]
    taken = by_id["short"].pods
    assert taken is not None
    grown = by_id["long"].pods
    short_extra = taken.cpu - START.cpu
    long_extra = 0 if grown is None else max(0, grown.cpu - START.cpu)
    assert short_extra + long_extra <= free
    assert by_id["long"].predicted_throughput < by_id["short"].predicted_throughput
    assert reply.free_cpu_left == pytest.approx(free - short_extra - long_extra)


def test_no_free_capacity_keeps_every_job_where_it_is_unless_a_move_costs_nothing() -> None:
    jobs = population(4)
    reply = cluster_round(RoundRequest(tuple(jobs), free_cpu=0, free_memory_gib=0))
    for job, choice in zip(jobs, reply.choices, strict=True):
        if choice.pods is not None:
            assert choice.pods.cpu <= job.pods.cpu
            assert choice.pods.memory_gib <= job.pods.memory_gib


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    count=st.integers(1, 12),
    free_cpu=st.floats(0, 400),
    free_memory=st.floats(0, 2_000),
    limit=st.integers(8, 200),
    rho=st.sampled_from([-1.0, 0.0, 2.5]),
)
def test_a_round_never_gives_more_than_is_free_nor_more_than_a_job_may_hold(
    seed: int, count: int, free_cpu: float, free_memory: float, limit: int, rho: float
) -> None:
    rng = np.random.default_rng(seed)
    jobs = []
    for index, job in enumerate(population(count, seed)):
        pods = Pods(int(rng.choice([1, 2, 4])), 2, 4, int(rng.choice([1, 2])), 2, 8)
        jobs.append(
            replace(
                job,
                pods=pods,
                core_limit=max(limit, pods.cpu),
                remaining_samples=float(rng.uniform(1e5, 1e8)),
                job_id=f"j{index}",
            )
        )
    reply = cluster_round(
        RoundRequest(tuple(jobs), free_cpu=free_cpu, free_memory_gib=free_memory, rho=rho)
    )
    extra_cpu = extra_memory = 0.0
    for job, choice in zip(jobs, reply.choices, strict=True):
        if choice.pods is None:
            continue
        assert choice.pods.cpu <= job.core_limit
        extra_cpu += max(0, choice.pods.cpu - job.pods.cpu)
        extra_memory += max(0, choice.pods.memory_gib - job.pods.memory_gib)
    assert extra_cpu <= free_cpu + 1e-9
    assert extra_memory <= free_memory + 1e-9
    assert reply.free_cpu_left == pytest.approx(free_cpu - extra_cpu, abs=1e-6)


def test_bad_input_names_the_field() -> None:
    (job,) = population(1)
    with pytest.raises(InvalidRound, match="appears more than once"):
        RoundRequest((job, job), free_cpu=1, free_memory_gib=1)
    with pytest.raises(InvalidRound, match="free_cpu"):
        RoundRequest((job,), free_cpu=-1, free_memory_gib=1)
    with pytest.raises(InvalidRound, match="remaining_samples"):
        replace(job, remaining_samples=float("nan"))
    with pytest.raises(InvalidRound, match="core_limit"):
        replace(job, core_limit=0)


def test_the_round_is_registered_and_crosses_the_wire_unchanged() -> None:
    spec = default_registry().get(ALGORITHM_NAME)
    request = RoundRequest(tuple(population(3)), free_cpu=50, free_memory_gib=500)
    wire = from_dict(spec.request_type, to_dict(request))
    assert wire == request
    reply = spec.run(wire)
    assert from_dict(spec.reply_type, to_dict(reply)) == reply


def test_a_round_split_into_chunks_decides_what_the_whole_round_decides() -> None:
    jobs = population(9)
    whole = cluster_round(RoundRequest(tuple(jobs), free_cpu=60, free_memory_gib=400))
    fronts = [
        f for chunk in (jobs[:4], jobs[4:]) for f in job_fronts(FrontsRequest(tuple(chunk))).fronts
    ]
    assert choose(ChooseRequest(tuple(fronts), free_cpu=60, free_memory_gib=400)) == whole


def test_a_job_with_samples_is_fitted_first_and_needs_three_configurations() -> None:
    (job,) = population(1)
    assert job.params is not None
    probes = [
        START,
        replace(START, workers=2),
        replace(START, ps=2),
        replace(START, worker_cpu=8),
        replace(START, ps_cpu=8),
    ]
    samples = tuple(Sample(p, model_throughput(job.params, job.shape, p)) for p in probes)
    fitted = job_front(replace(job, params=None, samples=samples), SPACE)
    exact = job_front(job, SPACE)
    assert 0 <= fitted.fit_rmsle < 0.01 and exact.fit_rmsle == -1.0
    assert fitted.current_throughput == pytest.approx(exact.current_throughput, rel=0.01)
    with pytest.raises(InvalidRound, match="at least 5 samples of at least 3 configurations"):
        replace(job, params=None, samples=samples[:1])
