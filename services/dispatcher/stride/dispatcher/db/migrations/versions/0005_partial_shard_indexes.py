"""The shard indexes become partial: TODO shards in hand-out order, DOING shards by holder
and by lease expiry.

Each hand-out and each completion rewrote a shard row and, since the state is in every
index, added an entry to all four indexes (PostgreSQL cannot update in place when an
indexed column changes). Now a lease adds entries to the primary key and the two DOING
indexes, a completion to the primary key alone, and the TODO index holds TODO rows only,
in the exact hand-out order (epoch, position, shard id), so the next shards are read off
its head without a sort. That also keeps PostgreSQL's plan for a hand-out on that index
when its statistics do not know the dataset yet (every new job's dataset): with the old
index it chose a scan of the dataset's whole primary key with a sort, found with
auto_explain under ``bench/dispatcher_vs_dlrover.py``.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    # As in 0002: name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def _where(state: str) -> dict[str, object]:
    predicate = sa.text(f"state = '{state}'")
    return {"postgresql_where": predicate, "sqlite_where": predicate}


def upgrade() -> None:
    schema = _schema()
    op.drop_index("ix_shards_next", table_name="shards", schema=schema)
    op.drop_index("ix_shards_worker", table_name="shards", schema=schema)
    op.drop_index("ix_shards_lease", table_name="shards", schema=schema)
    op.create_index(
        "ix_shards_todo",
        "shards",
        ["dataset_id", "epoch", "position", "shard_id"],
        schema=schema,
        **_where("TODO"),
    )
    op.create_index("ix_shards_held", "shards", ["worker"], schema=schema, **_where("DOING"))
    op.create_index(
        "ix_shards_lease", "shards", ["lease_expires_at"], schema=schema, **_where("DOING")
    )


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_shards_lease", table_name="shards", schema=schema)
    op.drop_index("ix_shards_held", table_name="shards", schema=schema)
    op.drop_index("ix_shards_todo", table_name="shards", schema=schema)
    op.create_index("ix_shards_lease", "shards", ["state", "lease_expires_at"], schema=schema)
    op.create_index("ix_shards_worker", "shards", ["worker", "state"], schema=schema)
    op.create_index(
        "ix_shards_next", "shards", ["dataset_id", "state", "epoch", "position"], schema=schema
    )
