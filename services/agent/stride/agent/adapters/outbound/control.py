"""The agent's side of the control channel on the bus: commands for its job come in
(``topics.CONTROL_COMMAND``), and the trainer's answers go out (``topics.CONTROL_ACK``).

Commands are read with a plain NATS subscription on the job's command subject, not a
JetStream consumer: only commands issued while the pod runs matter (a new pod's trainer
gets its cluster from its environment), and a thousand pods must not leave a thousand
durable consumers behind.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import nats.errors
import structlog
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.msg import Msg

from stride.bus import topics
from stride.bus.client import Bus, flush_in_order
from stride.events.v1 import control_pb2
from stride.runtime.errors import Unavailable

log = structlog.get_logger(__name__)

Receiver = Callable[[control_pb2.ControlCommand], Awaitable[None]]


class AckPublisher:
    """Publishes the trainer's answers to control commands."""

    def __init__(self, bus: Bus, job_id: str, pod_name: str) -> None:
        self.bus = bus
        self.job_id = job_id
        self.pod_name = pod_name

    async def publish(self, ack: control_pb2.ControlAck) -> None:
        """Publish ``ack`` as this pod's; a retried ack has the same id and counts once."""
        ack.job_id = self.job_id
        ack.pod_name = self.pod_name
        acked_at = Timestamp()
        acked_at.FromDatetime(datetime.now(UTC))
        ack.acked_at.CopyFrom(acked_at)
        action = control_pb2.ControlAction.Name(ack.action).removeprefix("CONTROL_ACTION_").lower()
        message_id = f"{self.pod_name}.ack.{ack.plan_version}.{action}"
        try:
            await self.bus.publish(topics.CONTROL_ACK, self.job_id, ack, message_id)
        except (nats.errors.Error, TimeoutError) as error:
            raise Unavailable(f"NATS did not accept the control ack: {error}") from None


async def subscribe_commands(
    bus: Bus, job_id: str, receive: Receiver
) -> Callable[[], Awaitable[None]]:
    """Call ``receive`` with each command published for ``job_id`` from now on; returns a
    function that ends the subscription. Commands the pod watcher did not sign, and
    undecodable payloads, are logged and dropped."""
    subject = topics.CONTROL_COMMAND.subject(job_id)

    async def on_message(msg: Msg) -> None:
        # Only the pod watcher commands pods: a command anyone else could put on this
        # subject is not obeyed.
        forged = bus.forged(topics.CONTROL_COMMAND, subject, msg.data, msg.headers or {}, job_id)
        if forged is not None:
            log.warning("control command of an unverified sender dropped", reason=forged)
            return
        try:
            command = control_pb2.ControlCommand.FromString(msg.data)
        except DecodeError as error:
            log.warning("undecodable control command dropped", subject=subject, error=str(error))
            return
        if command.job_id != job_id:
            log.warning("control command for another job dropped", job_id=command.job_id)
            return
        try:
            await receive(command)
        except Exception:  # a bad command must not end the subscription
            log.exception("control command failed", action=command.action)

    subscription = await bus.nc.subscribe(subject, cb=on_message)
    await flush_in_order(bus.nc)  # "from now on": the server has the subscription

    async def stop() -> None:
        await subscription.unsubscribe()

    return stop
