"""The data-worker mode's pure parts: step ids map to fixed batches, and the consumer's
orderer hands each step once, in order."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.steps import MAX_IN_FLIGHT, batch_of, new_steps, total_steps
from stride.shardclient.steps import StepOrderer


@given(
    record_count=st.integers(1, 300),
    batch_size=st.integers(1, 40),
    epochs=st.integers(1, 3),
    kind=st.sampled_from([ShardingKind.INDEX_RANGE, ShardingKind.INDEX_LIST]),
)
def test_steps_cover_every_index_of_every_epoch_once(
    record_count: int, batch_size: int, epochs: int, kind: ShardingKind
) -> None:
    params = DatasetParameters(
        record_count, min(batch_size, record_count), 1, epochs, True, 3, kind, 0
    )
    seen = Counter(
        (batch.epoch, index)
        for step in range(total_steps(params))
        for batch in [batch_of(params, step)]
        for index in batch.indices
    )
    assert set(seen) == {(e, i) for e in range(epochs) for i in range(record_count)}
    assert set(seen.values()) == {1}
    assert batch_of(params, 0) == batch_of(params, 0)  # deterministic


def test_new_steps_respect_the_end_and_the_in_flight_cap() -> None:
    assert new_steps(0, -1, 10, 4) == range(0, 4)
    assert new_steps(8, -1, 10, 4) == range(8, 10)
    assert new_steps(MAX_IN_FLIGHT, -1, 10**6, 4) == range(MAX_IN_FLIGHT, MAX_IN_FLIGHT)
    assert new_steps(MAX_IN_FLIGHT, 1, 10**6, 4) == range(MAX_IN_FLIGHT, MAX_IN_FLIGHT + 2)


def test_the_consumers_queue_bounds_what_is_dispatched_ahead() -> None:
    # 64 in flight: with steps 0-63 dispatched and none consumed, nothing more goes out.
    assert new_steps(64, -1, 10**6, 8, in_flight=64) == range(64, 64)
    # Training consumed 0-9: ten more may go.
    assert new_steps(64, 9, 10**6, 16, in_flight=64) == range(64, 74)
    # A setting above the lease table's cap is held to it.
    assert new_steps(MAX_IN_FLIGHT, -1, 10**6, 4, in_flight=10**6) == range(
        MAX_IN_FLIGHT, MAX_IN_FLIGHT
    )


def test_orderer_hands_out_in_order_once_and_drops_duplicates() -> None:
    orderer: StepOrderer[str] = StepOrderer()
    assert list(orderer.push(1, "b")) == []
    assert list(orderer.push(0, "a")) == [(0, "a"), (1, "b")]
    assert list(orderer.push(1, "b again")) == []  # a re-dispatched step produced twice
    assert list(orderer.push(3, "d")) == []
    assert list(orderer.push(3, "d again")) == []
    assert list(orderer.push(2, "c")) == [(2, "c"), (3, "d")]
    assert orderer.consumed_step == 3 and orderer.dropped == 2
    restarted: StepOrderer[str] = StepOrderer(consumed_step=3)
    assert list(restarted.push(2, "old")) == [] and restarted.dropped == 1
    small: StepOrderer[str] = StepOrderer(max_buffered=1)
    assert list(small.push(5, "x")) == []
    with pytest.raises(OverflowError, match="wait for step 0"):
        list(small.push(6, "y"))
