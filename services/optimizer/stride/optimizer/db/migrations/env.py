"""Alembic environment of the optimizer (run via `python -m stride.optimizer migrate`)."""

from stride.db.migrations import run_env
from stride.optimizer.db.tables import metadata

run_env(metadata)
