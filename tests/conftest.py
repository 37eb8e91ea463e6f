"""Test-wide settings. Fixtures come from the ``stride.testing`` pytest plugin."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

from stride.testing import SHARED_TRACES
from stride.testing.scheduling import grouped_by_file

# Under CI, property tests replay the same examples every run (a red build is never a roll
# of the dice) and have no per-example deadline (a loaded 2-core runner is slow). Developers
# get fresh random examples each run, which is how new counterexamples are found.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


TENSORFLOW_FILES = frozenset(
    {
        "e2e/test_training.py",
        "e2e/test_tf_checkpoint.py",
        "e2e/test_ckptclient_tf_snapshot.py",
        "e2e/test_tf_server_isolation.py",
    }
)
"""End-to-end tests that train TensorFlow jobs: each keeps both cores busy, so under
``pytest -n`` (``make test``) they run one after another on one worker
(``--dist loadgroup``), beside the lighter tests on the others, never two at once."""

SUITE_FILES = frozenset(
    {
        "e2e/test_cli_suite.py",
        "e2e/test_job_path.py",
        "e2e/test_loadgen.py",
        "e2e/test_replay.py",
        "e2e/test_supervisor.py",
    }
)
"""The other end-to-end tests, each starting the whole suite (eight services, NATS, a
database): one after another on one worker too, so no more than one such start competes
with a TensorFlow job and the lighter tests (with three at once, a service took 39 s to
start and exit)."""


KUBE_FILES = (
    "integration/test_kube_cluster.py",
    "integration/test_kubernetes_backend.py",
    "e2e/test_kubernetes.py",
)
"""Each module starts a Kubernetes control plane of its own: one worker runs them in turn."""


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the TensorFlow end-to-end tests as one group and the other
    end-to-end tests as another, told by their files (``xdist_group`` markers group nothing
    here: :mod:`stride.testing.scheduling`)."""
    groups = (
        dict.fromkeys(TENSORFLOW_FILES, "tensorflow")
        | dict.fromkeys(SUITE_FILES, "suite")
        | dict.fromkeys(KUBE_FILES, "kube")
    )
    return grouped_by_file(config, log, groups)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that read the public traces need ``shared/traces`` beside the checkout.

    Where it is absent (a bare clone), they skip with the reason; CI has it, and there a
    missing folder fails the run instead of hiding the tests.
    """
    if SHARED_TRACES.is_dir():
        return
    reason = f"the public traces are not at {SHARED_TRACES} (shared/ beside the checkout)"
    if os.environ.get("CI"):
        raise pytest.UsageError(reason)
    sources: dict[str, bool] = {}
    for item in items:
        path = str(item.path)
        if path not in sources:
            sources[path] = "SHARED_TRACES" in item.path.read_text()
        if sources[path]:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Remove the local pod backend's TensorFlow port guards (nftables tables and cgroup v2
    groups) that this run's pod watchers left: tests stop pod watchers with their pods
    running, and the guard of a state folder outlives its pod watcher by design (pods do).
    Run once, by the controlling process, after every worker."""
    if hasattr(session.config, "workerinput"):
        return
    from stride.podwatcher.adapters.outbound.backends.localpods import firewall

    if firewall.unavailable() is not None:
        return
    factory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    firewall.sweep_stale(under=factory.getbasetemp())
