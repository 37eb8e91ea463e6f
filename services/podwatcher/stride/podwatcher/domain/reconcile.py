"""From a job's newest plan and its live pods to what the backend must do (pure).

A plan says how many pods of each role a job has and how big each is (DLRover sec. 5.1:
the plan, not the pods, is the source of truth). :func:`reconcile` compares it with the
pods the podwatcher runs and returns one :class:`Reconciliation`:

- **create** the pods the plan adds (scale out), placed on a node with room;
- **relaunch** a failed pod under its own name and address, at the plan's size, so a
  ParameterServerStrategy coordinator finds its PS or worker again where it was;
- **resize** a pod in place when its node has room for the new size (a CPU quota always
  changes in place; memory does where the kernel allows it, else the use case migrates);
- **migrate** a pod whose node cannot hold its new size: a replacement (next generation,
  new name and address) is placed first, and the old pod is deleted only after the chief
  has moved to the new cluster. This is DLRover-RM sec. 5.2's seamless migration: new
  pods first, then a short pause to checkpoint and restore, then the old pods go;
- **delete** the pods the plan drops (scale in), also only after the chief moved.

``membership_changed`` says whether the TensorFlow cluster (chief, PS and workers)
changes, in which case the chief must be told the new cluster (a RECONFIGURE command)
before any pod it still uses is removed. Data workers are not part of that cluster.

Placement is first fit decreasing (largest memory first) over the nodes' free capacity,
counting every live pod of every job, and the pods about to be deleted too: their room
is free only once they are gone. A pod that fits nowhere makes the whole plan
unplaceable, with a message naming the pod, its size and the largest room left, so no
plan is half applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.plans import Plan
from stride.vocabulary import Role

CLUSTER_ROLES = (Role.CHIEF, Role.PS, Role.WORKER)
"""The roles a TensorFlow ParameterServerStrategy cluster is made of, in its task order."""

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
    """The pod names of the TensorFlow cluster once applied, per role in index order."""
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


def _place(
    rooms: dict[str, _Room], name: str, cpu: float, memory_bytes: int, avoid: str = ""
) -> str:
    for room in rooms.values():
        if room.name != avoid and _fits(room, cpu, memory_bytes):
            room.cpu -= cpu
            room.memory_bytes -= memory_bytes
            return room.name
    largest = max(rooms.values(), key=lambda r: (r.memory_bytes, r.cpu), default=None)
    if largest is None:
        left = "no nodes"
    else:
        free = _size_text(max(largest.cpu, 0.0), max(largest.memory_bytes, 0))
        left = f"{largest.name} has {free} free"
    raise Unplaceable(
        f"no node has room for pod {name} ({_size_text(cpu, memory_bytes)}); the roomiest, {left}"
    )


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


def reconcile(
    plan: Plan,
    pods: Sequence[PodRecord],
    nodes: Sequence[NodeSpec],
    others: Iterable[PodRecord] = (),
) -> Reconciliation:
    """What to do so ``pods`` (the job's, any phase) match ``plan`` on ``nodes``, given the
    ``others`` (other jobs' pods) that hold room too. Raises :class:`Unplaceable`."""
    live = [pod for pod in pods if pod.live]
    current: dict[tuple[Role, int], PodRecord] = {}
    for record in sorted(live, key=lambda p: p.generation):
        current[(record.role, record.index)] = record  # the newest generation stands for it
    superseded = [pod for pod in live if current.get((pod.role, pod.index)) is not pod]
    rooms = _free_rooms(nodes, [*live, *others])
    sizes = desired_sizes(plan)

    create: list[PodWant] = []
    relaunch: list[PodWant] = []
    resize: list[Resize] = []
    migrate: list[Migration] = []
    delete: list[PodRecord] = list(superseded)
    # Largest first, so big pods are not left without a node by small ones.
    for (role, index), (cpu, memory) in sorted(
        sizes.items(), key=lambda item: (-item[1][1], -item[1][0], item[0][0].value, item[0][1])
    ):
        pod = current.get((role, index))
        if pod is None:
            name = pod_name(plan.job_id, role, index)
            create.append(
                PodWant(name, role, index, 0, cpu, memory, _place(rooms, name, cpu, memory))
            )
            continue
        if pod.phase is PodPhase.FAILED:
            # Relaunch in place: its own room is already counted; only growth needs more.
            room = rooms.get(pod.node)
            grow_cpu, grow_memory = cpu - pod.cpu, memory - pod.memory_bytes
            if room is not None and _fits(room, max(grow_cpu, 0), max(grow_memory, 0)):
                room.cpu -= grow_cpu
                room.memory_bytes -= grow_memory
                relaunch.append(
                    PodWant(pod.name, role, index, pod.generation, cpu, memory, pod.node)
                )
            else:
                # The failed pod holds nothing real any more: free its room, place anew.
                if room is not None:
                    room.cpu += pod.cpu
                    room.memory_bytes += pod.memory_bytes
                node = _place(rooms, pod.name, cpu, memory)
                relaunch.append(PodWant(pod.name, role, index, pod.generation, cpu, memory, node))
            continue
        if (cpu, memory) == (pod.cpu, pod.memory_bytes):
            continue
        room = rooms.get(pod.node)
        grow_cpu, grow_memory = cpu - pod.cpu, memory - pod.memory_bytes
        if room is not None and _fits(room, max(grow_cpu, 0), max(grow_memory, 0)):
            room.cpu -= grow_cpu
            room.memory_bytes -= grow_memory
            resize.append(Resize(pod, cpu, memory))
        else:
            generation = pod.generation + 1
            name = pod_name(plan.job_id, role, index, generation)
            node = _place(rooms, name, cpu, memory, avoid=pod.node)
            migrate.append(
                Migration(pod, PodWant(name, role, index, generation, cpu, memory, node))
            )
    for (role, index), slot in current.items():
        if (role, index) not in sizes:
            delete.append(slot)

    cluster: dict[Role, tuple[str, ...]] = {}
    for role in CLUSTER_ROLES:
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
        any(want.role in CLUSTER_ROLES for want in create)
        or any(m.old.role in CLUSTER_ROLES for m in migrate)
        or any(pod.role in CLUSTER_ROLES for pod in delete)
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
