"""Virtual node specs and the eviction order."""

from __future__ import annotations

import pytest

from stride.podwatcher.domain.nodes import NodeSpec, PodUsage, choose_eviction, parse_nodes
from stride.runtime.errors import InvalidArgument

GIB = 1024**3


def test_groups_and_units() -> None:
    nodes = parse_nodes("2x(cpu=1,memory=2Gi)+1x(cpu=500m,memory=1500M)")
    assert nodes == (
        NodeSpec("node-0", 1.0, 2 * GIB),
        NodeSpec("node-1", 1.0, 2 * GIB),
        NodeSpec("node-2", 0.5, 1_500_000_000),
    )
    assert parse_nodes("(cpu=4, memory=8589934592)") == (NodeSpec("node-0", 4.0, 8 * GIB),)
    assert len(parse_nodes("4x(cpu=2,memory=4Gi); 4x(cpu=2,memory=4Gi)")) == 8
    # Simulated GPUs for a GPU trace's replay: admission counts them.
    gpus = parse_nodes("2x(cpu=8,memory=64Gi,gpu=8)")
    assert [node.gpus for node in gpus] == [8, 8] and gpus[0].cpu == 8.0


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("4x(cpu=two,memory=4Gi)", 'cpu "two" is not a number'),
        ("4x(cpu=2,memory=4Gb)", 'memory "4Gb" is not a quantity'),
        ("4x(cpu=2)", "memory missing"),
        ("4x(cpu=2,memory=4Gi,disk=1)", 'unknown key "disk"'),
        ("4x(cpu=2,memory=4Gi,gpu=-1)", 'gpu "-1" must be a whole number'),
        ("4x(cpu=2,memory=4Gi,gpu=1.5)", 'gpu "1.5" must be a whole number'),
        ("4x(cpu=2,cpu=3,memory=4Gi)", '"cpu" is given twice'),
        ("4(cpu=2,memory=4Gi)", "expected Nx(cpu=C,memory=M)"),
        ("0x(cpu=2,memory=4Gi)", "at least 1"),
        ("1x(cpu=0,memory=4Gi)", "positive"),
        ("1x(cpu=nan,memory=4Gi)", "positive"),
        ("1x(cpu=1,memory=0)", "positive"),
        ("300x(cpu=1,memory=1Gi)", "more than 256 nodes"),
        ("", "is empty"),
    ],
)
def test_bad_specs_name_the_part_and_the_problem(text: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_nodes(text)
    assert raised.value.field == "STRIDE_PODWATCHER_LOCAL_NODES"
    assert problem in str(raised.value), str(raised.value)


def test_eviction_takes_the_pod_most_over_its_request_first() -> None:
    pods = [
        PodUsage("big-but-within", 8 * GIB, 7 * GIB),
        PodUsage("over", GIB, 2 * GIB),
        PodUsage("small", GIB, GIB // 2),
    ]
    assert choose_eviction(pods) == "over"
    assert choose_eviction([]) is None
    assert choose_eviction(pods[::2]) == "small"  # the one least under its request
