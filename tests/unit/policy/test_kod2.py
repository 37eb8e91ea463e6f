"""KOD2: job weights, preemptive scheduling with scale-in/out and aging, and placement."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy import kod2
from stride.policy.kod2 import (
    JobState,
    JobStatus,
    Kod2InputError,
    Node,
    PlacementReply,
    PlacementRequest,
    ScheduleReply,
    ScheduleRequest,
    TFJob,
    greedy_placement,
    job_weight,
    place,
    schedule,
)
from stride.policy.serialization import from_dict, to_dict

GIB = 1024**3


def tfjob(name: str, *, workers: tuple[int, int] = (1, 4), cpu: float = 2, at: float = 0) -> TFJob:
    return TFJob(name, 1, 1.0, GIB, cpu, 2 * GIB, workers[0], workers[1], at)


def nodes(count: int = 3, cpu: float = 10, memory: int = 32 * GIB) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", cpu, memory) for i in range(count))


def test_weight_is_the_sigmoid_of_min_workers_over_normalized_demand() -> None:
    job = tfjob("a", workers=(2, 4))
    cpu = 1 + 2 * 2
    memory = GIB + 2 * 2 * GIB
    raw = 2 / (cpu / 30 + memory / (96 * GIB))
    assert job_weight(job, 30, 96 * GIB) == pytest.approx(1 / (1 + math.exp(-raw)))
    assert job_weight(tfjob("cheap", cpu=1), 30, 96 * GIB) > job_weight(
        tfjob("dear", cpu=4), 30, 96 * GIB
    )


def test_a_job_that_fits_starts_and_scales_out() -> None:
    reply = schedule(ScheduleRequest(nodes(1), (JobStatus(tfjob("a"), JobState.WAITING),), now=0))
    (status,) = reply.jobs
    assert status.state is JobState.RUNNING
    assert len(status.worker_nodes) == 4 and status.ps_nodes == ("n0",)  # 1 + 4 * 2 <= 10


def test_heavier_job_preempts_workers_of_a_lighter_one_but_not_its_ps() -> None:
    light = JobStatus(tfjob("light", cpu=3, workers=(1, 3)), JobState.RUNNING, ("n0",), ("n0",) * 3)
    heavy = JobStatus(tfjob("heavy", cpu=1, workers=(2, 2), at=5), JobState.WAITING)
    reply = schedule(ScheduleRequest(nodes(1), (light, heavy), now=10))
    assert reply.weights["heavy"] >= reply.weights["light"]
    after = {s.job.name: s for s in reply.jobs}
    assert after["heavy"].state is JobState.RUNNING
    assert after["light"].ps_nodes == ("n0",) and len(after["light"].worker_nodes) >= 1
    assert any("scale-in" in action for action in reply.actions)


def test_finished_job_completes_and_frees_its_nodes() -> None:
    done = JobStatus(tfjob("a"), JobState.RUNNING, ("n0",), ("n0",), finished=True)
    reply = schedule(ScheduleRequest(nodes(1), (done,), now=1))
    assert reply.jobs == (JobStatus(done.job, JobState.COMPLETED),)


def test_waiting_past_the_starve_limit_ages_the_weight() -> None:
    blocker = JobStatus(tfjob("b", workers=(4, 4)), JobState.RUNNING, ("n0",), ("n0",) * 4)
    old = JobStatus(tfjob("old", cpu=3, workers=(3, 3)), JobState.WAITING)
    reply = schedule(ScheduleRequest(nodes(1), (blocker, old), now=301))
    assert reply.jobs[1].state is JobState.STARVING and reply.weights["old"] > 1


def test_invalid_requests_name_the_field() -> None:
    job = tfjob("a")
    with pytest.raises(Kod2InputError, match=r"^nodes: needs"):
        ScheduleRequest((), (), now=0)
    with pytest.raises(Kod2InputError, match=r"nodes\[0\].cpu"):
        ScheduleRequest((Node("x", float("nan"), 1),), (), now=0)
    with pytest.raises(Kod2InputError, match=r"jobs\[0\].job.max_workers"):
        ScheduleRequest(nodes(), (JobStatus(tfjob("a", workers=(3, 2)), JobState.WAITING),), now=0)
    with pytest.raises(Kod2InputError, match=r"jobs\[0\].worker_nodes\[0\]: unknown node"):
        ScheduleRequest(nodes(), (JobStatus(job, JobState.RUNNING, ("n0",), ("zz",)),), now=0)
    with pytest.raises(Kod2InputError, match=r"jobs\[0\].job.entered_at"):
        ScheduleRequest(nodes(), (JobStatus(tfjob("a", at=5), JobState.WAITING),), now=0)
    with pytest.raises(Kod2InputError, match=r"^jobs: running tasks exceed"):
        ScheduleRequest(
            nodes(1, cpu=2), (JobStatus(job, JobState.RUNNING, ("n0",), ("n0",)),), now=0
        )
    with pytest.raises(Kod2InputError, match=r"starve_limit_seconds"):
        ScheduleRequest(nodes(), (), now=0, starve_limit_seconds=0)


# --- property tests -----------------------------------------------------------------------


@st.composite
def tfjobs(draw: st.DrawFn, name: str, at: float) -> TFJob:
    low = draw(st.integers(1, 3))
    return TFJob(
        name,
        draw(st.integers(0, 2)),
        draw(st.sampled_from([0.5, 1.0, 2.0])),
        draw(st.sampled_from([1, 2, 4])) * GIB,
        draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
        draw(st.sampled_from([1, 2, 4])) * GIB,
        low,
        low + draw(st.integers(0, 4)),
        at,
    )


@st.composite
def clusters(draw: st.DrawFn) -> tuple[tuple[Node, ...], list[TFJob]]:
    node_list = tuple(
        Node(f"n{i}", draw(st.sampled_from([4.0, 8.0, 10.0])), draw(st.sampled_from([8, 16])) * GIB)
        for i in range(draw(st.integers(1, 4)))
    )
    count = draw(st.integers(1, 6))
    jobs = [draw(tfjobs(f"j{i}", float(i * 30))) for i in range(count)]
    return node_list, jobs


def used(nodes_: tuple[Node, ...], statuses: tuple[JobStatus, ...]) -> dict[str, tuple[float, int]]:
    load = {node.name: (0.0, 0) for node in nodes_}
    for status in statuses:
        if status.state is not JobState.RUNNING:
            continue
        job = status.job
        for name in status.ps_nodes:
            load[name] = (load[name][0] + job.ps_cpu, load[name][1] + job.ps_memory_bytes)
        for name in status.worker_nodes:
            load[name] = (load[name][0] + job.worker_cpu, load[name][1] + job.worker_memory_bytes)
    return load


def simulate(
    nodes_: tuple[Node, ...], jobs: list[TFJob], rounds: int, run_for: int = 3
) -> list[tuple[float, ScheduleReply]]:
    """Jobs arrive at their entered_at; each pass is 30 s; a job finishes after run_for passes."""
    statuses: dict[str, JobStatus] = {}
    started: dict[str, int] = {}
    history: list[tuple[float, ScheduleReply]] = []
    for step in range(rounds):
        now = step * 30.0
        for job in jobs:
            if job.entered_at <= now and job.name not in statuses:
                statuses[job.name] = JobStatus(job, JobState.WAITING)
        for name, status in statuses.items():
            if status.state is JobState.RUNNING and step - started[name] >= run_for:
                statuses[name] = JobStatus(
                    status.job, status.state, status.ps_nodes, status.worker_nodes, True
                )
        reply = schedule(
            ScheduleRequest(nodes_, tuple(statuses.values()), now=now, starve_limit_seconds=90)
        )
        for status in reply.jobs:
            if (
                status.state is JobState.RUNNING
                and statuses[status.job.name].state is not JobState.RUNNING
            ):
                started[status.job.name] = step
            statuses[status.job.name] = status
        history.append((now, reply))
    return history


@given(clusters())
@settings(max_examples=100, deadline=None)
def test_scheduling_never_exceeds_capacity_and_keeps_min_workers_and_ps(
    cluster: tuple[tuple[Node, ...], list[TFJob]],
) -> None:
    nodes_, jobs = cluster
    capacity = {node.name: node for node in nodes_}
    previous: dict[str, JobStatus] = {}
    for _, reply in simulate(nodes_, jobs, rounds=12):
        for name, (cpu, memory) in used(nodes_, reply.jobs).items():
            assert cpu <= capacity[name].cpu + 1e-9 and memory <= capacity[name].memory_bytes
        for status in reply.jobs:
            if status.state is JobState.RUNNING:
                assert len(status.ps_nodes) == status.job.ps_count
                assert status.job.min_workers <= len(status.worker_nodes) <= status.job.max_workers
                before = previous.get(status.job.name)
                if before is not None and before.state is JobState.RUNNING:
                    assert status.ps_nodes == before.ps_nodes  # scale-in never takes a PS
        previous = {status.job.name: status for status in reply.jobs}


@given(clusters())
@settings(max_examples=100, deadline=None)
def test_a_starving_job_is_scheduled_before_fresher_jobs(
    cluster: tuple[tuple[Node, ...], list[TFJob]],
) -> None:
    nodes_, jobs = cluster
    largest = max(nodes_, key=lambda n: n.cpu)
    fits_somewhere = {job.name for job in jobs if place(PlacementRequest(nodes_, job)).fits}
    started_at: dict[str, int] = {}
    for step, (_, reply) in enumerate(simulate(nodes_, jobs, rounds=40)):
        starving = [
            s for s in reply.jobs if s.state is JobState.STARVING and s.job.name in fits_somewhere
        ]
        for status in reply.jobs:
            if status.state is JobState.RUNNING:
                started_at.setdefault(status.job.name, step)
        for status in reply.jobs:
            if status.job.name in started_at and started_at[status.job.name] == step:
                # A job that was not starving (weight < 1) never starts while a starving job
                # that fits the cluster still waits; starving jobs go by their own weights.
                assert reply.weights[status.job.name] > 1 or not starving
    assert largest.cpu > 0
    # Every job that fits the empty cluster eventually runs (jobs finish after 3 passes).
    assert fits_somewhere <= set(started_at)


def brute_force_nodes(request: PlacementRequest) -> int | None:
    job = request.job
    tasks = [(job.ps_cpu, job.ps_memory_bytes)] * job.ps_count + [
        (job.worker_cpu, job.worker_memory_bytes)
    ] * job.min_workers
    best: int | None = None
    for assignment in itertools.product(range(len(request.nodes)), repeat=len(tasks)):
        load = [[0.0, 0] for _ in request.nodes]
        for (cpu, memory), index in zip(tasks, assignment, strict=True):
            load[index][0] += cpu
            load[index][1] += memory
        if all(
            load[i][0] <= node.cpu + 1e-9 and load[i][1] <= node.memory_bytes
            for i, node in enumerate(request.nodes)
        ):
            count = len(set(assignment))
            best = count if best is None else min(best, count)
    return best


@given(
    st.lists(
        st.tuples(st.sampled_from([1.0, 2.0, 3.0, 5.0]), st.sampled_from([1, 2, 3, 6])),
        min_size=1,
        max_size=4,
    ),
    tfjobs("p", 0.0),
)
@settings(max_examples=150, deadline=None)
def test_placement_uses_the_fewest_nodes(sizes: list[tuple[float, int]], job: TFJob) -> None:
    job = TFJob(
        job.name,
        job.ps_count,
        job.ps_cpu,
        job.ps_memory_bytes,
        job.worker_cpu,
        job.worker_memory_bytes,
        min(job.min_workers, 3),
        max(min(job.min_workers, 3), 3),
        0.0,
    )
    request = PlacementRequest(
        tuple(Node(f"n{i}", c, m * GIB) for i, (c, m) in enumerate(sizes)), job
    )
    reply = place(request)
    expected = brute_force_nodes(request)
    assert reply.fits == (expected is not None)
    if expected is not None:
        assert reply.node_count == expected
        assert len(reply.ps_nodes) == job.ps_count and len(reply.worker_nodes) == job.min_workers
        greedy = greedy_placement(request)
        assert not greedy.fits or greedy.node_count >= reply.node_count


def test_placement_prefers_one_node_that_holds_everything() -> None:
    request = PlacementRequest(
        (Node("small", 4, 8 * GIB), Node("big", 16, 64 * GIB)), tfjob("a", workers=(3, 3))
    )
    assert place(request) == PlacementReply(True, ("big",), ("big",) * 3)


def test_requests_and_replies_round_trip() -> None:
    request = ScheduleRequest(
        nodes(2),
        (
            JobStatus(tfjob("a"), JobState.RUNNING, ("n0",), ("n0",)),
            JobStatus(tfjob("b", at=1), JobState.WAITING),
        ),
        now=2,
    )
    assert from_dict(ScheduleRequest, to_dict(request)) == request
    reply = schedule(request)
    assert from_dict(ScheduleReply, to_dict(reply)) == reply
    placement = PlacementRequest(nodes(2), tfjob("a"), workers=2)
    assert from_dict(PlacementRequest, to_dict(placement)) == placement
    assert from_dict(PlacementReply, to_dict(place(placement))) == place(placement)


def test_algorithms_are_registrable() -> None:
    assert [spec.qualified_name for spec in kod2.ALGORITHMS] == [
        "kod2-schedule/1",
        "kod2-placement/1",
    ]
    out = kod2.ALGORITHMS[1].run_dict(to_dict(PlacementRequest(nodes(1), tfjob("a"))))
    assert out["fits"] is True
