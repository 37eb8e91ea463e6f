"""The errors a policy raises for bad input, each naming the field at fault.

They are plain ``ValueError`` subclasses (the library depends only on the pure
``stride.vocabulary``), and
services map them to their own error types at the edge: the executor to an
INVALID_ARGUMENT reply, the optimizer to a dead-lettered message.
"""

from __future__ import annotations


class PolicyError(ValueError):
    """An input to a policy is invalid. ``field`` is its dotted path, e.g. ``roles[1].cpu``."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidPlan(PolicyError):
    """A resource plan breaks a rule (a negative count, a non-positive CPU, ...)."""


class InvalidFeatures(PolicyError):
    """A job's features cannot be planned for (no batch size, no termination, ...)."""
