"""Where the checkpoint cache keeps checkpoints in the node's shared memory by default.

Two parties need the path: the cache (its default ``shm_dir``) and ``stride down``, which
removes what a killed cache left in RAM. Services never import each other and the CLI
imports no service, so the one derivation lives here.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

SHARED_MEMORY_ROOT = Path("/dev/shm")
DIRECTORY_PREFIX = "stride-ckptcache-"


def default_shm_dir(store_dir: Path) -> Path:
    """``/dev/shm/stride-ckptcache-<hash of the store directory>``: the node's shared memory,
    which trainers can write. Named after the store so two caches on one machine (two local
    stacks, parallel tests) never share it, while a restarted cache finds its own again."""
    digest = hashlib.sha256(str(store_dir.resolve()).encode()).hexdigest()[:12]
    return SHARED_MEMORY_ROOT / f"{DIRECTORY_PREFIX}{digest}"


def remove_default_shm_dir(store_dir: Path) -> Path | None:
    """Remove the default shared-memory directory of the cache whose store is ``store_dir``
    (its process must be gone); returns the directory if there was one.

    For the end of a suite: a cache stopped cleanly removes it itself once everything in it
    is durable, so one is left only by a killed cache or one that could not persist
    everything. Whatever only it held is lost; the durable checkpoints in ``store_dir``
    stay. Only the derived directory is removed: one named by ``STRIDE_CKPTCACHE_SHM_DIR``
    is the operator's.
    """
    directory = default_shm_dir(store_dir)
    if not directory.exists():
        return None
    shutil.rmtree(directory, ignore_errors=True)
    return directory
