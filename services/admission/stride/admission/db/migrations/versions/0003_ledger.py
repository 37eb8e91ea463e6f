"""Admission's books: each planned job's resource kind, deadline as planned, progress under
the model, units and share version (the pool is rebuilt from them on start).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.job_id"), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("deadline", sa.Float, nullable=True),
        sa.Column("submitted", sa.Float, nullable=False),
        sa.Column("total_steps", sa.Float, nullable=False),
        sa.Column("remaining", sa.Float, nullable=False),
        sa.Column("units", sa.Integer, nullable=False),
        sa.Column("paused_until", sa.Float, nullable=False),
        sa.Column("last_update", sa.Float, nullable=False),
        sa.Column("share_version", sa.Integer, nullable=False),
        sa.Column("share", sa.LargeBinary, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("ledger")
