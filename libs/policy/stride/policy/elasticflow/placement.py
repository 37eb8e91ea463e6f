"""Topology-aware placement: best fit on a device tree, and buddy allocation (sec. 4.3).

A job's scaling curve depends on where its workers run (Fig. 2b), so ElasticFlow places a
job in the smallest subtree of the topology that holds it: "a multilayer hierarchical
tree" whose leaves are devices (Fig. 5), with "Best-Fit, which chooses the subtree in which
the number of idle GPUs is closest to the number of GPUs needed". Best fit alone fragments
(two servers with seven busy GPUs each cannot host a 2-GPU job in one server), so ElasticFlow
restricts jobs to power-of-two sizes and uses "buddy allocation combined with job
migration": then "if the cluster has enough idle GPUs for a job, there is a subtree that
contains enough GPUs".

The tree is given by its fan-outs from the top, e.g. ``(2, 32, 8)`` for the ``n64g8`` shape
(2 switches x 32 nodes x 8 GPUs). Devices are numbered in leaf order, so every subtree is a
contiguous range. Devices can be any unit (GPUs, CPU shares).

Buddy allocation here: a job of ``2^k`` devices gets an aligned block ``[m 2^k, (m+1) 2^k)``
(inside one subtree of the right size when the fan-outs below the top are powers of two).
Among free aligned blocks it takes the one inside the smallest maximal free block (the
classic buddy rule: split the smallest free block). If there is none although enough
devices are free, the running jobs are *repacked*: all blocks, the new one included, are
laid out largest first from device 0, which aligns each one (every start is a sum of
larger powers of two). The reply lists the jobs that move. Departure: the paper does not
say which jobs to migrate. Stride first tries to empty one aligned block by moving only the
jobs inside it (the block with the fewest busy devices first, its jobs into free aligned
blocks elsewhere); only if that fails does it repack everything, which may move more jobs
than needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np
import numpy.typing as npt

from stride.policy.errors import PolicyError

ALGORITHM_NAME = "elasticflow-placement"
ALGORITHM_VERSION = 1


class InvalidPlacement(PolicyError):
    """A placement request is malformed (overlapping jobs, a size that is not allowed, ...)."""


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class Topology:
    """A device tree by fan-out per level from the top (Fig. 5)."""

    fanouts: tuple[int, ...]
    """Children per node at each level, e.g. (switches, nodes per switch, devices per node)."""
    level_names: tuple[str, ...] = ()
    """Optional names of the levels, same length as fanouts (for readers only)."""

    def __post_init__(self) -> None:
        if not self.fanouts:
            raise InvalidPlacement("topology.fanouts", "must not be empty")
        for index, fanout in enumerate(self.fanouts):
            if isinstance(fanout, bool) or not isinstance(fanout, int) or fanout <= 0:
                raise InvalidPlacement(
                    f"topology.fanouts[{index}]", f"must be a whole number > 0, got {fanout!r}"
                )
        if self.level_names and len(self.level_names) != len(self.fanouts):
            raise InvalidPlacement("topology.level_names", "must name every level or none")

    @property
    def device_count(self) -> int:
        """Leaves of the tree."""
        return math.prod(self.fanouts)

    def spans(self) -> list[int]:
        """Devices under one node at each depth: depth 0 is the root, the last is a leaf."""
        return [math.prod(self.fanouts[depth:]) for depth in range(len(self.fanouts) + 1)]


def topology_from_cluster_spec(text: str, source: str = "cluster_spec") -> Topology:
    """A topology from an ElasticFlow ``cluster_specs/nXgY.csv`` text (switch, node, device)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise InvalidPlacement(source, "needs a header and one row")
    header = [cell.strip() for cell in lines[0].split(",")]
    row = [cell.strip() for cell in lines[1].split(",")]
    wanted = ("num_switch", "num_node_p_switch", "num_gpu_p_node")
    values: list[int] = []
    for name in wanted:
        if name not in header or header.index(name) >= len(row):
            raise InvalidPlacement(f"{source}.{name}", "is missing")
        cell = row[header.index(name)]
        if not cell.isdigit() or int(cell) <= 0:
            raise InvalidPlacement(f"{source}.{name}", f"must be a positive integer, got {cell!r}")
        values.append(int(cell))
    return Topology(tuple(values), ("switch", "node", "device"))


class PlacementStrategy(Enum):
    """How devices are chosen (sec. 4.3)."""

    BEST_FIT = "best-fit"
    BUDDY = "buddy"


@dataclass(frozen=True)
class DeviceAllocation:
    """The devices (leaf indexes) one job runs on."""

    job_id: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class PlacementRequest:
    """Place ``job_id`` on ``devices_needed`` devices beside the running ``occupied`` jobs."""

    topology: Topology
    job_id: str
    devices_needed: int
    occupied: tuple[DeviceAllocation, ...] = ()
    strategy: PlacementStrategy = PlacementStrategy.BUDDY


