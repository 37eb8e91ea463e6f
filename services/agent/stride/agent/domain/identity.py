"""Who this agent speaks for: a job, a pod, and the pod's role in the job."""

from __future__ import annotations

import re
from enum import Enum

JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
"""Job ids are NATS subject tokens (``stride.metrics.v1.<job_id>.steps``), so no dots."""
POD_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
"""Kubernetes pod names are DNS subdomains of up to 253 characters."""


class Role(Enum):
    """The role a pod plays in a job (mirrors ``stride.events.v1.Role``)."""

    PS = "ps"
    WORKER = "worker"
    DATA_WORKER = "data-worker"
    CHIEF = "chief"


def parse_role(value: str) -> Role:
    """A role from its name: ``worker``, ``ps``, ``data-worker`` or ``chief``.

    Also accepts ``data_worker`` and the proto enum names (``ROLE_WORKER``), in any case,
    so the pod spec may use either spelling.
    """
    name = value.strip().lower().removeprefix("role_").replace("_", "-")
    for role in Role:
        if role.value == name:
            return role
    choices = ", ".join(role.value for role in Role)
    raise ValueError(f"{value!r} is not a role; use one of {choices}")
