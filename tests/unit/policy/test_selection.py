"""Cluster-level weighted greedy selection (DLRover-RM eq. 11-14)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy import selection
from stride.policy.selection import (
    Candidate,
    InvalidSelection,
    JobCandidates,
    SelectionReply,
    SelectionRequest,
    score,
    select,
    weight,
)
from stride.policy.serialization import from_dict, to_dict


def plan(cpu: float, gain: float, cost: float | None = None, speed: float = 100.0) -> Candidate:
    return Candidate(resources=(cpu,), throughput=speed, throughput_gain=gain,
                     resource_cost=cpu if cost is None else cost)  # fmt: skip


def test_weight_follows_eq_14() -> None:
    assert weight(1000.0, 10.0, 2.5, 0.0) == pytest.approx(100.0**-2.5)
    assert weight(1000.0, 10.0, 0.0, 1e-9) == 1.0  # rho -> 0: every job weighs the same
    assert weight(1000.0, 10.0, -1.0, 0.0) == pytest.approx(100.0)  # rho < 0 favours long jobs
    assert math.isfinite(weight(0.0, 10.0, 2.5, 1e-9))  # epsilon guards a finished job


def test_worked_example_prefers_the_shorter_job_under_rho() -> None:
    # Same plan for two jobs, room for one: rho = 2.5 gives it to the job with less left.
    short = JobCandidates("short", 1_000.0, (plan(4, 40),))
    long = JobCandidates("long", 100_000.0, (plan(4, 40),))
    reply = select(SelectionRequest((4.0,), (long, short)))
    assert [p.job_id for p in reply.selected] == ["short"]
    # RE = 40 / 4 = 10; remaining time 1000/100 = 10 s; WG = 10^-2.5.
    assert reply.objective == pytest.approx(10 * 10**-2.5)
    assert reply.remaining_capacity == (0.0,)
    # With rho < 0 the long job wins instead.
    assert [p.job_id for p in select(SelectionRequest((4.0,), (long, short), rho=-1)).selected] == [
        "long"
    ]


def test_at_most_one_plan_per_job_and_non_positive_scores_are_left_out() -> None:
    job = JobCandidates("a", 10.0, (plan(1, 5), plan(2, 50), plan(1, -3)))
    loser = JobCandidates("b", 10.0, (plan(1, 0.0),))
    reply = select(SelectionRequest((100.0,), (job, loser)))
    assert [(p.job_id, p.candidate_index) for p in reply.selected] == [("a", 1)]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: SelectionRequest((), ()), "capacity"),
        (lambda: SelectionRequest((0.0,), ()), "capacity[0]"),
        (lambda: SelectionRequest((float("nan"),), ()), "capacity[0]"),
        (lambda: SelectionRequest((1.0,), (), epsilon=0.0), "epsilon"),
        (lambda: SelectionRequest((1.0,), (), rho=float("inf")), "rho"),
        (lambda: SelectionRequest((1.0,), (), resource_names=("cpu", "mem")), "resource_names"),
        (lambda: plan(-1, 1), "resources[0]"),
        (lambda: plan(1, 1, cost=0.0), "resource_cost"),
        (lambda: plan(1, float("nan")), "throughput_gain"),
        (lambda: plan(1, 1, speed=0.0), "throughput"),
        (lambda: JobCandidates("", 1.0, ()), "job_id"),
        (lambda: JobCandidates("a", -1.0, ()), "remaining_samples"),
        (
            lambda: SelectionRequest(
                (1.0,), (JobCandidates("a", 1, ()), JobCandidates("a", 1, ()))
            ),
            "jobs[1].job_id",
        ),
        (
            lambda: SelectionRequest((1.0, 1.0), (JobCandidates("a", 1, (plan(1, 1),)),)),
            "jobs[0].candidates[0].resources",
        ),
    ],
)
def test_bad_inputs_name_their_field(build: object, field: str) -> None:
    with pytest.raises(InvalidSelection) as raised:
        build()  # type: ignore[operator]
    assert raised.value.field == field


def test_request_and_reply_round_trip_through_dicts() -> None:
    request = SelectionRequest(
        (8.0, 32.0),
        (JobCandidates("a", 1e6, (Candidate((2.0, 4.0), 100.0, 10.0, 2.5),)),),
        resource_names=("cpu", "memory_gib"),
    )
    assert from_dict(SelectionRequest, to_dict(request)) == request
    reply = select(request)
    assert from_dict(SelectionReply, to_dict(reply)) == reply
    assert selection.ALGORITHMS[0].run_dict(to_dict(request)) == to_dict(reply)


# --- properties -------------------------------------------------------------------------

amounts = st.integers(0, 10).map(float)
candidates_ = st.builds(
    Candidate,
    resources=st.tuples(amounts, amounts),
    throughput=st.integers(1, 1000).map(float),
    throughput_gain=st.integers(-20, 100).map(float),
    resource_cost=st.integers(1, 50).map(float),
)


@st.composite
def requests(draw: st.DrawFn, max_jobs: int = 6, max_candidates: int = 4) -> SelectionRequest:
    count = draw(st.integers(0, max_jobs))
    jobs = tuple(
        JobCandidates(
            f"job-{index}",
            float(draw(st.integers(0, 100_000))),
            tuple(draw(st.lists(candidates_, max_size=max_candidates))),
        )
        for index in range(count)
    )
    capacity = (float(draw(st.integers(1, 30))), float(draw(st.integers(1, 30))))
    return SelectionRequest(capacity, jobs, rho=draw(st.sampled_from([2.5, 0.0, -1.0, 1.0])))


def brute_force(request: SelectionRequest) -> float:
    """Eq. 12-13 exactly: the best objective over every choice of <= 1 plan per job."""
    options = [[None, *range(len(job.candidates))] for job in request.jobs]
    best = 0.0
    for choice in itertools.product(*options):
        total = 0.0
        used = [0.0] * len(request.capacity)
        for job, picked in zip(request.jobs, choice, strict=True):
            if picked is None:
                continue
            candidate = job.candidates[picked]
            total += score(job, candidate, request.rho, request.epsilon)
            used = [u + r for u, r in zip(used, candidate.resources, strict=True)]
        if all(u <= s for u, s in zip(used, request.capacity, strict=True)):
            best = max(best, total)
    return best


def demand(request: SelectionRequest, reply: SelectionReply) -> list[float]:
    by_id = {job.job_id: job for job in request.jobs}
    used = [0.0] * len(request.capacity)
    for picked in reply.selected:
        candidate = by_id[picked.job_id].candidates[picked.candidate_index]
        used = [u + r for u, r in zip(used, candidate.resources, strict=True)]
    return used


@settings(max_examples=200)
@given(request=requests())
def test_selection_respects_capacity_and_picks_one_plan_per_job(request: SelectionRequest) -> None:
    reply = select(request)
    assert all(u <= s for u, s in zip(demand(request, reply), request.capacity, strict=True))
    ids = [p.job_id for p in reply.selected]
    assert len(ids) == len(set(ids)) and ids == sorted(ids)
    assert all(p.score > 0 for p in reply.selected)


@settings(max_examples=200)
@given(request=requests(), seed=st.integers(0, 2**32 - 1))
def test_selection_is_invariant_to_job_order(request: SelectionRequest, seed: int) -> None:
    jobs = list(request.jobs)
    random.Random(seed).shuffle(jobs)
    shuffled = SelectionRequest(request.capacity, tuple(jobs), rho=request.rho)
    assert select(shuffled) == select(request)


@settings(max_examples=150)
@given(request=requests(max_jobs=5, max_candidates=3))
def test_greedy_against_brute_force(request: SelectionRequest) -> None:
    reply = select(request)
    optimum = brute_force(request)
    assert reply.objective <= optimum * (1 + 1e-9) + 1e-300
    # Bound 1: the greedy takes the best single plan that fits, so it reaches at least
    # OPT / (number of jobs).
    best_single = max(
        (
            score(job, c, request.rho, request.epsilon)
            for job in request.jobs
            for c in job.candidates
            if all(r <= s for r, s in zip(c.resources, request.capacity, strict=True))
        ),
        default=0.0,
    )
    assert reply.objective >= best_single * (1 - 1e-9)
    assert reply.objective >= optimum / max(1, len(request.jobs)) * (1 - 1e-9)
    # Bound 2: maximality: no job left out has a positive plan that still fits.
    left = [s - u for s, u in zip(request.capacity, demand(request, reply), strict=True)]
    chosen = {p.job_id for p in reply.selected}
    for job in request.jobs:
        if job.job_id in chosen:
            continue
        for c in job.candidates:
            fits = all(r <= room for r, room in zip(c.resources, left, strict=True))
            assert not (fits and score(job, c, request.rho, request.epsilon) > 0)


@settings(max_examples=150)
@given(request=requests(max_jobs=5, max_candidates=3))
def test_greedy_is_optimal_when_every_best_plan_fits(request: SelectionRequest) -> None:
    # With S large enough for every job's largest plan, the greedy takes each job's best plan,
    # which is optimal (eq. 12 separates by job once eq. 13 cannot bind).
    roomy = SelectionRequest((1e6, 1e6), request.jobs, rho=request.rho)
    assert select(roomy).objective == pytest.approx(brute_force(roomy), rel=1e-9)
