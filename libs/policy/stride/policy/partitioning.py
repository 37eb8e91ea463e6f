"""GoldMiner's state-aware graph partitioning (sec. 3.2, Algorithm 1): which part of a job's
dataflow graph its stateless data workers can run.

Data pre-processing is what does not depend on the model's state: a node upstream of every
stateful node (one that holds model parameters, such as a variable or an embedding table)
can run ahead of training, on other machines, without waiting for an update. Algorithm 1
collects the stateful nodes, walks everything downstream of them breadth-first (the
training workers' subgraph), and leaves the rest to data workers. That rest is then cut
into stages by device type (lines 6-9: typically a CPU stage, and a GPU stage where some
pre-processing uses GPUs), each run by its own set of data workers, raw indices going to
the first (:func:`_stages` says how stages are grown here). The edges from a data node to
a training node are where the data queue sits (GoldMiner's DWSend/DWRecv): what a data
worker sends, whole mini-batches of it.

Pure: the graph comes in as nodes (any granularity: TensorFlow operations, or Keras layers
as ``stride.trainer.partition`` gives them), the partition goes out.
"""

from __future__ import annotations

import graphlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from stride.policy.errors import PolicyError


class InvalidGraph(PolicyError):
    """The dataflow graph cannot be partitioned; the message names the problem."""


@dataclass(frozen=True)
class DataflowNode:
    """One node of a job's dataflow graph."""

    name: str
    inputs: tuple[str, ...] = ()
    """The nodes whose outputs it takes."""
    stateful: bool = False
    """Whether it holds model parameters that training updates (a variable, a table)."""
    device: str = "CPU"
    """The device type it runs on (stages group nodes by it)."""


@dataclass(frozen=True)
class Partition:
    """Algorithm 1's answer for one graph."""

    train_nodes: tuple[str, ...]
    """The stateful nodes and everything downstream of them, in topological order."""
    data_stages: tuple[tuple[str, ...], ...]
    """The rest, cut into stages of one device type each, in the order data flows through
    them; each stage's nodes in topological order. Empty: nothing for data workers (the job
    pre-processes locally)."""
    crossing: tuple[tuple[str, str], ...]
    """The edges (data node, training node) where the data queue sits."""

    @property
    def data_nodes(self) -> tuple[str, ...]:
        return tuple(name for stage in self.data_stages for name in stage)


def partition(nodes: Sequence[DataflowNode]) -> Partition:
    """GoldMiner's Algorithm 1 over ``nodes``.

    Raises :class:`InvalidGraph` for a name used twice, an input that is not a node, a
    cycle, or a graph with no stateful node (nothing for training to update)."""
    by_name = _check(nodes)
    order = _topological(by_name)
    consumers: dict[str, list[str]] = {name: [] for name in order}
    for name in order:
        for source in by_name[name].inputs:
            consumers[source].append(name)
    stateful = [name for name in order if by_name[name].stateful]
    if not stateful:
        raise InvalidGraph(
            "nodes", "the graph has no stateful node: nothing in it holds model parameters"
        )
    train = _reach(stateful, consumers)
    data = [name for name in order if name not in train]
    stages = _stages(data, by_name)
    crossing = tuple(
        (source, name)
        for name in order
        if name in train
        for source in by_name[name].inputs
        if source not in train
    )
    return Partition(
        train_nodes=tuple(name for name in order if name in train),
        data_stages=stages,
        crossing=crossing,
    )


def _check(nodes: Sequence[DataflowNode]) -> dict[str, DataflowNode]:
    by_name: dict[str, DataflowNode] = {}
    for index, node in enumerate(nodes):
        if not node.name:
            raise InvalidGraph(f"nodes[{index}].name", "is empty")
        if node.name in by_name:
            raise InvalidGraph(f"nodes[{index}].name", f"node {node.name!r} is named twice")
        if not node.device:
            raise InvalidGraph(f"nodes[{index}].device", f"node {node.name!r} has none")
        by_name[node.name] = node
    for index, node in enumerate(nodes):
        for source in node.inputs:
            if source not in by_name:
                raise InvalidGraph(
                    f"nodes[{index}].inputs",
                    f"node {node.name!r} takes input {source!r}, which is no node",
                )
    return by_name


def _topological(by_name: dict[str, DataflowNode]) -> list[str]:
    """The nodes with every input before its consumer, ties kept in the order given (so a
    graph listed in order comes back as listed)."""
    try:
        graphlib.TopologicalSorter({name: node.inputs for name, node in by_name.items()}).prepare()
    except graphlib.CycleError as error:
        cycle = " -> ".join(error.args[1])
        raise InvalidGraph("nodes", f"the graph has a cycle: {cycle}") from error
    position = {name: index for index, name in enumerate(by_name)}
    waiting = {name: len(set(node.inputs)) for name, node in by_name.items()}
    consumers: dict[str, list[str]] = {name: [] for name in by_name}
    for name, node in by_name.items():
        for source in set(node.inputs):
            consumers[source].append(name)
    ready = [name for name in by_name if waiting[name] == 0]
    order: list[str] = []
    while ready:
        name = ready.pop(0)
        order.append(name)
        for consumer in consumers[name]:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                ready.append(consumer)
                ready.sort(key=position.__getitem__)
    return order


def _reach(starts: list[str], consumers: dict[str, list[str]]) -> set[str]:
    """``starts`` and every node downstream of them, breadth first (Algorithm 1, line 3)."""
    seen = set(starts)
    queue = deque(starts)
    while queue:
        for consumer in consumers[queue.popleft()]:
            if consumer not in seen:
                seen.add(consumer)
                queue.append(consumer)
    return seen


def _stages(data: list[str], by_name: dict[str, DataflowNode]) -> tuple[tuple[str, ...], ...]:
    """Algorithm 1, lines 5-9: the data nodes grouped into stages of one device type each.

    Departure: the paper grows each stage breadth first within a device from a seed node,
    which leaves two unconnected parts of one device (two features pre-processed apart) in
    two stages; but a data worker produces a whole mini-batch (sec. 3.3), every feature of
    it. So a node's stage is its device type and how many device changes lie upstream of
    it: features processed side by side on CPUs are one stage, and a CPU step after a GPU
    step is a stage after the GPU's, as in the paper."""
    changes: dict[str, int] = {}
    for name in data:  # topological: every data input is placed before its consumer
        device = by_name[name].device
        changes[name] = max(
            (
                changes[source] + (by_name[source].device != device)
                for source in by_name[name].inputs
                if source in changes
            ),
            default=0,
        )
    stages: dict[tuple[int, str], list[str]] = {}
    for name in sorted(data, key=changes.__getitem__):  # stable: topological within a stage
        stages.setdefault((changes[name], by_name[name].device), []).append(name)
    return tuple(tuple(stage) for stage in stages.values())
