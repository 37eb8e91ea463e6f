"""Alembic environment of the configdb service (run via `python -m stride.configdb migrate`)."""

from stride.configdb.db.tables import metadata
from stride.db.migrations import run_env

run_env(metadata)
