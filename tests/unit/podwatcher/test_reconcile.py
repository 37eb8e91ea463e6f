"""From a plan and the pods a job has to what the backend must do."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.plans import Plan, PodOverride, RoleResources
from stride.podwatcher.domain.reconcile import (
    PodRecord,
    Unplaceable,
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
