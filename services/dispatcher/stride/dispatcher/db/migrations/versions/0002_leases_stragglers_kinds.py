"""Lease sweeping, straggler rates, shard splits and stream partitions.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    # ALTER statements name their table by string, so the schema_translate_map the
    # environment sets does not reach them; name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "datasets",
        sa.Column("splits", sa.BigInteger, nullable=False, server_default="0"),
        schema=schema,
    )
    op.add_column(
        "shards",
        sa.Column("partition", sa.Integer, nullable=False, server_default="0"),
        schema=schema,
    )
    op.create_index("ix_shards_lease", "shards", ["state", "lease_expires_at"], schema=schema)
    op.add_column(
        "workers", sa.Column("rate", sa.Float, nullable=False, server_default="0"), schema=schema
    )
    op.add_column(
        "workers", sa.Column("rate_at", sa.DateTime(timezone=True), nullable=True), schema=schema
    )
    op.add_column(
        "workers",
        sa.Column("straggler", sa.Boolean, nullable=False, server_default=sa.false()),
        schema=schema,
    )


def downgrade() -> None:
    schema = _schema()
    with op.batch_alter_table("workers", schema=schema) as batch:
        batch.drop_column("straggler")
        batch.drop_column("rate_at")
        batch.drop_column("rate")
    op.drop_index("ix_shards_lease", table_name="shards", schema=schema)
    with op.batch_alter_table("shards", schema=schema) as batch:
        batch.drop_column("partition")
    with op.batch_alter_table("datasets", schema=schema) as batch:
        batch.drop_column("splits")
