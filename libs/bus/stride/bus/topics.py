"""The bus contract, typed: every event type is one :class:`Topic`, spelled only here.

A topic knows its JetStream stream, how to build the subject of one job's event, the
pattern a consumer subscribes to, and the protobuf type of its payload. Producers build
what they publish through a topic (:meth:`Topic.outgoing`), and consumers subscribe through
one (``Bus.consume(topic, ...)``), so a producer and its consumers cannot disagree on a
subject, a stream or a type. ``tests/unit/test_bus_contract.py`` fails if a subject or
stream name is written anywhere else.

Subjects mirror the proto packages: ``stride.<area>.v1.<...>``; each ``proto/stride/events``
file names its subjects in its header comment.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from stride.events.v1 import (
    auth_pb2,
    checkpoint_pb2,
    cluster_pb2,
    control_pb2,
    job_pb2,
    metrics_pb2,
    optimization_pb2,
    plan_pb2,
    pod_pb2,
    shard_pb2,
)
from stride.obs.tracing import inject_headers

M = TypeVar("M", bound=Message)

TYPE_HEADER = "Stride-Type"
"""Full protobuf name of the payload, checked by consumers before decoding."""

DUPLICATE_WINDOW = timedelta(minutes=10)
"""JetStream drops a message whose Nats-Msg-Id it saw within this window. Ten minutes covers
a service restart plus its outbox retry, which is what makes a re-publish harmless."""


@dataclass(frozen=True)
class Stream:
    """A JetStream stream: its name, the subjects it holds and how long it keeps them."""

    name: str
    subjects: tuple[str, ...]
    max_age: timedelta
    description: str


JOBS = Stream("STRIDE_JOBS", ("stride.jobs.v1.>",), timedelta(days=7), "job lifecycle facts")
PLANS = Stream("STRIDE_PLANS", ("stride.plans.v1.>",), timedelta(days=7), "versioned plans")
PODS = Stream("STRIDE_PODS", ("stride.pods.v1.>",), timedelta(days=2), "pod lifecycle and usage")
SHARDS = Stream("STRIDE_SHARDS", ("stride.shards.v1.>",), timedelta(days=2), "shard progress")
METRICS = Stream("STRIDE_METRICS", ("stride.metrics.v1.>",), timedelta(days=2), "training metrics")
CHECKPOINTS = Stream(
    "STRIDE_CHECKPOINTS", ("stride.checkpoints.v1.>",), timedelta(days=7), "checkpoint facts"
)
CONTROL = Stream(
    "STRIDE_CONTROL",
    ("stride.control.v1.>",),
    timedelta(hours=6),
    "commands to a job's pods and their answers",
)
CLUSTER = Stream("STRIDE_CLUSTER", ("stride.cluster.v1.>",), timedelta(days=7), "node inventory")
AUTH = Stream(
    "STRIDE_AUTH",
    ("stride.auth.v1.>",),
    timedelta(days=400),
    "revoked tokens (kept longer than a user token may live: 365 days)",
)
DEAD_LETTERS = Stream(
    "STRIDE_DEADLETTER", ("stride.deadletter.>",), timedelta(days=14), "undeliverable messages"
)

STREAMS: tuple[Stream, ...] = (
    JOBS,
    PLANS,
    PODS,
    SHARDS,
    METRICS,
    CHECKPOINTS,
    CONTROL,
    CLUSTER,
    AUTH,
    DEAD_LETTERS,
)
"""Every stream of the contract; each service declares them all at start (idempotent)."""

ANY = "*"
"""The key of a consumer pattern: every job (one subject token)."""


class BadKey(ValueError):
    """A subject key (a job id, a consumer name) that is not one NATS subject token."""


def check_token(key: str, what: str) -> str:
    """``key`` if it is one non-empty subject token without wildcards, dots or spaces."""
    if not key or any(c in key for c in ".*> \t\r\n") or len(key) > 255:
        raise BadKey(f"{what}: {key[:40]!r} is not a subject token (no dots, wildcards, spaces)")
    return key


@dataclass(frozen=True)
class Outgoing:
    """An event ready to publish or to put in an outbox: subject, bytes, id and headers."""

    subject: str
    payload: bytes
    message_id: str
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Topic(Generic[M]):
    """One event type: ``<prefix>.<key>[.<suffix>]`` in ``stream``, carrying ``message_type``.

    The key is the job id for every job-scoped event, so a consumer subscribes to all jobs
    with :meth:`pattern` and a handler checks a message's job against its subject with
    :meth:`key_of`.
    """

    name: str
    """A short name for logs and durable consumer names, e.g. ``job-admitted``."""
    stream: Stream
    prefix: str
    message_type: type[M]
    suffix: str = ""
    description: str = field(default="", compare=False)
    producers: tuple[str, ...] = field(default=(), compare=False)
    """The identities (:data:`stride.runtime.tls.SERVICE_IDENTITIES`) that may publish it:
    consumers refuse an event signed by anyone else (:mod:`stride.bus.signing`)."""

    def subject(self, key: str) -> str:
        """The subject of one event; ``key`` (a job id) must be one subject token."""
        return self._build(check_token(key, f"{self.name} key"))

    def pattern(self) -> str:
        """The subject a consumer of every job's events subscribes to."""
        return self._build(ANY)

    def _build(self, key: str) -> str:
        tail = f".{self.suffix}" if self.suffix else ""
        return f"{self.prefix}.{key}{tail}"

    def key_of(self, subject: str) -> str | None:
        """The key (job id) in ``subject`` if it is one of this topic's subjects, else None."""
        head = f"{self.prefix}."
        tail = f".{self.suffix}" if self.suffix else ""
        if not subject.startswith(head) or not subject.endswith(tail):
            return None
        key = subject[len(head) : len(subject) - len(tail)]
        try:
            return check_token(key, self.name)
        except BadKey:
            return None

    def outgoing(
        self,
        key: str,
        message: M,
        message_id: str,
        headers: Mapping[str, str] | None = None,
    ) -> Outgoing:
        """The event for ``key``, with the payload type and trace context in its headers.

        Raises TypeError if ``message`` is not this topic's type: a producer cannot put a
        plan on the jobs stream by mistake.
        """
        if not isinstance(message, self.message_type):
            raise TypeError(
                f"{self.name} carries {self.message_type.DESCRIPTOR.full_name}, "
                f"not {message.DESCRIPTOR.full_name}"
            )
        return Outgoing(
            self.subject(key),
            message.SerializeToString(),
            message_id,
            {**(headers or {}), **message_headers(message)},
        )


