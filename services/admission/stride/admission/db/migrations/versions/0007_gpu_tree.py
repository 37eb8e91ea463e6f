"""The GPU tree beside the GPU capacity (switches x nodes x GPUs and the node names), so a
restarted admission places GPU jobs on the tree of the newest inventory; and a job's curve in
its books when it came from similar jobs' history (not from its spec), so a restart plans it
with the same curve.

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
    # ALTER statements name their table by string, so the schema_translate_map the
    # environment sets does not reach them; name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column("capacity", sa.Column("tree", sa.Text, nullable=True), schema=_schema())
    op.add_column("ledger", sa.Column("curve", sa.JSON, nullable=True), schema=_schema())


def downgrade() -> None:
    op.drop_column("ledger", "curve", schema=_schema())
    op.drop_column("capacity", "tree", schema=_schema())
