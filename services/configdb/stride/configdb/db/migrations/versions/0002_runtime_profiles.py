"""Step windows and usage samples: the measurements of each job's runtime profile.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_windows",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("pod_name", sa.String(253), primary_key=True),
        sa.Column("plan_version", sa.BigInteger, primary_key=True),
        sa.Column("global_step", sa.BigInteger, primary_key=True),
        sa.Column("steps", sa.BigInteger, nullable=False),
        sa.Column("step_seconds", sa.Float, nullable=False),
        sa.Column("samples_per_second", sa.Float, nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "usage_samples",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("pod_name", sa.String(253), primary_key=True),
        sa.Column("sampled_at", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("plan_version", sa.BigInteger, nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("cpu_used", sa.Float, nullable=False),
        sa.Column("memory_used_bytes", sa.BigInteger, nullable=False),
        sa.Column("cpu_limit", sa.Float, nullable=False),
        sa.Column("memory_limit_bytes", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("usage_samples")
    op.drop_table("step_windows")
