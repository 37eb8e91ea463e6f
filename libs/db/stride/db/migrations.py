"""Per-service Alembic migrations: run them, check them, and the shared ``env.py`` body.

Each service keeps its own migration scripts and version table in its own schema, so a
service can be migrated, rolled back and deployed without touching any other.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, create_engine, pool, text

from stride.db.engine import schema_for, sync_url
from stride.runtime.errors import StartupError

VERSION_TABLE = "alembic_version"


def alembic_config(url: str, service: str, script_location: Path) -> Config:
    """An Alembic config for one service; ``env.py`` reads the URL and schema from it."""
    config = Config()
    config.set_main_option("script_location", str(script_location))
    config.attributes["url"] = url
    config.attributes["service"] = service
    return config


def upgrade(url: str, service: str, script_location: Path, revision: str = "head") -> None:
    """Migrate the service's schema to ``revision`` (head by default)."""
    command.upgrade(alembic_config(url, service, script_location), revision)


def downgrade(url: str, service: str, script_location: Path, revision: str) -> None:
    """Migrate the service's schema down to ``revision``."""
    command.downgrade(alembic_config(url, service, script_location), revision)


def current_and_head(
    url: str, service: str, script_location: Path
) -> tuple[str | None, str | None]:
    """The schema's current revision and the scripts' head revision."""
    head = ScriptDirectory(str(script_location)).get_current_head()
    schema = schema_for(url, service)
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table_schema": schema, "version_table": VERSION_TABLE}
            )
            return context.get_current_revision(), head
    finally:
        engine.dispose()


def require_migrated(url: str, service: str, script_location: Path) -> None:
    """Fail startup clearly if the service's schema is not at head."""
    current, head = current_and_head(url, service, script_location)
    if current != head:
        raise StartupError(
            f"{service} database is at revision {current or 'none'}, expected {head}: "
            f"run `python -m stride.{service} migrate` "
            f"(or set STRIDE_{service.upper()}_AUTO_MIGRATE=true)"
        )


def run_env(target_metadata: MetaData) -> None:
    """The body of every service's ``env.py``: online migrations in the service's schema."""
    from alembic import context

    config = context.config
    url = config.attributes.get("url")
    service = config.attributes.get("service")
    if not url or not service:
        raise StartupError("run migrations through `python -m stride.<service> migrate`")
    schema = schema_for(url, service)
    engine = create_engine(sync_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as raw_connection:
            connection = raw_connection
            if schema is not None:
                raw_connection.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
                raw_connection.commit()
                connection = raw_connection.execution_options(schema_translate_map={None: schema})
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                version_table=VERSION_TABLE,
                version_table_schema=schema,
                render_as_batch=schema is None,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()
