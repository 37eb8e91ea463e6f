"""The cache's events on the bus: a checkpoint reached a tier."""

from __future__ import annotations

from stride.bus.client import Bus
from stride.ckptcache.adapters.convert import stored_event
from stride.ckptcache.domain.checkpoints import Tier
from stride.ckptcache.domain.tiers import StoredCheckpoint

EVENT_BY_TIER = {Tier.MEMORY: "saved", Tier.DURABLE: "persisted"}
"""``stride.checkpoints.v1.<job_id>.<event>`` per tier (checkpoint.proto)."""


def stored_subject(job_id: str, tier: Tier) -> str:
    """Where the event for a checkpoint reaching ``tier`` goes."""
    return f"stride.checkpoints.v1.{job_id}.{EVENT_BY_TIER[tier]}"


def stored_message_id(stored: StoredCheckpoint) -> str:
    """Deterministic per checkpoint content and tier, so a retried publish is de-duplicated
    while a new checkpoint that reuses a deleted one's id is not."""
    info = stored.info
    return f"{info.job_id}.{info.checkpoint_id}.{EVENT_BY_TIER[info.tier]}.{info.crc32c:08x}"


class BusCheckpointEvents:
    """Publishes ``CheckpointStored`` straight to JetStream (the cache has no database)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def stored(self, stored: StoredCheckpoint) -> None:
        """Publish that ``stored`` reached its tier; raises if NATS did not acknowledge."""
        await self.bus.publish(
            stored_subject(stored.info.job_id, stored.info.tier),
            stored_event(stored),
            stored_message_id(stored),
        )
