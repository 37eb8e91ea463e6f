"""Pods, nodes and how far a plan has been applied: what backends report in domain terms."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from stride.vocabulary import Role


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


@dataclass(frozen=True)
class Pod:
    """One pod of a job as the backend sees it."""

    name: str
    role: Role
    index: int
    phase: PodPhase
    cpu: float
    memory_bytes: int
    node: str
    plan_version: int


@dataclass(frozen=True)
class Node:
    """A machine the backend can place pods on."""

    name: str
    cpu: float
    memory_bytes: int
    devices: int = 0


@dataclass(frozen=True)
class Application:
    """What a backend did with a plan: the plan's new state, and why if it failed."""

    state: PlanState
    message: str = ""
