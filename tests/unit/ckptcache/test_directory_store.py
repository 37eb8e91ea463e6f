"""The durable directory tier on a real (temporary) filesystem: atomic commits, leftovers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from stride.ckptcache.adapters.directory_store import DirectoryStore
from stride.ckptcache.domain.checkpoints import CheckpointHeader
from stride.runtime.errors import AlreadyExists

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def header(checkpoint_id: str = "c1", crc: int = 7, step: int = 3) -> CheckpointHeader:
    return CheckpointHeader("job-1", checkpoint_id, step, 6, crc)


async def save(store: DirectoryStore, head: CheckpointHeader, data: bytes = b"abcdef") -> None:
    upload = await store.begin(head, b"blob")
    await upload.write(data[:2])
    await upload.write(data[2:])
    await upload.commit(NOW)


@pytest.fixture
def store(tmp_path: Path) -> DirectoryStore:
    store = DirectoryStore(tmp_path / "store")
    store.prepare()
    return store


async def test_commit_makes_it_visible_and_readable(store: DirectoryStore) -> None:
    await save(store, header())
    found = await store.find("job-1", "c1")
    assert found is not None and found.header_blob == b"blob" and found.info.size_bytes == 6
    assert b"".join([c async for c in store.read("job-1", "c1", 4)]) == b"abcdef"
    assert [i.checkpoint_id for i in await store.checkpoints_of("job-1")] == ["c1"]
    assert await store.checkpoints_of("job-2") == []
    assert [s.info.checkpoint_id for s in await store.unpublished()] == ["c1"]
    await store.mark_published(found.info)
    assert await store.unpublished() == []


async def test_an_unfinished_upload_is_invisible_and_cleared_on_start(
    store: DirectoryStore,
) -> None:
    upload = await store.begin(header(), b"blob")
    await upload.write(b"abc")
    assert await store.find("job-1", "c1") is None
    assert await store.checkpoints_of("job-1") == []
    DirectoryStore(store.root).prepare()  # what the next start does
    assert not (store.root / ".staging").exists()
    await upload.abort()


async def test_abort_leaves_nothing(store: DirectoryStore) -> None:
    upload = await store.begin(header(), b"blob")
    await upload.write(b"abc")
    await upload.abort()
    assert list((store.root / ".staging").iterdir()) == []
    assert await store.find("job-1", "c1") is None


async def test_same_id_twice_same_content_is_fine_different_content_conflicts(
    store: DirectoryStore,
) -> None:
    await save(store, header())
    await save(store, header())
    with pytest.raises(AlreadyExists):
        await save(store, header(crc=8))
    assert list((store.root / ".staging").iterdir()) == []


async def test_delete(store: DirectoryStore) -> None:
    await save(store, header())
    assert await store.delete("job-1", "c1") is True
    assert await store.delete("job-1", "c1") is False
    assert await store.find("job-1", "c1") is None


async def test_writable_probe(store: DirectoryStore, tmp_path: Path) -> None:
    assert store.writable()
    assert not DirectoryStore(tmp_path / "missing").writable()


def test_unsafe_names_never_become_paths(store: DirectoryStore) -> None:
    with pytest.raises(ValueError):
        store.checkpoint_dir("job-1", "../escape")
    with pytest.raises(ValueError):
        store.job_dir("..")
