"""The node inventory from the cluster's Nodes.

A node's room is its ``status.allocatable`` (what the kubelet offers pods, after the
system's reservations). Placement counts the plan's sizes only; each pod's agent sidecar
requests 50m and 128Mi more (``manifests.AGENT_RESOURCES``), which the node's reservations
must leave room for (a departure: the local backend's agents are not counted either). A node is
drained when it is cordoned (``spec.unschedulable``, ``kubectl cordon`` and ``kubectl
drain``), tainted ``NoSchedule`` or ``NoExecute``, or not Ready: the pod watcher places no
pod there, and a drain through Stride's API cordons it. A cordoned or ``NoExecute`` node is
also emptied (:func:`evicting`): its Stride pods are evicted and relaunched elsewhere.
Only nodes matching the selector (``STRIDE_PODWATCHER_KUBE_NODE_SELECTOR``) are Stride's.
"""

from __future__ import annotations

from typing import Any

from stride.podwatcher.adapters.outbound.backends.kubernetes.manifests import GPU_RESOURCE
from stride.podwatcher.domain.nodes import NodeSpec
from stride.vocabulary.quantities import parse_cpu, parse_memory

DRAINING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def node_spec(node: dict[str, Any]) -> NodeSpec:
    """The node as placement sees it: its allocatable cores, memory and GPUs."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = str(allocatable.get(GPU_RESOURCE, "0"))
    return NodeSpec(
        name=(node.get("metadata") or {}).get("name", ""),
        cpu=parse_cpu(str(allocatable.get("cpu", "0"))) or 0.0,
        memory_bytes=parse_memory(str(allocatable.get("memory", "0"))) or 0,
        gpus=int(gpus) if gpus.isdigit() else 0,
    )


NODE_LIFECYCLE_TAINTS = "node.kubernetes.io/"
"""Taints the node controller sets by itself (``not-ready``, ``unreachable``, pressure):
Kubernetes evicts by the pods' tolerations of those (300 s by default, none while every node
is down), so Stride leaves them to it."""


def evicting(node: dict[str, Any]) -> bool:
    """Cordoned (an operator's ``kubectl cordon`` or ``drain``, or Stride's drain) or
    tainted ``NoExecute`` by someone (a ``node.kubernetes.io/`` taint is Kubernetes' own,
    :data:`NODE_LIFECYCLE_TAINTS`): Stride's pods there are evicted and relaunched
    elsewhere. A node only tainted ``NoSchedule`` or not Ready keeps its pods: a heartbeat
    late by a second must not move a job."""
    spec = node.get("spec") or {}
    return bool(spec.get("unschedulable")) or any(
        taint.get("effect") == "NoExecute"
        and not str(taint.get("key", "")).startswith(NODE_LIFECYCLE_TAINTS)
        for taint in spec.get("taints") or []
    )


def drained(node: dict[str, Any]) -> bool:
    """Cordoned, tainted against new pods, or not Ready: no new pod goes there."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return True
    if any(taint.get("effect") in DRAINING_EFFECTS for taint in spec.get("taints") or []):
        return True
    conditions = (node.get("status") or {}).get("conditions") or []
    return not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def cordon_patch(drain: bool) -> dict[str, Any]:
    """The patch that cordons a node (or uncordons it)."""
    return {"spec": {"unschedulable": True if drain else None}}
