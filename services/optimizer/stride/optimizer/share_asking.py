"""The port share requests go through (admission's ``RequestShare``; see
:mod:`stride.optimizer.domain.requests`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from stride.events.v1 import job_pb2
from stride.policy.contention import ShareRequest


@dataclass(frozen=True)
class ShareAnswer:
    """Admission's answer to a share request."""

    granted: bool
    queued: bool
    reason: str
    share: job_pb2.JobShare | None = None
    """The job's share after the decision (the raised one when granted)."""


class ShareAsker(Protocol):
    """Where share requests go (admission's API)."""

    async def ask(self, plan_version: int, request: ShareRequest) -> ShareAnswer: ...
