"""Local pods: supervised process groups under cgroup (or rlimit) limits, re-adoptable."""

from stride.podwatcher.adapters.outbound.backends.localpods.cgroups import Enforcement
from stride.podwatcher.adapters.outbound.backends.localpods.runtime import (
    ExitReason,
    Limits,
    LocalPods,
    PodExit,
    PodLaunch,
    PodStatus,
    ProcessSpec,
    ResizeRefused,
    Usage,
)

__all__ = [
    "Enforcement",
    "ExitReason",
    "Limits",
    "LocalPods",
    "PodExit",
    "PodLaunch",
    "PodStatus",
    "ProcessSpec",
    "ResizeRefused",
    "Usage",
]
