"""The checkpoint cache's composition root: wires the tiers, the bus and the API into a host.

The cache owns no database (``needs_database = False``): its storage is the durable
directory, whose writability is part of readiness.
"""

from __future__ import annotations

import asyncio

from stride.api.ckptcache.v1 import ckptcache_service_pb2, ckptcache_service_pb2_grpc
from stride.ckptcache.adapters.convert import parse_header, with_checksum
from stride.ckptcache.adapters.inbound.grpc_api import ACCESS, CheckpointCacheApi
from stride.ckptcache.adapters.outbound.directory_store import DirectoryStore
from stride.ckptcache.adapters.outbound.events import BusCheckpointEvents
from stride.ckptcache.adapters.outbound.memory_store import MemoryStore, SharedMemoryTooSmall
from stride.ckptcache.domain.retention import RetentionPolicy
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.ckptcache.usecases import CacheLimits, Checkpoints
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.wiring import connect_bus, create_host

SERVICE_NAME = ckptcache_service_pb2.DESCRIPTOR.services_by_name["CheckpointCacheService"].full_name


async def _nothing_to_close() -> None:
    return None


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
        max_job_memory_bytes=settings.max_job_memory_bytes,
        chunk_bytes=settings.chunk_bytes,
        retention=RetentionPolicy(settings.retain_last, settings.retain_every_steps),
        memory_keep=settings.memory_keep,
        persist_bytes_per_second=settings.persist_bytes_per_second,
        memory_ttl_seconds=settings.memory_ttl_seconds,
    )
    checkpoints = Checkpoints(
        memory, store, BusCheckpointEvents(bus), limits, with_checksum, parse_header
    )
    await checkpoints.recover()
    ckptcache_service_pb2_grpc.add_CheckpointCacheServiceServicer_to_server(
        CheckpointCacheApi(checkpoints), host.server.server
    )
    host.add_root_task("persist", lambda: checkpoints.run_persister(host.stop))
    sweep_every = min(60.0, settings.memory_ttl_seconds / 2)
    host.add_root_task("sweep-memory", lambda: checkpoints.run_sweeper(host.stop, sweep_every))
    host.add_root_task(
        "publish-pending",
        lambda: checkpoints.run_publisher(host.stop, settings.publish_retry_seconds),
    )
    return host
