"""Dataset validation and shard cutting: every field error is named, epochs are cut exactly."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stride.dispatcher.domain.datasets import (
    MAX_SHARDS_PER_EPOCH,
    DatasetParameters,
    ShardingKind,
    check_dataset,
    check_job_id,
    check_worker,
    validate,
)
from stride.dispatcher.domain.sharding import (
    cut_ranges,
    epoch_permutation,
    hand_out_order,
    plan_epoch,
    shard_indices,
)
from stride.dispatcher.domain.stragglers import decayed_rate, judge, straggler_shard_records
from stride.runtime.errors import InvalidArgument


def parameters(**changes: object) -> DatasetParameters:
    base = DatasetParameters(
        record_count=10_000,
        batch_size=32,
        shard_batches=8,
        epochs=2,
        shuffle=False,
        seed=0,
        kind=ShardingKind.INDEX_RANGE,
        partitions=0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_valid_parameters_pass() -> None:
    validate(parameters())
    assert parameters().shard_records == 256
    assert parameters().shards_per_epoch == 40  # 39 full shards and one of 16 records


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (parameters(kind=None), "parameters.kind"),
        (parameters(kind=ShardingKind.STREAM), "parameters.partitions"),
        (parameters(kind=ShardingKind.STREAM, partitions=5000), "parameters.partitions"),
        (parameters(record_count=1 << 41), "parameters.record_count"),
        (
            parameters(kind=ShardingKind.INDEX_LIST, record_count=3_000_000),
            "parameters.record_count",
        ),
        (parameters(shard_batches=1 << 60), "parameters.shard_batches"),
        (parameters(record_count=0), "parameters.record_count"),
        (parameters(record_count=-5), "parameters.record_count"),
        (parameters(batch_size=0), "parameters.batch_size"),
        (parameters(batch_size=20_000), "parameters.batch_size"),
        (parameters(shard_batches=0), "parameters.shard_batches"),
        (parameters(epochs=0), "parameters.epochs"),
        (parameters(epochs=10**9), "parameters.epochs"),
        (parameters(partitions=3), "parameters.partitions"),
        (
            parameters(record_count=MAX_SHARDS_PER_EPOCH * 2, batch_size=1, shard_batches=1),
            "parameters.shard_batches",
        ),
    ],
)
def test_invalid_parameters_name_the_field(bad: DatasetParameters, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate(bad)
    assert raised.value.field == field


def test_index_list_epochs_are_seeded_permutations_sliced_by_shards() -> None:
    params = parameters(
        kind=ShardingKind.INDEX_LIST, record_count=1_000, batch_size=10, shuffle=True, seed=5
    )
    validate(params)
    for epoch in range(2):
        permutation = epoch_permutation(params, epoch)
        assert sorted(permutation) == list(range(1_000))
        sliced = [
            index
            for shard in plan_epoch(params, epoch)
            for index in shard_indices(params, epoch, shard.start, shard.end)
        ]
        assert sorted(sliced) == list(range(1_000))
    assert epoch_permutation(params, 0) != epoch_permutation(params, 1)
    unshuffled = replace(params, shuffle=False)
    assert shard_indices(unshuffled, 0, 3, 6) == [3, 4, 5]


def test_stream_epochs_cover_the_next_window_of_every_partition() -> None:
    params = parameters(
        kind=ShardingKind.STREAM, partitions=3, record_count=100, batch_size=10, shard_batches=3
    )
    validate(params)
    assert params.shards_per_epoch == 3 * 4
    for epoch in range(2):
        covered = sorted(
            (shard.partition, offset)
            for shard in plan_epoch(params, epoch)
            for offset in range(shard.start, shard.end)
        )
        window = range(epoch * 100, (epoch + 1) * 100)
        assert covered == [(p, o) for p in range(3) for o in window]
    ids = [s.shard_id for e in range(2) for s in plan_epoch(params, e)]
    assert len(set(ids)) == len(ids)


def test_straggler_rule_needs_peers_and_has_hysteresis() -> None:
    assert judge({"a": 1.0, "b": 100.0}, set()) == set()  # one peer says nothing
    rates = {"a": 40.0, "b": 100.0, "c": 110.0, "d": 90.0}
    assert judge(rates, set()) == {"a"}
    recovering = {**rates, "a": 60.0}
    assert judge(recovering, set()) == set()
    assert judge(recovering, {"a"}) == {"a"}  # below 3/4 of the median: still one
    assert judge({**rates, "a": 80.0}, {"a"}) == set()
    assert judge({"a": 0.0, "b": 0.0, "c": 0.0}, set()) == set()


def test_decayed_rate_follows_a_steady_rate_and_damps_bursts() -> None:
    rate = 0.0
    for _ in range(200):
        rate = decayed_rate(rate, 50, 1.0, 10.0)
    assert rate == pytest.approx(50.0, rel=1e-6)
    assert decayed_rate(50.0, 5, 0.0, 10.0) == pytest.approx(50.5)
    assert straggler_shard_records(parameters(shard_batches=8)) == 4 * 32
    assert straggler_shard_records(parameters(shard_batches=1)) == 32


@pytest.mark.parametrize("value", ["", "a.b", "-x", "x" * 65, "a b", "a*"])
def test_bad_job_ids(value: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_job_id(value)
    assert raised.value.field == "job_id"


def test_good_names() -> None:
    check_job_id("job-1a2b3c")
    check_dataset("criteo.train-v2")
    check_worker("job-1a2b-worker-0.pod")
    with pytest.raises(InvalidArgument):
        check_dataset("../etc")
    with pytest.raises(InvalidArgument):
        check_worker("")


@given(st.integers(1, 5_000), st.integers(1, 700))
def test_ranges_cover_every_record_once(record_count: int, shard_records: int) -> None:
    ranges = cut_ranges(record_count, shard_records)
    assert ranges[0].start == 0 and ranges[-1].end == record_count
    for before, after in itertools.pairwise(ranges):
        assert before.end == after.start
    assert all(r.size == shard_records for r in ranges[:-1])
    assert 0 < ranges[-1].size <= shard_records


@given(
    st.integers(1, 3_000),
    st.integers(1, 16),
    st.integers(1, 8),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 50),
)
def test_shuffled_order_is_a_deterministic_permutation(
    record_count: int, batch_size: int, shard_batches: int, seed: int, epoch: int
) -> None:
    params = parameters(
        record_count=max(record_count, batch_size),
        batch_size=batch_size,
        shard_batches=shard_batches,
        shuffle=True,
        seed=seed,
    )
    order = hand_out_order(params, epoch)
    assert sorted(order) == list(range(params.shards_per_epoch))
    assert hand_out_order(params, epoch) == order


def test_shuffle_differs_between_epochs_and_seeds() -> None:
    params = parameters(record_count=100_000, batch_size=10, shard_batches=10, shuffle=True, seed=7)
    assert hand_out_order(params, 0) != hand_out_order(params, 1)
    assert hand_out_order(params, 0) != hand_out_order(replace(params, seed=8), 0)
    assert hand_out_order(replace(params, shuffle=False), 3) == list(range(1000))


def test_known_order_for_a_seed_is_stable_across_processes() -> None:
    # Pinned: a restarted dispatcher (or the simulator) must hand out the same order.
    params = parameters(record_count=80, batch_size=1, shard_batches=10, shuffle=True, seed=42)
    assert hand_out_order(params, 0) == [7, 0, 2, 1, 6, 3, 4, 5]


def test_plan_epoch_ids_are_unique_per_dataset() -> None:
    params = parameters(shuffle=True, seed=3, epochs=3)
    planned = [shard for epoch in range(3) for shard in plan_epoch(params, epoch)]
    assert len({shard.shard_id for shard in planned}) == 3 * params.shards_per_epoch
    epoch_one = plan_epoch(params, 1)
    assert [s.position for s in epoch_one] == list(range(params.shards_per_epoch))
    assert {s.shard_id for s in epoch_one} == set(range(40, 80))
    assert sorted((s.start, s.end) for s in epoch_one)[-1] == (9984, 10_000)