def message_headers(message: Message) -> dict[str, str]:
    """Headers for publishing ``message`` (now or later from an outbox): payload type and
    trace context."""
    headers = {TYPE_HEADER: message.DESCRIPTOR.full_name}
    inject_headers(headers)
    return headers


ADMISSION = ("admission",)
OPTIMIZER = ("optimizer",)
PODWATCHER = ("podwatcher",)
DISPATCHER = ("dispatcher",)
CKPTCACHE = ("ckptcache",)
AGENT = ("agent",)

# --- jobs (admission publishes; the optimizer, configdb and admission consume) -----------
JOB_SUBMITTED = Topic(
    "job-submitted",
    JOBS,
    "stride.jobs.v1.submitted",
    job_pb2.JobSubmitted,
    description="admission stored a valid job",
    producers=ADMISSION,
)
JOB_ADMITTED = Topic(
    "job-admitted",
    JOBS,
    "stride.jobs.v1.admitted",
    job_pb2.AdmissionDecision,
    description="admission admitted a job, with its minimum share",
    producers=ADMISSION,
)
JOB_REJECTED = Topic(
    "job-rejected",
    JOBS,
    "stride.jobs.v1.rejected",
    job_pb2.AdmissionDecision,
    description="admission rejected a job, with the reason",
    producers=ADMISSION,
)
JOB_QUEUED = Topic(
    "job-queued",
    JOBS,
    "stride.jobs.v1.queued",
    job_pb2.AdmissionDecision,
    description="admission queued a job for capacity",
    producers=ADMISSION,
)
JOB_FINISHED = Topic(
    "job-finished",
    JOBS,
    "stride.jobs.v1.finished",
    job_pb2.JobFinished,
    description="a job ended: succeeded, failed or cancelled",
    producers=("admission", "podwatcher"),
)

JOB_SHARE = Topic(
    "job-share",
    JOBS,
    "stride.jobs.v1.share",
    job_pb2.JobShare,
    description="admission set a job's share of the cluster (the optimizer plans within it)",
    producers=ADMISSION,
)

DECISION_TOPICS: Mapping[str, Topic[job_pb2.AdmissionDecision]] = {
    "admitted": JOB_ADMITTED,
    "soft": JOB_ADMITTED,
    "rejected": JOB_REJECTED,
    "queued": JOB_QUEUED,
}
"""The decision topic of each admission outcome; a soft job runs (best effort), so it is
announced as admitted, with outcome SOFT."""