@dataclass(frozen=True)
class PlacementReply:
    """Where the job goes and which running jobs move (buddy repacking only)."""

    placed: bool
    devices: tuple[int, ...]
    migrations: tuple[DeviceAllocation, ...]
    """New device sets of running jobs that must move first; empty for best fit."""
    reason: str


def _occupancy(request: PlacementRequest) -> npt.NDArray[np.int64]:
    total = request.topology.device_count
    needed = request.devices_needed
    if isinstance(needed, bool) or not isinstance(needed, int) or not 0 < needed <= total:
        raise InvalidPlacement(
            "devices_needed", f"must be a whole number in 1..{total}, got {needed!r}"
        )
    if not request.job_id:
        raise InvalidPlacement("job_id", "is required")
    fast = _occupancy_if_valid(request, total)
    if fast is not None:
        return fast
    busy = np.zeros(total, dtype=np.int64)
    seen = {request.job_id}
    for index, allocation in enumerate(request.occupied):
        field = f"occupied[{index}]"
        if allocation.job_id in seen:
            raise InvalidPlacement(f"{field}.job_id", f"{allocation.job_id!r} repeats")
        seen.add(allocation.job_id)
        if not allocation.devices:
            raise InvalidPlacement(f"{field}.devices", "must not be empty")
        for position, device in enumerate(allocation.devices):
            if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < total:
                raise InvalidPlacement(
                    f"{field}.devices[{position}]", f"must be a device in 0..{total - 1}"
                )
            if busy[device]:
                raise InvalidPlacement(f"{field}.devices[{position}]", f"device {device} is taken")
            busy[device] = 1
    return busy


def _occupancy_if_valid(request: PlacementRequest, total: int) -> npt.NDArray[np.int64] | None:
    """The busy map in a few array operations when the request is valid, else None.

    The simulator places on every rescale, so the common (valid) case is checked in bulk;
    :func:`_occupancy` then walks the request only to name what is wrong.
    """
    ids = {allocation.job_id for allocation in request.occupied}
    if len(ids) != len(request.occupied) or request.job_id in ids:
        return None
    if any(not allocation.devices for allocation in request.occupied):
        return None
    if not request.occupied:
        return np.zeros(total, dtype=np.int64)
    flat = [device for allocation in request.occupied for device in allocation.devices]
    if any(type(device) is not int for device in flat):  # bools and floats are errors
        return None
    devices = np.asarray(flat, dtype=np.int64)
    if devices.min() < 0 or devices.max() >= total:
        return None
    busy = np.bincount(devices, minlength=total)
    if busy.max() > 1:
        return None
    return busy.astype(np.int64)


class _FreeCounter:
    """Free devices in any contiguous range in O(1), from a prefix sum."""

    def __init__(self, busy: npt.NDArray[np.int64]) -> None:
        self.busy = busy
        self.prefix = np.concatenate([[0], np.cumsum(1 - busy)])

    def free(self, start: int, end: int) -> int:
        return int(self.prefix[end] - self.prefix[start])


def best_fit(request: PlacementRequest) -> PlacementReply:
    """The subtree whose idle devices are closest to (and at least) the need, then devices."""
    busy = _occupancy(request)
    counter = _FreeCounter(busy)
    needed = request.devices_needed
    spans = request.topology.spans()
    total_free = counter.free(0, busy.size)
    if total_free < needed:
        return PlacementReply(False, (), (), f"{total_free} devices free, {needed} needed")
    # (idle devices, subtree size, first device): fewest idle, then the smallest subtree.
    best: tuple[int, int, int, int] | None = None
    for depth, span in enumerate(spans):
        for start in range(0, busy.size, span):
            idle = counter.free(start, start + span)
            if idle >= needed and (best is None or (idle, span, start) < best[:3]):
                best = (idle, span, start, depth)
    assert best is not None  # the root holds total_free >= needed
    _, _, start, depth = best
    chosen = _take(counter, spans, start, depth, needed)
    return PlacementReply(True, tuple(sorted(chosen)), (), f"best fit in a subtree of {best[1]}")


def _take(
    counter: _FreeCounter, spans: list[int], start: int, depth: int, needed: int
) -> list[int]:
    """``needed`` free devices under the node at ``start``/``depth``, kept close together."""
    if depth == len(spans) - 1:
        return [start] if not counter.busy[start] else []
    child_span = spans[depth + 1]
    children = [
        (counter.free(child, child + child_span), child)
        for child in range(start, start + spans[depth], child_span)
    ]
    fitting = [(idle, child) for idle, child in children if idle >= needed]
    if fitting:
        _, child = min(fitting)
        return _take(counter, spans, child, depth + 1, needed)
    taken: list[int] = []
    for idle, child in sorted(children, key=lambda item: (-item[0], item[1])):
        if len(taken) == needed:
            break
        if idle:
            taken += _take(counter, spans, child, depth + 1, min(idle, needed - len(taken)))
    return taken


