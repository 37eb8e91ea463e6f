"""Jobs, pods, and the outbox that publishes pod and job events with them.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from stride.db.outbox import create_outbox_dead_letter_table_v1, create_outbox_table_v1

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("spec", sa.LargeBinary, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("reconfigure_version", sa.BigInteger, nullable=False),
        sa.Column("reconfigure_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "pods",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("job_id", sa.String(64), nullable=False, index=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("pod_index", sa.Integer, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("cpu", sa.Float, nullable=False),
        sa.Column("memory_bytes", sa.BigInteger, nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("agent_port", sa.Integer, nullable=False),
        sa.Column("plan_version", sa.BigInteger, nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("restarts", sa.Integer, nullable=False),
        sa.Column("last_failure", sa.String(16), nullable=False),
        sa.Column("last_message", sa.Text, nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retire_after", sa.BigInteger, nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    create_outbox_table_v1(op)
    create_outbox_dead_letter_table_v1(op)


def downgrade() -> None:
    op.drop_table("outbox_dead_letter")
    op.drop_table("outbox")
    op.drop_table("pods")
    op.drop_table("jobs")