# --- plans (the optimizer publishes; the pod watcher and configdb consume) ---------------
PLAN = Topic(
    "plan",
    PLANS,
    "stride.plans.v1",
    plan_pb2.ResourcePlan,
    description="a new plan version for a job; the highest version wins",
    producers=OPTIMIZER,
)

WINDOW_DECIDED = Topic(
    "window-decided",
    PLANS,
    "stride.plans.v1",
    optimization_pb2.WindowDecided,
    "decided",
    description="the optimizer decided on a job's measurement window: plan kept, changed or held",
    producers=OPTIMIZER,
)

# --- pods (the pod watcher publishes; the dispatcher and the optimizer consume) ----------
POD_STARTED = Topic(
    "pod-started", PODS, "stride.pods.v1", pod_pb2.PodEvent, "started", producers=PODWATCHER
)
POD_FAILED = Topic(
    "pod-failed", PODS, "stride.pods.v1", pod_pb2.PodEvent, "failed", producers=PODWATCHER
)
POD_DELETED = Topic(
    "pod-deleted", PODS, "stride.pods.v1", pod_pb2.PodEvent, "deleted", producers=PODWATCHER
)
POD_SUCCEEDED = Topic(
    "pod-succeeded", PODS, "stride.pods.v1", pod_pb2.PodEvent, "succeeded", producers=PODWATCHER
)
POD_USAGE = Topic(
    "pod-usage", PODS, "stride.pods.v1", pod_pb2.UsageSample, "usage", producers=PODWATCHER
)

# --- shards (the dispatcher publishes) ----------------------------------------------------
SHARD_PROGRESS = Topic(
    "shard-progress",
    SHARDS,
    "stride.shards.v1",
    shard_pb2.ShardProgress,
    "progress",
    producers=DISPATCHER,
)
SHARD_DONE = Topic(
    "shard-done", SHARDS, "stride.shards.v1", shard_pb2.ShardProgress, "done", producers=DISPATCHER
)
SHARDS_DONE = Topic(
    "shards-done",
    SHARDS,
    "stride.shards.v1",
    shard_pb2.ShardsDone,
    "done-batch",
    producers=DISPATCHER,
    description="shards a batched GetShard reported done: one event per call",
)
SHARD_FAILED = Topic(
    "shard-failed",
    SHARDS,
    "stride.shards.v1",
    shard_pb2.ShardProgress,
    "failed",
    producers=DISPATCHER,
)
SHARD_REQUEUED = Topic(
    "shard-requeued",
    SHARDS,
    "stride.shards.v1",
    shard_pb2.ShardProgress,
    "requeued",
    producers=DISPATCHER,
)
SHARD_EPOCH = Topic(
    "shard-epoch",
    SHARDS,
    "stride.shards.v1",
    shard_pb2.ShardProgress,
    "epoch",
    producers=DISPATCHER,
)
STRAGGLER_DETECTED = Topic(
    "straggler-detected",
    SHARDS,
    "stride.shards.v1",
    shard_pb2.StragglerDetected,
    "straggler",
    producers=DISPATCHER,
)

SHARD_TOPICS: Mapping[str, Topic[shard_pb2.ShardProgress]] = {
    "progress": SHARD_PROGRESS,
    "done": SHARD_DONE,
    "failed": SHARD_FAILED,
    "requeued": SHARD_REQUEUED,
    "epoch": SHARD_EPOCH,
}
"""The topic of each shard event that carries a :class:`ShardProgress`."""

# --- metrics (agents publish) -------------------------------------------------------------
STEP_METRICS = Topic(
    "step-metrics", METRICS, "stride.metrics.v1", metrics_pb2.StepMetrics, "steps", producers=AGENT
)

# --- checkpoints (the checkpoint cache publishes) -----------------------------------------
CHECKPOINT_SAVED = Topic(
    "checkpoint-saved",
    CHECKPOINTS,
    "stride.checkpoints.v1",
    checkpoint_pb2.CheckpointStored,
    "saved",
    producers=CKPTCACHE,
)
CHECKPOINT_PERSISTED = Topic(
    "checkpoint-persisted",
    CHECKPOINTS,
    "stride.checkpoints.v1",
    checkpoint_pb2.CheckpointStored,
    "persisted",
    producers=CKPTCACHE,
)

