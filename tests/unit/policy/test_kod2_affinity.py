"""KOD2 placement of a job's tasks of any sizes, with affinity to the nodes it holds."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.kod2 import (
    Kod2InputError,
    Node,
    PlacementRequest,
    Task,
    TaskPlacementReply,
    TaskPlacementRequest,
    TFJob,
    place,
    place_tasks,
)

GIB = 1024**3


def added(reply: TaskPlacementReply, prefer: Sequence[str]) -> int:
    return len(set(reply.nodes) - set(prefer))


def first_fit_decreasing(nodes: Sequence[Node], tasks: Sequence[Task]) -> list[str] | None:
    """The reference: largest memory (then CPU) first, each on the first node with room."""
    left = {node.name: [float(node.cpu), node.memory_bytes] for node in nodes}
    where = [""] * len(tasks)
    for position in sorted(
        range(len(tasks)), key=lambda p: (-tasks[p].memory_bytes, -tasks[p].cpu)
    ):
        task = tasks[position]
        for name, room in left.items():
            if room[0] + 1e-9 >= task.cpu and room[1] >= task.memory_bytes:
                room[0] -= task.cpu
                room[1] -= task.memory_bytes
                where[position] = name
                break
        else:
            return None
    return where


def brute_force(request: TaskPlacementRequest) -> tuple[int, int] | None:
    """Best (nodes added beyond prefer, -tasks on prefer) over every assignment."""
    best: tuple[int, int] | None = None
    names = [node.name for node in request.nodes]
    for assignment in itertools.product(range(len(names)), repeat=len(request.tasks)):
        load = [[0.0, 0] for _ in names]
        for task, index in zip(request.tasks, assignment, strict=True):
            load[index][0] += task.cpu
            load[index][1] += task.memory_bytes
        if all(
            load[i][0] <= node.cpu + 1e-9 and load[i][1] <= node.memory_bytes
            for i, node in enumerate(request.nodes)
        ):
            used = {names[i] for i in assignment}
            score = (
                len(used - set(request.prefer)),
                -sum(1 for i in assignment if names[i] in request.prefer),
            )
            best = score if best is None else min(best, score)
    return best


def assert_within_capacity(request: TaskPlacementRequest, reply: TaskPlacementReply) -> None:
    assert len(reply.nodes) == len(request.tasks)
    for node in request.nodes:
        on = [t for t, n in zip(request.tasks, reply.nodes, strict=True) if n == node.name]
        assert sum(t.cpu for t in on) <= node.cpu + 1e-9
        assert sum(t.memory_bytes for t in on) <= node.memory_bytes
    assert set(reply.nodes) <= {node.name for node in request.nodes}


node_sizes = st.tuples(st.sampled_from([0.0, 1.0, 2.0, 4.0]), st.sampled_from([0, 1, 2, 4]))
task_sizes = st.tuples(st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([1, 2]))


@st.composite
def requests(draw: st.DrawFn, max_sizes: int, max_tasks: int) -> TaskPlacementRequest:
    sizes = draw(st.lists(node_sizes, min_size=1, max_size=4))
    nodes = tuple(Node(f"n{i}", cpu, memory * GIB) for i, (cpu, memory) in enumerate(sizes))
    shapes = draw(st.lists(task_sizes, min_size=1, max_size=max_sizes, unique=True))
    tasks = draw(
        st.lists(st.sampled_from(shapes), min_size=1, max_size=max_tasks).map(
            lambda picked: tuple(Task(cpu, memory * GIB) for cpu, memory in picked)
        )
    )
    prefer = draw(st.lists(st.sampled_from([n.name for n in nodes]), unique=True, max_size=2))
    capacity = tuple(Node(n.name, n.cpu + 2, n.memory_bytes + 2 * GIB) for n in nodes)
    return TaskPlacementRequest(nodes, tasks, tuple(prefer), capacity)


@given(requests(max_sizes=2, max_tasks=5))
@settings(max_examples=150, deadline=None)
def test_one_or_two_sizes_are_placed_exactly(request: TaskPlacementRequest) -> None:
    reply = place_tasks(request)
    best = brute_force(request)
    assert reply.fits == (best is not None)
    if best is not None:
        assert_within_capacity(request, reply)
        assert (
            added(reply, request.prefer),
            -sum(1 for n in reply.nodes if n in request.prefer),
        ) == best


@given(requests(max_sizes=4, max_tasks=7))
@settings(max_examples=200, deadline=None)
def test_any_sizes_never_overcommit_nor_add_more_nodes_than_first_fit_decreasing(
    request: TaskPlacementRequest,
) -> None:
    reply = place_tasks(request)
    reference = first_fit_decreasing(request.nodes, request.tasks)
    if reference is not None:
        assert reply.fits
        assert added(reply, request.prefer) <= len(set(reference) - set(request.prefer))
    if reply.fits:
        assert_within_capacity(request, reply)
    else:
        assert reply.nodes == ()


def test_without_prefer_two_sizes_match_kod2_place() -> None:
    nodes = (Node("small", 4, 8 * GIB), Node("big", 16, 64 * GIB))
    job = TFJob("a", 1, 1.0, GIB, 2, 2 * GIB, 3, 3, 0)
    tasks = (Task(1.0, GIB),) + (Task(2, 2 * GIB),) * 3
    reply = place_tasks(TaskPlacementRequest(nodes, tasks))
    expected = place(PlacementRequest(nodes, job))
    assert reply.nodes == expected.ps_nodes + expected.worker_nodes == ("big",) * 4


def test_a_scale_out_goes_to_the_jobs_node_even_if_another_is_idler() -> None:
    # "held" has room for two more 1-cpu tasks; "idle" is empty (idler), but using it
    # would add a node to the job.
    nodes = (Node("idle", 8, 16 * GIB), Node("held", 2, 4 * GIB))
    capacity = (Node("idle", 8, 16 * GIB), Node("held", 8, 16 * GIB))
    reply = place_tasks(TaskPlacementRequest(nodes, (Task(1, GIB),) * 2, ("held",), capacity))
    assert reply == TaskPlacementReply(True, ("held", "held"))
    # Without the affinity, the idlest node wins the tie between one-node placements.
    plain = place_tasks(TaskPlacementRequest(nodes, (Task(1, GIB),) * 2, (), capacity))
    assert plain == TaskPlacementReply(True, ("idle", "idle"))


def test_the_jobs_node_is_filled_first_when_it_holds_only_part() -> None:
    # Three tasks, room for one on "held": either way one node is added; "held" gets one.
    nodes = (Node("idle", 8, 16 * GIB), Node("held", 1, 4 * GIB))
    reply = place_tasks(TaskPlacementRequest(nodes, (Task(1, GIB),) * 3, ("held",)))
    assert sorted(reply.nodes) == ["held", "idle", "idle"]


def test_more_than_two_sizes_round_up_to_reach_the_fewest_nodes() -> None:
    # 2 PS (1 cpu, 2 GiB), 4 workers (1 cpu, 1 GiB), a chief (0.5 cpu, 1 GiB): 6.5 cpu, so
    # two 4-cpu nodes at least; "b" + "c" hold it (PS+PS+2 workers = 4 cpu / 6 GiB, and
    # 2 workers + chief = 2.5 cpu / 3 GiB). Greedy over sizes packs PS and workers on
    # "a" + "b" and strands the chief; first fit decreasing uses all three.
    nodes = (Node("a", 2, 2 * GIB), Node("b", 4, 8 * GIB), Node("c", 4, 8 * GIB))
    tasks = (Task(1, 2 * GIB),) * 2 + (Task(1, GIB),) * 4 + (Task(0.5, GIB),)
    request = TaskPlacementRequest(nodes, tasks)
    reply = place_tasks(request)
    assert reply.fits and set(reply.nodes) == {"b", "c"}
    assert_within_capacity(request, reply)
    reference = first_fit_decreasing(nodes, tasks)
    assert reference is not None and len(set(reference)) == 3


def test_first_fit_decreasing_is_the_safety_net_for_more_than_two_sizes() -> None:
    # 2 cpu / 1 GiB, three 0.5 cpu / 1 GiB and 1 cpu / 1 GiB: 4.5 cpu, 5 GiB. Placing the
    # two largest groups first (exactly, on two nodes) leaves no node with a whole cpu for
    # the last task, and so does rounding up; first fit decreasing places all five:
    # n0 = 2 + 1 + 0.5 cpu / 3 GiB, n1 = 2 x 0.5 cpu / 2 GiB.
    nodes = (Node("n0", 4, 3 * GIB), Node("n1", 2, 2 * GIB))
    tasks = (Task(2, GIB), Task(0.5, GIB), Task(0.5, GIB), Task(1, GIB), Task(0.5, GIB))
    request = TaskPlacementRequest(nodes, tasks)
    reply = place_tasks(request)
    assert reply.fits and reply.node_count == 2
    assert_within_capacity(request, reply)
    assert list(reply.nodes) == first_fit_decreasing(nodes, tasks)


def test_full_nodes_empty_requests_and_unknown_prefer_are_fine() -> None:
    nodes = (Node("full", 0, 0), Node("free", 1, GIB))
    assert place_tasks(TaskPlacementRequest(nodes, ())) == TaskPlacementReply(True)
    reply = place_tasks(TaskPlacementRequest(nodes, (Task(1, GIB),), ("gone",)))
    assert reply == TaskPlacementReply(True, ("free",))
    assert place_tasks(TaskPlacementRequest(nodes, (Task(1, GIB),) * 2)) == TaskPlacementReply(
        False
    )
    assert place_tasks(TaskPlacementRequest((), (Task(1, GIB),))).fits is False


@pytest.mark.parametrize(
    ("request_args", "field"),
    [
        (((Node("a", 1, GIB),), (Task(0, GIB),)), "tasks[0].cpu"),
        (((Node("a", 1, GIB),), (Task(1, 0),)), "tasks[0].memory_bytes"),
        (((Node("a", 1, GIB), Node("a", 1, GIB)), ()), "nodes[1].name"),
        (((Node("a", -1, GIB),), ()), "nodes[0].cpu"),
        (((Node("a", 1, GIB),), ((1, GIB),)), "tasks[0]"),
    ],
)
def test_invalid_requests_name_the_field(request_args: tuple[object, ...], field: str) -> None:
    with pytest.raises(Kod2InputError) as raised:
        TaskPlacementRequest(*request_args)  # type: ignore[arg-type]
    assert raised.value.field == field
