"""Checkpoint header validation, ordering and the checksum."""

from __future__ import annotations

import zlib
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from stride.ckptcache.domain import checksum
from stride.ckptcache.domain.checkpoints import (
    CheckpointHeader,
    CheckpointInfo,
    TensorSpan,
    Tier,
    check_checkpoint_id,
    merge_tiers,
    newest_first,
    validate_header,
)
from stride.runtime.errors import InvalidArgument

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def header(**changes: object) -> CheckpointHeader:
    base = CheckpointHeader(
        job_id="job-1",
        checkpoint_id="step-100",
        step=100,
        size_bytes=64,
        crc32c=1,
        tensors=(TensorSpan("w", "float32", 0, 32), TensorSpan("b", "float32", 32, 32)),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def info(
    checkpoint_id: str, step: int, minutes: int = 0, tier: Tier = Tier.DURABLE
) -> CheckpointInfo:
    return CheckpointInfo(
        "job-1", checkpoint_id, step, 10, 0, tier, T0 + timedelta(minutes=minutes)
    )


def test_a_valid_header_passes() -> None:
    validate_header(header(), max_size_bytes=1024)
    validate_header(header(size_bytes=0, tensors=()), max_size_bytes=1024)


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (header(job_id=""), "header.job_id"),
        (header(job_id="job.1"), "header.job_id"),
        (header(checkpoint_id=""), "header.checkpoint_id"),
        (header(checkpoint_id=".."), "header.checkpoint_id"),
        (header(checkpoint_id="a/b"), "header.checkpoint_id"),
        (header(step=-1), "header.step"),
        (header(size_bytes=-1), "header.size_bytes"),
        (header(size_bytes=4096), "header.size_bytes"),
        (header(tensors=(TensorSpan("", "f", 0, 1),)), "header.tensors[0].name"),
        (
            header(tensors=(TensorSpan("a", "f", 0, 1), TensorSpan("b", "f", -1, 1))),
            "header.tensors[1].offset",
        ),
        (header(tensors=(TensorSpan("a", "f", 0, -1),)), "header.tensors[0].length"),
        (header(tensors=(TensorSpan("a", "f", 60, 8),)), "header.tensors[0].length"),
    ],
)
def test_bad_headers_name_the_field(bad: CheckpointHeader, field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate_header(bad, max_size_bytes=1024)
    assert raised.value.field == field


def test_checkpoint_ids_that_are_safe_directory_names() -> None:
    check_checkpoint_id("ckpt-000100.final_v2")
    for bad in (".hidden", "a b", "x" * 129, "-lead"):
        with pytest.raises(InvalidArgument):
            check_checkpoint_id(bad)


def test_newest_first_by_step_then_save_time() -> None:
    ordered = newest_first([info("a", 5), info("b", 9), info("c", 9, minutes=1), info("d", 1)])
    assert [c.checkpoint_id for c in ordered] == ["c", "b", "a", "d"]


def test_merge_keeps_the_highest_tier() -> None:
    merged = merge_tiers(
        [info("a", 5, tier=Tier.MEMORY), info("a", 5), info("b", 6, tier=Tier.MEMORY)]
    )
    assert [(c.checkpoint_id, c.tier) for c in merged] == [("b", Tier.MEMORY), ("a", Tier.DURABLE)]


def test_same_content_compares_step_size_and_checksum() -> None:
    stored = CheckpointInfo("job-1", "step-100", 100, 64, 1, Tier.DURABLE, T0)
    assert stored.same_content(header())
    assert not stored.same_content(header(crc32c=2))
    assert not stored.same_content(header(step=101))


def test_checksum_is_incremental() -> None:
    data = bytes(range(256)) * 100
    whole = checksum.checksum(data)
    assert checksum.extend(checksum.extend(0, data[:1000]), data[1000:]) == whole
    assert checksum.checksum(b"") == 0
    # The CRC-32C check value of the standard test vector (RFC 3720, B.4).
    assert checksum.checksum(b"123456789") == 0xE3069283
    assert whole != zlib.crc32(data)