def _aligned_free_block(counter: _FreeCounter, needed: int) -> tuple[int, int] | None:
    """The free aligned block of ``needed`` devices inside the smallest maximal free block.

    Returns ``(size of the enclosing free block, start)`` or None if no aligned block is free.
    """
    total = counter.busy.size
    best: tuple[int, int] | None = None
    for start in range(0, total - needed + 1, needed):
        if counter.free(start, start + needed) != needed:
            continue
        block = needed
        while True:  # grow to the largest aligned free block that holds this one
            bigger = block * 2
            base = start - start % bigger
            if base + bigger > total or counter.free(base, base + bigger) != bigger:
                break
            block = bigger
        if best is None or (block, start) < best:
            best = (block, start)
    return best


_EVICTION_CANDIDATES = 8
"""Aligned blocks tried for eviction (fewest busy devices first) before a full repack."""


def _evict(request: PlacementRequest, busy: npt.NDArray[np.int64]) -> PlacementReply | None:
    """Free one aligned block by moving only the jobs inside it, or None if that fails.

    The block with the fewest busy devices is tried first; its jobs (every one smaller than
    the block, since buddy blocks nest) move, largest first, into aligned free blocks
    outside it. This moves far fewer jobs than a full repack.
    """
    needed = request.devices_needed
    total = busy.size
    owner = np.full(total, -1, dtype=np.int64)
    for index, allocation in enumerate(request.occupied):
        owner[list(allocation.devices)] = index
    candidates: list[tuple[int, int]] = []
    for start in range(0, total - needed + 1, needed):
        inside = owner[start : start + needed]
        jobs = {int(job) for job in inside if job >= 0}
        if any(
            not start <= min(request.occupied[job].devices)
            or max(request.occupied[job].devices) >= start + needed
            for job in jobs
        ):
            continue  # a job straddles the block: moving it would not free the block alone
        candidates.append((int((inside >= 0).sum()), start))
    candidates.sort()
    for _, start in candidates[:_EVICTION_CANDIDATES]:
        trial = busy.copy()
        movers = sorted(
            {int(job) for job in owner[start : start + needed] if job >= 0},
            key=lambda job: (-len(request.occupied[job].devices), job),
        )
        for job in movers:
            trial[list(request.occupied[job].devices)] = 0
        trial[start : start + needed] = 1  # reserved for the new job
        migrations: list[DeviceAllocation] = []
        for job in movers:
            size = len(request.occupied[job].devices)
            found = _aligned_free_block(_FreeCounter(trial), size)
            if found is None:
                break
            trial[found[1] : found[1] + size] = 1
            devices = tuple(range(found[1], found[1] + size))
            migrations.append(DeviceAllocation(request.occupied[job].job_id, devices))
        else:
            return PlacementReply(
                True,
                tuple(range(start, start + needed)),
                tuple(migrations),
                f"evicted {len(migrations)} jobs from an aligned block",
            )
    return None


def buddy(request: PlacementRequest) -> PlacementReply:
    """Buddy allocation with repacking: never fragmented for power-of-two sizes."""
    topology = request.topology
    for index, fanout in enumerate(topology.fanouts[1:], start=1):
        if not _is_power_of_two(fanout):
            raise InvalidPlacement(
                f"topology.fanouts[{index}]", f"must be a power of two for buddy, got {fanout}"
            )
    needed = request.devices_needed
    if not _is_power_of_two(needed):
        raise InvalidPlacement("devices_needed", f"must be a power of two for buddy, got {needed}")
    busy = _occupancy(request)
    for index, allocation in enumerate(request.occupied):
        if not _is_power_of_two(len(allocation.devices)):
            raise InvalidPlacement(
                f"occupied[{index}].devices",
                f"has {len(allocation.devices)} devices; buddy needs powers of two",
            )
    counter = _FreeCounter(busy)
    total = busy.size
    total_free = counter.free(0, total)
    if total_free < needed:
        return PlacementReply(False, (), (), f"{total_free} devices free, {needed} needed")
    best = _aligned_free_block(counter, needed)
    if best is not None:
        start = best[1]
        return PlacementReply(
            True, tuple(range(start, start + needed)), (), f"buddy block of {best[0]} split"
        )
    evicted = _evict(request, busy)
    if evicted is not None:
        return evicted
    # Fragmented: repack everything largest first; each start is then aligned.
    blocks = sorted(
        [(len(a.devices), min(a.devices), a.job_id) for a in request.occupied]
        + [(needed, -1, request.job_id)],
        key=lambda item: (-item[0], item[1]),
    )
    position = 0
    migrations: list[DeviceAllocation] = []
    placed: tuple[int, ...] = ()
    current = {a.job_id: tuple(sorted(a.devices)) for a in request.occupied}
    for size, _, job_id in blocks:
        devices = tuple(range(position, position + size))
        position += size
        if job_id == request.job_id:
            placed = devices
        elif current[job_id] != devices:
            migrations.append(DeviceAllocation(job_id, devices))
    return PlacementReply(
        True, placed, tuple(migrations), f"repacked: {len(migrations)} jobs migrate"
    )


