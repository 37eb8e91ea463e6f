"""The consumer side of the data-worker mode (GoldMiner sec. 4): batches in step-id order.

Data workers produce mini-batches tagged with step ids, in whatever order they finish, and
a timed-out step may be produced twice (the dispatcher hands it to another data worker).
:class:`StepOrderer` gives the training loop each step exactly once and in order: it holds
early arrivals until the gap before them is filled, and drops any step at or below the last
one consumed. After a restart, start it from the consumed step id the dispatcher reports
(``FetchBatchesResponse.consumed_step``) or the checkpoint recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class StepOrderer(Generic[T]):
    """Reorders (step id, batch) pairs into consecutive step ids, dropping duplicates."""

    def __init__(self, consumed_step: int = -1, max_buffered: int = 4096) -> None:
        self.consumed_step = consumed_step
        """The last step id handed to the consumer (-1 before any)."""
        self.max_buffered = max_buffered
        self._early: dict[int, T] = {}
        self.dropped = 0
        """Batches dropped as duplicates or stale (at or below the consumed step)."""

    def push(self, step_id: int, batch: T) -> Iterator[tuple[int, T]]:
        """Add a produced batch; yields every batch now ready, in step order."""
        if step_id <= self.consumed_step or step_id in self._early:
            self.dropped += 1
            return
        if len(self._early) >= self.max_buffered:
            raise OverflowError(
                f"{len(self._early)} batches wait for step {self.consumed_step + 1}; "
                "its data worker is gone and the dispatcher has not re-dispatched it yet"
            )
        self._early[step_id] = batch
        while (following := self.consumed_step + 1) in self._early:
            self.consumed_step = following
            yield following, self._early.pop(following)
