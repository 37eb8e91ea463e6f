"""KOD2's priority-preemptive scheduling with elastic workers, and its affinity placement.

KOD2 (sec. 3-4) schedules parameter-server jobs on a small cluster so that cheap jobs run
first, expensive running jobs give workers back (never below their minimum, never their
PS) when a job of at least their priority arrives, spare capacity is handed out as extra
workers, and a job that waits too long is promoted. Stride's admission service applies the
same policy to its queue, and ``stride sim`` replays it, so it is one pure function over the
cluster's state: :func:`schedule` is one pass of Algorithm 1 (with Algorithms 2 and 3), and
:func:`place` is the placement of sec. 4.1.

Choices where the paper is silent, each tested:

- **Weight** (eq. 1): the paper gives only ``w_j = 1 / (1 + exp(-w'_j))`` and says ``w'_j``
  is "proportional to the minimum number of worker tasks and inversely proportional to the
  sum of required CPU and memory", normalized. We use
  ``w'_j = min_workers / (cpu_j / cluster_cpu + memory_j / cluster_memory)`` where cpu_j and
  memory_j are the job's minimum demand (all PS plus min_workers workers).
- **Aging** (lines 27-29, STARVELIMIT): a job waiting longer than :data:`STARVE_LIMIT_SECONDS`
  becomes STARVING and its weight becomes ``1 + w_j``, above every non-starving weight (eq. 1
  is below 1), so it is the first job Algorithm 1 considers and it may preempt. Once running
  it competes with its own weight ``w_j`` again.
- **Fit test of scale-in** (Alg. 2 line 15): "a node has idle resources >= the job's minimum"
  is read as "the job's PS and minimum workers can be placed on the idle resources" (which
  is what the test is for, and also covers jobs spread over several nodes).
- **Placement** (sec. 4.1): the paper's heuristic (one node if any holds the whole job, else
  fill the idlest nodes first) is :func:`greedy_placement`; :func:`place` instead finds the
  *fewest* nodes exactly, by dynamic programming over (PS placed, workers placed), since a
  job has only two task shapes. It never uses more nodes than the heuristic.
- **Pods of any sizes, with affinity**: :func:`place_tasks` places a list of task sizes
  (what the podwatcher creates for a plan: chief, PS, workers, data workers, per-pod
  sizes) on the fewest nodes *beyond those the job already holds*, which count as free, so
  a scale-out stays on the job's nodes when they have room. Exact (the same dynamic
  program, with those nodes free) for one or two sizes; for more, the best of rounding up
  to two sizes, a greedy over sizes and first fit decreasing, so never worse than first
  fit decreasing.
- **Scale-out** (Alg. 3) visits the nodes that already hold the job's tasks first (the
  paper's affinity goal), then the idlest.
- **Jobs that can never fit** (their PS and minimum workers exceed the empty cluster) are
  skipped, so they cannot block the head of the waiting queue for ever.
- **Order within a pass**: finished jobs complete first (lines 37-40), so their resources are
  free to the same pass; aging (27-29) is applied before the choice of lines 5-26.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from stride.policy.errors import PolicyError
from stride.policy.registry import AlgorithmSpec

SCHEDULE_NAME = "kod2-schedule"
"""Registered name of one scheduling pass."""
PLACEMENT_NAME = "kod2-placement"
"""Registered name of the placement."""
ALGORITHM_VERSION = 1
"""Bump when a rule or default below changes."""

STARVE_LIMIT_SECONDS = 300.0
"""STARVELIMIT has no value in the paper. Its jobs arrive every 30 s (sec. 5.1); five
minutes is ten arrivals, long enough that aging does not override the weights for every job
in a burst, short enough to bound a cheap-but-low-weight job's wait."""
CPU_TOLERANCE = 1e-9
"""Slack for float sums of CPU cores, so 0.1 + 0.2 cores fit in 0.3."""


class Kod2InputError(PolicyError):
    """An input to KOD2 is invalid; the field says which."""


class JobState(Enum):
    """States of a TFJob (KOD2 Fig. 5)."""

    RUNNING = "running"
    WAITING = "waiting"
    STARVING = "starving"
    """Waiting longer than STARVELIMIT; its weight is aged."""
    COMPLETED = "completed"


@dataclass(frozen=True)
class Node:
    """A node's allocatable resources."""

    name: str
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class TFJob:
    """A job's spec: PS and worker task sizes, and its elastic worker range."""

    name: str
    ps_count: int
    ps_cpu: float
    ps_memory_bytes: int
    worker_cpu: float
    worker_memory_bytes: int
    min_workers: int
    max_workers: int
    entered_at: float
    """t_j: when the job first entered the waiting queue (seconds, any epoch)."""


