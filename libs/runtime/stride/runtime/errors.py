"""Domain errors that every layer may raise and the gRPC edge maps to status codes.

Pure on purpose (no gRPC import) so domain code can raise them. Each error names the
field or thing at fault, because "invalid argument" alone helps nobody.
"""

from __future__ import annotations


class StrideError(Exception):
    """Base of the errors the API edge turns into a gRPC status."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(StrideError):
    """A request field is missing or wrong; ``field`` is its dotted path (``spec.batch_size``)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class NotFound(StrideError):
    """The named thing does not exist."""


class AlreadyExists(StrideError):
    """The named thing exists with different contents."""


class FailedPrecondition(StrideError):
    """The request is well-formed but the system is not in a state to accept it."""


class Unavailable(StrideError):
    """A dependency (NATS, the database) cannot be reached right now; retrying may help."""


class ResourceExhausted(StrideError):
    """A quota of the caller's is used up; the message says which and what frees it."""


class DeadlineExceeded(StrideError):
    """The work ran past its time limit and was stopped; asking for less may help."""


class Unauthenticated(StrideError):
    """The call carries no valid credentials (no token, an expired or forged one)."""


class PermissionDenied(StrideError):
    """The caller is known but may not do this (another user's job, another job's data)."""


class StartupError(Exception):
    """A service cannot start; the message says what to fix. Printed as one line, no traceback."""
