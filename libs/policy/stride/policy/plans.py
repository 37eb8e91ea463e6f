"""Resource plans as plain values: how many pods of each role a job gets, and their sizes.

A :class:`Plan` here has no job id and no version. The optimizer numbers the plans of a job
as it publishes them; algorithms (and ``stride sim``) only propose them. A plan validates
itself when built, so an algorithm cannot hand out a plan a pod backend would choke on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from stride.policy.errors import InvalidPlan
from stride.vocabulary import (
    MAX_MEMORY_BYTES,
    MAX_PODS_PER_ROLE,
    InvalidWord,
    Role,
    check_cpu,
    check_memory_bytes,
    check_pod_count,
)

# Role and the limits are the vocabulary's, defined once for every service; re-exported
# here because the algorithms and ``stride sim`` import them with the plan types.
__all__ = [
    "MAX_MEMORY_BYTES",
    "MAX_PODS_PER_ROLE",
    "Plan",
    "PodOverride",
    "Role",
    "RoleResources",
]


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@contextmanager
def _sizing(role: Role) -> Iterator[None]:
    """Reports the vocabulary's refusal of an amount as :class:`InvalidPlan`, naming the
    role the pods belong to."""
    try:
        yield
    except InvalidWord as error:
        raise InvalidPlan(error.field, f"{error.problem} ({role.value})") from None


@dataclass(frozen=True)
class PodOverride:
    """One pod that differs from its role's default size, e.g. a bigger replacement for a hot
    PS (DLRover sec. 4.2, "Hot parameter server")."""

    index: int
    """The pod's index within its role, 0-based."""
    cpu: float
    """CPU cores of this pod."""
    memory_bytes: int
    """Memory of this pod in bytes."""


@dataclass(frozen=True)
class RoleResources:
    """All pods of one role: how many, and how big each one is unless overridden."""

    role: Role
    count: int
    """Number of pods; zero means the role has none."""
    cpu: float
    """CPU cores per pod."""
    memory_bytes: int
    """Memory per pod in bytes."""
    overrides: tuple[PodOverride, ...] = ()
    """Pods whose size differs from ``cpu`` and ``memory_bytes``, at most one per index."""

    def __post_init__(self) -> None:
        if not isinstance(self.role, Role):
            allowed = ", ".join(r.value for r in Role)
            raise InvalidPlan("role", f"must be one of {allowed}, got {self.role!r}")
        with _sizing(self.role):
            check_pod_count(self.count)
            check_cpu(self.cpu, positive=True)
            check_memory_bytes(self.memory_bytes, positive=True)
        object.__setattr__(self, "overrides", tuple(self.overrides))
        seen: set[int] = set()
        for position, override in enumerate(self.overrides):
            path = f"overrides[{position}]"
            if not isinstance(override, PodOverride):
                raise InvalidPlan(path, f"must be a PodOverride, got {type(override).__name__}")
            if not _is_integer(override.index) or not 0 <= override.index < self.count:
                raise InvalidPlan(
                    f"{path}.index",
                    f"must be a pod index in 0..{self.count - 1}, got {override.index!r} "
                    f"({self.role.value} has {self.count} pods)",
                )
            if override.index in seen:
                raise InvalidPlan(f"{path}.index", f"pod {override.index} is overridden twice")
            seen.add(override.index)
            with _sizing(self.role):
                check_cpu(override.cpu, f"{path}.cpu", positive=True)
                check_memory_bytes(override.memory_bytes, f"{path}.memory_bytes", positive=True)

    def pod_sizes(self) -> list[tuple[float, int]]:
        """``(cpu, memory_bytes)`` of every pod of the role, in index order."""
        by_index = {override.index: override for override in self.overrides}
        sizes: list[tuple[float, int]] = []
        for index in range(self.count):
            override = by_index.get(index)
            if override is None:
                sizes.append((self.cpu, self.memory_bytes))
            else:
                sizes.append((override.cpu, override.memory_bytes))
        return sizes


@dataclass(frozen=True)
class Plan:
    """A proposed resource plan for one job: resources per role, and why.

    A role that is not listed has no pods. Each role appears at most once.
    """

    roles: tuple[RoleResources, ...]
    reason: str
    """Why the plan was made, in words an operator can act on, e.g. "cold start"."""
    algorithm: str
    """The algorithm that produced it, ``name/version``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "roles", tuple(self.roles))
        seen: set[Role] = set()
        for position, resources in enumerate(self.roles):
            if not isinstance(resources, RoleResources):
                raise InvalidPlan(
                    f"roles[{position}]", f"must be a RoleResources, got {type(resources).__name__}"
                )
            if resources.role in seen:
                raise InvalidPlan(
                    f"roles[{position}].role", f"{resources.role.value} is listed twice"
                )
            seen.add(resources.role)
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise InvalidPlan("reason", "is required (say why the plan was made)")
        if not isinstance(self.algorithm, str) or not self.algorithm.strip():
            raise InvalidPlan("algorithm", "is required (name/version of what made the plan)")

    def role(self, role: Role) -> RoleResources | None:
        """The resources of ``role``, or None if the plan gives it no entry."""
        return next((resources for resources in self.roles if resources.role is role), None)

    def pod_count(self, role: Role | None = None) -> int:
        """Pods of ``role``, or of all roles."""
        return sum(r.count for r in self.roles if role is None or r.role is role)

    def total_cpu(self) -> float:
        """CPU cores of all pods, overrides included."""
        return sum(cpu for resources in self.roles for cpu, _ in resources.pod_sizes())

    def total_memory_bytes(self) -> int:
        """Memory of all pods in bytes, overrides included."""
        return sum(memory for resources in self.roles for _, memory in resources.pod_sizes())
