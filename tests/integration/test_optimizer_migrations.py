"""The optimizer's 0004 migration fills the due window and held resources of views stored
before it, so a restarted optimizer resumes their decisions and counts their capacity."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text

from stride.db.engine import schema_for, sync_url
from stride.db.migrations import current_and_head, downgrade, upgrade
from stride.optimizer.app import MIGRATIONS

pytestmark = pytest.mark.integration


def _table(url: str, name: str) -> str:
    schema = schema_for(url, "optimizer")
    return f'"{schema}".{name}' if schema else name


def test_views_stored_before_0004_get_their_due_window_and_held_resources(
    database_url: str,
) -> None:
    engine = create_engine(sync_url(database_url))
    try:
        upgrade(database_url, "optimizer", MIGRATIONS, "0003")
        now = datetime.now(UTC)
        view = {
            "pending": 3,
            "pods": {
                "workers": 4,
                "worker_cpu": 2,
                "worker_mem_gib": 3,
                "ps": 2,
                "ps_cpu": 4,
                "ps_mem_gib": 8,
            },
        }
        with engine.begin() as connection:
            connection.execute(
                text(
                    f"INSERT INTO {_table(database_url, 'administrators')} "
                    "(job_id, stage, plan_version, spec, created_at, updated_at) "
                    "VALUES ('job-old', 'STEADY', 2, NULL, :now, :now)"
                ),
                {"now": now},
            )
            connection.execute(
                text(
                    f"INSERT INTO {_table(database_url, 'observations')} "
                    "(job_id, view, updated_at) VALUES ('job-old', :view, :now)"
                ),
                {"view": json.dumps(view), "now": now},
            )
        upgrade(database_url, "optimizer", MIGRATIONS)
        with engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT pending, held_cpu, held_memory_gib FROM "
                    f"{_table(database_url, 'observations')} WHERE job_id = 'job-old'"
                )
            ).one()
        assert tuple(row) == (3, 4 * 2 + 2 * 4, 4 * 3 + 2 * 8)
        with engine.connect() as connection:
            later = connection.execute(
                text(
                    f"SELECT tuning_due, elastic FROM {_table(database_url, 'observations')} "
                    "WHERE job_id = 'job-old'"
                )
            ).one()
        # Nothing of GoldMiner's (0006, 0007) is due or divided for a view from before it.
        assert (bool(later.tuning_due), bool(later.elastic)) == (False, False)
        downgrade(database_url, "optimizer", MIGRATIONS, "0003")
        upgrade(database_url, "optimizer", MIGRATIONS)
        current, head = current_and_head(database_url, "optimizer", MIGRATIONS)
        assert current == head == "0007"
    finally:
        engine.dispose()
