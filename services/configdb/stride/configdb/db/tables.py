"""Configdb's tables: one record per job (spec, features, outcome) and its plan versions.

The features are stored in columns next to the spec they were extracted from, so a
similar-job query reads a few small columns instead of decoding every spec.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

job_records = Table(
    "job_records",
    metadata,
    Column("job_id", String(64), primary_key=True),
    # NULL while the record is a placeholder made by a plan or finish that beat the
    # submitted event; the submitted event fills it in.
    Column("spec", LargeBinary, nullable=True),
    Column("user", String(128), nullable=True),
    Column("model_name", Text, nullable=True),
    Column("model_family", Text, nullable=True),
    Column("dataset_name", Text, nullable=True),
    Column("dataset_format", String(32), nullable=True),
    Column("record_count", BigInteger, nullable=True),
    Column("batch_size", BigInteger, nullable=True),
    Column("embedding_dim", BigInteger, nullable=True),
    Column("parameter_count", BigInteger, nullable=True),
    Column("plan_count", Integer, nullable=False),
    Column("outcome", String(32), nullable=True),
    Column("recorded_at", DateTime(timezone=True), nullable=False, index=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_job_records_outcome_finished_at", "outcome", "finished_at"),
)

plans = Table(
    "plans",
    metadata,
    Column("job_id", String(64), ForeignKey("job_records.job_id"), primary_key=True),
    Column("version", BigInteger, primary_key=True),
    Column("plan", LargeBinary, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
)
