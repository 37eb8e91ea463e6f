"""What one user may submit (pure): the spec fields that grant power, and the default cap
on a user's active jobs (issue 37).

Two fields of a spec hand a job more than its fair turn: ``simulated: true`` holds a share
of the cluster and runs no pods (``stride loadgen`` and replays play its agents), and a
``priority`` above normal preempts other users' jobs. Any user could set both, so admission
refuses them unless the submitter may: an admin, or a user bound by a quota that grants
them (:attr:`~stride.admission.domain.quotas.Quota.max_priority`,
:attr:`~stride.admission.domain.quotas.Quota.allow_simulated`).

And with no quota set, one user could fill the books: every user's jobs are capped at a
default number active (admitted or queued) at once, unless a quota of their own
(``user:<name>``) sets ``max_active_jobs``. The submitter is the verified identity (the
caller's token), never a field of the spec.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stride.admission.domain.quotas import DEFAULT_CLASS, Quota
from stride.vocabulary.jobspec import PRIORITY_BY_NUMBER, Priority

_RANK = {Priority.LOW: 0, Priority.NORMAL: 1, Priority.HIGH: 2}


@dataclass(frozen=True)
class Submitter:
    """Who submits a job, as verified: the user whose job it is, and whether the caller
    is trusted with every field and exempt from the default limits (an admin, or nobody
    verified at all in plain text, where every caller is)."""

    user: str
    trusted: bool


@dataclass(frozen=True)
class Refusal:
    """Why a submission is refused: the field it names and what is wrong."""

    field: str
    problem: str


def user_class(binding: Iterable[Quota]) -> Priority:
    """The highest priority class a user bound by ``binding`` may ask for."""
    granted = [q.max_priority for q in binding if q.max_priority is not None]
    return max([DEFAULT_CLASS, *granted], key=_RANK.__getitem__)


def privilege_refusal(
    submitter: Submitter, priority: int, simulated: bool, binding: Iterable[Quota]
) -> Refusal | None:
    """Why ``submitter`` may not submit a job of ``priority`` (its wire number) or
    ``simulated``, given the quotas ``binding`` them; None if they may. An unknown
    priority number passes here: the spec's validation names it."""
    if submitter.trusted:
        return None
    quotas = tuple(binding)
    user = submitter.user
    if simulated and not any(q.allow_simulated for q in quotas):
        return Refusal(
            "spec.simulated",
            f"user {user!r} may not submit simulated jobs (they hold a share of the cluster "
            "and run no pods): an admin may, or a user whose quota sets allow_simulated "
            f"(stride quota set user:{user} --allow-simulated)",
        )
    asked = PRIORITY_BY_NUMBER.get(priority)
    allowed = user_class(quotas)
    if asked is not None and _RANK[asked] > _RANK[allowed]:
        return Refusal(
            "spec.priority",
            f"{asked.value} is above user {user!r}'s class ({allowed.value}): an admin may "
            f"submit it, or a user whose quota sets max_priority {asked.value} "
            f"(stride quota set user:{user} --max-priority {asked.value})",
        )
    return None


def active_cap(user: str, quotas: Iterable[Quota], default: int) -> int:
    """How many active jobs ``user`` may hold under the default cap: 0 (no default cap)
    when their own quota sets ``max_active_jobs`` (that quota is checked instead) or the
    default is off."""
    own = f"user:{user}"
    if any(q.scope == own and q.max_active_jobs for q in quotas):
        return 0
    return default


def over_active_cap(user: str, active: int, cap: int, setting: str) -> Refusal | None:
    """Why one more job of ``user``, who holds ``active`` jobs, breaks the default ``cap``
    (named by its ``setting``), or None."""
    if not cap or active < cap:
        return None
    return Refusal(
        "max_active_jobs",
        f"user {user!r} holds {active} active (admitted or queued) jobs, at the default "
        f"limit of {cap} a user ({setting}); submit again when one of them ends, or ask an "
        f"admin for a quota (stride quota set user:{user} --max-active-jobs N)",
    )
