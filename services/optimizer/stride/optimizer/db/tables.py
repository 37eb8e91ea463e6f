"""The optimizer's tables: job administrators, optimization events, plans, the outbox and
its dead-letter table."""

from __future__ import annotations

from sqlalchemy import (
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

administrators = Table(
    "administrators",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("stage", String(32), nullable=False),
    Column("plan_version", Integer, nullable=False),
    # The admitted spec (a JobSpec); NULL for a job whose end arrived before its admission.
    Column("spec", LargeBinary, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

optimization_events = Table(
    "optimization_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(200), nullable=False, unique=True),
    Column("job_id", String(64), ForeignKey("administrators.job_id"), nullable=False, index=True),
    Column("root_cause", String(32), nullable=False),
    Column("event", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

plans = Table(
    "plans",
    metadata,
    Column("job_id", String(64), ForeignKey("administrators.job_id"), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("algorithm", String(128), nullable=False),
    Column("plan", LargeBinary, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Why the plan was chosen (JSON, see domain.explanation); NULL for plans made before
    # explanations were recorded.
    Column("explanation", Text, nullable=True),
)

observations = Table(
    "observations",
    metadata,
    Column("job_id", String(64), ForeignKey("administrators.job_id"), primary_key=True),
    # The job's windowed metric view as JSON (domain.observations.to_json).
    Column("view", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # The view's due window (its ``pending``; -1: none), for finding due decisions.
    Column("pending", Integer, nullable=False, server_default="-1", index=True),
    # Cores and GiB the job's current plan holds (every role), for the capacity check.
    Column("held_cpu", Float, nullable=False, server_default="0"),
    Column("held_memory_gib", Float, nullable=False, server_default="0"),
    # Whether the view's data-worker tuning step is due (its ``feeding.due``).
    Column("tuning_due", Boolean, nullable=False, server_default=false()),
    # Whether the cluster level divides CPUs to the job's data workers (``feeding.elastic``).
    Column("elastic", Boolean, nullable=False, server_default=false()),
)

claims = Table(
    "claims",
    metadata,
    Column("job_id", String(64), ForeignKey("administrators.job_id"), primary_key=True),
    # The plan version the claim was made against (void once the job has a newer one).
    Column("plan_version", Integer, nullable=False),
    # The claim as JSON (domain.claims.to_json).
    Column("claim", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

shares = Table(
    "shares",
    metadata,
    # No foreign key: a share may arrive before the job's admission is applied here.
    Column("job_id", String(64), primary_key=True),
    Column("version", Integer, nullable=False),
    # The most the job may hold (0 and 0: admission gave it no CPU share to bound).
    Column("cpu", Float, nullable=False),
    Column("memory_gib", Float, nullable=False),
    # What is reserved for its guarantee (held for it even while its plan is smaller).
    Column("minimum_cpu", Float, nullable=False),
    Column("minimum_memory_gib", Float, nullable=False),
    Column("guaranteed", Boolean, nullable=False),
    Column("reason", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

outbox = outbox_table(metadata)
outbox_dead_letter = outbox_dead_letter_table(metadata)
