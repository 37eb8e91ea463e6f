"""Podwatcher's tables: every plan it accepted, with how far applying it has got.

Only plans newer than the job's newest are stored, so a job's rows are its accepted plans
in version order and the newest row is the plan the backend works towards.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, LargeBinary, MetaData, String, Table, Text

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
