"""A throwaway PostgreSQL database per test run, on the server given by the environment."""

from __future__ import annotations

import functools
import os
import uuid

import pytest
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


REQUIRE_POSTGRES_ENV = "STRIDE_TEST_REQUIRE_POSTGRES"
"""Set to 1 (CI does) to make a missing PostgreSQL fail the run instead of being skipped."""


@functools.cache
def optional_postgres_problem() -> str | None:
    """Why PostgreSQL is unreachable, or None; fails the test instead where
    :data:`REQUIRE_POSTGRES_ENV` forbids going without it. Asked once per test run."""
    problem = postgres_unreachable_reason()
    if problem is not None and os.environ.get(REQUIRE_POSTGRES_ENV) == "1":
        pytest.fail(f"{problem}; {REQUIRE_POSTGRES_ENV}=1 forbids skipping")
    return problem


def require_postgres() -> None:
    """Skip the calling test, saying why, when PostgreSQL is unreachable and optional."""
    problem = optional_postgres_problem()
    if problem is not None:
        pytest.skip(f"{problem}: set STRIDE_TEST_DATABASE_URL to run the PostgreSQL cases")
