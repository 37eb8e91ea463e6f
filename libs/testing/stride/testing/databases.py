"""A throwaway PostgreSQL database per test run, on the server given by the environment."""

from __future__ import annotations

import os
import uuid

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import URL

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def admin_url() -> URL:
    """Where to create test databases: STRIDE_TEST_DATABASE_URL, else local PostgreSQL."""
    return make_url(os.environ.get("STRIDE_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)).set(
        drivername="postgresql+psycopg"
    )


def postgres_unreachable_reason() -> str | None:
    """Why PostgreSQL cannot be used for tests, or None if it can."""
    engine = create_engine(
        admin_url(), isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:
        reason = str(getattr(error, "orig", error)).strip().splitlines()[0]
        return f"PostgreSQL at {admin_url().render_as_string()} is not reachable ({reason})"
    finally:
        engine.dispose()
    return None


def create_database(prefix: str = "stride_test") -> str:
    """Create an empty database and return its plain ``postgresql://`` URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    engine = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return (
        admin_url()
        .set(database=name, drivername="postgresql")
        .render_as_string(hide_password=False)
    )


def drop_database(url: str) -> None:
    """Drop a database made by :func:`create_database`, disconnecting its sessions."""
    name = make_url(url).database
    engine = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()
