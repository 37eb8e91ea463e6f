"""Reading what is on a JetStream subject, as a test checks what a service published."""

from __future__ import annotations

import nats
from nats.aio.msg import Msg

from stride.bus.topics import dead_letter_subject


async def stream_messages(nats_url: str, subject: str, idle: float = 0.3) -> list[Msg]:
    """Every stored message on ``subject`` (wildcards allowed), oldest first.

    Reads with an ordered consumer until nothing arrives for ``idle`` seconds.
    """
    nc = await nats.connect(nats_url)
    try:
        subscription = await nc.jetstream().subscribe(subject, ordered_consumer=True)
        messages = []
        try:
            while True:
                messages.append(await subscription.next_msg(timeout=idle))
        except nats.errors.TimeoutError:
            return messages
    finally:
        await nc.close()


async def dead_letters(nats_url: str, durable: str) -> list[Msg]:
    """Messages the consumer ``durable`` parked on the dead-letter stream."""
    return await stream_messages(nats_url, dead_letter_subject(durable))
