"""Algorithms for testing the executor: one that computes for as long as it is asked, one
that always fails. ``STRIDE_EXECUTOR_REGISTRY=stride.testing.algorithms:registry`` adds
them to the default registry, in the service and in its worker processes."""

from __future__ import annotations

import time
from dataclasses import dataclass

from stride.policy.registry import AlgorithmSpec, Registry, default_registry


@dataclass(frozen=True)
class SpinRequest:
    seconds: float


@dataclass(frozen=True)
class SpinReply:
    spun_seconds: float


def spin(request: SpinRequest) -> SpinReply:
    """Busy on one core for ``seconds`` (a search asked for too much work)."""
    started = time.perf_counter()
    while time.perf_counter() - started < request.seconds:
        pass
    return SpinReply(time.perf_counter() - started)


@dataclass(frozen=True)
class Nothing:
    pass


def explode(request: Nothing) -> Nothing:
    raise ZeroDivisionError("this algorithm always fails")


def registry() -> Registry:
    """The default registry with ``test-spin/1`` and ``test-explode/1``."""
    made = default_registry()
    made.register(
        AlgorithmSpec("test-spin", 1, "busy for the seconds asked", SpinRequest, SpinReply, spin)
    )
    made.register(AlgorithmSpec("test-explode", 1, "always fails", Nothing, Nothing, explode))
    return made
