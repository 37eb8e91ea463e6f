"""Admission's tables: jobs, their decisions, the outbox and its dead-letter table."""

from __future__ import annotations

from sqlalchemy import Column, DateTime, ForeignKey, Integer, LargeBinary, MetaData, String, Table

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

outbox = outbox_table(metadata)
outbox_dead_letter = outbox_dead_letter_table(metadata)
