"""Datasets, shards, workers and the outbox.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from stride.db.outbox import create_outbox_table_v1

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("dataset", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("record_count", sa.BigInteger, nullable=False),
        sa.Column("batch_size", sa.BigInteger, nullable=False),
        sa.Column("shard_batches", sa.BigInteger, nullable=False),
        sa.Column("epochs", sa.BigInteger, nullable=False),
        sa.Column("shuffle", sa.Boolean, nullable=False),
        sa.Column("seed", sa.BigInteger, nullable=False),
        sa.Column("partitions", sa.Integer, nullable=False),
        sa.Column("epochs_created", sa.BigInteger, nullable=False),
        sa.Column("version", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("job_id", "dataset", name="uq_datasets_job_dataset"),
    )
    op.create_table(
        "shards",
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), primary_key=True),
        sa.Column("shard_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("position", sa.BigInteger, nullable=False),
        sa.Column("start_index", sa.BigInteger, nullable=False),
        sa.Column("end_index", sa.BigInteger, nullable=False),
        sa.Column("consumed", sa.BigInteger, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("worker", sa.String(253), nullable=True),
        sa.Column("incarnation", sa.BigInteger, nullable=True),
        sa.Column("leases", sa.Integer, nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_shards_next", "shards", ["dataset_id", "state", "epoch", "position"])
    op.create_index("ix_shards_worker", "shards", ["worker", "state"])
    op.create_table(
        "workers",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("worker", sa.String(253), primary_key=True),
        sa.Column("incarnation", sa.BigInteger, nullable=False),
        sa.Column("lost", sa.Boolean, nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
    )
    create_outbox_table_v1(op)


def downgrade() -> None:
    op.drop_table("outbox")
    op.drop_table("workers")
    op.drop_index("ix_shards_worker", table_name="shards")
    op.drop_index("ix_shards_next", table_name="shards")
    op.drop_table("shards")
    op.drop_table("datasets")
