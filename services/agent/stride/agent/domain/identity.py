"""Who this agent speaks for: a job, a pod, and the pod's role in the job.

The words themselves (job ids, pod names, roles) are the shared vocabulary's; this module
only names what the agent reads from its settings.
"""

from __future__ import annotations

from stride.vocabulary import JOB_ID_PATTERN, POD_NAME_PATTERN, InvalidWord, Role

__all__ = ["JOB_ID_PATTERN", "POD_NAME_PATTERN", "Role", "parse_role"]


def parse_role(value: str) -> Role:
    """A role from its name: ``worker``, ``ps``, ``data-worker`` or ``chief``; also
    ``data_worker`` and the proto enum names (``ROLE_WORKER``), in any case. Raises
    ValueError naming the choices."""
    try:
        return Role.parse(value)
    except InvalidWord as error:
        raise ValueError(error.problem) from None
