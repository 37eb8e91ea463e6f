"""Each running job's windowed metric view, and each plan's explanation.

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
    # ALTER statements name their table by string: the environment's schema_translate_map
    # does not reach them, so the service's schema is named explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.create_table(
        "observations",
        sa.Column(
            "job_id", sa.String(64), sa.ForeignKey("administrators.job_id"), primary_key=True
        ),
        sa.Column("view", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.add_column("plans", sa.Column("explanation", sa.Text(), nullable=True), schema=_schema())


def downgrade() -> None:
    op.drop_column("plans", "explanation", schema=_schema())
    op.drop_table("observations")
