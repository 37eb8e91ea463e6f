"""Pytest fixtures: a real NATS server, a real PostgreSQL database, service processes.

- ``nats_server`` / ``nats_url``: a fresh nats-server with JetStream per test (isolated).
- ``postgres_url``: a fresh PostgreSQL database per test, dropped afterwards.
- ``database_url``: parametrized over PostgreSQL and a SQLite file, for storage code that
  must work on both.
- ``kube_cluster``: a real Kubernetes control plane with kwok nodes, per test module
  (:mod:`stride.testing.kube`). ``make kube-tools`` builds its binaries once per session,
  before the first test when a collected test needs them (:func:`pytest_collection_finish`).

The databases live on the run's PostgreSQL (:mod:`stride.testing.databases`): the server
``STRIDE_TEST_DATABASE_URL`` names, else an embedded one the run starts before its first
test (once, in the controlling process under ``pytest -n``) and stops when it ends, after
a failure, a timeout, Ctrl-C or SIGTERM too. No PostgreSQL test ever skips.

Every gRPC server and client needs certificates (mutual TLS is on by default): each test
process makes a CA and a certificate per identity once, and sets ``STRIDE_TLS_DIR`` for
itself and everything it starts (:func:`pytest_configure`). A test of plain text or of
missing certificates changes the environment it gives its own processes.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stride.obs.tracing import configure_tracing
from stride.runtime.embedded_nats import NatsServer
from stride.testing.channels import ensure_certificates
from stride.testing.databases import (
    TEST_DATABASE_ENV,
    create_database,
    drop_database,
    start_test_server,
    stop_test_server,
)
from stride.testing.kube import KubeCluster, KubeToolsMissing, ensure_kube_tools
from stride.testing.watchdog import Watchdog, grace_from_environment, timeout_of

_WATCHDOG = pytest.StashKey[Watchdog]()
_KUBE_TOOLS = pytest.StashKey[Path | KubeToolsMissing]()


def pytest_configure(config: pytest.Config) -> None:
    """The session's certificates and admin token (see :func:`ensure_certificates`), unless
    the caller set some; the hang watchdog (:mod:`stride.testing.watchdog`); the run's
    PostgreSQL, started here by the controlling process so that xdist's workers, started
    after this hook, inherit its URL."""
    ensure_certificates()
    config.stash[_WATCHDOG] = Watchdog(grace_from_environment())
    if not hasattr(config, "workerinput") and not os.environ.get(TEST_DATABASE_ENV):
        # SIGTERM (a CI job's timeout, `kill`) unwinds like Ctrl-C, so the server is
        # stopped and its folder removed; SIGKILL leaves it to the kernel (embedded_postgres).
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        start_test_server()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the run's embedded PostgreSQL, if this process started one."""
    stop_test_server()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Run ``make kube-tools`` now if a collected test needs the Kubernetes control plane:
    a first build takes minutes, longer than a test's timeout allows its setup. A failed
    build fails only those tests (:func:`kube_tools`). Under ``pytest -n`` every worker
    calls it; the build script's lock makes the others wait for the one that builds."""
    if session.config.option.collectonly:
        return
    if any("kube_tools" in getattr(item, "fixturenames", ()) for item in session.items):
        try:
            session.config.stash[_KUBE_TOOLS] = ensure_kube_tools()
        except KubeToolsMissing as error:
            session.config.stash[_KUBE_TOOLS] = error


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """Every test's setup, call and teardown under the watchdog."""
    watchdog = item.config.stash[_WATCHDOG]
    watchdog.begin(item.nodeid, timeout_of(item))
    try:
        yield
    finally:
        watchdog.end()


@pytest.fixture
def nats_server() -> Iterator[NatsServer]:
    """A running nats-server with JetStream, stopped after the test."""
    server = NatsServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    """URL of the test's own nats-server."""
    return nats_server.url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database on the run's server."""
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database URL, once for PostgreSQL and once for a SQLite file."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'test.db'}"
        return
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture(scope="session")
def kube_tools(request: pytest.FixtureRequest) -> Path:
    """The folder of the control-plane binaries, which ``make -s kube-tools`` built."""
    built = request.config.stash.get(_KUBE_TOOLS, None) or ensure_kube_tools()
    if isinstance(built, KubeToolsMissing):
        raise KubeToolsMissing(str(built))
    return built


@pytest.fixture(scope="module")
def kube_cluster(
    kube_tools: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KubeCluster]:
    """A started :class:`~stride.testing.kube.KubeCluster` (kine, kube-apiserver,
    kube-controller-manager, kube-scheduler, kwok; users ``alice`` and ``bob``) shared by
    the module's tests, which keep to namespaces of their own; stopped after the module."""
    with KubeCluster(tmp_path_factory.mktemp("kube"), bin_dir=kube_tools) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _span_exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = configure_tracing("stride-tests", None)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


@pytest.fixture(autouse=True)
def spans(_span_exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """Spans finished during the test (tracing is on in every test, as in production)."""
    _span_exporter.clear()
    yield _span_exporter
    _span_exporter.clear()
