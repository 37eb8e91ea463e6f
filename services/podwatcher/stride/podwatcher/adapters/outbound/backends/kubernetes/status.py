"""How a training pod ended, read from its status (Kubernetes' own words).

The reasons are the ones the pod watcher records on the pod-failed event
(``stride.events.v1.PodFailureReason``): ``OOMKilled`` (a container's last state),
``Evicted`` (the kubelet under pressure, the Eviction API, a NoExecute taint),
``Preempted`` (the scheduler made room for a pod of higher priority), ``ImagePullBackOff``
and ``CrashLoopBackOff`` (a container waiting for good: the pod never runs, so the pod
watcher ends it), ``Error`` (a non-zero exit) and ``Succeeded``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
DISRUPTIONS = {
    "PreemptionByScheduler": "Preempted",
    "PreemptionByKubeScheduler": "Preempted",
    "EvictionByEvictionAPI": "Evicted",
    "DeletionByTaintManager": "Evicted",
    "TerminationByKubelet": "Evicted",
}
"""A DisruptionTarget condition's reason, and what the pod watcher calls it."""


@dataclass(frozen=True)
class Ending:
    """Why a pod is over: a reason of the module docstring, its exit code, a message."""

    reason: str
    exit_code: int | None
    message: str


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def _disruption(pod: dict[str, Any]) -> Ending | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            reason = DISRUPTIONS.get(condition.get("reason", ""), "Evicted")
            return Ending(reason, None, condition.get("message") or condition.get("reason", ""))
    return None


def _terminated(pod: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The trainer's termination if it has one, else any container's."""
    found = None
    for status in _containers(pod):
        state = (status.get("state") or {}).get("terminated") or (
            status.get("lastState") or {}
        ).get("terminated")
        if state:
            if status.get("name") == "trainer":
                return status["name"], state
            found = found or (status.get("name", ""), state)
    return found


def ending(pod: dict[str, Any]) -> Ending | None:
    """How the pod ended, or None while it is pending or running normally."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    for container in _containers(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason", "")
        if reason in PULL_FAILURES:
            return Ending("ImagePullBackOff", None, waiting.get("message") or reason)
        if reason == "CrashLoopBackOff":
            return Ending("CrashLoopBackOff", None, waiting.get("message") or reason)
    if phase not in ("Failed", "Succeeded"):
        return None
    if status.get("reason") == "Evicted":
        return Ending("Evicted", None, status.get("message") or "evicted by the kubelet")
    disrupted = _disruption(pod)
    terminated = _terminated(pod)
    if terminated is not None and terminated[1].get("reason") == "OOMKilled":
        name, state = terminated
        return Ending("OOMKilled", state.get("exitCode", 137), f"{name}: OOMKilled")
    if disrupted is not None:
        return disrupted
    if phase == "Succeeded":
        return Ending("Succeeded", 0, "")
    if terminated is not None:
        name, state = terminated
        message = state.get("message") or state.get("reason") or "exited"
        return Ending("Error", state.get("exitCode"), f"{name}: {message}")
    return Ending("Error", None, status.get("message") or status.get("reason") or "failed")


def deleted_ending(pod: dict[str, Any], by_us: bool) -> Ending:
    """A pod gone from the API: ``Deleted`` when the pod watcher deleted it, else the
    disruption that removed it (an eviction through the API, a preemption), else an
    ``Error``: something outside Stride deleted a pod its plan still needs, so it is
    relaunched."""
    if by_us:
        return Ending("Deleted", None, "deleted by the pod watcher")
    ended = ending(pod)
    if ended is not None and ended.reason != "Succeeded":
        return ended
    disrupted = _disruption(pod)
    if disrupted is not None:
        return disrupted
    return Ending("Error", None, "the pod was deleted outside Stride")


def ready(pod: dict[str, Any]) -> bool:
    """Whether the pod's Ready condition is true."""
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in (pod.get("status") or {}).get("conditions") or []
    )
