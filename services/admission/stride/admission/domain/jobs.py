"""What a valid job spec is.

A submitted spec has no resources: Stride picks them. Validation names the first bad field
by its dotted path (``spec.dataset.record_count``), so the CLI and gRPC errors point at the
exact line to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from stride.runtime.errors import InvalidArgument

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ENTRYPOINT_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class Priority(Enum):
    """Scheduling priority of a job."""

    LOW = "low"
    NORMAL = "normal"
    HIGH = "high"


@dataclass(frozen=True)
class JobSpec:
    """The fields of a submitted job that admission reasons about."""

    name: str
    user: str
    model_name: str
    image: str
    entrypoint: str
    dataset_name: str
    record_count: int
    batch_size: int
    max_steps: int
    max_epochs: int
    deadline: datetime | None
    priority: Priority
    hyperparameters: dict[str, str] = field(default_factory=dict)

    @property
    def total_steps(self) -> int:
        """Global steps the job runs: max_steps, or epochs times steps per epoch."""
        if self.max_steps > 0:
            return self.max_steps
        steps_per_epoch = -(-self.record_count // self.batch_size)
        return self.max_epochs * steps_per_epoch


def validate(spec: JobSpec, now: datetime) -> None:
    """Raise :class:`InvalidArgument` naming the first bad field of ``spec``."""
    if not spec.name:
        raise InvalidArgument("spec.name", "is required")
    if not NAME_PATTERN.match(spec.name):
        raise InvalidArgument(
            "spec.name", f"{spec.name!r} must be 1-128 letters, digits, '.', '_' or '-'"
        )
    if not spec.user:
        raise InvalidArgument("spec.user", "is required (quotas are per user)")
    if not NAME_PATTERN.match(spec.user):
        raise InvalidArgument(
            "spec.user", f"{spec.user!r} must be 1-128 letters, digits, '.', '_' or '-'"
        )
    if not spec.model_name:
        raise InvalidArgument("spec.model.name", "is required")
    if bool(spec.image) == bool(spec.entrypoint):
        raise InvalidArgument("spec.model", "set exactly one of image or entrypoint")
    if spec.entrypoint and not ENTRYPOINT_PATTERN.match(spec.entrypoint):
        raise InvalidArgument(
            "spec.model.entrypoint", f"{spec.entrypoint!r} must look like 'package.module:function'"
        )
    if not spec.dataset_name:
        raise InvalidArgument("spec.dataset.name", "is required")
    if spec.record_count <= 0:
        raise InvalidArgument(
            "spec.dataset.record_count",
            "is required and must be positive (sharding and deadlines depend on the dataset size)",
        )
    if spec.batch_size <= 0:
        raise InvalidArgument("spec.batch_size", f"must be positive, got {spec.batch_size}")
    if spec.batch_size > spec.record_count:
        raise InvalidArgument(
            "spec.batch_size",
            f"{spec.batch_size} is larger than the dataset ({spec.record_count} records)",
        )
    if spec.max_steps < 0:
        raise InvalidArgument(
            "spec.termination.max_steps", f"must not be negative, got {spec.max_steps}"
        )
    if spec.max_epochs < 0:
        raise InvalidArgument(
            "spec.termination.max_epochs", f"must not be negative, got {spec.max_epochs}"
        )
    if (spec.max_steps > 0) == (spec.max_epochs > 0):
        raise InvalidArgument("spec.termination", "set exactly one of max_steps or max_epochs")
    if spec.deadline is not None and spec.deadline <= now:
        raise InvalidArgument(
            "spec.deadline",
            f"{spec.deadline.isoformat()} is not in the future (now {now.isoformat()})",
        )
    for key in spec.hyperparameters:
        if not key:
            raise InvalidArgument("spec.hyperparameters", "keys must not be empty")
