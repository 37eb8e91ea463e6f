"""Podwatcher settings and the choice of backend."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pydantic
import pytest

from stride.podwatcher.adapters.outbound.backends.local import LocalBackend
from stride.podwatcher.app import make_backend
from stride.podwatcher.operator import api_client
from stride.podwatcher.settings import PodWatcherSettings
from stride.runtime.errors import StartupError


def test_defaults() -> None:
    settings = PodWatcherSettings()
    assert settings.grpc_port == 50057
    assert settings.backend == "local"
    assert settings.agent_image == "stride/agent:latest"
    assert settings.namespace == "default"


def test_settings_come_from_the_service_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRIDE_PODWATCHER_NAMESPACE", "training")
    monkeypatch.setenv("STRIDE_PODWATCHER_AGENT_IMAGE", "registry/agent:1.2")
    settings = PodWatcherSettings()
    assert (settings.namespace, settings.agent_image) == ("training", "registry/agent:1.2")


def test_unknown_backend_is_rejected() -> None:
    with pytest.raises(pydantic.ValidationError, match="backend"):
        PodWatcherSettings(backend="slurm")  # type: ignore[arg-type]


def test_local_backend_is_the_default(tmp_path: Path) -> None:
    settings = PodWatcherSettings(
        nats_url="nats://127.0.0.1:4222",
        local_state_dir=tmp_path,
        local_nodes="3x(cpu=1,memory=1Gi)",
    )
    backend = make_backend(settings)
    assert isinstance(backend, LocalBackend)
    assert [node.name for node in backend.nodes()] == ["node-0", "node-1", "node-2"]
    assert backend.enforcement in ("cgroup-v1", "cgroup-v2", "rlimit")


def test_the_kubernetes_backend_without_an_api_server_fails_start_up_saying_what_to_set(
    tmp_path: Path,
) -> None:
    settings = PodWatcherSettings(
        nats_url="nats://127.0.0.1:4222", backend="kubernetes", kube_config=tmp_path / "none"
    )
    with pytest.raises(StartupError, match="STRIDE_PODWATCHER_KUBE_CONFIG"):
        asyncio.run(api_client(settings))
    with pytest.raises(pydantic.ValidationError, match="key=value"):
        PodWatcherSettings(backend="kubernetes", kube_pod_labels="app")


def test_virtual_nodes_that_do_not_parse_are_refused_naming_the_setting() -> None:
    with pytest.raises(pydantic.ValidationError, match="local_nodes") as raised:
        PodWatcherSettings(local_nodes="4x(cpu=two,memory=4Gi)")
    assert "two" in str(raised.value)


def test_pod_service_addresses_must_be_host_port() -> None:
    with pytest.raises(pydantic.ValidationError, match="dispatcher_address"):
        PodWatcherSettings(dispatcher_address="nowhere")
