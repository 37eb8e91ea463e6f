"""From a job's newest plan and its live pods to what the backend must do (pure).

A plan says how many pods of each role a job has and how big each is (DLRover sec. 5.1:
the plan, not the pods, is the source of truth). :func:`reconcile` compares it with the
pods the podwatcher runs and returns one :class:`Reconciliation`:

- **create** the pods the plan adds (a new job, a scale out), placed with KOD2 (below);
- **relaunch** a failed pod under its own name and address, at the plan's size, so a
  ParameterServerStrategy coordinator finds its PS or worker again where it was;
- **resize** a pod in place when its node has room for the new size (a CPU quota always
  changes in place; memory does where the kernel allows it, else the use case migrates);
- **migrate** a pod whose node cannot hold its new size: a replacement (next generation,
  new name and address) is placed first, and the old pod is deleted only after the chief
  has moved to the new cluster. This is DLRover-RM sec. 5.2's seamless migration: new
  pods first, then a short pause to checkpoint and restore, then the old pods go;
- **delete** the pods the plan drops (scale in), also only after the chief moved.

``membership_changed`` says whether the chief's cluster (its TensorFlow tasks and its data
workers) changes, in which case the chief must be told the new cluster (a RECONFIGURE
command) before any pod it still uses is removed. A change of data workers alone changes
nothing for TensorFlow: the chief only starts or stops reading from them.

Placement works on the nodes' free capacity, counting every live pod of every job, and
the pods about to be deleted too: their room is free only once they are gone. It is KOD2's
(sec. 4.1), through :func:`stride.policy.kod2.place_tasks`, in three steps:

1. **In place first**: a failed pod is relaunched on its node, and a resized pod grows
   there, when the node has room for the growth (largest pods first).
2. **Pods that move** (a relaunch that no longer fits its node, a migration's
   replacement; largest first) go one at a time, on a node already holding the job's
   other pods if one has room, else on the idlest; a replacement never on its old node.
3. **Pods the plan creates** (a new job, or a scale out), of every role (chief, PS,
   workers and data workers), are placed *together* on the fewest nodes beyond those the
   job already holds: its nodes are free to use, so a scale out lands beside the job's
   pods when they have room, even if another node is idler; a new job goes to the fewest
   nodes (one node if one holds it all). Ties go to the job's nodes, then the idlest.

Departures from the paper:

- KOD2 places two task sizes (PS and workers), exactly. A plan has more: the chief, data
  workers, per-pod overrides. One or two sizes (a scale out, or a job whose chief is the
  size of its workers) are still placed exactly; for three or more, ``place_tasks`` keeps
  the best of three candidates: every pod rounded up to one of two sizes and placed
  exactly, a greedy over sizes (the two largest groups exactly, then each further size,
  the nodes used so far first), and first fit decreasing, the placement used before. So,
  on the same free room, it never uses more nodes than first fit decreasing, and it places
  the pods whenever first fit decreasing could.
- "Fewest nodes" counts the nodes the job holds as free, so a job's later pods join it
  (the affinity Alg. 3 gives a scale out) rather than move the job: running pods are never
  repacked, only the pods a plan adds or moves are placed.
- Data workers, outside the paper's jobs, are placed with the group, beside the trainers
  they feed.
- In-place changes are settled before any pod is placed (first fit decreasing took all
  pods in one largest-first pass), so a new pod never takes the room a resize needs.

A pod that fits nowhere makes the whole plan unplaceable, with a message naming the pod,
its size and the largest room left (for a group, the first pod first fit decreasing has no
room for), so no plan is half applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.plans import Plan
from stride.policy.kod2 import Node, Task, TaskPlacementRequest, place_tasks
from stride.vocabulary import Role

CLUSTER_ROLES = (Role.CHIEF, Role.PS, Role.WORKER)
"""The roles a TensorFlow ParameterServerStrategy cluster is made of, in its task order."""
MEMBER_ROLES = (*CLUSTER_ROLES, Role.DATA_WORKER)
"""The roles the chief's cluster lists: its TensorFlow tasks, then its data workers, whose
streams of ready mini-batches it reads (GoldMiner sec. 3.3). A change of any of them is
sent to the chief, and a retiring pod goes only once the chief has moved off it."""

GIB = 1024**3


def pod_name(job_id: str, role: Role, index: int, generation: int = 0) -> str:
    """A pod's name: ``<job>-<role>-<index>``, and ``-g<generation>`` for a migrated one.

    Roles are spelled with dashes (``data-worker``) so names are valid Kubernetes names.
    """
    base = f"{job_id}-{role.value.replace('_', '-')}-{index}"
    return base if generation == 0 else f"{base}-g{generation}"


@dataclass(frozen=True)
class PodRecord:
    """A pod the podwatcher runs (or ran) for a job."""

    name: str
    job_id: str
    role: Role
    index: int
    generation: int
    cpu: float
    memory_bytes: int
    node: str
    phase: PodPhase
    restarts: int = 0

    @property
    def live(self) -> bool:
        """Holding resources: starting, running, or failed and waiting to be relaunched."""
        return self.phase in (PodPhase.PENDING, PodPhase.RUNNING, PodPhase.FAILED)


@dataclass(frozen=True)
class PodWant:
    """A pod to start: where and how big."""

    name: str
    role: Role
    index: int
    generation: int
    cpu: float
    memory_bytes: int
    node: str


@dataclass(frozen=True)
class Resize:
    """A pod to resize in place."""

    pod: PodRecord
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class Migration:
    """A pod replaced by a new one (``replacement``) that is placed before it goes."""

    old: PodRecord
    replacement: PodWant


@dataclass(frozen=True)
class Reconciliation:
    """What to do to make a job's pods match its plan; empty when they already do."""

    create: tuple[PodWant, ...] = ()
    relaunch: tuple[PodWant, ...] = ()
    resize: tuple[Resize, ...] = ()
    migrate: tuple[Migration, ...] = ()
    delete: tuple[PodRecord, ...] = ()
    cluster: Mapping[Role, tuple[str, ...]] = field(default_factory=dict)
    """The pod names of the chief's cluster once applied (:data:`MEMBER_ROLES`), per role
    in index order."""
    membership_changed: bool = False

    @property
    def empty(self) -> bool:
        """Nothing to do."""
        return not (self.create or self.relaunch or self.resize or self.migrate or self.delete)


