"""Administrators, optimization events, plans and the outbox.

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
        "administrators",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("plan_version", sa.Integer, nullable=False),
        sa.Column("spec", sa.LargeBinary, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "optimization_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(200), nullable=False, unique=True),
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey("administrators.job_id"), nullable=False, index=True
        ),
        sa.Column("root_cause", sa.String(32), nullable=False),
        sa.Column("event", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "plans",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("administrators.job_id"), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("algorithm", sa.String(128), nullable=False),
        sa.Column("plan", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    create_outbox_table_v1(op)


def downgrade() -> None:
    op.drop_table("outbox")
    op.drop_table("plans")
    op.drop_table("optimization_events")
    op.drop_table("administrators")
