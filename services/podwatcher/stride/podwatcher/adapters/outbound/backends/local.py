"""The local backend: this machine is the one node, and pods will be local processes.

THIS ISSUE'S SCOPE: only :meth:`LocalBackend.nodes` is real. :meth:`LocalBackend.apply`
leaves a plan RECORDED and creates no pods, and :meth:`LocalBackend.list_pods` reports
none, rather than pretending. The local-processes issue extends this class: it starts one
supervised process per pod (trainer plus agent) with the plan's memory limit, resizes and
migrates them on a newer plan, and reports their phases.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import structlog

from stride.podwatcher.domain.cluster import Application, Node, PlanState, Pod
from stride.podwatcher.domain.plans import Plan

log = structlog.get_logger(__name__)

MEMINFO = Path("/proc/meminfo")


def parse_meminfo_total(text: str) -> int | None:
    """Total memory in bytes from the text of ``/proc/meminfo`` (its ``MemTotal`` line)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() != "MemTotal":
            continue
        parts = value.split()
        if not parts or not parts[0].isdigit():
            return None
        unit = parts[1].lower() if len(parts) > 1 else "b"
        factor = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}.get(unit)
        return None if factor is None else int(parts[0]) * factor
    return None


def total_memory_bytes() -> int:
    """This machine's memory: ``/proc/meminfo`` on Linux, else the page count times page size."""
    try:
        total = parse_meminfo_total(MEMINFO.read_text())
    except OSError:
        total = None
    if total is not None:
        return total
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def detect_local_node() -> Node:
    """This machine as a node: its host name, CPU count and total memory."""
    return Node(
        name=socket.gethostname() or "localhost",
        cpu=float(os.cpu_count() or 1),
        memory_bytes=total_memory_bytes(),
    )


class LocalBackend:
    """Pods as local processes on one node (pod creation comes with a later issue)."""

    name = "local"

    def __init__(self, node: Node) -> None:
        self.node = node

    async def apply(self, plan: Plan) -> Application:
        """Leave the plan RECORDED: this backend does not create pods yet."""
        log.info(
            "plan recorded; the local backend creates no pods yet",
            job_id=plan.job_id,
            version=plan.version,
        )
        return Application(PlanState.RECORDED)

    async def list_pods(self, job_id: str) -> list[Pod]:
        """No pods: none are created yet."""
        return []

    async def nodes(self) -> list[Node]:
        """This machine."""
        return [self.node]