@dataclass(frozen=True)
class JobStatus:
    """A job and where it stands: its state and, when running, where its tasks are."""

    job: TFJob
    state: JobState
    ps_nodes: tuple[str, ...] = ()
    """The node of each PS task (running jobs only)."""
    worker_nodes: tuple[str, ...] = ()
    """The node of each worker task (running jobs only)."""
    finished: bool = False
    """Training is done (Algorithm 1 lines 37-40): the job completes in this pass."""


@dataclass(frozen=True)
class ScheduleRequest:
    """The request of ``kod2-schedule``: the cluster and every job in it."""

    nodes: tuple[Node, ...]
    jobs: tuple[JobStatus, ...]
    now: float
    starve_limit_seconds: float = STARVE_LIMIT_SECONDS

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "jobs", tuple(self.jobs))
        _check_nodes(self.nodes)
        now = _finite("now", self.now)
        limit = _finite("starve_limit_seconds", self.starve_limit_seconds)
        if limit <= 0:
            raise Kod2InputError("starve_limit_seconds", f"must be > 0, got {limit}")
        names = {node.name for node in self.nodes}
        seen: set[str] = set()
        for position, status in enumerate(self.jobs):
            path = f"jobs[{position}]"
            if not isinstance(status, JobStatus):
                raise Kod2InputError(path, f"must be a JobStatus, got {status!r}")
            _check_job(f"{path}.job", status.job)
            if status.job.name in seen:
                raise Kod2InputError(f"{path}.job.name", f"{status.job.name!r} is listed twice")
            seen.add(status.job.name)
            if status.job.entered_at > now:
                raise Kod2InputError(
                    f"{path}.job.entered_at", f"{status.job.entered_at} is after now ({now})"
                )
            if not isinstance(status.state, JobState):
                raise Kod2InputError(f"{path}.state", f"must be a JobState, got {status.state!r}")
            object.__setattr__(status, "ps_nodes", tuple(status.ps_nodes))
            object.__setattr__(status, "worker_nodes", tuple(status.worker_nodes))
            if status.state is JobState.RUNNING:
                if len(status.ps_nodes) != status.job.ps_count:
                    raise Kod2InputError(
                        f"{path}.ps_nodes",
                        f"places {len(status.ps_nodes)} PS, the job has {status.job.ps_count}",
                    )
                if not status.job.min_workers <= len(status.worker_nodes) <= status.job.max_workers:
                    raise Kod2InputError(
                        f"{path}.worker_nodes",
                        f"places {len(status.worker_nodes)} workers, outside "
                        f"{status.job.min_workers}..{status.job.max_workers}",
                    )
                for kind, placed in (
                    ("ps_nodes", status.ps_nodes),
                    ("worker_nodes", status.worker_nodes),
                ):
                    for index, node in enumerate(placed):
                        if node not in names:
                            raise Kod2InputError(
                                f"{path}.{kind}[{index}]", f"unknown node {node!r}"
                            )
            elif status.ps_nodes or status.worker_nodes:
                raise Kod2InputError(
                    f"{path}.worker_nodes",
                    f"only a running job has tasks, not a {status.state.value} one",
                )
            if status.finished and status.state is not JobState.RUNNING:
                raise Kod2InputError(f"{path}.finished", "only a running job can finish")
        idle = _idle(self.nodes, self.jobs)
        for node_name, (cpu, memory) in idle.items():
            if cpu < -CPU_TOLERANCE or memory < 0:
                raise Kod2InputError(
                    "jobs", f"running tasks exceed the capacity of node {node_name!r}"
                )


