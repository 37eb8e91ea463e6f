"""The shared-memory tier's file protocol on a real directory: adopting a client's segment,
rebuilding after a restart, releasing to the free pool, and refusing what does not fit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stride.ckptcache.adapters.outbound.memory_store import (
    FREE,
    INCOMING,
    PINNED,
    MemoryStore,
    SharedMemoryTooSmall,
)
from stride.ckptcache.domain.checksum import checksum
from stride.runtime.errors import AlreadyExists, InvalidArgument, ResourceExhausted


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    store = MemoryStore(tmp_path / "shm", free_segments_per_job=1)
    store.prepare(min_bytes=0)
    return store


def client_segment(store: MemoryStore, name: str, data: bytes, job: str = "job-1") -> None:
    incoming = store.root / job / INCOMING
    incoming.mkdir(parents=True, exist_ok=True)
    (incoming / name).write_bytes(data)


def test_the_node_id_survives_a_restart(store: MemoryStore) -> None:
    again = MemoryStore(store.root)
    again.prepare(min_bytes=0)
    assert again.node_id == store.node_id and len(store.node_id) == 32


def test_too_small_a_filesystem_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(SharedMemoryTooSmall, match="--shm-size"):
        MemoryStore(tmp_path / "shm").prepare(min_bytes=1 << 60)


def test_a_segment_is_adopted_checked_and_found_again_after_a_restart(store: MemoryStore) -> None:
    client_segment(store, "a.seg", b"abcdef")
    path = store.adopt("job-1", "step-1", 0, "a.seg", 6)
    assert path == store.segment_path("job-1", "step-1", 0) and path.read_bytes() == b"abcdef"
    assert store.compute_checksum(path, 6) != 0
    # Not yet whole (no header): a restart drops it.
    assert MemoryStore(store.root).scan() == {}
    assert not path.exists()

    client_segment(store, "b.seg", b"abcdef")
    path = store.adopt("job-1", "step-2", 0, "b.seg", 6)
    store.write_header("job-1", "step-2", 0, b"header")
    found = MemoryStore(store.root).scan()
    assert [(k, [s.header_blob for s in v]) for k, v in found.items()] == [
        (("job-1", "step-2"), [b"header"])
    ]


def test_bad_segments_are_refused_naming_the_field(store: MemoryStore) -> None:
    client_segment(store, "a.seg", b"abcdef")
    for name in ("../a.seg", "a", "x/a.seg", ".seg"):
        with pytest.raises(InvalidArgument) as raised:
            store.adopt("job-1", "c", 0, name, 6)
        assert raised.value.field == "segment_name"
    with pytest.raises(InvalidArgument) as raised:
        store.adopt("job-1", "c", 0, "missing.seg", 6)
    assert raised.value.field == "segment_name"
    with pytest.raises(InvalidArgument) as raised:
        store.adopt("job-1", "c", 0, "a.seg", 7)
    assert raised.value.field == "header.size_bytes"
    store.adopt("job-1", "c", 0, "a.seg", 6)
    client_segment(store, "b.seg", b"abcdef")
    with pytest.raises(AlreadyExists):
        store.adopt("job-1", "c", 0, "b.seg", 6)


def test_released_segments_fill_the_free_pool_then_are_unlinked(store: MemoryStore) -> None:
    for index, name in enumerate(("a.seg", "b.seg")):
        client_segment(store, name, b"xy")
        store.adopt("job-1", "c", index, name, 2)
    store.release("job-1", "c")
    assert not (store.root / "job-1" / "c").exists()
    assert len(list((store.root / "job-1" / FREE).iterdir())) == 1  # pool of one


def test_a_stream_segment_reserves_its_pages_as_data_arrives_or_says_why_not(
    store: MemoryStore,
) -> None:
    path, descriptor = store.create_incoming("job-1")
    try:
        # Nothing arrived: nothing held yet.
        assert path.stat().st_size == 0 and path.parent.name == INCOMING
        assert path.stat().st_blocks == 0
        store.reserve(descriptor, 0, 4096)  # the first chunk's pages
        assert path.stat().st_size == 4096 and path.stat().st_blocks * 512 >= 4096
        # Pages the filesystem cannot back (it filled up since) are refused with the fix.
        with pytest.raises(ResourceExhausted, match="--shm-size"):
            store.reserve(descriptor, 4096, 1 << 60)
    finally:
        os.close(descriptor)


def test_observe_counts_the_free_pool_and_drop_gives_it_back(store: MemoryStore) -> None:
    client_segment(store, "a.seg", b"x" * 8192)
    store.adopt("job-1", "c", 0, "a.seg", 8192)
    assert store.observe().pool_bytes == 0
    store.release("job-1", "c")
    seen = store.observe()
    assert seen.pool_bytes >= 8192 and seen.free_bytes > 0 and seen.path == str(store.root)
    store.drop_free_pool()
    assert store.observe().pool_bytes == 0


def test_remove_takes_what_the_cache_keeps_and_only_that(store: MemoryStore) -> None:
    client_segment(store, "a.seg", b"ab")
    store.adopt("job-1", "c", 0, "a.seg", 2)
    store.remove()
    assert not store.root.exists()
    # An operator's directory (STRIDE_CKPTCACHE_SHM_DIR=/dev/shm) keeps what is not ours.
    store.prepare(min_bytes=0)
    client_segment(store, "b.seg", b"ab")
    (store.root / "someone-elses.txt").write_text("keep")
    store.remove()
    assert [p.name for p in store.root.iterdir()] == ["someone-elses.txt"]


def test_the_pool_keeps_the_newest_releases(store: MemoryStore) -> None:
    client_segment(store, "old.seg", b"small")
    store.adopt("job-1", "c1", 0, "old.seg", 5)
    store.release("job-1", "c1")
    client_segment(store, "new.seg", b"much bigger")
    store.adopt("job-1", "c2", 0, "new.seg", 11)
    store.release("job-1", "c2")
    pooled = list((store.root / "job-1" / FREE).iterdir())
    assert [p.stat().st_size for p in pooled] == [11]


def test_the_checksum_is_taken_over_a_mapping_and_sees_later_damage(store: MemoryStore) -> None:
    data = os.urandom(3 * 4096 + 5)
    client_segment(store, "c.seg", data)
    path = store.adopt("job-1", "step-1", 0, "c.seg", len(data))
    assert store.compute_checksum(path, len(data)) == checksum(data)
    assert store.compute_checksum(path, 100) == checksum(data[:100])
    # The mapping is kept for the next check, which still sees a byte changed in the file.
    with path.open("r+b") as handle:
        handle.seek(4096)
        handle.write(bytes([data[4096] ^ 0xFF]))
    assert store.compute_checksum(path, len(data)) != checksum(data)
    # A shorter file than the header says cannot match.
    os.truncate(path, 10)
    assert store.compute_checksum(path, len(data)) != checksum(data)


def test_a_pinned_segment_is_never_pooled_and_its_pin_is_swept_later(store: MemoryStore) -> None:
    data = b"x" * 8192
    client_segment(store, "p.seg", data)
    path = store.adopt("job-1", "step-1", 0, "p.seg", len(data))
    pins = store.root / "job-1" / PINNED
    pins.mkdir()
    pin = pins / "restore.pin"
    os.link(path, pin)  # what a restoring client does before mapping the segment
    assert store.remove_stale_pins() == 0  # still in its checkpoint: the pin protects it
    store.release("job-1", "step-1")
    assert list((store.root / "job-1" / FREE).iterdir()) == []  # unlinked, not pooled
    assert pin.read_bytes() == data  # the restored view still reads the checkpoint
    store.expire_free(older_than=0)  # the sweep: the pin is all that is left of it
    assert not pin.exists()


def test_an_unpinned_segment_goes_to_the_pool(store: MemoryStore) -> None:
    client_segment(store, "q.seg", b"y" * 100)
    store.adopt("job-1", "step-1", 0, "q.seg", 100)
    store.release("job-1", "step-1")
    assert [p.suffix for p in (store.root / "job-1" / FREE).iterdir()] == [".seg"]
