"""The checkpoint cache's composition root: wires the tiers, the bus and the API into a host.

The cache owns no database (``needs_database = False``): its storage is the durable
directory, whose writability is part of readiness.
"""

from __future__ import annotations

import asyncio

from stride.api.ckptcache.v1 import ckptcache_service_pb2, ckptcache_service_pb2_grpc
from stride.ckptcache.adapters.directory_store import DirectoryStore
from stride.ckptcache.adapters.events import BusCheckpointEvents
from stride.ckptcache.adapters.grpc_api import CheckpointCacheApi
from stride.ckptcache.checkpoints import Checkpoints
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.wiring import connect_bus, create_host

SERVICE_NAME = ckptcache_service_pb2.DESCRIPTOR.services_by_name["CheckpointCacheService"].full_name


async def _nothing_to_close() -> None:
    return None


async def build(settings: CheckpointCacheSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME])
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
    # Tiers fastest first. The shared-memory tier (with a /dev/shm size check) and the
    # asynchronous persister that copies it to the directory arrive with the flash-checkpoint
    # issue, in front of this durable tier.
    checkpoints = Checkpoints(
        [store], BusCheckpointEvents(bus), settings.max_checkpoint_bytes, settings.chunk_bytes
    )
    ckptcache_service_pb2_grpc.add_CheckpointCacheServiceServicer_to_server(
        CheckpointCacheApi(checkpoints), host.server.server
    )
    host.add_root_task(
        "publish-pending",
        lambda: checkpoints.run_publisher(host.stop, settings.publish_retry_seconds),
    )
    return host
