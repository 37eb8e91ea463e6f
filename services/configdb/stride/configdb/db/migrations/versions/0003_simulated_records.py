"""Mark the records of simulated jobs (``JobSpec.simulated``, load tests such as ``stride
loadgen``): they are kept, and never warm-start candidates.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    # ALTER statements name their table by string, so the schema_translate_map the
    # environment sets does not reach them; name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column(
        "job_records",
        sa.Column("simulated", sa.Boolean, nullable=False, server_default=sa.false()),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_column("job_records", "simulated", schema=_schema())
