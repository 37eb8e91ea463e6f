"""The dispatcher's composition root: wires storage, bus and the shard API into a service host."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
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
from stride.dispatcher.domain.sharding import ROWS_PER_WRITE
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
    database: Database,
    lease_duration: timedelta,
    rate_window: timedelta,
    sync_commits: bool,
    *,
    rows_per_write: int = ROWS_PER_WRITE,
) -> FastPath:
    """The hot calls' own connection for the database's dialect (opened on first use)."""
    if database.schema is None:  # SQLite
        path = str(make_url(database.url).database)
        return SqliteFastPath(
            path, lease_duration, rate_window, sync_commits, rows_per_write=rows_per_write
        )
    libpq_url = make_url(database.url).set(drivername="postgresql")
    return PostgresFastPath(
        libpq_url.render_as_string(hide_password=False),
        database.schema,
        lease_duration,
        rate_window,
        sync_commits,
        rows_per_write=rows_per_write,
    )


async def always() -> bool:
    """A dependency that is always healthy (its failures show in the calls that use it)."""
    return True


class Shuffler(ProcessPoolExecutor):
    """One worker process for the seeded shuffles of big epochs (``sharding.Shuffle``): a
    million-shard shuffle is half a second of CPU, and on a thread of this process it held
    the GIL in 5 ms slices, so every other call waited behind it. Spawned, not forked: this
    process runs gRPC's threads. Started by the first big shuffle (which also waits for the
    worker's imports, about a second, once): most dispatchers never cut a big shuffled
    epoch, and a process per dispatcher at start cost every start a second of CPU. At a
    lower CPU priority (nice 10), so on a busy machine a shuffle takes the CPU this
    process's calls leave (on two cores it set their p99 otherwise)."""

    def __init__(self) -> None:
        super().__init__(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_shuffle_worker,
            initargs=(os.getpid(),),
        )

    async def close(self) -> None:
        """Stop the worker (a shuffle under way is abandoned: its callers are gone)."""
        await asyncio.to_thread(self.shutdown, wait=True, cancel_futures=True)


ORPHAN_CHECK_SECONDS = 1.0


def _shuffle_worker(dispatcher: int) -> None:
    """The shuffle worker's start: a lower CPU priority, and an end with its dispatcher's
    (a SIGKILLed dispatcher cannot stop it, and an orphan would live on idle for good)."""
    os.nice(10)

    def watch() -> None:
        while os.getppid() == dispatcher:
            time.sleep(ORPHAN_CHECK_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def open_shuffler() -> Shuffler:
    """The shuffles' worker process (see :class:`Shuffler`)."""
    return Shuffler()


async def build(settings: DispatcherSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME], ACCESS)
    bus = await connect_bus(settings, host)
    database = await open_database(settings, host, MIGRATIONS)
    if not settings.sync_commits:
        await relax_commit_sync(database)
    fast = open_fast_path(
        database,
        settings.lease_duration,
        settings.rate_window,
        settings.sync_commits,
        rows_per_write=settings.rows_per_write,
    )
    # The relay reads, deletes and parks through the fast path's group commit, so it never
    # waits for SQLite's write lock behind the hand-outs.
    outbox = Outbox(outbox_table, hooks=fast.relay_hooks())
    if isinstance(fast, SqliteFastPath):  # checkpoints off the hot path
        sqlite_fast = fast
        host.add_root_task("wal-checkpoints", lambda: sqlite_fast.run_checkpoints(host.stop))
    shuffler = open_shuffler()
    host.add_dependency(Dependency("shuffler", always, shuffler.close, closes_early=False))
    dispatcher = ShardDispatcher(
        database,
        outbox,
        settings.lease_duration,
        rate_window=settings.rate_window,
        batch_timeout=timedelta(seconds=settings.batch_timeout_seconds),
        fast=fast,
        steps_in_flight=settings.steps_in_flight,
        limits=settings.dataset_limits,
        rows_per_write=settings.rows_per_write,
        shuffler=shuffler,
    )

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
