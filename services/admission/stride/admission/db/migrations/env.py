"""Alembic environment of the admission service (run via `python -m stride.admission migrate`)."""

from stride.admission.db.tables import metadata
from stride.db.migrations import run_env

run_env(metadata)
