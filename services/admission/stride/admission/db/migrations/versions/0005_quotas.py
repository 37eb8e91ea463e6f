"""Quotas of users and teams (from the quotas file and the admin API).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quotas",
        sa.Column("scope", sa.String(140), primary_key=True),
        sa.Column("max_active_jobs", sa.Integer, nullable=False),
        sa.Column("max_submissions", sa.Integer, nullable=False),
        sa.Column("window_seconds", sa.Float, nullable=False),
        sa.Column("members", sa.JSON, nullable=False),
        sa.Column("source", sa.String(8), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("quotas")
