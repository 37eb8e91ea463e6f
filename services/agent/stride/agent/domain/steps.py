"""What a valid report of training steps is.

The trainer reports windows of steps with their mean step time and throughput; these are
the samples the optimizer fits the throughput model to (DLRover sec. 4, DLRover-RM sec.
4.1), so nonsense (negative or infinite times) is refused at the edge instead of skewing a fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stride.runtime.errors import InvalidArgument


@dataclass(frozen=True)
class InputQueue:
    """The chief's input queue over the window (GoldMiner's data-worker mode)."""

    data_workers: int
    enqueue_rate: float
    dequeue_rate: float
    wait_share: float
    queue_length: int
    steps_per_second: float = 0.0
    queue_capacity: int = 0
    """0: not reported (a trainer before the field)."""


@dataclass(frozen=True)
class StepWindow:
    """A window of training steps measured by one worker."""

    global_step: int
    steps: int
    step_seconds: float
    samples_per_second: float
    plan_version: int = 0
    """The plan version the job trained under (0: not known)."""
    input_queue: InputQueue | None = None
    """The chief's input queue, for a job read by steps."""


def validate(window: StepWindow) -> None:
    """Raise InvalidArgument naming the first bad field."""
    if window.global_step < 0:
        raise InvalidArgument("global_step", f"must not be negative, got {window.global_step}")
    if window.plan_version < 0:
        raise InvalidArgument("plan_version", f"must not be negative, got {window.plan_version}")
    if window.steps <= 0:
        raise InvalidArgument("steps", f"must be positive, got {window.steps}")
    if window.steps > window.global_step + 1:
        raise InvalidArgument(
            "steps", f"{window.steps} steps cannot end at global step {window.global_step}"
        )
    if not math.isfinite(window.step_seconds) or window.step_seconds < 0:
        raise InvalidArgument(
            "step_seconds", f"must be a finite, non-negative number, got {window.step_seconds}"
        )
    if not math.isfinite(window.samples_per_second) or window.samples_per_second < 0:
        raise InvalidArgument(
            "samples_per_second",
            f"must be a finite, non-negative number, got {window.samples_per_second}",
        )
    if window.input_queue is not None:
        _validate_queue(window.input_queue)


def _validate_queue(queue: InputQueue) -> None:
    for name in ("data_workers", "queue_length", "queue_capacity"):
        if getattr(queue, name) < 0:
            raise InvalidArgument(
                f"input_queue.{name}", f"must not be negative, got {getattr(queue, name)}"
            )
    for name in ("enqueue_rate", "dequeue_rate", "wait_share", "steps_per_second"):
        value = getattr(queue, name)
        if not math.isfinite(value) or value < 0:
            raise InvalidArgument(
                f"input_queue.{name}", f"must be a finite, non-negative number, got {value}"
            )
    if queue.wait_share > 1:
        raise InvalidArgument(
            "input_queue.wait_share", f"must be at most 1, got {queue.wait_share}"
        )
    if 0 < queue.queue_capacity < queue.queue_length:
        raise InvalidArgument(
            "input_queue.queue_length",
            f"{queue.queue_length} exceeds queue_capacity {queue.queue_capacity}",
        )
