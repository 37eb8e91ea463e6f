"""How far a job has trained, in words for a StrideJob's status (pure).

The dispatcher knows: the epoch it is in (from 0), how many of that epoch's shards are done
out of all of them, and whether the last epoch is complete. A job that stops after a
number of epochs is that far through; one that stops after a number of steps shows its
epoch and shards only (the steps it has left are the trainer's).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataProgress:
    """A job's place in its dataset, as the dispatcher reports it."""

    epoch: int
    epochs: int
    done: int
    shards: int
    finished: bool


def describe(progress: DataProgress) -> tuple[str, int | None]:
    """Words (``epoch 2/3, 40% of its shards``) and, for an epoch-bounded job, the percent
    of all its epochs done."""
    if progress.finished:
        return f"all {progress.epochs} epochs done", 100
    within = progress.done / progress.shards if progress.shards > 0 else 0.0
    epoch = min(max(progress.epoch, 0), max(progress.epochs - 1, 0))
    words = f"epoch {epoch + 1}/{progress.epochs}, {within:.0%} of its shards"
    if progress.epochs <= 0:
        return words, None
    return words, min(99, int(100 * (epoch + within) / progress.epochs))
