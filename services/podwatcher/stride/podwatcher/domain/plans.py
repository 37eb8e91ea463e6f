"""What a valid resource plan is, and which plan of a job wins.

Plans reach the podwatcher over the bus, where redelivery and reordering are normal
(DLRover sec. 5.1, DLRover-RM sec. 5.2: the plan sent last is the one to apply). Each plan
carries a per-job version that only grows, so the rule is simple: **the highest version
wins**. A plan whose version is not above the newest one recorded for its job is stale (or
a duplicate) and is ignored. Whatever order a set of versions arrives in, the newest
recorded is their maximum (:func:`newest_after`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from stride.runtime.errors import InvalidArgument

MAX_JOB_ID_LENGTH = 64
"""Job ids name pods and subjects; admission makes them far shorter than this."""


class Role(Enum):
    """The role a pod plays in a job; ``UNSPECIFIED`` is never valid in a plan."""

    UNSPECIFIED = "UNSPECIFIED"
    PS = "PS"
    WORKER = "WORKER"
    DATA_WORKER = "DATA_WORKER"
    CHIEF = "CHIEF"


@dataclass(frozen=True)
class PodOverride:
    """A per-pod exception to its role's size (e.g. a bigger replacement for a hot PS).

    Zero cpu or memory keeps the role's value for that resource.
    """

    index: int
    cpu: float
    memory_bytes: int


@dataclass(frozen=True)
class RoleResources:
    """How many pods of one role, and how big each one is."""

    role: Role
    count: int
    cpu: float
    memory_bytes: int
    overrides: tuple[PodOverride, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A versioned resource plan for one job."""

    job_id: str
    version: int
    roles: tuple[RoleResources, ...] = field(default_factory=tuple)
    reason: str = ""
    algorithm: str = ""


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def _validate_role(position: int, resources: RoleResources, seen: set[Role]) -> None:
    path = f"roles[{position}]"
    if resources.role is Role.UNSPECIFIED:
        known = ", ".join(role.value for role in Role if role is not Role.UNSPECIFIED)
        raise InvalidArgument(f"{path}.role", f"must be one of {known}")
    if resources.role in seen:
        raise InvalidArgument(f"{path}.role", f"{resources.role.value} is listed twice")
    seen.add(resources.role)
    if resources.count < 0:
        raise InvalidArgument(f"{path}.count", f"must not be negative, got {resources.count}")
    if resources.count == 0:
        return
    if not _positive(resources.cpu):
        raise InvalidArgument(
            f"{path}.cpu", f"must be positive when count > 0, got {resources.cpu}"
        )
    if resources.memory_bytes <= 0:
        raise InvalidArgument(
            f"{path}.memory_bytes",
            f"must be positive when count > 0, got {resources.memory_bytes}",
        )
    indexes: set[int] = set()
    for number, override in enumerate(resources.overrides):
        where = f"{path}.overrides[{number}]"
        if not 0 <= override.index < resources.count:
            raise InvalidArgument(
                f"{where}.index", f"must be in 0..{resources.count - 1}, got {override.index}"
            )
        if override.index in indexes:
            raise InvalidArgument(f"{where}.index", f"pod {override.index} is overridden twice")
        indexes.add(override.index)
        if not (math.isfinite(override.cpu) and override.cpu >= 0):
            raise InvalidArgument(f"{where}.cpu", f"must not be negative, got {override.cpu}")
        if override.memory_bytes < 0:
            raise InvalidArgument(
                f"{where}.memory_bytes", f"must not be negative, got {override.memory_bytes}"
            )


def validate_plan(plan: Plan) -> None:
    """Raise :class:`InvalidArgument` naming the first bad field of ``plan``.

    A plan needs a job id and a version of at least 1. Every role is specified and listed
    once, its count is not negative, and a role with pods has positive, finite CPU and
    positive memory. Overrides name a pod of the role once and are not negative.
    """
    if not plan.job_id:
        raise InvalidArgument("job_id", "is required")
    if len(plan.job_id) > MAX_JOB_ID_LENGTH:
        raise InvalidArgument("job_id", f"must be at most {MAX_JOB_ID_LENGTH} characters")
    if plan.version < 1:
        raise InvalidArgument("version", f"must be at least 1, got {plan.version}")
    seen: set[Role] = set()
    for position, resources in enumerate(plan.roles):
        _validate_role(position, resources, seen)


class Arrival(Enum):
    """What a plan's version means given the newest version recorded for its job."""

    NEWER = "newer"
    """Above the newest: record it; it is the plan to apply now."""
    DUPLICATE = "duplicate"
    """The newest version again (a redelivery): nothing to do."""
    STALE = "stale"
    """Below the newest: overtaken by a later plan; ignore it."""


def classify_arrival(version: int, newest: int | None) -> Arrival:
    """Whether a plan of ``version`` is newer than ``newest`` (None: no plan yet)."""
    if newest is None or version > newest:
        return Arrival.NEWER
    if version == newest:
        return Arrival.DUPLICATE
    return Arrival.STALE


def newest_after(versions: Iterable[int], newest: int | None = None) -> int | None:
    """The newest recorded version after plans of ``versions`` arrive in that order."""
    for version in versions:
        if classify_arrival(version, newest) is Arrival.NEWER:
            newest = version
    return newest
