"""How a training pod ended, read from Kubernetes pod status (the backend's words)."""

from __future__ import annotations

from typing import Any

from stride.podwatcher.adapters.outbound.backends.kubernetes import nodes, status


def pod(phase: str = "Running", **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"phase": phase, **fields}}


def terminated(reason: str, code: int, name: str = "trainer") -> dict[str, Any]:
    return {"name": name, "state": {"terminated": {"reason": reason, "exitCode": code}}}


def test_running_and_pending_pods_have_not_ended() -> None:
    assert status.ending(pod()) is None
    assert status.ending(pod("Pending")) is None


def reason(item: dict[str, Any]) -> str:
    ended = status.ending(item)
    assert ended is not None
    return ended.reason


def test_each_reason() -> None:
    oom = status.ending(pod("Failed", containerStatuses=[terminated("OOMKilled", 137)]))
    assert oom == status.Ending("OOMKilled", 137, "trainer: OOMKilled")
    evicted = status.ending(pod("Failed", reason="Evicted", message="low on memory"))
    assert evicted == status.Ending("Evicted", None, "low on memory")
    preempted = pod(
        "Failed",
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
        ],
    )
    assert status.ending(preempted) == status.Ending("Preempted", None, "PreemptionByScheduler")
    pull = {"name": "trainer", "state": {"waiting": {"reason": "ErrImagePull"}}}
    assert reason(pod("Pending", containerStatuses=[pull])) == "ImagePullBackOff"
    crash = {"name": "agent", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    assert reason(pod(containerStatuses=[crash])) == "CrashLoopBackOff"
    error = status.ending(pod("Failed", containerStatuses=[terminated("Error", 2)]))
    assert error == status.Ending("Error", 2, "trainer: Error")
    assert status.ending(pod("Succeeded")) == status.Ending("Succeeded", 0, "")


def test_the_trainers_end_is_the_pods_whatever_the_sidecar_did() -> None:
    both = [terminated("Error", 1, "agent"), terminated("OOMKilled", 137)]
    assert reason(pod("Failed", containerStatuses=both)) == "OOMKilled"


def test_a_pod_gone_from_the_api() -> None:
    assert status.deleted_ending(pod(), by_us=True).reason == "Deleted"
    outside = status.deleted_ending(pod(), by_us=False)
    assert outside.reason == "Error" and "outside Stride" in outside.message
    taint = pod(
        conditions=[
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
        ]
    )
    assert status.deleted_ending(taint, by_us=False).reason == "Evicted"


def test_nodes_drained_for_placement_and_emptied() -> None:
    ready = {"conditions": [{"type": "Ready", "status": "True"}]}
    plain = {"metadata": {"name": "n"}, "spec": {}, "status": {**ready, "allocatable": {
        "cpu": "7500m", "memory": "31Gi", "nvidia.com/gpu": "8"}}}  # fmt: skip
    spec = nodes.node_spec(plain)
    assert (spec.cpu, spec.memory_bytes, spec.gpus) == (7.5, 31 * 1024**3, 8)
    assert not nodes.drained(plain) and not nodes.evicting(plain)
    cordoned = {**plain, "spec": {"unschedulable": True}}
    assert nodes.drained(cordoned) and nodes.evicting(cordoned)
    no_schedule = {**plain, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
    assert nodes.drained(no_schedule) and not nodes.evicting(no_schedule)
    no_execute = {**plain, "spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}
    assert nodes.evicting(no_execute)
    not_ready = {**plain, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert nodes.drained(not_ready) and not nodes.evicting(not_ready)
    # The node controller's own NoExecute taints are Kubernetes' to act on (tolerations).
    unreachable = {**plain, "spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}}  # fmt: skip
    assert nodes.drained(unreachable) and not nodes.evicting(unreachable)