def run(request: PlacementRequest) -> PlacementReply:
    """The registry entry point: best fit or buddy, as the request says."""
    if request.strategy is PlacementStrategy.BEST_FIT:
        return best_fit(request)
    return buddy(request)


def _scrambled(index: int) -> int:
    """A fixed permutation of place numbers (Knuth's multiplicative hash, 32 bits)."""
    return (index * 2654435761) & 0xFFFFFFFF


@dataclass
class Placements:
    """Where every job's devices are, kept across rounds: the placement step after each
    allocation (sec. 4.3), shared by ``stride sim`` and the live admission service so both
    move the same jobs and charge them the same pause.

    :meth:`apply` takes a round's decision (devices per job): a job whose size changed is
    placed anew, the largest first, with buddy allocation (repacking running jobs when
    buddy needs it) or best fit; a job whose size did not change keeps its devices unless
    a repack moves it. Best fit never moves a job; it is used when the tree's fan-outs
    below the top are not powers of two, or a size is not one.
    """

    topology: Topology
    placed: dict[str, tuple[int, ...]]

    def __init__(
        self, topology: Topology, placed: dict[str, tuple[int, ...]] | None = None
    ) -> None:
        self.topology = topology
        self.placed = dict(placed or {})

    def strategy(self, decision: Mapping[str, int]) -> PlacementStrategy:
        """Buddy where the tree and every size allow it (sec. 4.3's choice), else best fit
        (the curves of GPU jobs keep power-of-two sizes, so buddy is the rule there)."""
        tree = all(_is_power_of_two(fanout) for fanout in self.topology.fanouts[1:])
        sizes = all(_is_power_of_two(count) for count in decision.values() if count)
        return PlacementStrategy.BUDDY if tree and sizes else PlacementStrategy.BEST_FIT

    def forget(self, job_id: str) -> None:
        """A job ended: its devices are free."""
        self.placed.pop(job_id, None)

    def apply(self, decision: Mapping[str, int], arrivals: Iterable[str] = ()) -> set[str]:
        """Place the decision's sizes; returns the jobs that moved at an unchanged size (a
        migration, which pays the scaling pause). Raises :class:`InvalidPlacement` if a
        size cannot be placed (more devices than are free: the decision overcommits).

        Jobs to place go largest first; equal sizes in a fixed pseudo-random order of their
        places in ``arrivals`` (the active jobs' ids, first arrived first; others after, in
        the decision's order). Not by id: the live service draws its ids at random and the
        simulator takes the trace's, so an id order placed the same jobs differently in the
        two. Pseudo-random because the trace ids it replaces were (UUIDs), and plain orders
        pack worse: on the first 1,000 jobs of itp clusters 1-8 and 195job (``n8g8``) the
        mean deadline ratio was 0.547 by trace id, 0.541 here, 0.526 in deadline order and
        0.522 in arrival order (cluster04 0.21 / 0.26 / 0.16 / 0.12)."""
        rank = {job_id: _scrambled(index) for index, job_id in enumerate(arrivals)}
        for job_id, devices in list(self.placed.items()):
            if decision.get(job_id, 0) != len(devices):
                del self.placed[job_id]
        kept = set(self.placed)  # same size as before: these only move in a repack
        strategy = self.strategy(decision)
        moved: set[str] = set()
        waiting = sorted(
            (
                (count, job_id)
                for job_id, count in decision.items()
                if count and job_id not in self.placed
            ),
            key=lambda item: (-item[0], rank.get(item[1], len(rank))),
        )
        for count, job_id in waiting:
            request = PlacementRequest(
                self.topology,
                job_id,
                count,
                tuple(DeviceAllocation(j, d) for j, d in self.placed.items()),
                strategy,
            )
            reply = run(request)
            if not reply.placed:
                raise InvalidPlacement("decision", f"job {job_id}: {reply.reason}")
            for migration in reply.migrations:
                self.placed[migration.job_id] = migration.devices
                moved.add(migration.job_id)
            self.placed[job_id] = reply.devices
        return moved & kept

    def nodes(self, job_id: str) -> tuple[int, ...]:
        """The node (leaf's parent, in leaf order) of each of a job's devices."""
        per_node = self.topology.fanouts[-1]
        return tuple(device // per_node for device in self.placed.get(job_id, ()))
