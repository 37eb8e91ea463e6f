"""Virtual nodes and whom to evict (pure).

The local backend splits one machine into virtual nodes so placement, admission and
packing have a cluster to work with (``STRIDE_PODWATCHER_LOCAL_NODES``). The grammar is a
list of groups joined by ``+`` or ``;``, each ``N x(cpu=C,memory=M)`` or ``(cpu=C,memory=M)``:
``4x(cpu=2,memory=4Gi)``, ``2x(cpu=1,memory=2Gi)+1x(cpu=4,memory=8Gi)``. CPU is cores
(``1.5``) or millicores (``500m``); memory is bytes or has a unit: ``Ki Mi Gi Ti`` (powers of
1024) or ``K M G T`` (powers of 1000), as Kubernetes writes quantities. An optional
``gpu=G`` gives a node G GPUs (``16x(cpu=8,memory=64Gi,gpu=8)``): admission counts them for
GPU jobs (a replay of a GPU trace on simulated pods); local pods do not use them.

Under memory pressure the kubelet evicts the pod whose use most exceeds its request first;
:func:`choose_eviction` does the same for the local backend.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from stride.runtime.errors import InvalidArgument
from stride.vocabulary.quantities import parse_cpu, parse_memory

SETTING = "STRIDE_PODWATCHER_LOCAL_NODES"
MAX_NODES = 256
_GROUP = re.compile(r"^\s*(?:(\d+)\s*x\s*)?\((.*)\)\s*\Z")


@dataclass(frozen=True)
class NodeSpec:
    """A (virtual) node: its name, cores and memory."""

    name: str
    cpu: float
    memory_bytes: int
    gpus: int = 0


def _fail(part: str, problem: str) -> InvalidArgument:
    return InvalidArgument(SETTING, f"{part.strip()!r}: {problem}")


def _cpu(part: str, text: str) -> float:
    value = text.strip()
    cores = parse_cpu(value)
    if cores is None:
        raise _fail(part, f'cpu "{value}" is not a number of cores (2, 0.5 or 500m)')
    if not 0 < cores <= 1_000_000:  # also refuses nan
        raise _fail(part, f'cpu "{value}" must be a positive number of cores')
    return cores


def _memory(part: str, text: str) -> int:
    value = text.strip()
    amount = parse_memory(value)
    if amount is None:
        raise _fail(
            part,
            f'memory "{value}" is not a quantity (bytes, or a number with Ki Mi Gi Ti K M G T)',
        )
    if amount <= 0 or amount > 2**53:
        raise _fail(part, f'memory "{value}" must be positive and at most 8 PiB')
    return amount


def _gpus(part: str, text: str) -> int:
    value = text.strip()
    if not value.isdigit() or int(value) > 1024:
        raise _fail(part, f'gpu "{value}" must be a whole number of GPUs from 0 to 1024')
    return int(value)


def parse_nodes(text: str, *, prefix: str = "node") -> tuple[NodeSpec, ...]:
    """The nodes ``text`` describes, named ``<prefix>-0`` onwards; raises InvalidArgument
    quoting the part that does not parse and what was expected."""
    nodes: list[NodeSpec] = []
    parts = [part for part in re.split(r"[+;]", text)]
    if not text.strip():
        raise InvalidArgument(SETTING, "is empty; write e.g. 4x(cpu=2,memory=4Gi)")
    for part in parts:
        match = _GROUP.match(part)
        if match is None:
            raise _fail(part, "expected Nx(cpu=C,memory=M), e.g. 4x(cpu=2,memory=4Gi)")
        count = int(match.group(1)) if match.group(1) else 1
        if count < 1:
            raise _fail(part, "the node count must be at least 1")
        fields: dict[str, str] = {}
        for item in match.group(2).split(","):
            key, equals, value = item.partition("=")
            key = key.strip()
            if not equals or not key:
                raise _fail(part, f"{item.strip()!r} is not key=value")
            if key not in ("cpu", "memory", "gpu"):
                raise _fail(part, f'unknown key "{key}"; use cpu, memory and gpu')
            if key in fields:
                raise _fail(part, f'"{key}" is given twice')
            fields[key] = value
        missing = [key for key in ("cpu", "memory") if key not in fields]
        if missing:
            raise _fail(part, f"{' and '.join(missing)} missing")
        cpu, memory = _cpu(part, fields["cpu"]), _memory(part, fields["memory"])
        gpus = _gpus(part, fields.get("gpu", "0"))
        if len(nodes) + count > MAX_NODES:
            raise InvalidArgument(SETTING, f"more than {MAX_NODES} nodes")
        first = len(nodes)
        nodes.extend(NodeSpec(f"{prefix}-{first + n}", cpu, memory, gpus) for n in range(count))
    return tuple(nodes)


def check_node_name(name: str) -> str:
    """``name`` if it can name a node (Kubernetes: a DNS subdomain, at most 253 chars)."""
    if not name:
        raise InvalidArgument("name", "is required: the node's name (stride nodes lists them)")
    if len(name) > 253 or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        raise InvalidArgument("name", f"{name[:60]!r} is not a node name")
    return name


@dataclass(frozen=True)
class PodUsage:
    """A pod's memory request (its limit here) and what it uses."""

    pod: str
    memory_request: int
    memory_used: int


def choose_eviction(pods: Sequence[PodUsage]) -> str | None:
    """The pod to evict first: the one whose use most exceeds its request, then the
    largest user (the kubelet's order for pods of equal priority); None if no pods."""
    if not pods:
        return None
    victim = max(pods, key=lambda p: (p.memory_used - p.memory_request, p.memory_used, p.pod))
    return victim.pod