class Unplaceable(Exception):
    """No node has room for a pod of the plan; the message names the pod and the room."""


@dataclass
class _Room:
    name: str
    cpu: float
    memory_bytes: int


def _size_text(cpu: float, memory_bytes: int) -> str:
    return f"{cpu:g} cpu, {memory_bytes / GIB:.2f} GiB"


def _free_rooms(nodes: Sequence[NodeSpec], pods: Iterable[PodRecord]) -> dict[str, _Room]:
    rooms = {node.name: _Room(node.name, node.cpu, node.memory_bytes) for node in nodes}
    for pod in pods:
        room = rooms.get(pod.node)
        if room is not None and pod.live:
            room.cpu -= pod.cpu
            room.memory_bytes -= pod.memory_bytes
    return rooms


_EPSILON = 1e-9


def _fits(room: _Room, cpu: float, memory_bytes: int) -> bool:
    return room.cpu + _EPSILON >= cpu and room.memory_bytes >= memory_bytes


def _claim(room: _Room, cpu: float, memory_bytes: int) -> None:
    room.cpu -= cpu
    room.memory_bytes -= memory_bytes


def _unplaceable(
    rooms: Mapping[str, _Room], name: str, cpu: float, memory_bytes: int, avoid: str = ""
) -> Unplaceable:
    candidates = [room for room in rooms.values() if room.name != avoid]
    largest = max(candidates, key=lambda r: (r.memory_bytes, r.cpu), default=None)
    if largest is None:
        left = "no nodes"
    else:
        free = _size_text(max(largest.cpu, 0.0), max(largest.memory_bytes, 0))
        left = f"{largest.name} has {free} free"
    return Unplaceable(
        f"no node has room for pod {name} ({_size_text(cpu, memory_bytes)}); the roomiest, {left}"
    )


