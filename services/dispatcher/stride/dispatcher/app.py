"""The dispatcher's composition root: wires storage, bus and the shard API into a service host."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url

from stride.api.dispatcher.v1 import dispatcher_service_pb2, dispatcher_service_pb2_grpc
from stride.bus import topics
from stride.db.engine import Database
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.inbound.bus_handlers import PodEventHandler
from stride.dispatcher.adapters.inbound.grpc_api import ACCESS, DispatcherApi
from stride.dispatcher.adapters.outbound.fastpath import FastPath, PostgresFastPath, SqliteFastPath
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.settings import DispatcherSettings
from stride.dispatcher.usecases import ShardDispatcher
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.wiring import connect_bus, consume, create_host, open_database, relay_outbox

MIGRATIONS = Path(__file__).parent / "db" / "migrations"
SERVICE_NAME = dispatcher_service_pb2.DESCRIPTOR.services_by_name["DispatcherService"].full_name


async def relax_commit_sync(database: Database) -> None:
    """SQLite: commit without waiting for the disk (see ``DispatcherSettings.sync_commits``).
    PostgreSQL keeps synchronous commits: with ``synchronous_commit = off`` a crash of the
    database server itself loses the last acknowledged commits (``bench/chaos.py``: 40,960
    samples trained twice after one restart)."""
    if database.schema is not None:
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # SQLite in WAL mode: NORMAL syncs at checkpoints, not at every commit.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(database.engine.sync_engine, "connect", on_connect)
    await database.engine.dispose()  # pooled connections opened before this reconnect with it


def open_fast_path(
    database: Database, lease_duration: timedelta, rate_window: timedelta, sync_commits: bool
) -> FastPath:
    """The hot calls' own connection for the database's dialect (opened on first use)."""
    if database.schema is None:  # SQLite
        path = str(make_url(database.url).database)
        return SqliteFastPath(path, lease_duration, rate_window, sync_commits)
    libpq_url = make_url(database.url).set(drivername="postgresql")
    return PostgresFastPath(
        libpq_url.render_as_string(hide_password=False),
        database.schema,
        lease_duration,
        rate_window,
        sync_commits,
    )


async def build(settings: DispatcherSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    if not settings.sync_commits:
        await relax_commit_sync(database)
    fast = open_fast_path(
        database, settings.lease_duration, settings.rate_window, settings.sync_commits
    )
    # The relay reads, deletes and parks through the fast path's group commit, so it never
    # waits for SQLite's write lock behind the hand-outs.
    outbox = Outbox(outbox_table, hooks=fast.relay_hooks())
    if isinstance(fast, SqliteFastPath):  # checkpoints off the hot path
        sqlite_fast = fast
        host.add_root_task("wal-checkpoints", lambda: sqlite_fast.run_checkpoints(host.stop))
    dispatcher = ShardDispatcher(
        database,
        outbox,
        settings.lease_duration,
        rate_window=settings.rate_window,
        batch_timeout=timedelta(seconds=settings.batch_timeout_seconds),
        fast=fast,
    )

    async def always() -> bool:
        return True

    host.add_dependency(Dependency("fast-path", always, fast.close, closes_early=False))
    dispatcher_service_pb2_grpc.add_DispatcherServiceServicer_to_server(
        DispatcherApi(dispatcher, timedelta(seconds=settings.retry_after_seconds)),
        host.server.server,
    )
    # Shard events (done, failed, requeued, straggler) leave through the outbox. Small,
    # frequent rounds: the relay's bursts share the event loop with the hand-outs, and a
    # second's worth of done events at once set their p99.
    relay_outbox(host, outbox, database, bus, poll_seconds=0.2, batch=100)
    host.add_root_task(
        "lease-sweeper",
        lambda: dispatcher.run_sweeper(host.stop, settings.sweep_interval_seconds),
    )
    handler = PodEventHandler(dispatcher)
    for topic in (topics.POD_FAILED, topics.POD_DELETED):
        consume(host, bus, topic, durable=f"dispatcher-pods-{topic.suffix}", handler=handler)
    return host
