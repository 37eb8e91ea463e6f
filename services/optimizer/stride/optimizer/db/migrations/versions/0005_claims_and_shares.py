"""Contended plans kept as claims (settled by the cluster's weighted greedy when capacity
frees), and the share admission grants each job (the optimizer plans within it).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey("administrators.job_id"), primary_key=True
        ),
        sa.Column("plan_version", sa.Integer(), nullable=False),
        sa.Column("claim", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        schema=_schema(),
    )
    op.create_table(
        "shares",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("cpu", sa.Float(), nullable=False),
        sa.Column("memory_gib", sa.Float(), nullable=False),
        sa.Column("minimum_cpu", sa.Float(), nullable=False),
        sa.Column("minimum_memory_gib", sa.Float(), nullable=False),
        sa.Column("guaranteed", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_table("shares", schema=_schema())
    op.drop_table("claims", schema=_schema())
