"""Checkpoint cache settings (env prefix ``STRIDE_CKPTCACHE_``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

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
    publish_retry_seconds: float = Field(default=5.0, gt=0, le=300)
    """How often "checkpoint stored" events that could not be published are retried."""
