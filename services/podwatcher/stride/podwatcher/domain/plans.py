"""What a valid resource plan is, and which plan of a job wins.

Plans reach the podwatcher over the bus, where redelivery and reordering are normal
(DLRover sec. 5.1, DLRover-RM sec. 5.2: the plan sent last is the one to apply). Each plan
carries a per-job version that only grows, so the rule is simple: **the highest version
wins**. A plan whose version is not above the newest one recorded for its job is stale (or
a duplicate) and is ignored. Whatever order a set of versions arrives in, the newest
recorded is their maximum (:func:`newest_after`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from stride.runtime.errors import InvalidArgument
from stride.vocabulary import Role, check_cpu, check_job_id, check_memory_bytes, check_pod_count


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


def _validate_role(position: int, resources: RoleResources, seen: set[Role]) -> None:
    path = f"roles[{position}]"
    if resources.role in seen:
        raise InvalidArgument(f"{path}.role", f"{resources.role.value} is listed twice")
    seen.add(resources.role)
    check_pod_count(resources.count, f"{path}.count", raise_as=InvalidArgument)
    if resources.count == 0:
        return
    check_cpu(resources.cpu, f"{path}.cpu", positive=True, raise_as=InvalidArgument)
    check_memory_bytes(
        resources.memory_bytes, f"{path}.memory_bytes", positive=True, raise_as=InvalidArgument
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
        # Zero keeps the role's size, so an override's amounts need not be positive.
        check_cpu(override.cpu, f"{where}.cpu", raise_as=InvalidArgument)
        check_memory_bytes(override.memory_bytes, f"{where}.memory_bytes", raise_as=InvalidArgument)


def validate_plan(plan: Plan) -> None:
    """Raise :class:`InvalidArgument` naming the first bad field of ``plan``.

    A plan needs a valid job id (:func:`stride.vocabulary.check_job_id`) and a version of at
    least 1. Every role is listed once (the adapter has already refused an unspecified
    one), its pod count is within the vocabulary's bounds, and a role with pods has a
    positive amount of CPU and memory. Overrides name a pod of the role once and their
    amounts are not negative.
    """
    check_job_id(plan.job_id, raise_as=InvalidArgument)
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
