"""Subject names and the streams that hold them; the one place the bus contract is spelled.

Subjects mirror the proto packages: ``stride.<area>.v1.<...>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream: its name, subjects and how long it keeps messages."""

    name: str
    subjects: tuple[str, ...]
    max_age: timedelta
    description: str


DUPLICATE_WINDOW = timedelta(minutes=10)
"""JetStream drops a message whose Nats-Msg-Id it saw within this window. Ten minutes covers
a service restart plus its outbox retry, which is what makes a re-publish harmless."""

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("STRIDE_JOBS", ("stride.jobs.v1.>",), timedelta(days=7), "job lifecycle facts"),
    StreamSpec(
        "STRIDE_PLANS", ("stride.plans.v1.>",), timedelta(days=7), "versioned resource plans"
    ),
    StreamSpec("STRIDE_PODS", ("stride.pods.v1.>",), timedelta(days=2), "pod lifecycle and usage"),
    StreamSpec("STRIDE_SHARDS", ("stride.shards.v1.>",), timedelta(days=2), "shard progress"),
    StreamSpec("STRIDE_METRICS", ("stride.metrics.v1.>",), timedelta(days=2), "training metrics"),
    StreamSpec(
        "STRIDE_CHECKPOINTS", ("stride.checkpoints.v1.>",), timedelta(days=7), "checkpoint facts"
    ),
    StreamSpec(
        "STRIDE_DEADLETTER", ("stride.deadletter.>",), timedelta(days=14), "undeliverable messages"
    ),
)

EXECUTOR_QUEUE_GROUP = "executors"


def job_submitted(job_id: str) -> str:
    """Admission stored a valid job."""
    return f"stride.jobs.v1.submitted.{job_id}"


def job_decision(outcome: str, job_id: str) -> str:
    """Admission decided: ``outcome`` is admitted, rejected or queued."""
    if outcome not in ("admitted", "rejected", "queued"):
        raise ValueError(f"outcome: {outcome!r} is not admitted, rejected or queued")
    return f"stride.jobs.v1.{outcome}.{job_id}"


def job_finished(job_id: str) -> str:
    """A job ended."""
    return f"stride.jobs.v1.finished.{job_id}"


def plan(job_id: str) -> str:
    """A new plan version for a job."""
    return f"stride.plans.v1.{job_id}"


def pod_event(job_id: str, event: str) -> str:
    """A pod of the job started, failed, was deleted or succeeded; or a usage sample."""
    return f"stride.pods.v1.{job_id}.{event}"


def dead_letter(consumer: str) -> str:
    """Where a consumer parks messages it can never process."""
    return f"stride.deadletter.{consumer}"


def executor_run(algorithm: str) -> str:
    """Request subject for running one algorithm in the executor pool."""
    return f"stride.executor.v1.run.{algorithm}"
