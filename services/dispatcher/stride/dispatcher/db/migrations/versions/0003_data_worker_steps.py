"""GoldMiner data-worker mode: step cursors and step leases.

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
        "step_cursors",
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), primary_key=True),
        sa.Column("next_step", sa.BigInteger, nullable=False),
        sa.Column("consumed_step", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "step_leases",
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), primary_key=True),
        sa.Column("step_id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("data_worker", sa.String(253), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_step_leases_deadline", "step_leases", ["dataset_id", "deadline"])


def downgrade() -> None:
    op.drop_index("ix_step_leases_deadline", table_name="step_leases")
    op.drop_table("step_leases")
    op.drop_table("step_cursors")
