"""Quotas of users and teams (pure): what they are, whom they bind, when a job breaks one.

ElasticFlow (sec. 4.4) leaves quotas to the operator, "e.g., set a maximum number of jobs
that can be submitted by each user per day", checked before Algorithm 1 plans the job.
:func:`stride.policy.elasticflow.quotas.quota_violation` is that check, the one
``stride sim`` uses; this module adds the live service's scopes: a quota binds one user
(``user:alice``) or every member of a team (``team:ranking``), and a job must fit every
quota that binds its user. Quotas come from the operator's quotas file and from the admin
API (``SetQuota``, which wins over the file for the same scope).

A team's membership is part of its quota, given by the operator; the user a job belongs to
is its spec's ``user`` (verified identities come with issue 15's tokens).

A quota may also *grant* what a user may not ask for by default (issue 37): a priority
class above normal (``max_priority``) and simulated jobs (``allow_simulated``), which hold
a share of the cluster and run no pods (:mod:`stride.admission.domain.limits` checks them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stride.policy.elasticflow.quotas import DAY_SECONDS, UserQuota, quota_violation
from stride.runtime.errors import InvalidArgument
from stride.vocabulary import InvalidWord, check_name
from stride.vocabulary.jobspec import Priority

SOURCES = ("config", "api")
MAX_MEMBERS = 10_000
MAX_COUNT = 1_000_000
DEFAULT_CLASS = Priority.NORMAL
"""The highest priority class every user may ask for; a quota grants more."""
GRANTABLE = (Priority.HIGH,)
"""The classes a quota's ``max_priority`` may grant (those above :data:`DEFAULT_CLASS`)."""


@dataclass(frozen=True)
class Quota:
    """Limits on one user or one team; 0 means no limit on that count."""

    scope: str
    max_active_jobs: int = 0
    max_submissions: int = 0
    window_seconds: float = DAY_SECONDS
    members: tuple[str, ...] = ()
    source: str = "api"
    max_priority: Priority | None = None
    """The highest priority class its users may ask for (None: :data:`DEFAULT_CLASS`)."""
    allow_simulated: bool = False
    """Whether its users may submit simulated jobs (a share held, no pods run)."""

    @property
    def kind(self) -> str:
        return self.scope.partition(":")[0]

    @property
    def name(self) -> str:
        return self.scope.partition(":")[2]

    def binds(self, user: str) -> bool:
        """Whether a job of ``user`` counts against this quota."""
        return self.name == user if self.kind == "user" else user in self.members

    def users(self) -> tuple[str, ...]:
        """Whose jobs it counts."""
        return (self.name,) if self.kind == "user" else self.members

    def limits(self) -> UserQuota:
        """The policy's form of the limits (the check ``stride sim`` runs)."""
        return UserQuota(self.max_submissions, self.window_seconds, self.max_active_jobs)


def check_scope(scope: str, field: str = "scope") -> str:
    """``scope`` if it is ``user:<name>`` or ``team:<name>``; else InvalidArgument."""
    kind, colon, name = scope.partition(":")
    if not colon or kind not in ("user", "team"):
        raise InvalidArgument(field, f"{scope[:60]!r} is not user:<name> or team:<name>")
    try:
        check_name(name, field)
    except InvalidWord as error:
        raise InvalidArgument(field, f"{scope[:60]!r}: the name {error.problem}") from None
    return scope


def _grants(
    max_priority: object, allow_simulated: object, field: str
) -> tuple[Priority | None, bool]:
    """A quota's grants, checked: the class (a word, "" or None for none) and the flag."""
    if not isinstance(allow_simulated, bool):
        raise InvalidArgument(f"{field}.allow_simulated", "must be true or false")
    if max_priority in (None, ""):
        return None, allow_simulated
    words = ", ".join(p.value for p in GRANTABLE)
    granted = next((p for p in GRANTABLE if p.value == max_priority), None)
    if granted is None:
        raise InvalidArgument(
            f"{field}.max_priority",
            f"{str(max_priority)[:40]!r} cannot be granted: give {words} (every user may ask "
            f"for {DEFAULT_CLASS.value} and below), or nothing",
        )
    return granted, allow_simulated


