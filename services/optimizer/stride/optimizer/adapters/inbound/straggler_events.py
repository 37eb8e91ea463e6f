"""The optimizer's consumer of the dispatcher's StragglerDetected (see
:mod:`stride.optimizer.stragglers`). The bus has already checked that the payload's job id
is its subject's, and acks only after the handler returned, i.e. after the commit."""

from __future__ import annotations

from stride.bus.client import Delivery
from stride.events.v1 import shard_pb2
from stride.optimizer.stragglers import StragglerEvents


class StragglerHandler:
    """Records each straggler on its job, once per bus message (a redelivery is a no-op)."""

    def __init__(self, stragglers: StragglerEvents) -> None:
        self.stragglers = stragglers

    async def __call__(self, event: shard_pb2.StragglerDetected, delivery: Delivery) -> None:
        await self.stragglers.detected(event, delivery.message_id)
