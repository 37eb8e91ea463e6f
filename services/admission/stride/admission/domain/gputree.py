"""The GPU tree admission places GPU jobs on (ElasticFlow sec. 4.3): switches, nodes, GPUs.

Placement needs the cluster as a tree whose leaves are GPUs, numbered in leaf order so that
every subtree is a contiguous range (:class:`~stride.policy.elasticflow.placement.Topology`).
The tree comes from one of two places, as capacity does:

- **settings** (``cluster_topology``, e.g. ``2x8x8``: 2 switches of 8 nodes of 8 GPUs), the
  shape of an ElasticFlow ``cluster_specs`` file; nodes are then named ``node-0`` ... in
  leaf order (a replay of a trace has no real nodes);
- **the node inventory**: the nodes with GPUs, by name, under one switch. The inventory says
  nothing of switches, so the tree has one; a cluster whose GPU nodes differ in GPU count
  has no tree here, and its GPUs are counted, not placed (logged at start).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from stride.policy.elasticflow.placement import Topology

__all__ = ["GpuTree", "TreeError"]

_SHAPE = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*x\s*(\d+)\s*$")


class TreeError(ValueError):
    """A tree that cannot be: the message names what is wrong."""


@dataclass(frozen=True)
class GpuTree:
    """The GPU tree: fan-outs (switches, nodes per switch, GPUs per node) and the name of
    every node in leaf order."""

    fanouts: tuple[int, int, int]
    nodes: tuple[str, ...]

    def __post_init__(self) -> None:
        if any(fanout <= 0 for fanout in self.fanouts):
            raise TreeError(f"every level needs at least one member, got {self.shape}")
        if len(self.nodes) != self.fanouts[0] * self.fanouts[1]:
            raise TreeError(
                f"{self.shape} has {self.fanouts[0] * self.fanouts[1]} nodes, "
                f"{len(self.nodes)} named"
            )
        if len(set(self.nodes)) != len(self.nodes):
            raise TreeError("node names repeat")

    @property
    def shape(self) -> str:
        """``switches x nodes per switch x GPUs per node``, as settings write it."""
        return "x".join(str(fanout) for fanout in self.fanouts)

    @property
    def gpus(self) -> int:
        """All GPUs of the tree."""
        return math.prod(self.fanouts)

    @property
    def topology(self) -> Topology:
        """The tree as placement takes it."""
        return Topology(self.fanouts, ("switch", "node", "gpu"))

    def where(self, devices: Sequence[int]) -> list[tuple[str, int]]:
        """Each device (leaf index) as its node's name and its index on the node."""
        per_node = self.fanouts[2]
        return [(self.nodes[device // per_node], device % per_node) for device in devices]

    @classmethod
    def parse(cls, text: str) -> GpuTree:
        """A tree from ``SxNxG`` (settings), its nodes named ``node-0`` ... in leaf order."""
        match = _SHAPE.match(text)
        if match is None:
            raise TreeError(
                f"{text!r} is not switches x nodes per switch x GPUs per node, e.g. 2x8x8"
            )
        switches, per_switch, per_node = (int(group) for group in match.groups())
        fanouts = (switches, per_switch, per_node)
        return cls(fanouts, tuple(f"node-{n}" for n in range(switches * per_switch)))

    @classmethod
    def from_nodes(cls, gpus_by_node: Sequence[tuple[str, int]]) -> GpuTree | None:
        """The tree of an inventory's GPU nodes (by name, one switch); None when no node has
        GPUs or their GPU counts differ (the tree needs one fan-out per level)."""
        with_gpus = sorted((name, count) for name, count in gpus_by_node if count > 0)
        if not with_gpus or len({count for _, count in with_gpus}) != 1:
            return None
        return cls((1, len(with_gpus), with_gpus[0][1]), tuple(name for name, _ in with_gpus))

    def to_text(self) -> str:
        """The tree as stored beside the capacity: the shape, then the node names."""
        return ";".join([self.shape, *self.nodes])

    @classmethod
    def from_text(cls, text: str) -> GpuTree:
        """The inverse of :meth:`to_text`."""
        shape, *nodes = text.split(";")
        parsed = cls.parse(shape)
        return cls(parsed.fanouts, tuple(nodes))
