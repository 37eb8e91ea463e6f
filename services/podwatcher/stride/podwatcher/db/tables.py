"""Podwatcher's tables: accepted plans, the jobs it runs pods for, their pods, and the
outbox that publishes pod and job events in the same transaction as the change.

Only plans newer than the job's newest are stored, so a job's rows are its accepted plans
in version order and the newest row is the plan the backend works towards. A pod row is
written before its processes start (PENDING) and updated when the backend reports it, so
after a crash the rows and the backend's adopted pods can be matched again.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

from stride.db.outbox import outbox_dead_letter_table, outbox_table

metadata = MetaData()

plans = Table(
    "plans",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("version", BigInteger, primary_key=True),
    Column("plan", LargeBinary, nullable=False),
    Column("state", String(16), nullable=False),
    Column("message", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", String(64), primary_key=True),
    # The admitted JobSpec: what the trainer runs.
    Column("spec", LargeBinary, nullable=False),
    # RUNNING, SUCCEEDED, FAILED or CANCELLED.
    Column("state", String(16), nullable=False),
    Column("message", Text, nullable=False),
    # The plan version whose cluster the chief was told to move to and has not confirmed
    # (0: none pending), and since when: pods retiring with it go once it confirms.
    Column("reconfigure_version", BigInteger, nullable=False),
    Column("reconfigure_since", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

pods = Table(
    "pods",
    metadata,
    Column("name", String(253), primary_key=True),
    Column("job_id", String(64), nullable=False, index=True),
    Column("role", String(16), nullable=False),
    Column("pod_index", Integer, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("cpu", Float, nullable=False),
    Column("memory_bytes", BigInteger, nullable=False),
    Column("node", String(253), nullable=False),
    # The trainer's port (its TensorFlow server) and the agent's, kept across relaunches so
    # the chief finds a relaunched PS or worker where it was.
    Column("port", Integer, nullable=False),
    Column("agent_port", Integer, nullable=False),
    Column("plan_version", BigInteger, nullable=False),
    Column("phase", String(16), nullable=False),
    Column("restarts", Integer, nullable=False),
    # Empty, OOMKilled, Evicted or Error.
    Column("last_failure", String(16), nullable=False),
    Column("last_message", Text, nullable=False),
    Column("failed_at", DateTime(timezone=True), nullable=True),
    # Set on a pod the plan dropped or replaced: it is deleted once the chief confirms the
    # cluster of this plan version (scale in and migration remove pods only after that).
    Column("retire_after", BigInteger, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

outbox = outbox_table(metadata)
outbox_dead_letter = outbox_dead_letter_table(metadata)
