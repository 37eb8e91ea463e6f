"""Step metrics from the trainer onto the bus (``topics.STEP_METRICS``)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

import nats.errors
from google.protobuf.timestamp_pb2 import Timestamp

from stride.agent.domain.steps import StepWindow, validate
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import metrics_pb2
from stride.runtime.errors import Unavailable


class StepReporter:
    """Publishes one pod's step windows straight to JetStream (the agent has no database)."""

    def __init__(self, bus: Bus, job_id: str, pod_name: str) -> None:
        self.bus = bus
        self.job_id = job_id
        self.pod_name = pod_name

    async def report(self, window: StepWindow) -> None:
        """Validate and publish a window. The id is ``<pod>.<plan version>.<global_step>``,
        so a trainer retrying a report is counted once, while the steps a move repeats from
        its checkpoint under a new plan are measurements of that plan."""
        validate(window)
        reported_at = Timestamp()
        reported_at.FromDatetime(datetime.now(UTC))
        message = metrics_pb2.StepMetrics(
            job_id=self.job_id,
            pod_name=self.pod_name,
            global_step=window.global_step,
            steps=window.steps,
            step_seconds=window.step_seconds,
            samples_per_second=window.samples_per_second,
            # Job-wide consumption is the dispatcher's to know, not one pod's; left 0 here.
            samples_consumed=0,
            reported_at=reported_at,
            plan_version=window.plan_version,
        )
        if window.input_queue is not None:
            queue = window.input_queue
            message.input_queue.CopyFrom(metrics_pb2.InputQueue(**asdict(queue)))
        try:
            await self.bus.publish(
                topics.STEP_METRICS,
                self.job_id,
                message,
                f"{self.pod_name}.{window.plan_version}.{window.global_step}",
            )
        except (nats.errors.Error, TimeoutError) as error:
            raise Unavailable(f"NATS did not accept the step metrics: {error}") from None
