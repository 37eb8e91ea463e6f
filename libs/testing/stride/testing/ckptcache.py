"""The checkpoint cache as a process of its own, for tests: its shared memory in a folder of
the test's under ``/dev/shm``, its store in the test's folder."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from stride.testing.processes import ServiceProcess


def shm_folder() -> Iterator[Path]:
    """A fresh folder name under ``/dev/shm`` (the cache makes it), removed after: the body
    of a test's ``shm_dir`` fixture."""
    path = Path("/dev/shm") / f"stride-test-{uuid.uuid4().hex[:12]}"
    yield path
    shutil.rmtree(path, ignore_errors=True)


def cache_process(nats_url: str, tmp_path: Path, shm_dir: Path, **settings: str) -> ServiceProcess:
    """The cache (not started) on ``shm_dir`` and ``<tmp_path>/store``; ``settings``: more
    of its settings, by name without the ``STRIDE_CKPTCACHE_`` prefix."""
    env = {
        "STRIDE_NATS_URL": nats_url,
        "STRIDE_CKPTCACHE_STORE_DIR": str(tmp_path / "store"),
        "STRIDE_CKPTCACHE_SHM_DIR": str(shm_dir),
        "STRIDE_CKPTCACHE_HEALTH_INTERVAL_SECONDS": "0.2",
    }
    env.update({f"STRIDE_CKPTCACHE_{key.upper()}": value for key, value in settings.items()})
    return ServiceProcess("ckptcache", env, tmp_path)
