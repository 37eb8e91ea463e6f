"""The cluster's capacity per resource kind, from the podwatcher's newest node inventory
(the pools are rebuilt on it after a restart, not on the settings' start-up capacity).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "capacity",
        sa.Column("kind", sa.String(8), primary_key=True),
        sa.Column("capacity", sa.Integer, nullable=False),
        sa.Column("observed_at", sa.Float, nullable=False),
        sa.Column("reason", sa.String(200), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("capacity")
