"""Epochs cut without writing their shards (issue 37): the rows written a batch at a time are
exactly the shards a whole cut plans, in the same order; big shuffles are computed only off
the event loop; a restore writes rows up to the last position leased; the per-job caps and
the limits shared with the job spec."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.dispatcher.domain import sharding
from stride.dispatcher.domain.datasets import (
    MAX_EPOCHS,
    MAX_LIST_RECORDS,
    MAX_RECORD_COUNT,
    MAX_SHARDS_PER_EPOCH,
    SPLIT_ID_BASE,
    DatasetLimits,
    DatasetParameters,
    ShardingKind,
    check_dataset_count,
    validate,
)
from stride.dispatcher.domain.queue import ShardRecord, ShardState
from stride.dispatcher.domain.restoring import LeaseCount, restored_queue
from stride.dispatcher.domain.sharding import (
    INLINE_ORDER_SHARDS,
    OrderNotReady,
    PlannedShard,
    compute_order,
    compute_permutation,
    epoch_order,
    epoch_permutation,
    epoch_seed,
    hand_out_order,
    next_rows,
    order_ready,
    permutation_ready,
    plan_epoch,
    plan_positions,
    unwritten,
)
from stride.runtime.errors import InvalidArgument, ResourceExhausted
from stride.vocabulary import jobspec


def parameters(**changes: object) -> DatasetParameters:
    base = DatasetParameters(
        record_count=100,
        batch_size=3,
        shard_batches=2,
        epochs=3,
        shuffle=True,
        seed=11,
        kind=ShardingKind.INDEX_RANGE,
        partitions=0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def written_in_batches(params: DatasetParameters, batch: int, wanted: int) -> list[PlannedShard]:
    """Every shard the dispatcher writes, batch after batch, as the TODO rows run out."""
    rows: list[PlannedShard] = []
    epochs_created, written = 0, 0
    while (step := next_rows(params, epochs_created, written, wanted, batch)) is not None:
        assert step.new_epoch == (step.first == 0)
        assert step.stop - step.first == min(
            max(wanted, batch), params.shards_per_epoch - step.first
        )
        rows += plan_positions(params, step.epoch, step.first, step.stop)
        epochs_created, written = step.epoch + 1, step.stop
    assert unwritten(params, epochs_created, written) == 0
    return rows


@given(
    records=st.integers(1, 60),
    batch_size=st.integers(1, 4),
    shard_batches=st.integers(1, 3),
    epochs=st.integers(1, 3),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    kind=st.sampled_from(list(ShardingKind)),
    batch=st.integers(1, 9),
    wanted=st.integers(1, 4),
)
def test_rows_written_in_batches_are_the_shards_of_whole_cuts_in_hand_out_order(
    records: int,
    batch_size: int,
    shard_batches: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    kind: ShardingKind,
    batch: int,
    wanted: int,
) -> None:
    params = parameters(
        record_count=records,
        batch_size=min(batch_size, records),
        shard_batches=shard_batches,
        epochs=epochs,
        shuffle=shuffle,
        seed=seed,
        kind=kind,
        partitions=2 if kind is ShardingKind.STREAM else 0,
    )
    whole = [shard for epoch in range(epochs) for shard in plan_epoch(params, epoch)]
    assert written_in_batches(params, batch, wanted) == whole
    for epoch in range(epochs):
        assert list(epoch_order(params, epoch)) == hand_out_order(params, epoch)


def test_the_order_of_a_big_shuffled_epoch_is_computed_only_when_asked_to() -> None:
    params = parameters(
        record_count=INLINE_ORDER_SHARDS * 3,
        batch_size=1,
        shard_batches=1,
        seed=random.getrandbits(63),
    )
    assert params.shards_per_epoch > INLINE_ORDER_SHARDS
    assert not order_ready(params, 1)
    with pytest.raises(OrderNotReady) as raised:
        plan_positions(params, 1, 0, 10)
    assert (raised.value.parameters, raised.value.epoch) == (params, 1)
    compute_order(params, 1)  # what the service runs on a worker thread
    assert order_ready(params, 1)
    assert not order_ready(params, 2)
    assert plan_positions(params, 1, 5, 9) == plan_epoch(params, 1)[5:9]
    # Small shuffles and unshuffled epochs never wait.
    assert order_ready(replace(params, record_count=INLINE_ORDER_SHARDS), 7)
    assert order_ready(replace(params, shuffle=False), 7)
    assert epoch_order(replace(params, shuffle=False), 7) == range(params.shards_per_epoch)


def test_the_order_cache_keeps_the_most_recently_used_orders_within_its_capacity() -> None:
    cache = sharding._OrderCache(capacity=10)
    cache.put((4, 0, 0), [0, 1, 2, 3])
    cache.put((4, 0, 1), [3, 2, 1, 0])
    assert cache.get((4, 0, 0)) is not None  # now the most recent
    cache.put((4, 0, 2), [1, 0, 3, 2])
    assert cache.get((4, 0, 1)) is None
    assert cache.get((4, 0, 0)) is not None and cache.get((4, 0, 2)) is not None
    cache.put((20, 0, 0), list(range(20)))  # over the capacity alone: kept, alone
    assert cache.get((20, 0, 0)) is not None and cache.get((4, 0, 2)) is None


def test_record_permutations_are_the_same_seeded_shuffle_as_before() -> None:
    params = parameters(
        kind=ShardingKind.INDEX_LIST,
        record_count=INLINE_ORDER_SHARDS * 3,
        batch_size=10,
        seed=random.getrandbits(63),
    )
    expected = list(range(params.record_count))
    random.Random(epoch_seed(params.seed, 1) ^ 0x5EED).shuffle(expected)
    assert not permutation_ready(params, 1)
    compute_permutation(params, 1)
    assert permutation_ready(params, 1)
    assert list(epoch_permutation(params, 1)) == expected
    assert permutation_ready(replace(params, shuffle=False), 1)


def shard(planned: PlannedShard, **changes: object) -> ShardRecord:
    return replace(ShardRecord.planned(planned), **changes)  # type: ignore[arg-type]


def test_a_restore_writes_rows_up_to_the_last_position_leased_then_or_since() -> None:
    params = parameters(record_count=30, batch_size=1, shard_batches=1, epochs=2)
    epoch0, epoch1 = plan_epoch(params, 0), plan_epoch(params, 1)
    # The snapshot: all of epoch 0 done, epoch 1's first two positions touched.
    saved = [shard(p, state=ShardState.DONE, offset=1, leases=1) for p in epoch0] + [
        shard(epoch1[0], state=ShardState.DONE, offset=1, leases=1),
        shard(epoch1[1], offset=0, leases=1),
    ]
    # Since then, positions 1 to 4 of epoch 1 were leased (position 1 twice).
    leased = {
        p.shard_id: LeaseCount(2 if p.position == 1 else 1, 1, p.position) for p in epoch1[1:5]
    }
    leased[epoch0[3].shard_id] = LeaseCount(1, 0, epoch0[3].position)
    restored = restored_queue(params, 2, saved, leased)
    assert restored.written == 5
    rows = {s.shard_id: s for s in restored.shards}
    assert set(rows) == {p.shard_id for p in epoch0} | {p.shard_id for p in epoch1[:5]}
    assert rows[epoch1[0].shard_id].state is ShardState.DONE
    assert all(rows[p.shard_id].state is ShardState.TODO for p in epoch1[1:5])
    assert [rows[p.shard_id].leases for p in epoch1[:5]] == [1, 2, 1, 1, 1]
    assert all(rows[p.shard_id].holder is None for p in epoch1[:5])
    # Nothing leased in the newest epoch: no row of it is written.
    assert restored_queue(params, 2, saved[:30], {}).written == 0
    # An older epoch's shard missing from the snapshot (never, but cheap) gets its row.
    partial = restored_queue(params, 2, saved[1:], {})
    assert epoch0[0].shard_id in {s.shard_id for s in partial.shards}


def test_per_job_caps_refuse_naming_the_limit_and_the_value() -> None:
    limits = DatasetLimits(max_shards_per_epoch=1_000, max_datasets_per_job=2)
    big = parameters(record_count=5_000, batch_size=1, shard_batches=1)
    with pytest.raises(InvalidArgument) as invalid:
        validate(big, limits=limits)
    assert invalid.value.field == "parameters.shard_batches"
    assert "5000 shards" in invalid.value.problem
    assert "at most 1000 per epoch" in invalid.value.problem
    assert "max_shards_per_epoch" in invalid.value.problem
    validate(big)  # within the hard limit
    check_dataset_count("job-a", 1, limits)
    with pytest.raises(ResourceExhausted, match=r"has 2 datasets.*max_datasets_per_job=2"):
        check_dataset_count("job-a", 2, limits)


def test_the_dataset_limits_have_one_home_in_the_vocabulary() -> None:
    assert MAX_RECORD_COUNT is jobspec.MAX_RECORD_COUNT
    assert MAX_LIST_RECORDS is jobspec.MAX_LIST_RECORDS
    assert MAX_SHARDS_PER_EPOCH is jobspec.MAX_SHARDS_PER_EPOCH
    assert MAX_EPOCHS is jobspec.MAX_EPOCHS
    assert SPLIT_ID_BASE == MAX_EPOCHS * MAX_SHARDS_PER_EPOCH
    assert DatasetLimits().max_shards_per_epoch == MAX_SHARDS_PER_EPOCH
