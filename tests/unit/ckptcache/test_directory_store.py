"""The durable directory tier on a real (temporary) filesystem: atomic persists, checksums
verified while copying, shards, leftovers."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from stride.ckptcache.adapters.outbound.directory_store import DirectoryStore
from stride.ckptcache.domain.checkpoints import CheckpointInfo, Tier
from stride.ckptcache.domain.checksum import checksum, combined
from stride.ckptcache.domain.tiers import ShardSource
from stride.runtime.errors import AlreadyExists

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def no_throttle(_: int) -> None:
    return None


def sources(tmp_path: Path, contents: list[bytes]) -> list[ShardSource]:
    found = []
    for index, data in enumerate(contents):
        path = tmp_path / f"segment-{index}"
        path.write_bytes(data)
        found.append(ShardSource(index, f"blob{index}".encode(), len(data), checksum(data), path))
    return found


def info(checkpoint_id: str, contents: list[bytes], step: int = 3) -> CheckpointInfo:
    return CheckpointInfo(
        "job-1",
        checkpoint_id,
        step,
        sum(len(c) for c in contents),
        combined(checksum(c) for c in contents),
        Tier.DURABLE,
        NOW,
        shard_count=len(contents),
        shard_snapshot_id="snap",
    )


@pytest.fixture
def store(tmp_path: Path) -> DirectoryStore:
    store = DirectoryStore(tmp_path / "store")
    store.prepare()
    return store


def test_persist_makes_every_shard_visible_and_readable(
    store: DirectoryStore, tmp_path: Path
) -> None:
    contents = [b"abcdef", b"0123456789"]
    store.persist(info("c1", contents), sources(tmp_path, contents), no_throttle)
    found = store.find("job-1", "c1")
    assert found is not None
    assert found.shard_headers == (b"blob0", b"blob1")
    assert found.info.shard_count == 2 and found.info.shard_snapshot_id == "snap"
    assert found.shard_checksums == (checksum(b"abcdef"), checksum(b"0123456789"))
    with store.open_shard("job-1", "c1", 1) as handle:
        assert handle.read() == b"0123456789"
    assert [i.checkpoint_id for i in store.checkpoints_of("job-1")] == ["c1"]
    assert store.checkpoints_of("job-2") == []
    assert [s.info.checkpoint_id for s in store.unpublished()] == ["c1"]
    store.mark_published(found.info)
    assert store.unpublished() == []


def test_a_source_that_shrank_is_refused_and_leaves_nothing(
    store: DirectoryStore, tmp_path: Path
) -> None:
    contents = [b"abcdef"]
    shards = sources(tmp_path, contents)
    shards[0].path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="shrank"):
        store.persist(info("c1", contents), shards, no_throttle)
    assert store.find("job-1", "c1") is None
    assert list((store.root / ".staging").iterdir()) == []


def test_the_throttle_sees_every_byte(store: DirectoryStore, tmp_path: Path) -> None:
    seen: list[int] = []
    contents = [b"x" * 100, b"y" * 50]
    store.persist(info("c1", contents), sources(tmp_path, contents), seen.append)
    assert sum(seen) == 150


def test_a_write_error_leaves_nothing_and_earlier_checkpoints_intact(
    store: DirectoryStore, tmp_path: Path
) -> None:
    store.persist(info("c1", [b"old"]), sources(tmp_path, [b"old"]), no_throttle)

    def disk_full(_: int) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        store.persist(info("c2", [b"new"]), sources(tmp_path, [b"new"]), disk_full)
    assert [i.checkpoint_id for i in store.checkpoints_of("job-1")] == ["c1"]
    assert list((store.root / ".staging").iterdir()) == []


def test_an_unfinished_persist_is_invisible_and_cleared_on_start(store: DirectoryStore) -> None:
    staging = store.root / ".staging" / "crashed"
    staging.mkdir(parents=True)
    (staging / "shard-00000.data").write_bytes(b"half")
    assert store.checkpoints_of("job-1") == []
    DirectoryStore(store.root).prepare()  # what the next start does
    assert not (store.root / ".staging").exists()


def test_same_id_twice_same_content_is_fine_different_content_conflicts(
    store: DirectoryStore, tmp_path: Path
) -> None:
    store.persist(info("c1", [b"abc"]), sources(tmp_path, [b"abc"]), no_throttle)
    store.persist(info("c1", [b"abc"]), sources(tmp_path, [b"abc"]), no_throttle)
    with pytest.raises(AlreadyExists):
        store.persist(info("c1", [b"xyz"]), sources(tmp_path, [b"xyz"]), no_throttle)
    assert list((store.root / ".staging").iterdir()) == []


def test_the_manifest_goes_last(
    store: DirectoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[str] = []
    real_open = Path.open

    def recording_open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            written.append(self.name)
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", recording_open)
    store.persist(info("c1", [b"a", b"b"]), sources(tmp_path, [b"a", b"b"]), no_throttle)
    assert written[-1] == "manifest.json"
    assert set(written[:-1]) >= {"shard-00000.data", "shard-00001.data"}


def test_a_format_1_checkpoint_is_still_read(store: DirectoryStore) -> None:
    directory = store.root / "job-1" / "old"
    directory.mkdir(parents=True)
    (directory / "data").write_bytes(b"legacy")
    (directory / "header.pb").write_bytes(b"h")
    (directory / "manifest.json").write_text(
        '{"format": 1, "job_id": "job-1", "checkpoint_id": "old", "step": 1, "size_bytes": 6,'
        f' "crc32c": {checksum(b"legacy")}, "saved_at": "{NOW.isoformat()}"}}'
    )
    found = store.find("job-1", "old")
    assert found is not None and found.shard_headers == (b"h",)
    with store.open_shard("job-1", "old", 0) as handle:
        assert handle.read() == b"legacy"


def test_delete(store: DirectoryStore, tmp_path: Path) -> None:
    store.persist(info("c1", [b"abc"]), sources(tmp_path, [b"abc"]), no_throttle)
    assert store.delete("job-1", "c1") is True
    assert store.delete("job-1", "c1") is False
    assert store.find("job-1", "c1") is None


def test_writable_probe(store: DirectoryStore, tmp_path: Path) -> None:
    assert store.writable()
    assert not DirectoryStore(tmp_path / "missing").writable()


def test_unsafe_names_never_become_paths(store: DirectoryStore) -> None:
    with pytest.raises(ValueError):
        store.checkpoint_dir("job-1", "../escape")
    with pytest.raises(ValueError):
        store.job_dir("..")
    assert os.sep not in "job-1"


def test_a_source_changed_since_it_was_saved_is_refused_and_leaves_nothing(
    store: DirectoryStore, tmp_path: Path
) -> None:
    # Persisting checks each piece's checksum as it writes it: a shard damaged in memory
    # after its save is never made durable.
    contents = [b"a" * 20_000_000]
    shards = sources(tmp_path, contents)
    with shards[0].path.open("r+b") as handle:
        handle.seek(12_345_678)
        handle.write(b"b")
    with pytest.raises(ValueError, match="no longer matches its checksum"):
        store.persist(info("c1", contents), shards, no_throttle)
    assert store.find("job-1", "c1") is None
    assert list((store.root / ".staging").iterdir()) == []


def test_a_large_shard_is_copied_whole_in_pieces(store: DirectoryStore, tmp_path: Path) -> None:
    contents = [os.urandom(20_000_001), b""]
    seen: list[int] = []
    store.persist(info("c1", contents), sources(tmp_path, contents), seen.append)
    with store.open_shard("job-1", "c1", 0) as handle:
        assert handle.read() == contents[0]
    with store.open_shard("job-1", "c1", 1) as handle:
        assert handle.read() == b""
    assert sum(seen) == 20_000_001 and len(seen) == 3
