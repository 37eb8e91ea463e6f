"""Retention (last N plus every K-th step), shard validation and the shared-memory checks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stride.ckptcache.domain.checkpoints import (
    CheckpointHeader,
    CheckpointInfo,
    Tier,
    validate_header,
)
from stride.ckptcache.domain.checksum import checksum, combined
from stride.ckptcache.domain.retention import RetentionPolicy
from stride.ckptcache.domain.shared_memory import no_room, too_small
from stride.runtime.errors import InvalidArgument

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MIB = 1024 * 1024


def at(step: int) -> CheckpointInfo:
    return CheckpointInfo(
        "job-1", f"step-{step}", step, 1, 0, Tier.DURABLE, T0 + timedelta(seconds=step)
    )


@pytest.mark.parametrize(
    ("keep_last", "keep_every", "kept"),
    [
        (3, 0, {7, 8, 9}),
        (2, 4, {4, 8, 9}),
        (1, 3, {3, 6, 9}),
        (20, 0, set(range(1, 10))),
    ],
)
def test_retention_keeps_the_newest_and_every_kth(
    keep_last: int, keep_every: int, kept: set[int]
) -> None:
    everything = [at(step) for step in range(1, 10)]
    expired = RetentionPolicy(keep_last, keep_every).expired(everything)
    assert {info.step for info in everything} - {info.step for info in expired} == kept


def test_retention_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RetentionPolicy(0)
    with pytest.raises(ValueError):
        RetentionPolicy(1, -1)


def test_shards_must_be_numbered_within_their_count() -> None:
    base = CheckpointHeader("job-1", "c", 1, 10, 0, shard_index=1, shard_count=2)
    validate_header(base, 100)
    for bad, field in (
        (
            CheckpointHeader("job-1", "c", 1, 10, 0, shard_index=2, shard_count=2),
            "header.shard_index",
        ),
        (
            CheckpointHeader("job-1", "c", 1, 10, 0, shard_index=-1, shard_count=2),
            "header.shard_index",
        ),
        (CheckpointHeader("job-1", "c", 1, 10, 0, shard_count=0), "header.shard_count"),
        (CheckpointHeader("job-1", "c", 1, 10, 0, shard_count=5000), "header.shard_count"),
    ):
        with pytest.raises(InvalidArgument) as raised:
            validate_header(bad, 100)
        assert raised.value.field == field


def test_shards_of_one_checkpoint_must_agree() -> None:
    one = CheckpointHeader("job-1", "c", 1, 10, 0, shard_count=2, shard_snapshot_id="s")
    assert one.same_checkpoint_as(
        CheckpointHeader(
            "job-1", "c", 1, 99, 5, shard_index=1, shard_count=2, shard_snapshot_id="s"
        )
    )
    assert not one.same_checkpoint_as(
        CheckpointHeader("job-1", "c", 2, 10, 0, shard_count=2, shard_snapshot_id="s")
    )
    assert not one.same_checkpoint_as(
        CheckpointHeader("job-1", "c", 1, 10, 0, shard_count=3, shard_snapshot_id="s")
    )
    assert not one.same_checkpoint_as(
        CheckpointHeader("job-1", "c", 1, 10, 0, shard_count=2, shard_snapshot_id="t")
    )


def test_the_combined_checksum_is_the_shard_one_for_one_shard() -> None:
    assert combined([checksum(b"a")]) == checksum(b"a")
    assert combined([1, 2]) != combined([2, 1])


def test_shared_memory_messages_say_how_to_fix_it() -> None:
    assert too_small("/dev/shm", 2048 * MIB, 256 * MIB) is None
    message = too_small("/dev/shm", 64 * MIB, 256 * MIB)
    assert message is not None
    assert "64 MiB" in message and "--shm-size" in message and "medium: Memory" in message
    assert "SIGBUS" in message
    assert no_room("/dev/shm", 100 * MIB, 10 * MIB) is None
    full = no_room("/dev/shm", 5 * MIB, 10 * MIB)
    assert full is not None and "5 MiB free" in full and "--shm-size" in full
