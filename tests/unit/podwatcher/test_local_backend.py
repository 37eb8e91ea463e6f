"""The local backend: this machine as the one node; plans stay RECORDED, no pods yet."""

from __future__ import annotations

import os

from stride.podwatcher.adapters.outbound.backends.local import (
    LocalBackend,
    detect_local_node,
    parse_meminfo_total,
)
from stride.podwatcher.domain.cluster import Node, PlanState
from stride.podwatcher.domain.plans import Plan

MEMINFO = """MemTotal:       16314344 kB
MemFree:         1036544 kB
MemAvailable:    9123456 kB
"""


def test_meminfo_total_is_read_in_bytes() -> None:
    assert parse_meminfo_total(MEMINFO) == 16314344 * 1024


def test_meminfo_without_a_total_gives_none() -> None:
    assert parse_meminfo_total("MemFree: 12 kB\n") is None
    assert parse_meminfo_total("MemTotal: lots\n") is None
    assert parse_meminfo_total("MemTotal: 12 parsecs\n") is None


def test_the_local_node_is_this_machine() -> None:
    node = detect_local_node()
    assert node.name
    assert node.cpu == float(os.cpu_count() or 1)
    assert node.memory_bytes > 0
    assert node.devices == 0


async def test_local_backend_records_plans_without_pods() -> None:
    node = Node("here", cpu=8.0, memory_bytes=32 * 1024**3)
    backend = LocalBackend(node)
    application = await backend.apply(Plan(job_id="job-1", version=1))
    assert application.state is PlanState.RECORDED
    assert await backend.list_pods("job-1") == []
    assert await backend.nodes() == [node]
