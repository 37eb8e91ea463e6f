"""How far a plan has been applied, and the phases of a pod."""

from __future__ import annotations

from enum import Enum


class PlanState(Enum):
    """How far applying a recorded plan has got."""

    RECORDED = "RECORDED"
    """Stored; no pod changed for it yet."""
    APPLYING = "APPLYING"
    """The backend is creating, resizing or deleting pods for it."""
    APPLIED = "APPLIED"
    """Every pod matches the plan."""
    FAILED = "FAILED"
    """The backend could not apply it; the message says why."""


class PodPhase(Enum):
    """The phase of a pod."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DELETED = "DELETED"