def make_quota(
    scope: str,
    max_active_jobs: object = 0,
    max_submissions: object = 0,
    window_seconds: object = 0,
    members: Sequence[object] = (),
    source: str = "api",
    field: str = "quota",
    *,
    max_priority: object = None,
    allow_simulated: object = False,
) -> Quota:
    """A checked quota; InvalidArgument names the bad field (under ``field``).
    ``max_priority``: a :class:`Priority` word a quota may grant (:data:`GRANTABLE`)."""
    check_scope(scope, f"{field}.scope")
    granted, simulated = _grants(max_priority, allow_simulated, field)
    counts = {"max_active_jobs": max_active_jobs, "max_submissions": max_submissions}
    for key, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise InvalidArgument(
                f"{field}.{key}", f"must be a whole number from 0 (no limit) to {MAX_COUNT:,}"
            )
    window = window_seconds
    if isinstance(window, bool) or not isinstance(window, int | float) or not math.isfinite(window):
        raise InvalidArgument(f"{field}.window_seconds", "must be a number of seconds")
    if window < 0 or window > 366 * DAY_SECONDS:
        raise InvalidArgument(
            f"{field}.window_seconds", "must be from 0 (one day) to 366 days in seconds"
        )
    if not max_active_jobs and not max_submissions and granted is None and not simulated:
        raise InvalidArgument(
            field,
            "sets no limit and grants nothing: give max_active_jobs, max_submissions, "
            "max_priority or allow_simulated (DeleteQuota removes one)",
        )
    kind = scope.partition(":")[0]
    if kind == "user" and members:
        raise InvalidArgument(f"{field}.members", "only a team has members")
    if kind == "team" and not members:
        raise InvalidArgument(f"{field}.members", "a team needs at least one member")
    if len(members) > MAX_MEMBERS:
        raise InvalidArgument(f"{field}.members", f"at most {MAX_MEMBERS:,} members")
    seen: list[str] = []
    for index, member in enumerate(members):
        if not isinstance(member, str):
            raise InvalidArgument(f"{field}.members[{index}]", "must be a user name")
        try:
            check_name(member, f"{field}.members[{index}]")
        except InvalidWord as error:
            raise InvalidArgument(error.field, error.problem) from None
        if member in seen:
            raise InvalidArgument(f"{field}.members[{index}]", f"{member!r} is listed twice")
        seen.append(member)
    if source not in SOURCES:
        raise InvalidArgument(f"{field}.source", f"must be one of {', '.join(SOURCES)}")
    return Quota(
        scope,
        int(max_active_jobs),  # type: ignore[call-overload]
        int(max_submissions),  # type: ignore[call-overload]
        float(window) or DAY_SECONDS,
        tuple(seen),
        source,
        granted,
        simulated,
    )


def quotas_from_config(data: object) -> tuple[Quota, ...]:
    """The quotas file's contents (parsed YAML): ``quotas: [{scope, max_active_jobs,
    max_submissions, window_seconds, members, max_priority, allow_simulated}]``;
    InvalidArgument names the bad entry."""
    if data is None:
        return ()
    if not isinstance(data, Mapping) or set(data) - {"quotas"}:
        raise InvalidArgument("quotas_file", "must be a mapping with one key, quotas")
    entries = data.get("quotas") or []
    if not isinstance(entries, list):
        raise InvalidArgument("quotas_file.quotas", "must be a list")
    quotas: list[Quota] = []
    scopes: set[str] = set()
    known = {
        "scope",
        "max_active_jobs",
        "max_submissions",
        "window_seconds",
        "members",
        "max_priority",
        "allow_simulated",
    }
    for index, entry in enumerate(entries):
        field = f"quotas_file.quotas[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidArgument(field, "must be a mapping")
        unknown = sorted(str(key) for key in entry if key not in known)
        if unknown:
            raise InvalidArgument(
                f"{field}.{unknown[0]}", f"unknown key; known: {', '.join(sorted(known))}"
            )
        scope = entry.get("scope")
        if not isinstance(scope, str):
            raise InvalidArgument(f"{field}.scope", "is required: user:<name> or team:<name>")
        members = entry.get("members") or []
        if not isinstance(members, list):
            raise InvalidArgument(f"{field}.members", "must be a list of user names")
        quota = make_quota(
            scope,
            entry.get("max_active_jobs", 0),
            entry.get("max_submissions", 0),
            entry.get("window_seconds", 0),
            members,
            "config",
            field,
            max_priority=entry.get("max_priority"),
            allow_simulated=entry.get("allow_simulated", False),
        )
        if scope in scopes:
            raise InvalidArgument(f"{field}.scope", f"{scope!r} is given twice")
        scopes.add(scope)
        quotas.append(quota)
    return tuple(quotas)


def violation(
    quota: Quota, now: float, earlier_submissions: tuple[float, ...], active_jobs: int
) -> str | None:
    """Why one more job of the scope breaks ``quota`` (the policy's check), or None."""
    problem = quota_violation(quota.limits(), now, earlier_submissions, active_jobs)
    if problem is None:
        return None
    return problem.replace("admitted jobs", "active (admitted or queued) jobs")
