"""Stride's shared words, spelled once: pod roles, job ids, names and resource amounts.

Every service, the policy library and the CLI say "a PS", "a job id" and "4 cores and
8 GiB" the same way because they import them from here. Pure on purpose (no I/O, no
generated protos), so domain and policy code may use it; the protobuf enums are mapped to
these values at each service's adapter edge.

Each ``check_*`` function raises :class:`InvalidWord` by default. A caller with an error
type of its own (a service's ``InvalidArgument``, the policy's ``InvalidPlan``) passes it as
``raise_as``, so the rule and its message stay here while the error keeps the caller's type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeGuard

__all__ = [
    "JOB_ID_PATTERN",
    "MAX_CPU_CORES",
    "MAX_DEVICES",
    "MAX_JOB_ID_LENGTH",
    "MAX_MEMORY_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_PODS_PER_ROLE",
    "MAX_POD_NAME_LENGTH",
    "NAME_PATTERN",
    "POD_NAME_PATTERN",
    "InvalidWord",
    "RaiseAs",
    "Resources",
    "Role",
    "check_cpu",
    "check_job_id",
    "check_memory_bytes",
    "check_name",
    "check_pod_count",
    "check_pod_name",
    "echo",
]

# The patterns end in \Z, not $: $ also matches before a final newline, which would let
# "job-1\n" through as a job id (and into a subject, a pod name or a directory name).

MAX_JOB_ID_LENGTH = 64
"""Job ids name pods and subject tokens; admission makes them far shorter (``job-`` + 12 hex)."""

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")
"""A job id is one NATS subject token (``stride.plans.v1.<job_id>``), part of pod names and
a directory name (checkpoints): letters, digits, '_' and '-', no dots, wildcards or spaces,
at most :data:`MAX_JOB_ID_LENGTH` characters, starting with a letter or digit."""

MAX_NAME_LENGTH = 128
"""Longest user, job, dataset or checkpoint name."""

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
"""User, job, dataset and checkpoint names: 1-128 letters, digits, '.', '_' or '-', starting
with a letter or digit (so never ``.`` or ``..``: a name is safe as a directory name)."""

MAX_POD_NAME_LENGTH = 253
"""Kubernetes pod names are DNS subdomains of up to 253 characters."""

POD_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")
"""Pod names, which also name a job's workers (at the dispatcher, on every metric)."""

ECHO_LIMIT = 40
"""How much of a bad value an error message repeats: enough to recognise it, never a
megabyte of someone's payload in a log line."""


class InvalidWord(ValueError):
    """A value that is not a valid word of the vocabulary; ``field`` names where it was."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


RaiseAs = Callable[[str, str], Exception]
"""Builds the error a check raises from ``(field, problem)``: :class:`InvalidWord`, or a
caller's own type with the same two arguments (``stride.runtime.errors.InvalidArgument``)."""


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 1]}… ({len(str(value))} characters)"


def _check_pattern(
    value: str, field: str, pattern: re.Pattern[str], rule: str, raise_as: RaiseAs
) -> str:
    if not value:
        raise raise_as(field, "is required")
    if not isinstance(value, str) or not pattern.match(value):
        raise raise_as(field, f"{echo(value)} must be {rule}, starting with a letter or digit")
    return value


def check_job_id(value: str, field: str = "job_id", *, raise_as: RaiseAs = InvalidWord) -> str:
    """``value`` if it is a valid job id (:data:`JOB_ID_PATTERN`); else raises ``raise_as``
    naming ``field``."""
    rule = f"1-{MAX_JOB_ID_LENGTH} letters, digits, '_' or '-'"
    return _check_pattern(value, field, JOB_ID_PATTERN, rule, raise_as)


def check_name(value: str, field: str, *, raise_as: RaiseAs = InvalidWord) -> str:
    """``value`` if it is a valid name (:data:`NAME_PATTERN`); else raises ``raise_as``."""
    rule = f"1-{MAX_NAME_LENGTH} letters, digits, '.', '_' or '-'"
    return _check_pattern(value, field, NAME_PATTERN, rule, raise_as)


def check_pod_name(value: str, field: str = "pod_name", *, raise_as: RaiseAs = InvalidWord) -> str:
    """``value`` if it is a valid pod (worker) name (:data:`POD_NAME_PATTERN`); else raises
    ``raise_as``."""
    rule = f"1-{MAX_POD_NAME_LENGTH} letters, digits, '.', '_' or '-'"
    return _check_pattern(value, field, POD_NAME_PATTERN, rule, raise_as)


