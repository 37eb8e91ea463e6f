"""What a valid job spec is, as admission says it at the API edge.

The rules are not admission's own: they are :mod:`stride.vocabulary.jobspec`'s, the same
ones the optimizer, configdb and the CLI apply, so a spec admission accepts is never
refused by a service after it is stored. This module only turns the vocabulary's
:class:`~stride.vocabulary.InvalidWord` into the :class:`InvalidArgument` the gRPC edge
maps to INVALID_ARGUMENT, keeping the dotted field path (``spec.dataset.record_count``).
"""

from __future__ import annotations

from datetime import datetime

from stride.runtime.errors import InvalidArgument
from stride.vocabulary import InvalidWord, jobspec
from stride.vocabulary.jobspec import JobSpec, Priority

__all__ = ["JobSpec", "Priority", "check_request_id", "validate"]


def validate(spec: JobSpec, now: datetime | None) -> None:
    """Raise :class:`InvalidArgument` naming the first bad field of ``spec`` submitted at
    ``now`` (None: every rule but the clock-based deadline ones)."""
    try:
        jobspec.validate(spec, now)
    except InvalidWord as error:
        raise InvalidArgument(error.field, error.problem) from None


def check_request_id(request_id: str) -> None:
    """Raise :class:`InvalidArgument` unless ``request_id`` can be an idempotency key
    (at most 200 characters, no control characters; "" means none)."""
    try:
        jobspec.check_request_id(request_id)
    except InvalidWord as error:
        raise InvalidArgument(error.field, error.problem) from None
