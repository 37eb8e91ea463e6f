"""Whether the cluster level divides CPUs to a job's data workers (GoldMiner sec. 3.4.2,
live), as a column, so a round reads only those jobs. Rows stored before this revision
start as not elastic; the next store of a job's view sets it.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column(
        "observations",
        sa.Column("elastic", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_column("observations", "elastic", schema=_schema())
