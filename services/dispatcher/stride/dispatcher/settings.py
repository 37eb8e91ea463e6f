"""Dispatcher settings (env prefix ``STRIDE_DISPATCHER_``)."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.dispatcher.domain.datasets import MAX_SHARDS_PER_EPOCH, DatasetLimits
from stride.dispatcher.domain.sharding import ROWS_PER_WRITE
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

    max_datasets_per_job: int = Field(default=16, ge=1, le=10_000)
    """Datasets one job may create (CreateDataset answers RESOURCE_EXHAUSTED past it). A job
    reads a training set and perhaps a few evaluation sets; sixteen leaves room for more
    stages while bounding what one job can make the dispatcher hold: its shard rows, and a
    cached shuffle order of up to 8 MB per dataset epoch (issue 37: no cap let one job's
    token create datasets and shards without end)."""
    max_shards_per_epoch: int = Field(default=MAX_SHARDS_PER_EPOCH, ge=1, le=MAX_SHARDS_PER_EPOCH)
    """Shards one epoch of a dataset may be cut into (CreateDataset answers INVALID_ARGUMENT
    past it, naming ``parameters.shard_batches``: bigger shards fix it). The default is the
    hard limit shard ids are built on (``stride.vocabulary.jobspec.MAX_SHARDS_PER_EPOCH``):
    an epoch is cut without writing its shards, so its size no longer stalls anyone, and
    what remains per epoch is its shuffled hand-out order, 8 MB at a million shards and half
    a second of one thread's CPU to compute once. Lower it on a small dispatcher."""
    rows_per_write: int = Field(default=ROWS_PER_WRITE, ge=1, le=100_000)
    """Shard rows written at a time when a dataset's TODO rows run out (the rest of the
    epoch is TODO without rows). About a millisecond of SQLite's write lock per hundred rows
    here, so a batch of 1,024 holds other jobs' calls for a few milliseconds, once every
    1,024 shards handed out (16 calls of 64); smaller batches cost more statements per
    shard, larger ones a longer pause for everyone."""

    batch_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    """Data-worker mode: how long a dispatched index batch may go unconsumed before another
    data worker gets it. Thirty seconds is many mini-batches of slack for a data worker
    that prefetches a few, yet a lost one's batches come back within the minute."""
    steps_in_flight: int = Field(default=64, ge=1, le=4096)
    """Data-worker mode: most steps dispatched and not yet consumed, per dataset. It bounds
    the chief's input queue (GoldMiner's queue capacity): data workers ahead of training by
    this much wait, and the chief never holds more ready mini-batches than it (64 of the
    text example's are 15 MB; 4,096, the lease table's cap, would be a gigabyte)."""
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
    def dataset_limits(self) -> DatasetLimits:
        """The per-job caps, for the use cases."""
        return DatasetLimits(self.max_shards_per_epoch, self.max_datasets_per_job)

    @property
    def rate_window(self) -> timedelta:
        """``straggler_window_seconds`` as a timedelta."""
        return timedelta(seconds=self.straggler_window_seconds)

    @property
    def lease_duration(self) -> timedelta:
        """``lease_seconds`` as a timedelta."""
        return timedelta(seconds=self.lease_seconds)
