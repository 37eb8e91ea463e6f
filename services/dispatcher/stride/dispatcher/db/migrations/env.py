"""Alembic environment of the dispatcher (run via `python -m stride.dispatcher migrate`)."""

from stride.db.migrations import run_env
from stride.dispatcher.db.tables import metadata

run_env(metadata)
