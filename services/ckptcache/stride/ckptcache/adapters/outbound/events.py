"""The cache's events on the bus: a checkpoint reached a tier."""

from __future__ import annotations

from stride.bus import topics
from stride.bus.client import Bus
from stride.ckptcache.adapters.convert import stored_event
from stride.ckptcache.domain.checkpoints import Tier
from stride.ckptcache.domain.tiers import StoredCheckpoint

TOPIC_BY_TIER = {Tier.MEMORY: topics.CHECKPOINT_SAVED, Tier.DURABLE: topics.CHECKPOINT_PERSISTED}
"""The event of a checkpoint reaching each tier (checkpoint.proto)."""


def stored_message_id(stored: StoredCheckpoint) -> str:
    """Deterministic per checkpoint content and tier, so a retried publish is de-duplicated
    while a new checkpoint that reuses a deleted one's id is not."""
    info = stored.info
    return f"{info.job_id}.{info.checkpoint_id}.{TOPIC_BY_TIER[info.tier].suffix}.{info.crc32c:08x}"


class BusCheckpointEvents:
    """Publishes ``CheckpointStored`` straight to JetStream (the cache has no database)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def stored(self, stored: StoredCheckpoint) -> None:
        """Publish that ``stored`` reached its tier; raises if NATS did not acknowledge."""
        await self.bus.publish(
            TOPIC_BY_TIER[stored.info.tier],
            stored.info.job_id,
            stored_event(stored),
            stored_message_id(stored),
        )
