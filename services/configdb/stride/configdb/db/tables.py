"""Configdb's tables: one record per job (spec, features, outcome), its plan versions, and
the measurements its runtime profile is built from (step windows and usage samples).

The features are stored in columns next to the spec they were extracted from, so a
similar-job query reads a few small columns instead of decoding every spec.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    false,
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
    # A simulated job's (a load test's ghost pods): kept, never a warm-start candidate, so
    # one load test never teaches another, nor a real job, what its model measured.
    Column("simulated", Boolean, nullable=False, server_default=false()),
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

# The measurements, one row each, keyed by what makes them unique on the bus: a redelivered
# message finds its row and changes nothing. No foreign key to job_records: metrics may
# arrive before the job's submitted event, and must not lock its record on every window.
step_windows = Table(
    "step_windows",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("pod_name", String(253), primary_key=True),
    Column("plan_version", BigInteger, primary_key=True),
    Column("global_step", BigInteger, primary_key=True),
    Column("steps", BigInteger, nullable=False),
    Column("step_seconds", Float, nullable=False),
    Column("samples_per_second", Float, nullable=False),
    Column("reported_at", DateTime(timezone=True), nullable=False),
)

usage_samples = Table(
    "usage_samples",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("pod_name", String(253), primary_key=True),
    Column("sampled_at", DateTime(timezone=True), primary_key=True),
    Column("plan_version", BigInteger, nullable=False),
    Column("role", String(32), nullable=False),
    Column("cpu_used", Float, nullable=False),
    Column("memory_used_bytes", BigInteger, nullable=False),
    Column("cpu_limit", Float, nullable=False),
    Column("memory_limit_bytes", BigInteger, nullable=False),
)