def _place(
    rooms: dict[str, _Room], name: str, cpu: float, memory_bytes: int, avoid: str = ""
) -> str:
    """First fit (nodes in order); only to name the pod when a group cannot be placed."""
    for room in rooms.values():
        if room.name != avoid and _fits(room, cpu, memory_bytes):
            _claim(room, cpu, memory_bytes)
            return room.name
    raise _unplaceable(rooms, name, cpu, memory_bytes, avoid)


@dataclass(frozen=True)
class _Pending:
    """A pod to place: its name and size."""

    name: str
    role: Role
    index: int
    generation: int
    cpu: float
    memory_bytes: int


def _place_together(
    rooms: dict[str, _Room],
    capacity: Sequence[Node],
    pods: Sequence[_Pending],
    holding: Iterable[str],
    avoid: str = "",
) -> list[str]:
    """Place ``pods`` as one group with KOD2 (:func:`place_tasks`): on the fewest nodes
    beyond ``holding`` (the job's nodes), never on ``avoid``. Claims their room and returns
    each pod's node; raises :class:`Unplaceable` and claims nothing if they do not fit."""
    if not pods:
        return []
    usable = [room for room in rooms.values() if room.name != avoid]
    request = TaskPlacementRequest(
        nodes=tuple(
            Node(room.name, max(room.cpu, 0.0), max(room.memory_bytes, 0)) for room in usable
        ),
        tasks=tuple(Task(pod.cpu, pod.memory_bytes) for pod in pods),
        prefer=tuple(sorted(set(holding))),
        capacity=tuple(node for node in capacity if node.name != avoid),
    )
    reply = place_tasks(request)
    if not reply.fits:
        # place_tasks fits whenever first fit decreasing (``pods`` are largest first) does,
        # so first fit stops at a pod too, on a copy of the rooms: that pod and the room
        # left when it stopped are what the message names, as before KOD2.
        trial = {
            name: _Room(room.name, room.cpu, room.memory_bytes) for name, room in rooms.items()
        }
        for pod in pods:
            _place(trial, pod.name, pod.cpu, pod.memory_bytes, avoid)
        first = pods[0]  # not reached (see above); name the largest pod all the same
        raise _unplaceable(rooms, first.name, first.cpu, first.memory_bytes, avoid)
    for pod, node in zip(pods, reply.nodes, strict=True):
        _claim(rooms[node], pod.cpu, pod.memory_bytes)
    return list(reply.nodes)


def desired_sizes(plan: Plan) -> dict[tuple[Role, int], tuple[float, int]]:
    """The size of every pod the plan asks for, by (role, index), overrides applied."""
    sizes: dict[tuple[Role, int], tuple[float, int]] = {}
    for resources in plan.roles:
        overrides = {o.index: o for o in resources.overrides}
        for index in range(resources.count):
            override = overrides.get(index)
            cpu = override.cpu if override is not None and override.cpu > 0 else resources.cpu
            memory = (
                override.memory_bytes
                if override is not None and override.memory_bytes > 0
                else resources.memory_bytes
            )
            sizes[(resources.role, index)] = (cpu, memory)
    return sizes


def _largest_first(
    sizes: Mapping[tuple[Role, int], tuple[float, int]],
) -> list[tuple[tuple[Role, int], tuple[float, int]]]:
    return sorted(
        sizes.items(), key=lambda item: (-item[1][1], -item[1][0], item[0][0].value, item[0][1])
    )


