"""Placement on a topology tree: best fit and buddy allocation (ElasticFlow sec. 4.3)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.elasticflow import ALGORITHMS
from stride.policy.elasticflow.placement import (
    DeviceAllocation,
    InvalidPlacement,
    PlacementReply,
    PlacementRequest,
    Placements,
    PlacementStrategy,
    Topology,
    run,
    topology_from_cluster_spec,
)
from stride.policy.serialization import from_dict, to_dict
from stride.testing import SHARED_TRACES

BEST_FIT = PlacementStrategy.BEST_FIT
BUDDY = PlacementStrategy.BUDDY
TWO_SERVERS = Topology((2, 2, 4), ("server", "socket", "gpu"))
"""Two servers of Fig. 5: two CPU sockets of four GPUs each."""


def test_cluster_spec_files_parse() -> None:
    text = (SHARED_TRACES / "cluster_specs" / "n64g8.csv").read_text()
    topology = topology_from_cluster_spec(text)
    assert topology.fanouts == (2, 32, 8) and topology.device_count == 512
    with pytest.raises(InvalidPlacement, match="num_gpu_p_node"):
        topology_from_cluster_spec("num_switch,num_node_p_switch\n1,2\n")


def test_best_fit_picks_the_subtree_closest_to_the_need() -> None:
    # Server 0 socket 0 has 1 idle GPU, socket 1 has 3; server 1 is idle.
    occupied = (DeviceAllocation("x", (0, 1, 2)), DeviceAllocation("y", (4,)))
    reply = run(PlacementRequest(TWO_SERVERS, "job", 2, occupied, BEST_FIT))
    assert reply.placed and reply.devices == (5, 6)  # the 3-idle socket, not a fresh one
    reply = run(PlacementRequest(TWO_SERVERS, "job", 4, occupied, BEST_FIT))
    assert reply.devices == (8, 9, 10, 11)  # a whole idle socket
    single = run(PlacementRequest(TWO_SERVERS, "job", 1, occupied, BEST_FIT))
    assert single.devices == (3,)


def test_fig5_best_fit_fragments_and_buddy_does_not() -> None:
    # Seven GPUs of each server are busy: no layer-1 subtree holds two idle GPUs.
    occupied: tuple[DeviceAllocation, ...] = (
        DeviceAllocation("A", tuple(range(7))),
        DeviceAllocation("B", tuple(range(8, 15))),
    )
    spread = run(PlacementRequest(TWO_SERVERS, "C", 2, occupied, BEST_FIT))
    assert spread.placed and spread.devices == (7, 15)  # across servers: fragmented
    # With power-of-two sizes buddy repacks and finds an aligned block.
    occupied = (
        DeviceAllocation("A", (0, 1, 2, 3)),
        DeviceAllocation("B", (8, 9, 10, 11)),
        DeviceAllocation("D", (4, 5)),
        DeviceAllocation("E", (12, 13)),
        DeviceAllocation("F", (6,)),
        DeviceAllocation("G", (14,)),
    )
    reply = run(PlacementRequest(TWO_SERVERS, "C", 2, occupied, BUDDY))
    assert reply.placed and len(reply.devices) == 2 and reply.devices[0] % 2 == 0
    assert reply.migrations  # it had to move jobs
    assert from_dict(PlacementReply, to_dict(reply)) == reply


def test_buddy_prefers_the_smallest_free_block() -> None:
    occupied = (DeviceAllocation("A", (0,)), DeviceAllocation("B", (8, 9, 10, 11)))
    reply = run(PlacementRequest(TWO_SERVERS, "C", 1, occupied, BUDDY))
    assert reply.devices == (1,)  # the buddy of A's device, not a fresh server
    reply = run(PlacementRequest(TWO_SERVERS, "C", 4, occupied, BUDDY))
    assert reply.devices == (4, 5, 6, 7)  # both 4-blocks are maximal: the first wins


def test_not_enough_devices() -> None:
    occupied = (
        DeviceAllocation("A", tuple(range(8))),
        DeviceAllocation("B", (8, 9, 10, 11)),
        DeviceAllocation("E", (12, 13)),
    )
    for strategy in (BEST_FIT, BUDDY):
        reply = run(PlacementRequest(TWO_SERVERS, "C", 4, occupied, strategy))
        assert not reply.placed and "2 devices free" in reply.reason


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (PlacementRequest(TWO_SERVERS, "C", 3, (), BUDDY), "devices_needed"),
        (PlacementRequest(TWO_SERVERS, "C", 0, (), BEST_FIT), "devices_needed"),
        (PlacementRequest(TWO_SERVERS, "C", 17, (), BEST_FIT), "devices_needed"),
        (
            PlacementRequest(
                TWO_SERVERS,
                "C",
                1,
                (DeviceAllocation("A", (1,)), DeviceAllocation("B", (1,))),
                BEST_FIT,
            ),
            "occupied[1].devices[0]",
        ),
        (
            PlacementRequest(TWO_SERVERS, "C", 1, (DeviceAllocation("A", (0, 1, 2)),), BUDDY),
            "occupied[0].devices",
        ),
        (PlacementRequest(Topology((2, 3)), "C", 1, (), BUDDY), "topology.fanouts[1]"),
        (
            PlacementRequest(TWO_SERVERS, "C", 1, (DeviceAllocation("A", (16,)),)),
            "occupied[0].devices[0]",
        ),
    ],
)
def test_rejected_inputs_name_the_field(request_: PlacementRequest, field: str) -> None:
    with pytest.raises(InvalidPlacement) as caught:
        run(request_)
    assert caught.value.field == field


def test_request_round_trips_and_is_registered() -> None:
    request = PlacementRequest(TWO_SERVERS, "C", 2, (DeviceAllocation("A", (0,)),), BEST_FIT)
    assert from_dict(PlacementRequest, to_dict(request)) == request
    spec = {spec.name: spec for spec in ALGORITHMS}["elasticflow-placement"]
    assert spec.run_dict(to_dict(request))["placed"] is True


operations = st.lists(
    st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=40
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([(2, 2, 4), (1, 4, 8), (3, 2, 2), (1, 1, 16)]), operations)
def test_buddy_never_fragments(
    fanouts: tuple[int, ...], steps: list[tuple[bool, int, int]]
) -> None:
    topology = Topology(fanouts)
    total = topology.device_count
    running: dict[str, tuple[int, ...]] = {}
    for number, (place, exponent, pick) in enumerate(steps):
        if not place and running:
            del running[sorted(running)[pick % len(running)]]
            continue
        needed = 2**exponent
        if needed > total:
            continue
        occupied = tuple(DeviceAllocation(job, devices) for job, devices in running.items())
        reply = run(PlacementRequest(topology, f"job{number}", needed, occupied, BUDDY))
        free = total - sum(len(devices) for devices in running.values())
        assert reply.placed == (free >= needed)
        if not reply.placed:
            continue
        for moved in reply.migrations:
            running[moved.job_id] = moved.devices
        running[f"job{number}"] = reply.devices
        # One aligned block of the requested size: one subtree, no fragment.
        assert reply.devices == tuple(range(reply.devices[0], reply.devices[0] + needed))
        assert reply.devices[0] % needed == 0
        taken = [device for devices in running.values() for device in devices]
        assert len(taken) == len(set(taken)) and all(0 <= d < total for d in taken)
        for devices in running.values():
            assert len(devices) & (len(devices) - 1) == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 16), max_size=8), st.integers(1, 16))
def test_best_fit_places_whenever_enough_devices_are_free(sizes: list[int], needed: int) -> None:
    running: list[DeviceAllocation] = []
    for index, size in enumerate(sizes):
        reply = run(PlacementRequest(TWO_SERVERS, f"j{index}", size, tuple(running), BEST_FIT))
        if reply.placed:
            assert len(reply.devices) == size
            running.append(DeviceAllocation(f"j{index}", reply.devices))
    free = 16 - sum(len(item.devices) for item in running)
    reply = run(PlacementRequest(TWO_SERVERS, "new", needed, tuple(running), BEST_FIT))
    assert reply.placed == (free >= needed)
    taken = {device for item in running for device in item.devices}
    assert not taken & set(reply.devices)


@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=8), st.randoms())
def test_equal_sizes_are_placed_by_arrival_whatever_the_jobs_are_called(
    sizes: list[int], rng: object
) -> None:
    """The live service names jobs at random, the simulator after the trace: the same jobs
    arriving in the same order must get the same devices under either naming."""
    topology = Topology((1, 4, 8), ("switch", "node", "gpu"))
    total = 0
    fitting = []
    for size in sizes:
        if total + size <= 32:
            fitting.append(size)
            total += size
    names = [f"trace-{index}" for index in range(len(fitting))]
    shuffled = list(names)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    other = {name: f"job-{shuffled[index]}" for index, name in enumerate(names)}
    first, second = Placements(topology), Placements(topology)
    first.apply(dict(zip(names, fitting, strict=True)), names)
    arrivals = [other[name] for name in names]
    second.apply({other[name]: size for name, size in zip(names, fitting, strict=True)}, arrivals)
    assert {other[name]: devices for name, devices in first.placed.items()} == second.placed
