"""The seam between the podwatcher and whatever runs pods (DLRover sec. 5.1, DLRover-RM 5.2).

The podwatcher's use cases decide which pods a plan needs (:mod:`stride.podwatcher.domain.
reconcile`), and a :class:`Backend` runs them: the local backend as supervised process
groups under cgroups on this machine, the Kubernetes backend as pods with an agent sidecar.
Both get the same calls in the same order, so the plan rules, the relaunch budget, the
migrations and the tests do not change with the backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.reconcile import PodRecord


@dataclass(frozen=True)
class PodStart:
    """Everything a backend needs to start (or relaunch) one pod."""

    record: PodRecord
    port: int
    """The trainer's port: its TensorFlow server (PS, worker) or coordinator (chief)."""
    agent_port: int
    """The agent sidecar's port, for the trainer in the same pod."""
    plan_version: int
    spec_json: str
    """The job's spec (protobuf JSON of ``stride.events.v1.JobSpec``)."""
    cluster_json: str
    """The TensorFlow cluster the pod belongs to, ``{"chief": [...], "ps": [...], ...}``."""
    standby: bool = False
    """A chief that replaces one still training (its pod migrated): it starts up and waits
    for RESUME to take over from the old chief's checkpoint (DLRover-RM sec. 5.2)."""


@dataclass(frozen=True)
class PodEnded:
    """A pod stopped: how (``Succeeded``, ``OOMKilled``, ``Evicted``, ``Error``,
    ``Deleted``), its exit code, and a message with the last lines of its log."""

    name: str
    job_id: str
    reason: str
    exit_code: int | None
    message: str


@dataclass(frozen=True)
class PodUsage:
    """What a pod used at its last sample."""

    cpu_cores: float
    memory_bytes: int


class ResizeRefused(Exception):
    """The backend cannot resize the pod in place; the message says why."""


class PodProvider(Protocol):
    """Runs pods: observe them, launch, terminate, resize (Ray's node provider, for pods).

    Each member is one of those four verbs; what is not (nodes, logs, credentials) has an
    interface of its own below."""

    name: str
    """Short name for logs and settings (``local``, ``kubernetes``)."""
    enforcement: str
    """How limits are enforced (``cgroup-v1``, ``cgroup-v2``, ``rlimit``, ``kubelet``)."""
    enforcement_note: str
    """One line on the enforcement mode, for ``stride up`` and the node inventory."""

    # --- observe ---------------------------------------------------------------------

    def adopt(self) -> list[str]:
        """At start: the names of pods an earlier run started that still run."""
        ...

    def running(self) -> list[str]:
        """The names of the pods running now."""
        ...

    def known(self) -> list[str]:
        """The pods running now and those whose end is not acknowledged yet."""
        ...

    def ended(self) -> AsyncIterator[PodEnded]:
        """Every pod end not yet acknowledged, at least once (again after a restart)."""
        ...

    async def acknowledge(self, name: str) -> None:
        """The end of ``name`` was recorded; forget it."""
        ...

    def usage(self, name: str) -> PodUsage | None:
        """The pod's usage since its previous sample, or None if it is not running."""
        ...

    # --- launch ----------------------------------------------------------------------

    def address(self, name: str, job_id: str, port: int) -> str:
        """The ``host:port`` other pods of the job reach pod ``name``'s trainer at."""
        ...

    async def start(self, pod: PodStart) -> None:
        """Start the pod; a pod of that name already running is left as it is."""
        ...

    async def wait_ready(self, pods: Sequence[PodStart], timeout: float) -> bool:
        """Wait until every pod's trainer serves (its port accepts connections); False if
        ``timeout`` passed first."""
        ...

    # --- terminate -------------------------------------------------------------------

    async def delete(self, name: str) -> None:
        """Stop and remove the pod (its end is reported through :meth:`ended`)."""
        ...

    async def evict(self, name: str, why: str) -> None:
        """Stop a pod as its node would evict it (its end is reported as Evicted)."""
        ...

    # --- resize ----------------------------------------------------------------------

    async def resize(self, name: str, cpu: float, memory_bytes: int) -> None:
        """Resize in place, or raise :class:`ResizeRefused`."""
        ...

    async def close(self) -> None:
        """Stop watching; running pods keep running."""
        ...


class NodeInventory(Protocol):
    """The nodes pods are placed on, and drains."""

    def nodes(self) -> list[NodeSpec]:
        """The nodes pods can be placed on."""
        ...

    def all_nodes(self) -> list[tuple[NodeSpec, bool]]:
        """Every node the backend knows and whether it is drained."""
        ...

    def set_drained(self, name: str, drained: bool) -> bool:
        """Drain a node or put it back; False for an unknown node."""
        ...


class PodLogs(Protocol):
    """What pods print."""

    async def log_tail(self, name: str, lines: int) -> list[str]:
        """The last lines of the pod's log."""
        ...

    def follow_logs(self, name: str) -> AsyncIterator[list[str]]:
        """New log lines as they are written, until the pod has ended."""
        ...


class PodCredentials(Protocol):
    """The job tokens pods present (:mod:`stride.runtime.tokens`)."""

    async def refresh_tokens(self) -> int:
        """Rewrite the job token of every running pod before it expires; how many."""
        ...


class Backend(PodProvider, NodeInventory, PodLogs, PodCredentials, Protocol):
    """A provider with its three side interfaces, as one backend object implements them
    (the local one, the Kubernetes one)."""