# --- control (the podwatcher commands a job's pods; their agents answer) ------------------
CONTROL_COMMAND = Topic(
    "control-command",
    CONTROL,
    "stride.control.v1",
    control_pb2.ControlCommand,
    "command",
    producers=PODWATCHER,
)
CONTROL_ACK = Topic(
    "control-ack", CONTROL, "stride.control.v1", control_pb2.ControlAck, "ack", producers=AGENT
)

# --- cluster (the podwatcher publishes its node inventory; admission plans on it) ---------
NODE_INVENTORY = Topic(
    "node-inventory",
    CLUSTER,
    "stride.cluster.v1.nodes",
    cluster_pb2.NodeInventory,
    description="every node pods may be placed on now (the newest replaces the rest)",
    producers=PODWATCHER,
)

# --- auth (admission publishes revoked tokens; every server follows them) -----------------
TOKEN_REVOKED = Topic(
    "token-revoked",
    AUTH,
    "stride.auth.v1",
    auth_pb2.TokenRevocation,
    "revoked",
    description="an administrator revoked one token, or a user's tokens until a moment; or a "
    "job ended, and with it its job tokens",
    producers=ADMISSION,
)


def revoked_token_key(token_id: str) -> str:
    """The subject key of one token's revocation."""
    return f"token-{token_id}"


def revoked_job_key(job_id: str) -> str:
    """The subject key of an ended job's job tokens' revocation."""
    return f"job-{job_id}"


def revoked_user_key(user: str) -> str:
    """The subject key of a user's revocation: a hash, as a user name may hold any
    character (a later revocation of the same user replaces the earlier one)."""
    return "user-" + hashlib.sha256(user.encode()).hexdigest()[:32]


TOPICS: tuple[Topic[Any], ...] = (
    JOB_SUBMITTED,
    JOB_ADMITTED,
    JOB_REJECTED,
    JOB_QUEUED,
    JOB_FINISHED,
    JOB_SHARE,
    PLAN,
    WINDOW_DECIDED,
    POD_STARTED,
    POD_FAILED,
    POD_DELETED,
    POD_SUCCEEDED,
    POD_USAGE,
    SHARD_PROGRESS,
    SHARD_DONE,
    SHARD_FAILED,
    SHARD_REQUEUED,
    SHARD_EPOCH,
    STRAGGLER_DETECTED,
    STEP_METRICS,
    CHECKPOINT_SAVED,
    CHECKPOINT_PERSISTED,
    CONTROL_COMMAND,
    CONTROL_ACK,
    NODE_INVENTORY,
    TOKEN_REVOKED,
)
"""Every durable event type of the contract."""


# --- dead letters (any consumer parks what it can never process) --------------------------
DEAD_LETTER_PREFIX = "stride.deadletter"


def dead_letter_subject(consumer: str) -> str:
    """Where the durable consumer ``consumer`` parks messages it can never process."""
    return f"{DEAD_LETTER_PREFIX}.{check_token(consumer, 'consumer')}"


# --- executor work (core NATS request/reply, not a stream) --------------------------------
@dataclass(frozen=True)
class RequestTopic:
    """Core NATS request/reply served by a queue group: one subject per algorithm.

    The replica that takes a request says so at once and then every ``progress_seconds``
    until it answers, in empty messages to the reply subject that carry the
    ``Stride-Progress`` header. A requester so tells a replica that died (no word for a
    few of those intervals) from one still running a long search, and asks another only
    in the first case: waiting for the answer itself, it had to guess a run's length, and
    each run longer than the guess was sent again while it still ran.
    """

    prefix: str
    queue_group: str
    request_type: type[optimization_pb2.AlgorithmRequest]
    reply_type: type[optimization_pb2.AlgorithmReply]
    progress_seconds: float = 1.0
    max_replies: int = 4096
    """Messages a replica may send to one reply subject (the progress messages, then the
    answer): what the NATS lock-down lets a responder publish per request
    (``allow_responses.max``). 4,096 at one a second covers 68 minutes of running, past
    the executor's longest time limit (an hour)."""

    def subject(self, algorithm: str) -> str:
        """The request subject of ``algorithm``."""
        return f"{self.prefix}.{check_token(algorithm, 'algorithm')}"

    def pattern(self) -> str:
        """What a replica subscribes to: every algorithm."""
        return f"{self.prefix}.>"


EXECUTOR_RUN = RequestTopic(
    "stride.executor.v1.run",
    "executors",
    optimization_pb2.AlgorithmRequest,
    optimization_pb2.AlgorithmReply,
)
"""Algorithm requests to the executor pool; any replica in the queue group answers."""
