"""The chief's input queue (stride.trainer.dataqueue) making its own steps, against a
dispatcher kept in memory that hands steps out as the real one does: new ones in order
within the steps in flight, and a step a gone data worker held only once it is freed."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.trainer.dataqueue import LOCAL_PREFETCH, DataQueue

BATCH = 4


class Dispatcher:
    """Steps ``0..total-1``; ``withheld`` were fetched by a data worker that is gone and are
    handed out again only after ``free_after`` more fetches (its time-out)."""

    def __init__(self, total: int, withheld: set[int], free_after: int, in_flight: int) -> None:
        self.total = total
        self.withheld = set(withheld)
        self.free_after = free_after
        self.in_flight = in_flight
        self.next_step = 0
        self.consumed = -1
        self.fetches = 0
        self._lock = threading.Lock()

    def fetch_batches(self, dataset: str, max_batches: int) -> pb.FetchBatchesResponse:
        with self._lock:
            self.fetches += 1
            steps: list[int] = []
            if self.withheld and self.fetches > self.free_after:
                steps += sorted(self.withheld)
                self.withheld.clear()
            while (
                len(steps) < max_batches
                and self.next_step < self.total
                and self.next_step - self.consumed <= self.in_flight
            ):
                if self.next_step not in self.withheld:
                    steps.append(self.next_step)
                self.next_step += 1
            return pb.FetchBatchesResponse(
                batches=[
                    pb.IndexBatch(step_id=s, epoch=0, indices=range(s * BATCH, (s + 1) * BATCH))
                    for s in steps
                ],
                end_of_data=self.consumed == self.total - 1,
                consumed_step=self.consumed,
            )


def make_batch(indices: np.ndarray) -> list[np.ndarray]:
    return [indices.astype(np.float32)]


def drain(queue: DataQueue, total: int, dispatcher: Dispatcher) -> list[int]:
    """Take every step on a thread (so a stuck queue fails the test instead of hanging it)."""
    taken: list[int] = []

    def run() -> None:
        while (ready := queue.take()) is not None:
            taken.append(ready.step_id)
            dispatcher.consumed = ready.step_id

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    queue.close()
    assert not thread.is_alive(), f"stuck after step {taken[-1] if taken else None}"
    return taken


def test_the_chief_makes_every_step_in_order() -> None:
    dispatcher = Dispatcher(total=100, withheld=set(), free_after=0, in_flight=64)
    agent: Any = dispatcher
    queue = DataQueue(agent, "job-q", "train", make_batch, -1, 100, lambda *a, **k: None)
    queue.follow(())
    assert drain(queue, 100, dispatcher) == list(range(100))
    window = queue.window()
    assert window.data_workers == 0 and window.queue_capacity == LOCAL_PREFETCH * 2
    assert 0 <= window.queue_length <= window.queue_capacity


def test_a_step_a_dropped_data_worker_held_is_fetched_though_the_chief_made_far_ahead() -> None:
    """The chief made as far ahead as it may (steps after the missing one); the missing step
    is handed out again later. The chief keeps fetching while it waits for it, instead of
    waiting for room that only taking the missing step would make."""
    dispatcher = Dispatcher(total=120, withheld={5}, free_after=6, in_flight=64)
    agent: Any = dispatcher
    queue = DataQueue(agent, "job-q", "train", make_batch, -1, 120, lambda *a, **k: None)
    queue.follow(())
    assert drain(queue, 120, dispatcher) == list(range(120))
    assert queue.counters.by_source == {"local": 120}