@dataclass(frozen=True)
class ScheduleReply:
    """Every job after one pass, each job's weight, and what the pass did, in order."""

    jobs: tuple[JobStatus, ...]
    weights: dict[str, float]
    """The weight each job had in this pass (aged for starving jobs)."""
    actions: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class PlacementRequest:
    """The request of ``kod2-placement``: idle resources per node, and a job to place."""

    nodes: tuple[Node, ...]
    """Each node with its *idle* CPU and memory."""
    job: TFJob
    workers: int | None = None
    """Workers to place; None means the job's minimum."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        _check_nodes(self.nodes)
        _check_job("job", self.job)
        if self.workers is not None and (
            isinstance(self.workers, bool)
            or not isinstance(self.workers, int)
            or not self.job.min_workers <= self.workers <= self.job.max_workers
        ):
            raise Kod2InputError(
                "workers",
                f"must be in {self.job.min_workers}..{self.job.max_workers}, got {self.workers!r}",
            )


@dataclass(frozen=True)
class PlacementReply:
    """Where each task goes, or ``fits = False`` when the job does not fit."""

    fits: bool
    ps_nodes: tuple[str, ...] = ()
    worker_nodes: tuple[str, ...] = ()

    @property
    def node_count(self) -> int:
        """How many distinct nodes the placement uses."""
        return len(set(self.ps_nodes) | set(self.worker_nodes))


# --- validation ---------------------------------------------------------------------------


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Kod2InputError(name, f"must be a finite number, got {value!r}")
    return float(value)


def _whole(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise Kod2InputError(name, f"must be a whole number >= {minimum}, got {value!r}")
    return value


def _check_nodes(nodes: Sequence[Node]) -> None:
    if not nodes:
        raise Kod2InputError("nodes", "needs at least one node")
    _check_node_entries("nodes", nodes)
    if sum(node.cpu for node in nodes) <= 0 or sum(node.memory_bytes for node in nodes) <= 0:
        raise Kod2InputError("nodes", "the cluster has zero CPU or zero memory")


def _check_node_entries(field_path: str, nodes: Sequence[Node]) -> None:
    """Each entry a Node with a unique name and finite, non-negative resources."""
    seen: set[str] = set()
    for position, node in enumerate(nodes):
        path = f"{field_path}[{position}]"
        if not isinstance(node, Node):
            raise Kod2InputError(path, f"must be a Node, got {node!r}")
        if not isinstance(node.name, str) or not node.name:
            raise Kod2InputError(f"{path}.name", "is required")
        if node.name in seen:
            raise Kod2InputError(f"{path}.name", f"{node.name!r} is listed twice")
        seen.add(node.name)
        if _finite(f"{path}.cpu", node.cpu) < 0:
            raise Kod2InputError(f"{path}.cpu", f"must be >= 0, got {node.cpu}")
        _whole(f"{path}.memory_bytes", node.memory_bytes, 0)


def _check_job(path: str, job: object) -> None:
    if not isinstance(job, TFJob):
        raise Kod2InputError(path, f"must be a TFJob, got {job!r}")
    if not isinstance(job.name, str) or not job.name:
        raise Kod2InputError(f"{path}.name", "is required")
    _whole(f"{path}.ps_count", job.ps_count, 0)
    for name in ("ps_cpu", "worker_cpu"):
        if _finite(f"{path}.{name}", getattr(job, name)) <= 0:
            raise Kod2InputError(f"{path}.{name}", f"must be > 0, got {getattr(job, name)}")
    _whole(f"{path}.ps_memory_bytes", job.ps_memory_bytes, 1)
    _whole(f"{path}.worker_memory_bytes", job.worker_memory_bytes, 1)
    _whole(f"{path}.min_workers", job.min_workers, 1)
    if _whole(f"{path}.max_workers", job.max_workers, 1) < job.min_workers:
        raise Kod2InputError(
            f"{path}.max_workers",
            f"must be >= min_workers {job.min_workers}, got {job.max_workers}",
        )
    _finite(f"{path}.entered_at", job.entered_at)


# --- weights ------------------------------------------------------------------------------


def job_weight(job: TFJob, cluster_cpu: float, cluster_memory_bytes: int) -> float:
    """KOD2 eq. 1: ``1 / (1 + exp(-w'))`` with ``w' = min_workers / (cpu / cluster_cpu +
    memory / cluster_memory)`` over the job's minimum demand (see the module docstring)."""
    _check_job("job", job)
    if _finite("cluster_cpu", cluster_cpu) <= 0:
        raise Kod2InputError("cluster_cpu", f"must be > 0, got {cluster_cpu}")
    if _whole("cluster_memory_bytes", cluster_memory_bytes, 1) <= 0:
        raise Kod2InputError("cluster_memory_bytes", "must be > 0")
    cpu = job.ps_count * job.ps_cpu + job.min_workers * job.worker_cpu
    memory = job.ps_count * job.ps_memory_bytes + job.min_workers * job.worker_memory_bytes
    raw = job.min_workers / (cpu / cluster_cpu + memory / cluster_memory_bytes)
    return 1.0 / (1.0 + math.exp(-raw))


# --- placement (sec. 4.1) -------------------------------------------------------------------


def _fits_count(cpu: float, memory: int, task_cpu: float, task_memory: int) -> int:
    """How many tasks of one shape fit in the given idle resources."""
    by_cpu = math.floor((cpu + CPU_TOLERANCE) / task_cpu)
    by_memory = memory // task_memory
    return max(0, min(by_cpu, by_memory))


def _idlest_first(idle: Mapping[str, tuple[float, int]], capacity: Mapping[str, Node]) -> list[str]:
    """Nodes by idle share of their capacity (CPU and memory together), most idle first."""

    def share(name: str) -> float:
        node = capacity[name]
        cpu_share = idle[name][0] / node.cpu if node.cpu > 0 else 0.0
        memory_share = idle[name][1] / node.memory_bytes if node.memory_bytes > 0 else 0.0
        return cpu_share + memory_share

    return sorted(idle, key=lambda name: (-share(name), name))


def _place_fewest(
    idle: Mapping[str, tuple[float, int]],
    order: Sequence[str],
    job: TFJob,
    workers: int,
    free: Collection[str] = frozenset(),
) -> PlacementReply:
    """The placement on the fewest nodes: DP over nodes with state (PS placed, workers placed).

    Putting as many workers as fit next to a chosen number of PS on a node is never worse
    (counts are capped at what is needed), so per node only the PS count is enumerated.

    Nodes in ``free`` (already holding the job's tasks) are not counted: the placement adds
    the fewest *other* nodes, and among those it puts the most tasks on free nodes (exact
    when the free nodes come first in ``order``; without free nodes this changes nothing).
    Among equally good placements, the one whose last node comes earliest in ``order`` wins.
    """
    total_ps = job.ps_count
    # best[(ps, workers)] = (nodes used, tasks off free nodes, path) where path lists
    # (node, ps, workers) choices.
    best: dict[tuple[int, int], tuple[int, int, tuple[tuple[str, int, int], ...]]] = {
        (0, 0): (0, 0, ())
    }
    for name in order:
        cpu, memory = idle[name]
        is_free = name in free
        updated = dict(best)
        for (placed_ps, placed_workers), (used, outside, path) in best.items():
            room_ps = min(
                total_ps - placed_ps, _fits_count(cpu, memory, job.ps_cpu, job.ps_memory_bytes)
            )
            for ps_here in range(room_ps + 1):
                left_cpu = cpu - ps_here * job.ps_cpu
                left_memory = memory - ps_here * job.ps_memory_bytes
                workers_here = min(
                    workers - placed_workers,
                    _fits_count(left_cpu, left_memory, job.worker_cpu, job.worker_memory_bytes),
                )
                if ps_here == 0 and workers_here == 0:
                    continue
                key = (placed_ps + ps_here, placed_workers + workers_here)
                candidate = (
                    used + (0 if is_free else 1),
                    outside + (0 if is_free else ps_here + workers_here),
                    (*path, (name, ps_here, workers_here)),
                )
                if key not in updated or candidate[:2] < updated[key][:2]:
                    updated[key] = candidate
        best = updated
    goal = best.get((total_ps, workers))
    if goal is None:
        return PlacementReply(fits=False)
    ps_nodes: list[str] = []
    worker_nodes: list[str] = []
    for name, ps_here, workers_here in goal[2]:
        ps_nodes += [name] * ps_here
        worker_nodes += [name] * workers_here
    return PlacementReply(True, tuple(ps_nodes), tuple(worker_nodes))


def place(request: PlacementRequest) -> PlacementReply:
    """Place all of a job's PS and ``workers`` workers on the fewest nodes (KOD2 sec. 4.1).

    Exact (see :func:`_place_fewest`); ties go to the idlest nodes, and a job that fits on
    one node goes to a single node. ``fits`` is False when the idle resources cannot hold it.
    """
    workers = request.job.min_workers if request.workers is None else request.workers
    idle = {node.name: (float(node.cpu), node.memory_bytes) for node in request.nodes}
    capacity = {node.name: node for node in request.nodes}
    return _place_fewest(idle, _idlest_first(idle, capacity), request.job, workers)


def greedy_placement(request: PlacementRequest) -> PlacementReply:
    """KOD2 sec. 4.1 as written: a single node that holds the whole job if there is one
    (the one with the least idle CPU, to keep big nodes free), else PS then workers onto
    the idlest nodes first. Kept as the reference :func:`place` is measured against."""
    job = request.job
    workers = job.min_workers if request.workers is None else request.workers
    nodes = sorted(request.nodes, key=lambda node: (node.cpu, node.memory_bytes, node.name))
    need_cpu = job.ps_count * job.ps_cpu + workers * job.worker_cpu
    need_memory = job.ps_count * job.ps_memory_bytes + workers * job.worker_memory_bytes
    for node in nodes:
        if node.cpu + CPU_TOLERANCE >= need_cpu and node.memory_bytes >= need_memory:
            return PlacementReply(True, (node.name,) * job.ps_count, (node.name,) * workers)
    idle = {node.name: [float(node.cpu), node.memory_bytes] for node in request.nodes}
    order = sorted(idle, key=lambda name: (-idle[name][0], -idle[name][1], name))
    tasks = [(True, job.ps_cpu, job.ps_memory_bytes)] * job.ps_count + [
        (False, job.worker_cpu, job.worker_memory_bytes)
    ] * workers
    ps_nodes: list[str] = []
    worker_nodes: list[str] = []
    for is_ps, cpu, memory in tasks:
        for name in order:
            if idle[name][0] + CPU_TOLERANCE >= cpu and idle[name][1] >= memory:
                idle[name][0] -= cpu
                idle[name][1] -= memory
                (ps_nodes if is_ps else worker_nodes).append(name)
                break
        else:
            return PlacementReply(fits=False)
    return PlacementReply(True, tuple(ps_nodes), tuple(worker_nodes))


# --- placing a job's tasks of any sizes, with affinity ----------------------------------------


@dataclass(frozen=True)
class Task:
    """The size of one task (pod) to place."""

    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class TaskPlacementRequest:
    """Tasks of one job, of any sizes, to place on the nodes' idle resources.

    The request of :func:`place_tasks`. Unlike :class:`PlacementRequest`, the tasks need not
    come in just a PS size and a worker size (a chief, data workers and per-task sizes add
    more), the job may already hold nodes (``prefer``), and nodes may be full.
    """

    nodes: tuple[Node, ...]
    """Each node with its *idle* CPU and memory, in the caller's order (first fit's order)."""
    tasks: tuple[Task, ...]
    prefer: tuple[str, ...] = ()
    """Nodes that already hold the job's tasks: using them adds no node to the job. Names
    not in ``nodes`` are ignored."""
    capacity: tuple[Node, ...] = ()
    """Allocatable CPU and memory per node, to rank the idlest; a node not listed is ranked
    as if its idle resources were its capacity."""

    def __post_init__(self) -> None:
        for name in ("nodes", "tasks", "prefer", "capacity"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_node_entries("nodes", self.nodes)
        _check_node_entries("capacity", self.capacity)
        for position, task in enumerate(self.tasks):
            path = f"tasks[{position}]"
            if not isinstance(task, Task):
                raise Kod2InputError(path, f"must be a Task, got {task!r}")
            if _finite(f"{path}.cpu", task.cpu) <= 0:
                raise Kod2InputError(f"{path}.cpu", f"must be > 0, got {task.cpu}")
            _whole(f"{path}.memory_bytes", task.memory_bytes, 1)
        for position, name in enumerate(self.prefer):
            if not isinstance(name, str):
                raise Kod2InputError(f"prefer[{position}]", f"must be a node name, got {name!r}")


@dataclass(frozen=True)
class TaskPlacementReply:
    """The node of each task, or ``fits = False`` when the tasks cannot all be placed."""

    fits: bool
    nodes: tuple[str, ...] = ()
    """The node of each task, in the order of the request's tasks."""

    @property
    def node_count(self) -> int:
        """How many distinct nodes the placement uses."""
        return len(set(self.nodes))


def place_tasks(request: TaskPlacementRequest) -> TaskPlacementReply:
    """Place a job's tasks so it spans the fewest nodes (KOD2 sec. 4.1), the nodes it already
    holds first (the affinity of Alg. 3's scale-out), then the idlest.

    The objective is the number of nodes used *beyond* ``prefer``: those nodes hold the job
    already, so they are free. With no ``prefer`` it is :func:`place`'s fewest nodes.

    - **One or two task sizes** (the common cases: a scale-out, a PS-and-worker job): exact,
      by :func:`place`'s dynamic program with one size as the "PS" and the other as the
      "workers".
    - **More sizes** (a chief, data workers or per-task sizes beside PS and workers): the
      dynamic program is exact for two sizes only, so three candidates are computed and the
      best is kept (fewest added nodes, then most tasks on ``prefer``, then this order):

      1. *rounded*: every task is rounded up to one of two sizes (the two sizes with the
         largest total demand; each further size joins the one whose envelope, the
         per-resource maximum, grows least) and placed exactly. A rounded task holds at
         least its own size, so the placement is valid; it is optimal when the rounding
         wastes nothing, e.g. a chief the size of a worker;
      2. *greedy over sizes*: the two sizes with the largest total demand placed together
         exactly, then each further size on its own (exactly, given what is placed), the
         nodes used so far counted as free;
      3. *first fit decreasing* (largest memory first, nodes in the request's order).

      So it never adds more nodes than first fit decreasing, and fits whenever that does.

    Among placements adding as few nodes, the one with the most tasks on ``prefer`` wins
    (the scale-out of Alg. 3 fills the job's nodes first), then the one whose last node
    comes earliest in the order "nodes in ``prefer``, then the rest, each most idle first"
    (exactly so for one or two sizes).
    """
    tasks = request.tasks
    if not tasks:
        return TaskPlacementReply(True)
    idle = {node.name: (float(node.cpu), node.memory_bytes) for node in request.nodes}
    capacity = {node.name: node for node in request.nodes}
    capacity.update((node.name, node) for node in request.capacity if node.name in idle)
    prefer = frozenset(request.prefer) & idle.keys()
    groups: dict[Task, list[int]] = {}
    for position, task in enumerate(tasks):
        groups.setdefault(task, []).append(position)
    by_demand = sorted(
        groups.items(),
        key=lambda item: (
            -len(item[1]) * item[0].memory_bytes,
            -len(item[1]) * item[0].cpu,
            -item[0].memory_bytes,
            -item[0].cpu,
        ),
    )
    if len(by_demand) <= 2:
        return _place_by_size(idle, capacity, prefer, by_demand, len(tasks))
    candidates = (
        _place_by_size(idle, capacity, prefer, _rounded(by_demand), len(tasks)),
        _place_by_size(idle, capacity, prefer, by_demand, len(tasks)),
        _first_fit_decreasing(idle, tasks),
    )
    placed = [reply for reply in candidates if reply.fits]
    if not placed:
        return TaskPlacementReply(False)
    # min keeps the first of equals, so the candidates' order breaks the last ties.
    return min(
        placed,
        key=lambda reply: (
            _added_nodes(reply, prefer),
            -sum(1 for name in reply.nodes if name in prefer),
        ),
    )


def _added_nodes(reply: TaskPlacementReply, prefer: Collection[str]) -> int:
    return len(set(reply.nodes).difference(prefer))


def _rounded(groups: Sequence[tuple[Task, list[int]]]) -> list[tuple[Task, list[int]]]:
    """Groups of equal tasks (largest total demand first) rounded up into two groups: the
    first two, each further group joining the one whose envelope grows least, counting
    the room the rounding reserves for nothing, relative to the tasks' total demand."""
    total_cpu = sum(task.cpu * len(at) for task, at in groups)
    total_memory = sum(task.memory_bytes * len(at) for task, at in groups)
    envelopes = [groups[0][0], groups[1][0]]
    members = [list(groups[0][1]), list(groups[1][1])]

    def grown(envelope: Task, task: Task) -> Task:
        return Task(max(envelope.cpu, task.cpu), max(envelope.memory_bytes, task.memory_bytes))

    def waste(which: int, task: Task, count: int) -> float:
        envelope = envelopes[which]
        bigger = grown(envelope, task)
        cpu = len(members[which]) * (bigger.cpu - envelope.cpu) + count * (bigger.cpu - task.cpu)
        memory = len(members[which]) * (bigger.memory_bytes - envelope.memory_bytes) + count * (
            bigger.memory_bytes - task.memory_bytes
        )
        return cpu / total_cpu + memory / total_memory

    for task, at in groups[2:]:
        which = min((0, 1), key=lambda w: waste(w, task, len(at)))
        envelopes[which] = grown(envelopes[which], task)
        members[which] += at
    return [(envelopes[0], members[0]), (envelopes[1], members[1])]


def _place_by_size(
    idle: Mapping[str, tuple[float, int]],
    capacity: Mapping[str, Node],
    prefer: Collection[str],
    groups: Sequence[tuple[Task, list[int]]],
    count: int,
) -> TaskPlacementReply:
    """The first two groups of equal tasks together, then each further group alone, each
    step by :func:`_place_fewest` with the nodes used so far free (exact for <= 2 groups)."""
    left = dict(idle)
    held = set(prefer)
    where = [""] * count
    for batch in [groups[:2], *([group] for group in groups[2:])]:
        # The smaller group plays the PS: the DP enumerates its count per node.
        if len(batch) == 2:
            (first, at_first), (second, at_second) = sorted(batch, key=lambda g: len(g[1]))
        else:
            ((second, at_second),) = batch
            first, at_first = second, []
        job = TFJob(
            "tasks",
            len(at_first),
            first.cpu,
            first.memory_bytes,
            second.cpu,
            second.memory_bytes,
            len(at_second),
            len(at_second),
            0.0,
        )
        order = sorted(_idlest_first(left, capacity), key=lambda name: name not in held)
        reply = _place_fewest(left, order, job, len(at_second), free=held)
        if not reply.fits:
            return TaskPlacementReply(False)
        for task, positions, nodes in (
            (first, at_first, reply.ps_nodes),
            (second, at_second, reply.worker_nodes),
        ):
            for position, name in zip(positions, nodes, strict=True):
                where[position] = name
                cpu, memory = left[name]
                left[name] = (cpu - task.cpu, memory - task.memory_bytes)
                held.add(name)
    return TaskPlacementReply(True, tuple(where))


def _first_fit_decreasing(
    idle: Mapping[str, tuple[float, int]], tasks: Sequence[Task]
) -> TaskPlacementReply:
    """Largest memory (then CPU) first, each task on the first node in order with room."""
    left = dict(idle)
    where = [""] * len(tasks)
    for position in sorted(
        range(len(tasks)), key=lambda p: (-tasks[p].memory_bytes, -tasks[p].cpu, p)
    ):
        task = tasks[position]
        for name, (cpu, memory) in left.items():
            if cpu + CPU_TOLERANCE >= task.cpu and memory >= task.memory_bytes:
                left[name] = (cpu - task.cpu, memory - task.memory_bytes)
                where[position] = name
                break
        else:
            return TaskPlacementReply(False)
    return TaskPlacementReply(True, tuple(where))


# --- scheduling (Algorithms 1-3) --------------------------------------------------------------


def _idle(nodes: Iterable[Node], jobs: Iterable[JobStatus]) -> dict[str, tuple[float, int]]:
    idle = {node.name: (float(node.cpu), node.memory_bytes) for node in nodes}
    for status in jobs:
        if status.state is not JobState.RUNNING:
            continue
        for name in status.ps_nodes:
            if name in idle:
                cpu, memory = idle[name]
                idle[name] = (cpu - status.job.ps_cpu, memory - status.job.ps_memory_bytes)
        for name in status.worker_nodes:
            if name in idle:
                cpu, memory = idle[name]
                idle[name] = (cpu - status.job.worker_cpu, memory - status.job.worker_memory_bytes)
    return idle


class _Cluster:
    """Mutable working state of one pass (never escapes :func:`schedule`)."""

    def __init__(self, nodes: Sequence[Node], jobs: Sequence[JobStatus]) -> None:
        self.capacity = {node.name: node for node in nodes}
        self.jobs = {status.job.name: status for status in jobs}
        self.idle = _idle(nodes, jobs)

    def placement(self, job: TFJob, workers: int) -> PlacementReply:
        idle = {name: (max(cpu, 0.0), max(memory, 0)) for name, (cpu, memory) in self.idle.items()}
        return _place_fewest(idle, _idlest_first(idle, self.capacity), job, workers)

    def add(self, name: str, job: TFJob, is_ps: bool, sign: int = 1) -> None:
        cpu, memory = self.idle[name]
        task_cpu = job.ps_cpu if is_ps else job.worker_cpu
        task_memory = job.ps_memory_bytes if is_ps else job.worker_memory_bytes
        self.idle[name] = (cpu - sign * task_cpu, memory - sign * task_memory)

    def start(self, job: TFJob, placement: PlacementReply) -> None:
        for name in placement.ps_nodes:
            self.add(name, job, True)
        for name in placement.worker_nodes:
            self.add(name, job, False)
        self.jobs[job.name] = JobStatus(
            job, JobState.RUNNING, placement.ps_nodes, placement.worker_nodes
        )


def _order_key(weights: Mapping[str, float], status: JobStatus) -> tuple[float, float, str]:
    """Descending weight, then who entered the waiting queue first, then name."""
    return (-weights[status.job.name], status.job.entered_at, status.job.name)


def _scale_in(cluster: _Cluster, weights: Mapping[str, float], new: TFJob) -> PlacementReply | None:
    """Algorithm 2 on a copy of the cluster: take workers from lower-weight running jobs,
    never a PS and never below a job's minimum, until ``new`` fits. Applies the result to
    ``cluster`` and returns the new job's placement, or returns None and changes nothing."""
    trial = _Cluster([], [])
    trial.capacity = cluster.capacity
    trial.jobs = dict(cluster.jobs)
    trial.idle = dict(cluster.idle)
    new_weight = weights[new.name]
    running = sorted(
        (s for s in trial.jobs.values() if s.state is JobState.RUNNING),
        key=lambda s: (weights[s.job.name], -s.job.entered_at, s.job.name),
    )
    for status in running:
        weight = weights[status.job.name]
        # Line 5: an equal-weight job that entered the waiting queue first keeps its workers.
        if weight > new_weight or (weight == new_weight and status.job.entered_at < new.entered_at):
            continue
        removable = len(status.worker_nodes) - status.job.min_workers
        workers = list(status.worker_nodes)
        # Line 12: nodes without the job's PS first, so PS and workers stay together longest.
        order = sorted(set(workers), key=lambda name: (name in status.ps_nodes, name))
        removed = 0
        for name in order:
            while name in workers and removed < removable:
                placement = trial.placement(new, new.min_workers)
                if placement.fits:
                    break
                workers.reverse()
                workers.remove(name)
                workers.reverse()
                trial.add(name, status.job, False, sign=-1)
                removed += 1
        trial.jobs[status.job.name] = replace(status, worker_nodes=tuple(workers))
        placement = trial.placement(new, new.min_workers)
        if placement.fits:
            cluster.jobs = trial.jobs
            cluster.idle = trial.idle
            return placement
    return None


def _scale_out(cluster: _Cluster, weights: Mapping[str, float], actions: list[str]) -> None:
    """Algorithm 3: add workers to running jobs below their maximum, highest weight first,
    on nodes that already hold the job's tasks first."""
    running = sorted(
        (s for s in cluster.jobs.values() if s.state is JobState.RUNNING),
        key=lambda s: _order_key(weights, s),
    )
    for status in running:
        job = status.job
        room = job.max_workers - len(status.worker_nodes)
        if room <= 0:
            continue
        holding = set(status.ps_nodes) | set(status.worker_nodes)
        idlest = _idlest_first(cluster.idle, cluster.capacity)
        order = sorted(idlest, key=lambda name: name not in holding)
        added: list[str] = []
        for name in order:
            while len(added) < room:
                cpu, memory = cluster.idle[name]
                if _fits_count(cpu, memory, job.worker_cpu, job.worker_memory_bytes) < 1:
                    break
                cluster.add(name, job, False)
                added.append(name)
        if added:
            cluster.jobs[job.name] = replace(
                status, worker_nodes=status.worker_nodes + tuple(added)
            )
            actions.append(f"scale-out {job.name}: +{len(added)} workers")


def schedule(request: ScheduleRequest) -> ScheduleReply:
    """One pass of KOD2's preemptive scheduling (Algorithm 1, with scale-in, Algorithm 2, and
    scale-out, Algorithm 3). See the module docstring for the choices the paper leaves open.

    Guarantees (property-tested): no node is over-committed; scale-in takes only workers and
    leaves every running job at least its minimum; a starving job is considered before every
    non-starving one, so no fresher job starts ahead of it.
    """
    cluster_cpu = sum(node.cpu for node in request.nodes)
    cluster_memory = sum(node.memory_bytes for node in request.nodes)
    actions: list[str] = []
    statuses: list[JobStatus] = []
    for given in request.jobs:
        status = given
        if given.finished:
            # Lines 37-40: the finished job leaves the running queue and frees its tasks.
            status = JobStatus(given.job, JobState.COMPLETED)
            actions.append(f"complete {given.job.name}")
        elif (
            given.state is JobState.WAITING
            and request.now - given.job.entered_at > request.starve_limit_seconds
        ):
            status = replace(given, state=JobState.STARVING)
            actions.append(f"starving {given.job.name}")
        statuses.append(status)
    weights: dict[str, float] = {}
    for status in statuses:
        weight = job_weight(status.job, cluster_cpu, cluster_memory)
        weights[status.job.name] = weight + 1.0 if status.state is JobState.STARVING else weight
    cluster = _Cluster(request.nodes, statuses)

    empty = _Cluster(request.nodes, ())
    waiting = []
    for status in statuses:
        if status.state not in (JobState.WAITING, JobState.STARVING):
            continue
        if empty.placement(status.job, status.job.min_workers).fits:
            waiting.append(status)
        else:
            # Not even the empty cluster holds it: left waiting, but it must not block the
            # head of the queue forever (Algorithm 1 as written would).
            actions.append(f"skip {status.job.name}: its minimum does not fit the cluster")
    waiting.sort(key=lambda s: _order_key(weights, s))
    running_weights = [weights[s.job.name] for s in statuses if s.state is JobState.RUNNING]
    if waiting:
        top = waiting[0]
        if not running_weights or weights[top.job.name] >= max(running_weights):
            # Lines 5-17: the heaviest waiting job starts, by preemption if it must.
            placement = cluster.placement(top.job, top.job.min_workers)
            if placement.fits:
                cluster.start(top.job, placement)
                actions.append(f"start {top.job.name}")
            else:
                placement_after = _scale_in(cluster, weights, top.job)
                if placement_after is not None:
                    cluster.start(top.job, placement_after)
                    actions.append(f"start {top.job.name} after scale-in")
        else:
            # Lines 18-26: no preemption; start every waiting job that fits, heaviest first.
            for status in waiting:
                placement = cluster.placement(status.job, status.job.min_workers)
                if placement.fits:
                    cluster.start(status.job, placement)
                    actions.append(f"start {status.job.name}")
    _scale_out(cluster, weights, actions)
    jobs = tuple(cluster.jobs[status.job.name] for status in request.jobs)
    return ScheduleReply(jobs=jobs, weights=weights, actions=tuple(actions))


def run_schedule(request: ScheduleRequest) -> ScheduleReply:
    """Registry entry point of ``kod2-schedule``."""
    return schedule(request)


ALGORITHMS: tuple[AlgorithmSpec[Any, Any], ...] = (
    AlgorithmSpec(
        name=SCHEDULE_NAME,
        version=ALGORITHM_VERSION,
        description=(
            "One pass of weight-priority preemptive scheduling with scale-in, scale-out and "
            "STARVELIMIT aging (KOD2 sec. 3.2-3.3, Algorithms 1-3)"
        ),
        request_type=ScheduleRequest,
        reply_type=ScheduleReply,
        run=run_schedule,
    ),
    AlgorithmSpec(
        name=PLACEMENT_NAME,
        version=ALGORITHM_VERSION,
        description="PS and worker tasks of a job on the fewest nodes (KOD2 sec. 4.1)",
        request_type=PlacementRequest,
        reply_type=PlacementReply,
        run=place,
    ),
)
"""The algorithms of this module, for :func:`stride.policy.registry.default_registry`."""
