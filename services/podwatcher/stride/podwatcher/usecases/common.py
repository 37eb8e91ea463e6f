"""Words the pod watcher's use cases share: timings, views, ports, the failure reasons
they publish, and the helpers each room uses."""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

import structlog

from stride.events.v1 import job_pb2, pod_pb2
from stride.podwatcher.adapters.outbound.backends.base import (
    PodUsage,
)
from stride.podwatcher.adapters.outbound.repository import StoredPod
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.reconcile import (
    Reconciliation,
)
from stride.vocabulary import Role

log = structlog.get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R")

SIMULATED = "simulated job: no pods (its agents are played by stride loadgen)"
"""Why a simulated job's plan counts as applied."""

FAILURE_REASONS = {
    "OOMKilled": pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
    "Evicted": pod_pb2.POD_FAILURE_REASON_EVICTED,
    "Error": pod_pb2.POD_FAILURE_REASON_ERROR,
    "Preempted": pod_pb2.POD_FAILURE_REASON_PREEMPTED,
    "ImagePullBackOff": pod_pb2.POD_FAILURE_REASON_IMAGE_PULL_BACK_OFF,
    "CrashLoopBackOff": pod_pb2.POD_FAILURE_REASON_CRASH_LOOP_BACK_OFF,
}
JOB_STATES = {
    job_pb2.JOB_OUTCOME_SUCCEEDED: "SUCCEEDED",
    job_pb2.JOB_OUTCOME_FAILED: "FAILED",
    job_pb2.JOB_OUTCOME_CANCELLED: "CANCELLED",
}


class JobNotAdmitted(Exception):
    """A plan for a job whose admission the podwatcher has not seen (yet).

    Retried by the bus: admission's event usually arrives a moment later. A plan for a job
    that is never admitted ends in the dead-letter stream with this message.
    """


@dataclass(frozen=True)
class Timing:
    """How patient the podwatcher is; see the settings of the same names."""

    relaunch_budget: int = 3
    oom_replan_seconds: float = 30.0
    reconfigure_timeout_seconds: float = 180.0
    usage_interval_seconds: float = 5.0


@dataclass(frozen=True)
class PodView:
    """A pod as the API shows it: its row and its last usage sample."""

    pod: StoredPod
    usage: PodUsage | None
    address: str


@dataclass(frozen=True)
class NodeView:
    """A node and what its pods were given."""

    node: NodeSpec
    cpu_allocated: float
    memory_allocated_bytes: int
    drained: bool = False


def free_port() -> int:
    """A TCP port free on this host right now (the pod binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


PORTS_REMEMBERED = 4096
"""How many ports handed out to pods a pod watcher remembers, to never hand one out twice."""


class PortPicker:
    """Ports for new pods: from ``probe`` (a port free right now), but never one already
    handed out to a pod. A pod binds its port only once its process starts, so until then
    a probe may return the same port again; two pods given one port fail at every relaunch
    (seen: a job's worker given its parameter server's port)."""

    def __init__(self, probe: Callable[[], int]) -> None:
        self.probe = probe
        self._given: deque[int] = deque(maxlen=PORTS_REMEMBERED)

    def __call__(self, taken: Iterable[int] = ()) -> int:
        """A port neither given before nor in ``taken`` (ports the caller knows are used)."""
        avoid = {*self._given, *taken}
        for _ in range(100):
            port = self.probe()
            if port not in avoid:
                self._given.append(port)
                return port
        raise RuntimeError("no free port that is not already a pod's, after 100 probes")


def now_utc() -> datetime:
    return datetime.now(UTC)


async def _together_or_alone(
    what: str, items: Sequence[T], store: Callable[[Sequence[T]], Awaitable[list[R]]]
) -> list[R | Exception]:
    """``store(items)``, one result per item, in one transaction; if that fails, each item
    stored alone, so a bad one fails alone (its result is then the error it met)."""
    try:
        return list(await store(items))
    except Exception as error:
        if len(items) <= 1:
            return [error for _ in items]
        log.info(f"{what} not stored together; one at a time", why=str(error)[:200])
    results: list[R | Exception] = []
    for item in items:
        try:
            results += await store([item])
        except Exception as alone:
            results.append(alone)
    return results


def _standby_chief(rows: list[StoredPod], version: int) -> StoredPod | None:
    """The chief waiting to take over from one the move to plan ``version`` retires."""
    moving = any(row.record.role is Role.CHIEF and row.retire_after == version for row in rows)
    if not moving or version == 0:
        return None
    return next(
        (
            row
            for row in rows
            if row.record.role is Role.CHIEF and row.record.live and row.retire_after is None
        ),
        None,
    )


def retiring_or_new(recon: Reconciliation) -> bool:
    """Whether the chief has anything to move to or away from."""
    return bool(recon.create or recon.migrate or recon.delete)
