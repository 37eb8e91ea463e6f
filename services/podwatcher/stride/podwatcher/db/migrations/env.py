"""Alembic environment of the podwatcher service (run via `python -m stride.podwatcher migrate`)."""

from stride.db.migrations import run_env
from stride.podwatcher.db.tables import metadata

run_env(metadata)
