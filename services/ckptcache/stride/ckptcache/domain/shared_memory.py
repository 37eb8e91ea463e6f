"""Whether shared memory is big enough, and what to tell the operator when it is not.

A write into a tmpfs page that the filesystem cannot back kills the writer with SIGBUS,
long after the file was created; Docker's default /dev/shm of 64 MB does exactly that to a
real checkpoint (DLRover issue #1046). So the cache checks the size when it starts and the
client reserves each segment's pages (posix_fallocate) before writing, and both fail with
this message instead.
"""

from __future__ import annotations

MIB = 1024 * 1024

HOW_TO_FIX = (
    "give the container a bigger /dev/shm: `docker run --shm-size=2g`, `shm_size: 2gb` in "
    "compose, or in Kubernetes an emptyDir volume with `medium: Memory` and a sizeLimit "
    "mounted at /dev/shm"
)


def too_small(path: str, total_bytes: int, needed_bytes: int) -> str | None:
    """Why a shared-memory filesystem of ``total_bytes`` cannot serve, or None if it can."""
    if total_bytes >= needed_bytes:
        return None
    return (
        f"shared memory at {path} is {total_bytes // MIB} MiB, less than the "
        f"{needed_bytes // MIB} MiB the checkpoint cache needs (writing past it kills the "
        f"writer with SIGBUS); {HOW_TO_FIX}, or lower STRIDE_CKPTCACHE_SHM_MIN_BYTES"
    )


def no_room(path: str, free_bytes: int, needed_bytes: int) -> str | None:
    """Why a segment of ``needed_bytes`` cannot be created, or None if it can."""
    if free_bytes >= needed_bytes:
        return None
    return (
        f"shared memory at {path} has {free_bytes // MIB} MiB free, not enough for a "
        f"{needed_bytes / MIB:.1f} MiB checkpoint; {HOW_TO_FIX}, or keep fewer checkpoints "
        "in memory"
    )