class Role(Enum):
    """The role a pod plays in a training job (``stride.events.v1.Role`` on the wire)."""

    PS = "ps"
    """Parameter server: holds a partition of the model parameters (DLRover sec. 2)."""
    WORKER = "worker"
    """Training worker: computes gradients."""
    DATA_WORKER = "data_worker"
    """Data worker: preprocesses samples for training workers (GoldMiner sec. 3)."""
    CHIEF = "chief"
    """Coordinates training (TensorFlow's ParameterServerStrategy needs one)."""

    @classmethod
    def parse(cls, value: str, field: str = "role") -> Role:
        """A role from any common spelling: ``ps``, ``data-worker``, ``data_worker``,
        ``ROLE_WORKER`` (the proto name), in any case. Raises :class:`InvalidWord`."""
        name = value.strip().lower().removeprefix("role_").replace("-", "_")
        for role in cls:
            if role.value == name:
                return role
        choices = ", ".join(role.value for role in cls)
        raise InvalidWord(field, f"{echo(value)} is not a role; use one of {choices}")


MAX_PODS_PER_ROLE = 100_000
"""Far beyond any cluster a job runs on, and well inside the 32-bit count of the wire form;
a larger count is an algorithm's bug, caught before a pod backend tries to start it."""
MAX_CPU_CORES = 1_000_000.0
"""Far beyond any pod or cluster; a larger number is a bug or an attack, not a request."""
MAX_MEMORY_BYTES = 2**53
"""8 PiB: the largest integer a JSON number (and a protobuf Struct) holds exactly, so an
amount survives the trip through the executor unchanged."""
MAX_DEVICES = 1_000_000
"""Accelerator devices: as far beyond any cluster as :data:`MAX_CPU_CORES`."""


def _whole_number(value: object, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_cpu(
    value: object, field: str = "cpu", *, positive: bool = False, raise_as: RaiseAs = InvalidWord
) -> float:
    """``value`` if it is a finite number of CPU cores in 0..:data:`MAX_CPU_CORES` (above 0
    if ``positive``: a pod that exists needs some CPU); else raises ``raise_as``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_CPU_CORES
        or (positive and value == 0)
    ):
        top = f"{MAX_CPU_CORES:,.0f}"
        rule = (
            f"a positive number of cores up to {top}"
            if positive
            else f"a number of cores in 0..{top}"
        )
        raise raise_as(field, f"must be {rule}, got {echo(value)}")
    return float(value)


def check_memory_bytes(
    value: object,
    field: str = "memory_bytes",
    *,
    positive: bool = False,
    raise_as: RaiseAs = InvalidWord,
) -> int:
    """``value`` if it is a whole number of bytes in 0..:data:`MAX_MEMORY_BYTES` (from 1 if
    ``positive``); else raises ``raise_as``."""
    low = 1 if positive else 0
    if not _whole_number(value, low, MAX_MEMORY_BYTES):
        raise raise_as(
            field,
            f"must be a whole number of bytes in {low}..{MAX_MEMORY_BYTES}, got {echo(value)}",
        )
    return value


def check_pod_count(
    value: object, field: str = "count", *, minimum: int = 0, raise_as: RaiseAs = InvalidWord
) -> int:
    """``value`` if it is a whole number of pods in ``minimum``..:data:`MAX_PODS_PER_ROLE`;
    else raises ``raise_as``."""
    if not _whole_number(value, minimum, MAX_PODS_PER_ROLE):
        raise raise_as(
            field, f"must be a whole number in {minimum}..{MAX_PODS_PER_ROLE}, got {echo(value)}"
        )
    return value


@dataclass(frozen=True)
class Resources:
    """An amount of CPU cores, memory and accelerator devices (a pod's size, a share, a
    node's capacity)."""

    cpu: float = 0.0
    memory_bytes: int = 0
    devices: int = 0

    def __post_init__(self) -> None:
        check_cpu(self.cpu)
        check_memory_bytes(self.memory_bytes)
        if not _whole_number(self.devices, 0, MAX_DEVICES):
            raise InvalidWord(
                "devices", f"must be a whole number in 0..{MAX_DEVICES}, got {echo(self.devices)}"
            )

    def __add__(self, other: Resources) -> Resources:
        return Resources(
            self.cpu + other.cpu,
            self.memory_bytes + other.memory_bytes,
            self.devices + other.devices,
        )

    def fits_in(self, capacity: Resources) -> bool:
        """True if every amount is at most ``capacity``'s."""
        return (
            self.cpu <= capacity.cpu + 1e-9
            and self.memory_bytes <= capacity.memory_bytes
            and self.devices <= capacity.devices
        )
