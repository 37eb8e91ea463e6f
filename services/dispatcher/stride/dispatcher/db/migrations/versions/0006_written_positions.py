"""An epoch is cut without writing its shards: ``datasets.written`` counts the positions of
the newest epoch that have a row (from the first, in hand-out order); the rest are TODO
without one, and are written a batch at a time just ahead of their leases.

Writing a million-shard epoch in its cutting call held SQLite's write lock (and on
PostgreSQL the fast path's one connection) for 25 s: every other job's calls waited, health
checks included (issue 37, finding 5). Datasets cut before this revision have every shard
of every epoch written, so ``written`` becomes the newest epoch's planned rows (shards split
off for stragglers, ids from 10**11 up, are not positions of their own).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SPLIT_ID_BASE = 100_000_000_000
"""``stride.dispatcher.domain.datasets.SPLIT_ID_BASE``, as of this revision."""


def _schema() -> str | None:
    # As in 0002: name the service's schema explicitly.
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "datasets",
        sa.Column("written", sa.BigInteger(), nullable=False, server_default="0"),
        schema=schema,
    )
    datasets = sa.table(
        "datasets", sa.column("id"), sa.column("epochs_created"), sa.column("written"), schema=schema
    )
    shards = sa.table(
        "shards", sa.column("dataset_id"), sa.column("epoch"), sa.column("shard_id"), schema=schema
    )
    planned_rows = (
        sa.select(sa.func.count())
        .select_from(shards)
        .where(
            shards.c.dataset_id == datasets.c.id,
            shards.c.epoch == datasets.c.epochs_created - 1,
            shards.c.shard_id < SPLIT_ID_BASE,
        )
        .scalar_subquery()
    )
    op.execute(datasets.update().where(datasets.c.epochs_created > 0).values(written=planned_rows))


def downgrade() -> None:
    # Revision 0005 expects every shard of every epoch written. Writing the rest would need
    # the epochs' seeded shuffles, so a database with an epoch not fully written is refused
    # rather than left with shards missing (its jobs would lose them).
    schema = _schema()
    datasets = sa.table(
        "datasets",
        sa.column("epochs_created"),
        sa.column("written"),
        sa.column("record_count"),
        sa.column("batch_size"),
        sa.column("shard_batches"),
        sa.column("kind"),
        sa.column("partitions"),
        schema=schema,
    )
    shard_records = datasets.c.batch_size * datasets.c.shard_batches
    shards_per_epoch = (
        (datasets.c.record_count + shard_records - 1) / shard_records
    ) * sa.case((datasets.c.kind == "STREAM", datasets.c.partitions), else_=1)
    unfinished = op.get_bind().execute(
        sa.select(sa.func.count())
        .select_from(datasets)
        .where(datasets.c.epochs_created > 0, datasets.c.written < shards_per_epoch)
    ).scalar_one()
    if unfinished:
        raise RuntimeError(
            f"cannot downgrade below 0006: {unfinished} datasets have an epoch whose shards "
            "are not all written yet; finish those jobs (or delete their datasets) first"
        )
    op.drop_column("datasets", "written", schema=schema)
