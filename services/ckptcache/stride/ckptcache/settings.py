"""Checkpoint cache settings (env prefix ``STRIDE_CKPTCACHE_``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.checkpoint_memory import default_shm_dir
from stride.runtime.settings import ServiceSettings

MIB = 1024 * 1024


def default_store_dir() -> Path:
    """``$XDG_STATE_HOME/stride/ckptcache``, else ``~/.local/state/stride/ckptcache``."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "stride" / "ckptcache"


class CheckpointCacheSettings(ServiceSettings):
    """Settings of the checkpoint cache."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_CKPTCACHE_", extra="ignore")
    service_name: ClassVar[str] = "ckptcache"
    needs_database: ClassVar[bool] = False

    grpc_port: int = Field(default=50056, ge=0, le=65535)
    """The checkpoint API's well-known port (agents dial it)."""
    grpc_max_receive_message_bytes: int = Field(default=16 * MIB, ge=64 * 1024, le=2**31 - 1)
    """A save streams the checkpoint in chunks (the client library sends 1 MiB, at most
    ``chunk_bytes``' 3 MiB); the one big message is the header, with one entry per tensor
    and the dispatcher's shard snapshot (up to its 16 MiB). 16 MiB holds that, and is the
    limit of the agent's channel to the cache, so whatever an agent forwards is accepted;
    the checkpoint's size is bounded by ``max_checkpoint_bytes``, not by this."""
    grpc_max_send_message_bytes: int = Field(default=16 * MIB, ge=64 * 1024, le=2**31 - 1)
    """A load streams ``chunk_bytes`` chunks after the header as saved, so the same 16 MiB
    as a save's header may be."""
    store_dir: Path = Field(default_factory=default_store_dir)
    """The durable tier's directory. It defaults to the user's XDG state directory, so a
    one-machine run keeps checkpoints across restarts without any setup. Compose and Helm
    mount a volume at /var/lib/stride/ckptcache. It must be writable, or the service
    reports NOT_SERVING."""
    chunk_bytes: int = Field(default=1 * MIB, ge=4096, le=3 * MIB)
    """Size of the data chunks a load streams. One MiB amortizes the per-message cost and
    stays well under gRPC's default 4 MiB message limit, headers included."""
    max_checkpoint_bytes: int = Field(default=64 * 1024 * MIB, gt=0)
    """The largest checkpoint accepted. 64 GiB covers the sparse models in DLRover-RM's
    evaluation (a 20 GB model in sec. 5.2) with room to spare; a bigger declared size is
    refused before any data is sent."""
    max_memory_bytes: int | None = Field(default=None, gt=0)
    """Shared memory all jobs' checkpoints may hold through this cache: the shards it keeps,
    every upload in progress at its declared size, and the free segments it keeps for
    reuse. A save past it is refused RESOURCE_EXHAUSTED (after the free segments are given
    back). Whatever it says, a save must also fit what the filesystem has free then, less
    what the uploads in progress will still write, since a tmpfs page is RAM that other
    processes on the node may have taken. Unset: half the shared-memory filesystem's size
    when the cache starts, because /dev/shm is the node's for everyone (trainers' data
    loaders and NCCL use it too) and tmpfs pages are unswappable RAM; half keeps the cache
    from crowding them out on Docker's and Kubernetes' sizes (``--shm-size``, an emptyDir's
    ``sizeLimit``) and on a host's default of half its RAM."""
    max_job_memory_bytes: int | None = Field(default=None, gt=0)
    """Shared memory one job's checkpoints may hold through this cache: the shards it
    keeps and its uploads in progress (at their declared size, from their header on). A
    save past it is refused RESOURCE_EXHAUSTED before any data is sent, so one job cannot
    take the node's memory from the others. Unset: twice ``max_checkpoint_bytes`` (a
    checkpoint kept and the next one), at most ``max_memory_bytes``; set above that
    budget, the cache refuses to start, since no job could ever use it."""
    max_uploads_per_job: int = Field(default=2, ge=1, le=64)
    """Streamed saves (``SaveCheckpoint``) one job may have in progress at once; one more is
    refused RESOURCE_EXHAUSTED. A trainer saves one shard at a time; two leaves room for a
    retry while the cache has not yet seen that the abandoned stream is gone."""
    upload_idle_seconds: float = Field(default=30.0, gt=0, le=3600)
    """A streamed save that sends nothing (not its header, not a chunk) for this long is
    aborted DEADLINE_EXCEEDED, and its partial data and reservation are released at once,
    so an idle stream cannot hold shared memory. A chunk is 1 MiB; 30 s is far longer
    than any live client takes to send one, even through the agent."""
    shm_dir: Path | None = None
    """Where checkpoints land first: a directory on a memory filesystem (tmpfs) that the
    trainers on this node can also write, so a save is one memory copy. Checkpoints here
    survive a crash of the cache, not of the node; a clean stop removes what the cache
    keeps here once all of it is durable (else it stays for the next start to persist).
    Unset: see :func:`default_shm_dir`, which ``stride down`` also removes."""
    shm_min_bytes: int = Field(default=256 * MIB, ge=0)
    """The smallest shared-memory filesystem the cache starts on. 256 MiB is four times
    Docker's 64 MB default, which kills a writer with SIGBUS on a real model (DLRover issue
    #1046), so a container started without --shm-size fails at once with the fix."""
    memory_keep: int = Field(default=1, ge=1, le=16)
    """Complete checkpoints kept in memory per job once persisted. Restores want only the
    newest; each one kept costs the model's size in RAM."""
    memory_ttl_seconds: float = Field(default=3600.0, gt=0)
    """A persisted checkpoint older than this leaves memory (its durable copy stays), so a
    finished or idle job does not hold RAM. An hour is far longer than any save interval,
    so a running job's newest checkpoint is always in memory."""
    free_segments_per_job: int = Field(default=2, ge=0, le=16)
    """Released segments kept for reuse per job: two lets a trainer alternate between
    buffers (save s+1 while s persists) without allocating fresh, slow-to-fault pages."""
    retain_last: int = Field(default=3, ge=1, le=1000)
    """Durable checkpoints kept per job: the newest few, in case the newest is bad."""
    retain_every_steps: int = Field(default=0, ge=0)
    """Also keep every durable checkpoint whose step is a multiple of this (0: none), for
    going back further than retain_last."""
    persist_bytes_per_second: float | None = Field(default=None, gt=0)
    """Cap on persistence bandwidth (None: as fast as the disk), so background copies do
    not starve the training's own reads from the same disk."""
    publish_retry_seconds: float = Field(default=5.0, gt=0, le=300)
    """How often "checkpoint stored" events that could not be published are retried."""

    @property
    def shared_memory_dir(self) -> Path:
        """``shm_dir``, or the default derived from the store directory."""
        return self.shm_dir or default_shm_dir(self.store_dir)
