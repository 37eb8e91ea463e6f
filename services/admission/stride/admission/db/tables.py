"""Admission's tables: jobs, their decisions, the ledger, the capacity, the outbox and its
dead letters."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    false,
)

from stride.db.outbox import outbox_dead_letter_table, outbox_table

metadata = MetaData()

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("request_id", String(200), nullable=True, unique=True),
    Column("name", String(128), nullable=False),
    Column("user", String(128), nullable=False, index=True),
    Column("state", String(32), nullable=False),
    Column("spec", LargeBinary, nullable=False),
    Column("submitted_at", DateTime(timezone=True), nullable=False, index=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

decisions = Table(
    "decisions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), ForeignKey("jobs.job_id"), nullable=False, index=True),
    Column("outcome", String(32), nullable=False),
    Column("decision", LargeBinary, nullable=False),
    Column("decided_at", DateTime(timezone=True), nullable=False),
)

ledger = Table(
    "ledger",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.job_id"), primary_key=True),
    Column("kind", String(8), nullable=False),
    Column("deadline", Float, nullable=True),
    Column("submitted", Float, nullable=False),
    Column("total_steps", Float, nullable=False),
    Column("remaining", Float, nullable=False),
    Column("units", Integer, nullable=False),
    Column("paused_until", Float, nullable=False),
    Column("last_update", Float, nullable=False),
    Column("share_version", Integer, nullable=False),
    Column("share", LargeBinary, nullable=True),
    Column("waiting_since", Float, nullable=True),
    Column("curve", JSON, nullable=True),
)
"""A planned job's books (:class:`stride.admission.domain.ledger.Entry`), written whenever
its units change; progress between writes follows from them (constant units). ``curve``
keeps a curve that came from similar jobs' history (a spec's profile is in the spec)."""

capacity = Table(
    "capacity",
    metadata,
    Column("kind", String(8), primary_key=True),
    Column("capacity", Integer, nullable=False),
    Column("observed_at", Float, nullable=False),
    Column("reason", String(200), nullable=False),
    Column("tree", Text, nullable=True),
)
"""Units of each resource kind in the newest node inventory (GPUs; CPU units), and for GPUs
the tree they are placed on (:meth:`stride.admission.domain.gputree.GpuTree.to_text`)."""

quotas = Table(
    "quotas",
    metadata,
    Column("scope", String(140), primary_key=True),
    Column("max_active_jobs", Integer, nullable=False),
    Column("max_submissions", Integer, nullable=False),
    Column("window_seconds", Float, nullable=False),
    Column("members", JSON, nullable=False),
    Column("source", String(8), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("max_priority", String(16), nullable=True),
    Column("allow_simulated", Boolean, nullable=False, server_default=false()),
)
"""Quotas of users and teams (:mod:`stride.admission.domain.quotas`), with what they grant
(``max_priority``: a priority word, NULL for none)."""

holdings = Table(
    "holdings",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.job_id"), primary_key=True),
    Column("plan_version", Integer, nullable=False),
    Column("cpu", Float, nullable=False),
    Column("memory_gib", Float, nullable=False),
)
"""What each running job's newest plan holds, whole (chief and data workers included), from
the optimizer's ``stride.plans.v1`` events: what share requests are decided against."""

share_requests = Table(
    "share_requests",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.job_id"), primary_key=True),
    Column("plan_version", Integer, nullable=False),
    Column("state", String(8), nullable=False),
    Column("request", JSON, nullable=False),
    Column("reason", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
"""Each job's newest share request (:class:`stride.policy.contention.ShareRequest`) and
admission's answer: ``queued`` (decided again when capacity frees), ``granted`` (the share
holds its wanted plan until the job ends or asks again) or ``refused``."""

outbox = outbox_table(metadata)
outbox_dead_letter = outbox_dead_letter_table(metadata)
