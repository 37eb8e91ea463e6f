"""The outbox's dead-letter table: events the bus refuses for good are parked there.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

from stride.db.outbox import create_outbox_dead_letter_table_v1

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_outbox_dead_letter_table_v1(op)


def downgrade() -> None:
    op.drop_table("outbox_dead_letter")
