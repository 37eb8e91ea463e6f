"""Whether a job's data-worker tuning step is due (GoldMiner's tuner, live), as a column,
so a restarted optimizer's sweep finds it with the due decisions. Views stored before this
revision have no tuning state: nothing is due.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column(
        "observations",
        sa.Column("tuning_due", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_column("observations", "tuning_due", schema=_schema())
