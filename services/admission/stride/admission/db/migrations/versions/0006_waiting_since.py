"""Since when a job in a pool has held no units: its age for starvation aging
(:mod:`stride.policy.elasticflow.priorities`), kept across restarts.

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
    # ALTER statements name their table by string, so the schema_translate_map the
    # environment sets does not reach them; name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column(
        "ledger", sa.Column("waiting_since", sa.Float, nullable=True), schema=_schema()
    )


def downgrade() -> None:
    op.drop_column("ledger", "waiting_since", schema=_schema())
