"""Job records and their plans.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_records",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("spec", sa.LargeBinary, nullable=True),
        sa.Column("user", sa.String(128), nullable=True),
        sa.Column("model_name", sa.Text, nullable=True),
        sa.Column("model_family", sa.Text, nullable=True),
        sa.Column("dataset_name", sa.Text, nullable=True),
        sa.Column("dataset_format", sa.String(32), nullable=True),
        sa.Column("record_count", sa.BigInteger, nullable=True),
        sa.Column("batch_size", sa.BigInteger, nullable=True),
        sa.Column("embedding_dim", sa.BigInteger, nullable=True),
        sa.Column("parameter_count", sa.BigInteger, nullable=True),
        sa.Column("plan_count", sa.Integer, nullable=False),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, index=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_job_records_outcome_finished_at", "job_records", ["outcome", "finished_at"])
    op.create_table(
        "plans",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("job_records.job_id"), primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True),
        sa.Column("plan", sa.LargeBinary, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("plans")
    op.drop_index("ix_job_records_outcome_finished_at", table_name="job_records")
    op.drop_table("job_records")
