"""The dispatcher's tables: datasets, their shards, registered workers, the outbox
and its dead-letter table.

All queue state lives here, not in memory, so a restarted dispatcher carries on exactly
where the last committed call left it (DLRover sec. 5.3 checkpoints the TODO and DOING
queues for the same reason; keeping them in the database makes that continuous).
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
    MetaData,
    String,
    Table,
    UniqueConstraint,
    false,
    literal_column,
    text,
)

from stride.db.outbox import outbox_dead_letter_table, outbox_table

metadata = MetaData()

datasets = Table(
    "datasets",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("dataset", String(128), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("record_count", BigInteger, nullable=False),
    Column("batch_size", BigInteger, nullable=False),
    Column("shard_batches", BigInteger, nullable=False),
    Column("epochs", BigInteger, nullable=False),
    Column("shuffle", Boolean, nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("partitions", Integer, nullable=False),
    Column("epochs_created", BigInteger, nullable=False),
    # Bumped by every call that changes the queue; the UPDATE is also the row lock that
    # serializes hand-outs per dataset (and takes SQLite's write lock before any read).
    Column("version", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Shards split off for stragglers so far; split shard ids are allotted from it (0002).
    Column("splits", BigInteger, nullable=False, server_default="0"),
    # Positions of the newest epoch that have a shard row, from the first: the rest are TODO
    # without one, written a batch at a time just ahead of their leases (0006).
    Column("written", BigInteger, nullable=False, server_default="0"),
    UniqueConstraint("job_id", "dataset", name="uq_datasets_job_dataset"),
)

shards = Table(
    "shards",
    metadata,
    Column("dataset_id", Integer, ForeignKey("datasets.id"), primary_key=True),
    Column("shard_id", BigInteger, primary_key=True, autoincrement=False),
    Column("epoch", BigInteger, nullable=False),
    Column("position", BigInteger, nullable=False),
    Column("start_index", BigInteger, nullable=False),
    Column("end_index", BigInteger, nullable=False),
    Column("consumed", BigInteger, nullable=False),
    Column("state", String(8), nullable=False),
    Column("worker", String(253), nullable=True),
    Column("incarnation", BigInteger, nullable=True),
    Column("leases", Integer, nullable=False),
    Column("lease_expires_at", DateTime(timezone=True), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # Stream partition (STREAM kind only; 0 otherwise) (0002).
    Column("partition", Integer, nullable=False, server_default="0"),
    # Partial (0005): TODO shards in hand-out order; DOING shards by holder and by expiry
    # (the lease sweeper's scan). A query uses one only if it spells the state as a literal
    # (TODO_STATE, DOING_STATE), not as a bound parameter.
    Index(
        "ix_shards_todo",
        "dataset_id",
        "epoch",
        "position",
        "shard_id",
        postgresql_where=text("state = 'TODO'"),
        sqlite_where=text("state = 'TODO'"),
    ),
    Index(
        "ix_shards_held",
        "worker",
        postgresql_where=text("state = 'DOING'"),
        sqlite_where=text("state = 'DOING'"),
    ),
    Index(
        "ix_shards_lease",
        "lease_expires_at",
        postgresql_where=text("state = 'DOING'"),
        sqlite_where=text("state = 'DOING'"),
    ),
)

TODO_STATE = shards.c.state == literal_column("'TODO'")
"""``state = 'TODO'`` with the literal the partial index ``ix_shards_todo`` is defined by."""
DOING_STATE = shards.c.state == literal_column("'DOING'")
"""``state = 'DOING'`` as ``ix_shards_held`` and ``ix_shards_lease`` spell it."""

workers = Table(
    "workers",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("worker", String(253), primary_key=True),
    Column("incarnation", BigInteger, nullable=False),
    Column("lost", Boolean, nullable=False),
    Column("registered_at", DateTime(timezone=True), nullable=False),
    Column("last_seen_at", DateTime(timezone=True), nullable=False),
    # Progress rate (records/s, time-decayed) and when it was last updated; the straggler
    # verdict the sweeper derives from the rates of the worker's peers (0002).
    Column("rate", Float, nullable=False, server_default="0"),
    Column("rate_at", DateTime(timezone=True), nullable=True),
    Column("straggler", Boolean, nullable=False, server_default=false()),
)

step_cursors = Table(
    "step_cursors",
    metadata,
    # GoldMiner data-worker mode (0003): the next step id to dispatch, the last consumed.
    Column("dataset_id", Integer, ForeignKey("datasets.id"), primary_key=True),
    Column("next_step", BigInteger, nullable=False),
    Column("consumed_step", BigInteger, nullable=False),
)

step_leases = Table(
    "step_leases",
    metadata,
    # A dispatched, not yet consumed step: who fetched it and until when (0003).
    Column("dataset_id", Integer, ForeignKey("datasets.id"), primary_key=True),
    Column("step_id", BigInteger, primary_key=True, autoincrement=False),
    Column("data_worker", String(253), nullable=False),
    Column("deadline", DateTime(timezone=True), nullable=False),
    Index("ix_step_leases_deadline", "dataset_id", "deadline"),
)

outbox = outbox_table(metadata)
outbox_dead_letter = outbox_dead_letter_table(metadata)
