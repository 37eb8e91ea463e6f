"""Per-user quotas, checked before a job is admitted (ElasticFlow sec. 4.4).

ElasticFlow assumes honest users but notes that one user "may submit many jobs with close
deadlines to occupy all GPUs", and that "the cloud operator can use quotas (e.g., set a
maximum number of jobs that can be submitted by each user per day) ... before line 9 of
Algorithm 1". The paper leaves the policy open; Stride's is two limits, both optional:
submissions per sliding window (the paper's example, default one day) and jobs a user may
hold admitted at once. The check runs before progressive filling, so a user over quota
costs no planning time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stride.policy.errors import PolicyError

DAY_SECONDS = 86_400.0
"""The paper's example window: "a maximum number of jobs ... per user per day"."""


class InvalidQuota(PolicyError):
    """A quota or a submission history is malformed."""


@dataclass(frozen=True)
class UserQuota:
    """Limits per user; 0 means no limit on that count."""

    max_submissions_per_window: int = 0
    """Jobs a user may submit within ``window_seconds`` (this one included)."""
    window_seconds: float = DAY_SECONDS
    max_admitted_jobs: int = 0
    """Deadline jobs a user may hold admitted at once (this one included)."""

    def __post_init__(self) -> None:
        for name in ("max_submissions_per_window", "max_admitted_jobs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidQuota(f"quota.{name}", f"must be a whole number >= 0, got {value!r}")
        window = self.window_seconds
        if not isinstance(window, int | float) or not math.isfinite(window) or window <= 0:
            raise InvalidQuota("quota.window_seconds", f"must be finite and > 0, got {window!r}")


def quota_violation(
    quota: UserQuota, now: float, earlier_submissions: tuple[float, ...], admitted_jobs: int
) -> str | None:
    """Why a new submission breaks ``quota``, or None if it is within it.

    ``earlier_submissions`` are the user's previous submission times (seconds, <= now);
    ``admitted_jobs`` counts the user's jobs currently admitted with a deadline.
    """
    for index, moment in enumerate(earlier_submissions):
        if not math.isfinite(moment) or moment > now:
            raise InvalidQuota(
                f"user_submissions[{index}]", f"must be finite and <= now ({now}), got {moment!r}"
            )
    if quota.max_submissions_per_window:
        window_start = now - quota.window_seconds
        recent = sum(1 for moment in earlier_submissions if moment > window_start) + 1
        if recent > quota.max_submissions_per_window:
            return (
                f"{recent} submissions within {quota.window_seconds:g} s exceed the quota of "
                f"{quota.max_submissions_per_window}"
            )
    if quota.max_admitted_jobs and admitted_jobs + 1 > quota.max_admitted_jobs:
        return (
            f"{admitted_jobs + 1} admitted jobs would exceed the quota of {quota.max_admitted_jobs}"
        )
    return None
