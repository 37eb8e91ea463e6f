"""The checkpoint cache's composition root: wires the tiers, the bus and the API into a host.

The cache owns no database (``needs_database = False``): its storage is the durable
directory, whose writability is part of readiness. Its shared-memory directory is left
last on a clean stop (:meth:`Checkpoints.leave_shared_memory`).
"""

from __future__ import annotations

import asyncio

import structlog

from stride.api.ckptcache.v1 import ckptcache_service_pb2, ckptcache_service_pb2_grpc
from stride.ckptcache.adapters.convert import parse_header, with_checksum
from stride.ckptcache.adapters.inbound.grpc_api import ACCESS, CheckpointCacheApi
from stride.ckptcache.adapters.outbound.directory_store import DirectoryStore
from stride.ckptcache.adapters.outbound.events import BusCheckpointEvents
from stride.ckptcache.adapters.outbound.memory_store import MemoryStore, SharedMemoryTooSmall
from stride.ckptcache.domain.memory_budget import MemoryLimits, SharedMemoryState, resolve_limits
from stride.ckptcache.domain.retention import RetentionPolicy
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.ckptcache.usecases import CacheLimits, Checkpoints
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.wiring import connect_bus, create_host

log = structlog.get_logger(__name__)

SERVICE_NAME = ckptcache_service_pb2.DESCRIPTOR.services_by_name["CheckpointCacheService"].full_name


async def _nothing_to_close() -> None:
    return None


async def _always() -> bool:
    return True


def memory_limits(
    settings: CheckpointCacheSettings, memory: MemoryStore, state: SharedMemoryState
) -> MemoryLimits:
    """The shared-memory limits (StartupError for a per-job quota above the budget), with a
    warning when the budget is more than the filesystem has free: every save is then
    held to what is free when it starts."""
    try:
        limits = resolve_limits(
            budget_bytes=settings.max_memory_bytes,
            filesystem_bytes=memory.filesystem_bytes,
            job_quota_bytes=settings.max_job_memory_bytes,
            max_checkpoint_bytes=settings.max_checkpoint_bytes,
            uploads_per_job=settings.max_uploads_per_job,
        )
    except ValueError as error:
        raise StartupError(str(error)) from None
    log.info(
        "shared-memory limits",
        directory=str(memory.root),
        budget_bytes=limits.budget_bytes,
        job_quota_bytes=limits.job_quota_bytes,
        uploads_per_job=limits.uploads_per_job,
        filesystem_bytes=memory.filesystem_bytes,
        free_bytes=state.free_bytes,
    )
    if limits.budget_bytes > state.free_bytes:
        log.warning(
            "the shared-memory budget is more than the filesystem has free; saves are held "
            "to what is free when they start",
            budget_bytes=limits.budget_bytes,
            free_bytes=state.free_bytes,
        )
    return limits


async def build(settings: CheckpointCacheSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    memory = MemoryStore(settings.shared_memory_dir, settings.free_segments_per_job)
    try:
        await asyncio.to_thread(memory.prepare, settings.shm_min_bytes)
    except SharedMemoryTooSmall as error:
        raise StartupError(str(error)) from None
    except OSError as error:
        raise StartupError(
            f"cannot use shared memory at {settings.shared_memory_dir}: {error.strerror or error} "
            "(set STRIDE_CKPTCACHE_SHM_DIR to a writable directory on a tmpfs)"
        ) from None
    memory_budget = memory_limits(settings, memory, await asyncio.to_thread(memory.observe))
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    store = DirectoryStore(settings.store_dir)
    try:
        await asyncio.to_thread(store.prepare)
    except OSError as error:
        raise StartupError(
            f"cannot use the checkpoint store {settings.store_dir}: {error.strerror or error} "
            "(set STRIDE_CKPTCACHE_STORE_DIR to a writable directory)"
        ) from None

    async def store_writable() -> bool:
        return await asyncio.to_thread(store.writable)

    host.add_dependency(Dependency("store", store_writable, _nothing_to_close, closes_early=False))
    bus = await connect_bus(settings, host)
    limits = CacheLimits(
        max_size_bytes=settings.max_checkpoint_bytes,
        chunk_bytes=settings.chunk_bytes,
        retention=RetentionPolicy(settings.retain_last, settings.retain_every_steps),
        memory=memory_budget,
        memory_keep=settings.memory_keep,
        persist_bytes_per_second=settings.persist_bytes_per_second,
        memory_ttl_seconds=settings.memory_ttl_seconds,
    )
    checkpoints = Checkpoints(
        memory, store, BusCheckpointEvents(bus), limits, with_checksum, parse_header
    )
    await checkpoints.recover()
    # Nothing to watch while it runs (prepare checked it); its close runs last, after the
    # server and the persister have stopped, and gives the memory back.
    host.add_dependency(
        Dependency("shared memory", _always, checkpoints.leave_shared_memory, closes_early=False)
    )
    ckptcache_service_pb2_grpc.add_CheckpointCacheServiceServicer_to_server(
        CheckpointCacheApi(checkpoints, settings.upload_idle_seconds), host.server.server
    )
    host.add_root_task("persist", lambda: checkpoints.run_persister(host.stop))
    sweep_every = min(60.0, settings.memory_ttl_seconds / 2)
    host.add_root_task("sweep-memory", lambda: checkpoints.run_sweeper(host.stop, sweep_every))
    host.add_root_task(
        "publish-pending",
        lambda: checkpoints.run_publisher(host.stop, settings.publish_retry_seconds),
    )
    return host
