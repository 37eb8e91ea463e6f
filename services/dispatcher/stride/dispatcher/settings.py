"""Dispatcher settings (env prefix ``STRIDE_DISPATCHER_``)."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import MIB, ServiceSettings


class DispatcherSettings(ServiceSettings):
    """Settings of the shard dispatcher."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_DISPATCHER_", extra="ignore")
    service_name: ClassVar[str] = "dispatcher"

    grpc_port: int = Field(default=50055, ge=0, le=65535)
    """The shard API's well-known port (agents dial it)."""
    grpc_max_receive_message_bytes: int = Field(default=16 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The limit is per server, so it is set by the largest request, RestoreShards' snapshot,
    not by the hot path: a ShardSession message or a report is tens of bytes. A snapshot
    records every touched shard in about 30 bytes, so 16 MiB holds about half a million,
    many epochs of a billion-record dataset; the checkpoint cache, which stores snapshots in
    checkpoint headers, accepts the same."""
    grpc_max_send_message_bytes: int = Field(default=16 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answers are SnapshotShards' snapshot (the same 16 MiB as a restore
    accepts, so every snapshot taken can be restored) and FetchBatches' index batches;
    a client that asks for those raises its receive limit to match."""
    lease_seconds: float = Field(default=60.0, gt=0, le=3600)
    """How long a shard lease lasts without a progress report; RegisterWorker tells workers.
    A minute is four missed heartbeats at the agent's 15 s cadence: long enough not to take
    shards from a worker in a GC pause, short enough that a lost worker's shards come back
    quickly (DLRover-RM sec. 5.1). The sweeper returns a lapsed lease's shard to TODO."""
    sweep_interval_seconds: float = Field(default=5.0, gt=0, le=600)
    """How often the sweeper looks for lapsed leases and re-judges stragglers. A twelfth of
    the lease: a lapsed shard waits at most this long beyond its lease to come back."""
    straggler_window_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Time constant of each worker's progress rate, and how long a newly registered worker
    runs before it is judged. Two heartbeats at the agent's 15 s cadence: long enough that
    one slow batch is not a verdict, short enough to act within a minute (DLRover-RM
    sec. 6 reports handling a straggler "within 1 minute")."""
    retry_after_seconds: float = Field(default=1.0, gt=0, le=60)
    """What GetShard tells a worker to wait when every free shard is taken but others are
    still held: a second is short against a shard's minutes of training."""

    batch_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Data-worker mode: how long a dispatched index batch may go unconsumed before another
    data worker gets it. Thirty seconds is many mini-batches of slack for a data worker
    that prefetches a few, yet a lost one's batches come back within the minute."""
    sync_commits: bool = False
    """SQLite: wait for each commit to reach the disk (``synchronous=FULL``) before
    answering. Off by default: a commit is then in the OS page cache when the call returns,
    which survives a crash or SIGKILL of the dispatcher (the requirement) but not a power
    loss of the machine, which could lose the last fraction of a second of reports; those
    shards would be read again (at least once). On this machine kind an fsync takes about
    3 ms, which would cap one worker at about 300 shard hand-outs a second.

    PostgreSQL always commits synchronously: its asynchronous commit loses the last
    acknowledged commits when the *database server* crashes, not only on power loss
    (``bench/chaos.py``: one immediate shutdown, 40,960 samples trained twice), and a
    database restart must not repeat data."""

    @property
    def rate_window(self) -> timedelta:
        """``straggler_window_seconds`` as a timedelta."""
        return timedelta(seconds=self.straggler_window_seconds)

    @property
    def lease_duration(self) -> timedelta:
        """``lease_seconds`` as a timedelta."""
        return timedelta(seconds=self.lease_seconds)