def reconcile(
    plan: Plan,
    pods: Sequence[PodRecord],
    nodes: Sequence[NodeSpec],
    others: Iterable[PodRecord] = (),
) -> Reconciliation:
    """What to do so ``pods`` (the job's, any phase) match ``plan`` on ``nodes``, given the
    ``others`` (other jobs' pods) that hold room too. Raises :class:`Unplaceable`.

    Placement (see the module docstring): in place first, then the pods that move, each
    beside the job's other pods when it can be, then the new pods together, with KOD2."""
    live = [pod for pod in pods if pod.live]
    current: dict[tuple[Role, int], PodRecord] = {}
    for record in sorted(live, key=lambda p: p.generation):
        current[(record.role, record.index)] = record  # the newest generation stands for it
    superseded = [pod for pod in live if current.get((pod.role, pod.index)) is not pod]
    rooms = _free_rooms(nodes, [*live, *others])
    capacity = tuple(Node(node.name, node.cpu, node.memory_bytes) for node in nodes)
    sizes = desired_sizes(plan)

    create: list[PodWant] = []
    relaunch: list[PodWant] = []
    resize: list[Resize] = []
    migrate: list[Migration] = []
    delete: list[PodRecord] = list(superseded)
    holding: set[str] = set()  # the nodes of the job's pods that stay (affinity)
    new: list[_Pending] = []
    moving: list[tuple[PodRecord, float, int]] = []
    # 1. Pods that stay where they are, growing in place where their node has room.
    for (role, index), (cpu, memory) in _largest_first(sizes):
        pod = current.get((role, index))
        if pod is None:
            new.append(_Pending(pod_name(plan.job_id, role, index), role, index, 0, cpu, memory))
            continue
        if pod.phase is not PodPhase.FAILED and (cpu, memory) == (pod.cpu, pod.memory_bytes):
            holding.add(pod.node)
            continue
        # Relaunch or resize in place: its own room is already counted; only growth needs
        # more.
        room = rooms.get(pod.node)
        grow_cpu, grow_memory = cpu - pod.cpu, memory - pod.memory_bytes
        if room is not None and _fits(room, max(grow_cpu, 0), max(grow_memory, 0)):
            _claim(room, grow_cpu, grow_memory)
            holding.add(pod.node)
            if pod.phase is PodPhase.FAILED:
                relaunch.append(
                    PodWant(pod.name, role, index, pod.generation, cpu, memory, pod.node)
                )
            else:
                resize.append(Resize(pod, cpu, memory))
            continue
        if pod.phase is PodPhase.FAILED and room is not None:
            # The failed pod holds nothing real any more: free its room, place it anew.
            _claim(room, -pod.cpu, -pod.memory_bytes)
        moving.append((pod, cpu, memory))
    # 2. Pods that move, beside the job's other pods where they fit; a migration's
    # replacement never on the node it leaves.
    for pod, cpu, memory in moving:
        if pod.phase is PodPhase.FAILED:
            want = _Pending(pod.name, pod.role, pod.index, pod.generation, cpu, memory)
            (node,) = _place_together(rooms, capacity, [want], holding)
            relaunch.append(
                PodWant(want.name, pod.role, pod.index, want.generation, cpu, memory, node)
            )
        else:
            generation = pod.generation + 1
            name = pod_name(plan.job_id, pod.role, pod.index, generation)
            want = _Pending(name, pod.role, pod.index, generation, cpu, memory)
            (node,) = _place_together(rooms, capacity, [want], holding, avoid=pod.node)
            migrate.append(
                Migration(pod, PodWant(name, pod.role, pod.index, generation, cpu, memory, node))
            )
        holding.add(node)
    # 3. New pods, together on the fewest nodes beyond the job's (KOD2).
    for want, node in zip(new, _place_together(rooms, capacity, new, holding), strict=True):
        create.append(
            PodWant(want.name, want.role, want.index, 0, want.cpu, want.memory_bytes, node)
        )
    for (role, index), slot in current.items():
        if (role, index) not in sizes:
            delete.append(slot)

    cluster: dict[Role, tuple[str, ...]] = {}
    for role in MEMBER_ROLES:
        names = []
        for index in range(max((i for r, i in sizes if r is role), default=-1) + 1):
            migrated = next(
                (m.replacement for m in migrate if (m.old.role, m.old.index) == (role, index)), None
            )
            if migrated is not None:
                names.append(migrated.name)
            elif (role, index) in current:
                names.append(current[(role, index)].name)
            else:
                names.append(pod_name(plan.job_id, role, index))
        cluster[role] = tuple(names)
    membership_changed = (
        any(want.role in MEMBER_ROLES for want in create)
        or any(m.old.role in MEMBER_ROLES for m in migrate)
        or any(pod.role in MEMBER_ROLES for pod in delete)
    )
    return Reconciliation(
        create=tuple(create),
        relaunch=tuple(relaunch),
        resize=tuple(resize),
        migrate=tuple(migrate),
        delete=tuple(delete),
        cluster=cluster,
        membership_changed=membership_changed,
    )
