"""The seam between the podwatcher and whatever runs pods (DLRover sec. 5.1, DLRover-RM 5.2).

The podwatcher records plans and asks a :class:`Backend` to apply them; the backend owns
the pods. The local backend runs pods as supervised processes on this machine, the
Kubernetes backend as pods with an agent sidecar. Both speak only domain types, so the
plan rules, the API and the tests do not change with the backend.
"""

from __future__ import annotations

from typing import Protocol

from stride.podwatcher.domain.cluster import Application, Node, Pod
from stride.podwatcher.domain.plans import Plan


class Backend(Protocol):
    """Applies plans and reports pods and nodes."""

    name: str
    """Short name for logs and settings (``local``, ``kubernetes``)."""

    async def apply(self, plan: Plan) -> Application:
        """Make the job's pods match ``plan`` (the newest recorded) and say how far it got.

        Called once per accepted plan, after it is stored as RECORDED. An exception is
        recorded as FAILED with its message.
        """
        ...

    async def list_pods(self, job_id: str) -> list[Pod]:
        """The job's pods, in role then index order."""
        ...

    async def nodes(self) -> list[Node]:
        """The machines pods can be placed on."""
        ...
