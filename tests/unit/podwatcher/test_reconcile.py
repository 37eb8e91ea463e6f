"""From a plan and the pods a job has to what the backend must do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.plans import Plan, PodOverride, RoleResources
from stride.podwatcher.domain.reconcile import (
    PodRecord,
    PodWant,
    Reconciliation,
    Unplaceable,
    desired_sizes,
    pod_name,
    reconcile,
)
from stride.vocabulary import Role

GIB = 1024**3
JOB = "job-r1"
NODES = tuple(NodeSpec(f"node-{n}", 2.0, 4 * GIB) for n in range(4))


def plan(workers: int, ps: int = 1, version: int = 1, worker_memory: int = GIB) -> Plan:
    return Plan(
        JOB,
        version,
        (
            RoleResources(Role.CHIEF, 1, 0.5, GIB),
            RoleResources(Role.PS, ps, 1.0, GIB),
            RoleResources(Role.WORKER, workers, 1.0, worker_memory),
        ),
    )


def running(recon_plan: Plan) -> list[PodRecord]:
    """The pods a first reconciliation of ``recon_plan`` creates, as running."""
    recon = reconcile(recon_plan, [], NODES)
    return [
        PodRecord(
            w.name,
            JOB,
            w.role,
            w.index,
            w.generation,
            w.cpu,
            w.memory_bytes,
            w.node,
            PodPhase.RUNNING,
        )
        for w in recon.create
    ]


def test_names_are_kubernetes_names() -> None:
    assert pod_name(JOB, Role.DATA_WORKER, 2) == "job-r1-data-worker-2"
    assert pod_name(JOB, Role.PS, 0, 3) == "job-r1-ps-0-g3"


def test_a_first_plan_creates_every_pod_and_fits_the_nodes() -> None:
    recon = reconcile(plan(3), [], NODES)
    assert sorted(w.name for w in recon.create) == sorted(
        [pod_name(JOB, Role.CHIEF, 0), pod_name(JOB, Role.PS, 0)]
        + [pod_name(JOB, Role.WORKER, i) for i in range(3)]
    )
    for node in NODES:
        on = [w for w in recon.create if w.node == node.name]
        assert sum(w.cpu for w in on) <= node.cpu
        assert sum(w.memory_bytes for w in on) <= node.memory_bytes
    assert recon.cluster[Role.WORKER] == tuple(pod_name(JOB, Role.WORKER, i) for i in range(3))
    assert recon.membership_changed


def test_the_same_plan_again_does_nothing() -> None:
    pods = running(plan(2))
    recon = reconcile(replace(plan(2), version=2), pods, NODES)
    assert recon.empty and not recon.membership_changed


def test_scale_out_creates_only_the_new_workers() -> None:
    pods = running(plan(1))
    recon = reconcile(plan(3, version=2), pods, NODES)
    assert [w.name for w in recon.create] == [
        pod_name(JOB, Role.WORKER, 1),
        pod_name(JOB, Role.WORKER, 2),
    ] or sorted(w.name for w in recon.create) == sorted(
        [pod_name(JOB, Role.WORKER, 1), pod_name(JOB, Role.WORKER, 2)]
    )
    assert not recon.delete and recon.membership_changed


def test_scale_in_deletes_the_highest_indexes() -> None:
    pods = running(plan(3))
    recon = reconcile(plan(1, version=2), pods, NODES)
    assert sorted(p.name for p in recon.delete) == [
        pod_name(JOB, Role.WORKER, 1),
        pod_name(JOB, Role.WORKER, 2),
    ]
    assert recon.cluster[Role.WORKER] == (pod_name(JOB, Role.WORKER, 0),)
    assert recon.membership_changed and not recon.create


def test_a_cpu_change_with_room_is_a_resize_in_place() -> None:
    roomy = tuple(NodeSpec(f"node-{n}", 4.0, 8 * GIB) for n in range(2))
    pods = [replace(p, node="node-0") for p in running(plan(1))]
    bigger = Plan(JOB, 2, (*plan(1).roles[:2], RoleResources(Role.WORKER, 1, 1.5, GIB)))
    recon = reconcile(bigger, pods, roomy)
    assert [(r.pod.name, r.cpu) for r in recon.resize] == [(pod_name(JOB, Role.WORKER, 0), 1.5)]
    assert not recon.membership_changed


def test_growth_without_room_on_the_node_migrates_the_pod() -> None:
    pods = running(plan(1))
    # 3.5 GiB no longer fits beside what the worker's node holds, if anything else is there;
    # move the worker onto a node with room.
    crowded = [replace(p, node="node-0") for p in pods]
    nodes = (NodeSpec("node-0", 8.0, 4 * GIB), NodeSpec("node-1", 8.0, 8 * GIB))
    grown = Plan(JOB, 2, (*plan(1).roles[:2], RoleResources(Role.WORKER, 1, 1.0, 3 * GIB)))
    recon = reconcile(grown, crowded, nodes)
    assert len(recon.migrate) == 1
    migration = recon.migrate[0]
    assert migration.replacement.name == pod_name(JOB, Role.WORKER, 0, 1)
    assert migration.replacement.node == "node-1"
    assert recon.cluster[Role.WORKER] == (migration.replacement.name,)
    assert recon.membership_changed


def test_more_ps_repartition_through_new_ps_pods() -> None:
    pods = running(plan(1))
    recon = reconcile(plan(1, ps=2, version=2), pods, NODES)
    assert [w.name for w in recon.create] == [pod_name(JOB, Role.PS, 1)]
    assert recon.cluster[Role.PS] == (pod_name(JOB, Role.PS, 0), pod_name(JOB, Role.PS, 1))
    assert recon.membership_changed


def test_a_failed_pod_is_relaunched_under_its_own_name() -> None:
    pods = running(plan(2))
    failed = [replace(p, phase=PodPhase.FAILED) if p.role is Role.PS else p for p in pods]
    recon = reconcile(plan(2, version=1), failed, NODES)
    assert [w.name for w in recon.relaunch] == [pod_name(JOB, Role.PS, 0)]
    assert not recon.create and not recon.membership_changed


def test_an_oom_relaunch_with_more_memory_gets_it_or_moves() -> None:
    pods = running(plan(1))
    failed = [replace(p, phase=PodPhase.FAILED) if p.role is Role.WORKER else p for p in pods]
    recon = reconcile(plan(1, version=2, worker_memory=2 * GIB), failed, NODES)
    assert [(w.name, w.memory_bytes) for w in recon.relaunch] == [
        (pod_name(JOB, Role.WORKER, 0), 2 * GIB)
    ]


def test_overrides_size_one_pod() -> None:
    with_override = Plan(
        JOB,
        1,
        (
            RoleResources(Role.CHIEF, 1, 0.5, GIB),
            RoleResources(Role.PS, 2, 1.0, GIB, (PodOverride(1, 2.0, 0),)),
            RoleResources(Role.WORKER, 1, 1.0, GIB),
        ),
    )
    recon = reconcile(with_override, [], NODES)
    sizes = {w.name: (w.cpu, w.memory_bytes) for w in recon.create}
    assert sizes[pod_name(JOB, Role.PS, 1)] == (2.0, GIB)
    assert sizes[pod_name(JOB, Role.PS, 0)] == (1.0, GIB)


def test_other_jobs_hold_room() -> None:
    others = [
        PodRecord(
            f"other-{n}",
            "job-other",
            Role.WORKER,
            n,
            0,
            2.0,
            4 * GIB,
            f"node-{n}",
            PodPhase.RUNNING,
        )
        for n in range(2)
    ]
    recon = reconcile(plan(1), [], NODES, others)
    assert {w.node for w in recon.create} <= {"node-2", "node-3"}


def test_an_unplaceable_plan_names_the_pod_and_the_room_left() -> None:
    huge = Plan(JOB, 1, (RoleResources(Role.WORKER, 1, 1.0, 64 * GIB),))
    with pytest.raises(Unplaceable, match=r"job-r1-worker-0 \(1 cpu, 64.00 GiB\).*4.00 GiB free"):
        reconcile(huge, [], NODES)


# --- KOD2 placement (sec. 4.1): fewest nodes, the job's nodes first ----------------------


def record(want: PodWant, job_id: str = JOB) -> PodRecord:
    return PodRecord(
        want.name,
        job_id,
        want.role,
        want.index,
        want.generation,
        want.cpu,
        want.memory_bytes,
        want.node,
        PodPhase.RUNNING,
    )


def pod(role: Role, index: int, cpu: float, memory: int, node: str, job: str = JOB) -> PodRecord:
    return PodRecord(
        pod_name(job, role, index), job, role, index, 0, cpu, memory, node, PodPhase.RUNNING
    )


def first_fit_decreasing(
    recon_plan: Plan,
    nodes: Sequence[NodeSpec],
    held: Sequence[PodRecord] = (),
    keep: Sequence[tuple[Role, int]] = (),
) -> dict[str, str] | None:
    """The placement reconcile had before KOD2, for the pods ``recon_plan`` creates: largest
    memory first, each on the first node (in order) with room left by ``held``."""
    rooms = {node.name: [node.cpu, node.memory_bytes] for node in nodes}
    for held_pod in held:
        rooms[held_pod.node][0] -= held_pod.cpu
        rooms[held_pod.node][1] -= held_pod.memory_bytes
    sizes = desired_sizes(recon_plan)
    where: dict[str, str] = {}
    for (role, index), (cpu, memory) in sorted(
        sizes.items(), key=lambda item: (-item[1][1], -item[1][0], item[0][0].value, item[0][1])
    ):
        if (role, index) in keep:
            continue
        for name, room in rooms.items():
            if room[0] + 1e-9 >= cpu and room[1] >= memory:
                room[0] -= cpu
                room[1] -= memory
                where[pod_name(recon_plan.job_id, role, index)] = name
                break
        else:
            return None
    return where


def assert_no_node_overcommitted(
    nodes: Sequence[NodeSpec], held: Sequence[PodRecord], recon: Reconciliation
) -> None:
    for node in nodes:
        on = [(p.cpu, p.memory_bytes) for p in held if p.node == node.name] + [
            (w.cpu, w.memory_bytes) for w in recon.create if w.node == node.name
        ]
        assert sum(cpu for cpu, _ in on) <= node.cpu + 1e-9, node
        assert sum(memory for _, memory in on) <= node.memory_bytes, node


def ps_and_workers(workers: int, cpu: float = 1.0, memory: int = GIB) -> Plan:
    return Plan(
        JOB,
        1,
        (
            RoleResources(Role.PS, 1, cpu, memory),
            RoleResources(Role.WORKER, workers, cpu, memory),
        ),
    )


def test_a_job_one_node_can_hold_goes_there_where_first_fit_spread_it() -> None:
    # 1 PS + 3 workers of 1 cpu / 1 GiB: 4 cpu. First fit puts two pods on each 2-cpu
    # node; node-2 (4 cpu) holds all four.
    nodes = (
        NodeSpec("node-0", 2.0, 4 * GIB),
        NodeSpec("node-1", 2.0, 4 * GIB),
        NodeSpec("node-2", 4.0, 8 * GIB),
    )
    recon = reconcile(ps_and_workers(3), [], nodes)
    assert len(recon.create) == 4
    assert {w.node for w in recon.create} == {"node-2"}
    before = first_fit_decreasing(ps_and_workers(3), nodes)
    assert before is not None and set(before.values()) == {"node-0", "node-1"}


def test_a_scale_out_lands_beside_the_jobs_pods_even_if_another_node_is_idler() -> None:
    nodes = (NodeSpec("node-0", 8.0, 16 * GIB), NodeSpec("node-1", 8.0, 16 * GIB))
    # The job runs on node-1 (2.5 cpu, 3 GiB used); node-0 is empty, so it is the idlest
    # and first fit's first choice too.
    pods = [
        pod(Role.CHIEF, 0, 0.5, GIB, "node-1"),
        pod(Role.PS, 0, 1.0, GIB, "node-1"),
        pod(Role.WORKER, 0, 1.0, GIB, "node-1"),
    ]
    recon = reconcile(plan(3, version=2), pods, nodes)
    assert sorted((w.name, w.node) for w in recon.create) == [
        (pod_name(JOB, Role.WORKER, 1), "node-1"),
        (pod_name(JOB, Role.WORKER, 2), "node-1"),
    ]
    before = first_fit_decreasing(plan(3, version=2), nodes, pods, [(r, 0) for r in Role])
    assert before is not None and set(before.values()) == {"node-0"}


def test_a_scale_out_the_jobs_node_holds_in_part_fills_it_first() -> None:
    nodes = (NodeSpec("node-0", 8.0, 16 * GIB), NodeSpec("node-1", 3.5, 16 * GIB))
    pods = [
        pod(Role.CHIEF, 0, 0.5, GIB, "node-1"),
        pod(Role.PS, 0, 1.0, GIB, "node-1"),
        pod(Role.WORKER, 0, 1.0, GIB, "node-1"),
    ]
    # node-1 has 1 cpu left: one new worker fits there, the other two go to node-0.
    recon = reconcile(plan(4, version=2), pods, nodes)
    assert sorted(w.node for w in recon.create) == ["node-0", "node-0", "node-1"]


def test_a_job_no_node_holds_uses_the_fewest_nodes() -> None:
    # Chief 0.5 cpu / 1 GiB, 2 PS of 1 cpu / 2 GiB, 4 workers of 1 cpu / 1 GiB: 6.5 cpu,
    # more than any node's 4, so two nodes at least; node-1 + node-2 hold it (2 PS + 2
    # workers = 4 cpu / 6 GiB on one, 2 workers + the chief = 2.5 cpu / 3 GiB on the other).
    # First fit used all three nodes.
    nodes = (
        NodeSpec("node-0", 2.0, 2 * GIB),
        NodeSpec("node-1", 4.0, 8 * GIB),
        NodeSpec("node-2", 4.0, 8 * GIB),
    )
    three_sizes = Plan(
        JOB,
        1,
        (
            RoleResources(Role.CHIEF, 1, 0.5, GIB),
            RoleResources(Role.PS, 2, 1.0, 2 * GIB),
            RoleResources(Role.WORKER, 4, 1.0, GIB),
        ),
    )
    recon = reconcile(three_sizes, [], nodes)
    assert len(recon.create) == 7
    assert {w.node for w in recon.create} == {"node-1", "node-2"}
    assert_no_node_overcommitted(nodes, [], recon)
    before = first_fit_decreasing(three_sizes, nodes)
    assert before is not None and len(set(before.values())) == 3


def test_a_migration_moves_beside_the_jobs_other_pods() -> None:
    nodes = (
        NodeSpec("node-0", 8.0, 16 * GIB),
        NodeSpec("node-1", 2.0, 2 * GIB),
        NodeSpec("node-2", 4.0, 8 * GIB),
    )
    pods = [
        pod(Role.CHIEF, 0, 0.5, GIB, "node-2"),
        pod(Role.PS, 0, 1.0, GIB, "node-2"),
        pod(Role.WORKER, 0, 1.0, GIB, "node-1"),
    ]
    # The worker grows to 3 GiB, more than node-1 has: it moves, to node-2 where the chief
    # and PS are (room: 2.5 cpu, 6 GiB), not to node-0, the idlest and first in order.
    grown = Plan(JOB, 2, (*plan(1).roles[:2], RoleResources(Role.WORKER, 1, 1.0, 3 * GIB)))
    recon = reconcile(grown, pods, nodes)
    assert [(m.old.name, m.replacement.node) for m in recon.migrate] == [
        (pod_name(JOB, Role.WORKER, 0), "node-2")
    ]


def test_a_failed_pod_whose_node_is_gone_comes_back_beside_the_jobs_pods() -> None:
    nodes = (NodeSpec("node-0", 8.0, 16 * GIB), NodeSpec("node-1", 4.0, 8 * GIB))
    pods = [
        pod(Role.CHIEF, 0, 0.5, GIB, "node-1"),
        pod(Role.PS, 0, 1.0, GIB, "node-1"),
        replace(pod(Role.WORKER, 0, 1.0, GIB, "drained"), phase=PodPhase.FAILED),
    ]
    recon = reconcile(plan(1), pods, nodes)
    assert [(w.name, w.node) for w in recon.relaunch] == [(pod_name(JOB, Role.WORKER, 0), "node-1")]


def test_a_group_that_cannot_be_placed_names_the_pod_first_fit_stops_at() -> None:
    nodes = (NodeSpec("node-0", 2.0, 4 * GIB), NodeSpec("node-1", 2.0, 4 * GIB))
    # Each node holds one 3 GiB worker; the third has nowhere to go.
    wide = Plan(
        JOB,
        1,
        (RoleResources(Role.CHIEF, 1, 0.5, GIB), RoleResources(Role.WORKER, 3, 1.0, 3 * GIB)),
    )
    with pytest.raises(
        Unplaceable,
        match=(
            r"^no node has room for pod job-r1-worker-2 \(1 cpu, 3.00 GiB\); "
            r"the roomiest, node-0 has 1 cpu, 1.00 GiB free$"
        ),
    ):
        reconcile(wide, [], nodes)


def test_a_migration_that_cannot_be_placed_names_the_replacement() -> None:
    nodes = (NodeSpec("node-0", 4.0, 4 * GIB), NodeSpec("node-1", 4.0, 2 * GIB))
    pods = [pod(Role.WORKER, 0, 1.0, GIB, "node-0")]
    grown = Plan(JOB, 2, (RoleResources(Role.WORKER, 1, 1.0, 6 * GIB),))
    with pytest.raises(Unplaceable, match=r"pod job-r1-worker-0-g1 \(1 cpu, 6.00 GiB\)"):
        reconcile(grown, pods, nodes)


node_specs = st.lists(
    st.tuples(st.sampled_from([1.0, 2.0, 4.0]), st.sampled_from([1, 2, 4, 8])),
    min_size=1,
    max_size=4,
).map(lambda sizes: tuple(NodeSpec(f"node-{i}", c, m * GIB) for i, (c, m) in enumerate(sizes)))
pod_sizes = st.tuples(st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([1, 2, 3]))


@st.composite
def placements(draw: st.DrawFn) -> tuple[tuple[NodeSpec, ...], list[PodRecord], Plan, Plan]:
    """Nodes, other jobs' pods on them, and a job's first plan and a scale out of it."""
    nodes = draw(node_specs)
    others = []
    for number, node in enumerate(nodes):
        if draw(st.booleans()):
            cpu = draw(st.sampled_from([0.5, 1.0])) * node.cpu
            memory = node.memory_bytes // draw(st.sampled_from([1, 2, 4]))
            others.append(pod(Role.WORKER, number, cpu, memory, node.name, job="job-other"))
    roles = []
    for role in (Role.CHIEF, Role.PS, Role.WORKER, Role.DATA_WORKER):
        count = draw(st.integers(0, 3))
        cpu, memory = draw(pod_sizes)
        overrides: tuple[PodOverride, ...] = ()
        if count and draw(st.booleans()):
            bigger_cpu, bigger_memory = draw(pod_sizes)
            overrides = (PodOverride(count - 1, bigger_cpu, bigger_memory * GIB),)
        roles.append(RoleResources(role, count, cpu, memory * GIB, overrides))
    first = Plan(JOB, 1, tuple(roles))
    more = draw(st.integers(1, 3))
    # The scale out adds workers (of the role's size) after any overridden one.
    grown = tuple(replace(r, count=r.count + more) if r.role is Role.WORKER else r for r in roles)
    return nodes, others, first, Plan(JOB, 2, grown)


@given(placements())
@settings(max_examples=300, deadline=None)
def test_placement_never_overcommits_nor_uses_more_nodes_than_first_fit_decreasing(
    case: tuple[tuple[NodeSpec, ...], list[PodRecord], Plan, Plan],
) -> None:
    nodes, others, first, grown = case
    # A new job: the nodes it uses.
    before = first_fit_decreasing(first, nodes, others)
    try:
        recon = reconcile(first, [], nodes, others)
    except Unplaceable:
        assert before is None
        return
    assert_no_node_overcommitted(nodes, others, recon)
    # KOD2 may place what first fit cannot; where first fit places it, never on fewer nodes.
    if before is not None:
        assert len({w.node for w in recon.create}) <= len(set(before.values()))
    # A scale out of it: the nodes the job spans afterwards.
    running_pods = [record(w) for w in recon.create]
    kept = [(p.role, p.index) for p in running_pods]
    before = first_fit_decreasing(grown, nodes, [*others, *running_pods], kept)
    try:
        out = reconcile(grown, running_pods, nodes, others)
    except Unplaceable:
        assert before is None
        return
    assert not (out.relaunch or out.resize or out.migrate or out.delete)
    assert_no_node_overcommitted(nodes, [*others, *running_pods], out)
    if before is not None:
        held = {p.node for p in running_pods}
        assert len(held | {w.node for w in out.create}) <= len(held | set(before.values()))
