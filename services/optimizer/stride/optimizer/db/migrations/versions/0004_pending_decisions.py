"""The window a job's due decision is on, as a column, so a restarted optimizer (and its
periodic sweep) finds every due decision with one indexed query; and the cores and memory
each job's current plan holds, so a plan is checked against the cluster's free capacity
with one sum.

Revision ID: 0004
Revises: 0003
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _schema() -> str | None:
    schema: str | None = op.get_context().opts.get("version_table_schema")
    return schema


def upgrade() -> None:
    op.add_column(
        "observations",
        sa.Column("pending", sa.Integer(), nullable=False, server_default="-1"),
        schema=_schema(),
    )
    for name in ("held_cpu", "held_memory_gib"):
        op.add_column(
            "observations",
            sa.Column(name, sa.Float(), nullable=False, server_default="0"),
            schema=_schema(),
        )
    # Views stored before this revision: their due window and the worker and PS cores and
    # memory of their pods, read from the JSON once (a chief's or data workers' share of
    # those plans is counted from their next plan on).
    observations = sa.table(
        "observations",
        sa.column("job_id"),
        sa.column("view"),
        sa.column("pending"),
        sa.column("held_cpu"),
        sa.column("held_memory_gib"),
        schema=_schema(),
    )
    connection = op.get_bind()
    for job_id, view in connection.execute(sa.select(observations.c.job_id, observations.c.view)):
        data = json.loads(view)
        pods = data.get("pods") or {}
        cpu = pods.get("workers", 0) * pods.get("worker_cpu", 0) + pods.get("ps", 0) * pods.get(
            "ps_cpu", 0
        )
        memory = pods.get("workers", 0) * pods.get("worker_mem_gib", 0) + pods.get(
            "ps", 0
        ) * pods.get("ps_mem_gib", 0)
        connection.execute(
            sa.update(observations)
            .where(observations.c.job_id == job_id)
            .values(
                pending=int(data.get("pending", -1)), held_cpu=cpu, held_memory_gib=memory
            )
        )
    op.create_index("ix_observations_pending", "observations", ["pending"], schema=_schema())


def downgrade() -> None:
    op.drop_index("ix_observations_pending", "observations", schema=_schema())
    for name in ("held_memory_gib", "held_cpu", "pending"):
        op.drop_column("observations", name, schema=_schema())
