"""The PostgreSQL server of a test run, and a throwaway database per test on it.

The server is the one ``STRIDE_TEST_DATABASE_URL`` names, else an embedded PostgreSQL
(:mod:`stride.runtime.embedded_postgres`) that the run starts in a temporary folder and
stops and removes when it ends, however it ends. Nothing has to be installed or running
beforehand, so PostgreSQL tests never skip: a server that cannot be reached fails them.

Under ``pytest -n`` the controlling process starts one server before the workers start and
names it to them in ``STRIDE_TEST_DATABASE_URL``; a run without workers starts it at the
first test that needs it. Benchmarks use :func:`test_database_server`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, make_url, text
from sqlalchemy.engine import URL

from stride.runtime.embedded_postgres import EmbeddedPostgres
from stride.runtime.processes import start_time

TEST_DATABASE_ENV = "STRIDE_TEST_DATABASE_URL"
"""A PostgreSQL server to make test databases on, instead of an embedded one."""
FOLDER_PREFIX = "stride-test-pg-"
"""The temporary folders of embedded test servers (in the system's temporary folder)."""
OWNER_FILE = "owner.json"
"""Which process made a test server's folder: a folder whose owner is gone is removed."""

_servers: list[EmbeddedPostgres] = []
"""The embedded server this process started, if it did (at most one)."""


def start_test_server() -> str:
    """Start this process's embedded test server (once) and name it in
    ``STRIDE_TEST_DATABASE_URL`` for this process and the processes it starts; returns its
    admin URL. Removes the folders of earlier runs' servers whose process is gone."""
    if not _servers:
        remove_stale_folders()
        folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        (folder / OWNER_FILE).write_text(json.dumps(_identity(os.getpid())))
        # Each log line names its session and database, as a server of one's own would.
        prefix = {"log_line_prefix": "%m [%p] %q%u@%d "}
        server = EmbeddedPostgres(folder / "pg", durable=False, settings=prefix)
        try:
            server.start()
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        _servers.append(server)
        os.environ[TEST_DATABASE_ENV] = server.url()
    return os.environ[TEST_DATABASE_ENV]


def test_server_log() -> Path | None:
    """The log of the embedded server this process started; None if it started none."""
    return _servers[0].log_path if _servers else None


def stop_test_server() -> None:
    """Stop and remove the server :func:`start_test_server` started, if it did."""
    if not _servers:
        return
    server = _servers.pop()
    try:
        server.stop()
    finally:
        shutil.rmtree(server.root.parent, ignore_errors=True)
        os.environ.pop(TEST_DATABASE_ENV, None)


@contextlib.contextmanager
def test_database_server() -> Iterator[str]:
    """The admin URL of the server to make test databases on, for code outside pytest (a
    benchmark): ``STRIDE_TEST_DATABASE_URL``'s if set, else an embedded one for the block."""
    if os.environ.get(TEST_DATABASE_ENV):
        yield os.environ[TEST_DATABASE_ENV]
        return
    try:
        yield start_test_server()
    finally:
        stop_test_server()


def remove_stale_folders() -> None:
    """Remove the folders of embedded test servers whose run ended without removing them
    (killed by SIGKILL: the kernel stopped the server itself, see embedded_postgres)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # being made right now, or not ours
        if owner != _identity(int(owner.get("pid", 0))):
            EmbeddedPostgres(folder / "pg").stop_orphan()
            shutil.rmtree(folder, ignore_errors=True)


def _identity(pid: int) -> dict[str, int | None]:
    """A process id with its start time, so a reused id is not taken for the same process."""
    return {"pid": pid, "start_time": start_time(pid)}


def admin_url() -> URL:
    """Where to create test databases: the run's server (see the module notes)."""
    configured = os.environ.get(TEST_DATABASE_ENV) or start_test_server()
    return make_url(configured).set(drivername="postgresql+psycopg")


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
