"""Share requests (issue 39): what each running job's newest plan holds, and the optimizer's
requests for more than a job's share with admission's answers.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "holdings",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.job_id"), primary_key=True),
        sa.Column("plan_version", sa.Integer, nullable=False),
        sa.Column("cpu", sa.Float, nullable=False),
        sa.Column("memory_gib", sa.Float, nullable=False),
    )
    op.create_table(
        "share_requests",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.job_id"), primary_key=True),
        sa.Column("plan_version", sa.Integer, nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("share_requests")
    op.drop_table("holdings")
