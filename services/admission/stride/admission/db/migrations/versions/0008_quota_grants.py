"""What a quota grants beside its limits (issue 37): the highest priority class its users
may ask for (``max_priority``, NULL: normal) and whether they may submit simulated jobs
(``allow_simulated``). Existing quotas grant neither.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    # ALTER statements name their table by string, so the schema_translate_map the
    # environment sets does not reach them; name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column(
        "quotas", sa.Column("max_priority", sa.String(16), nullable=True), schema=_schema()
    )
    op.add_column(
        "quotas",
        sa.Column("allow_simulated", sa.Boolean, nullable=False, server_default=sa.false()),
        schema=_schema(),
    )


def downgrade() -> None:
    op.drop_column("quotas", "allow_simulated", schema=_schema())
    op.drop_column("quotas", "max_priority", schema=_schema())
