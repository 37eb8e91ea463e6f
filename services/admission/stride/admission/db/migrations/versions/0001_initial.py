"""Jobs, decisions and the outbox.

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
        "jobs",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("request_id", sa.String(200), nullable=True, unique=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("user", sa.String(128), nullable=False, index=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("spec", sa.LargeBinary, nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "decisions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.job_id"), nullable=False, index=True),
        sa.Column("outcome", sa.String(32), nullable=False),
        sa.Column("decision", sa.LargeBinary, nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=False),
    )
    create_outbox_table_v1(op)


def downgrade() -> None:
    op.drop_table("outbox")
    op.drop_table("decisions")
    op.drop_table("jobs")
