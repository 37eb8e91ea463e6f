"""Podwatcher settings and the choice of backend."""

from __future__ import annotations

import pydantic
import pytest

from stride.podwatcher.adapters.outbound.backends.local import LocalBackend
from stride.podwatcher.app import make_backend
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


def test_local_backend_is_the_default_and_kubernetes_is_not_built_yet() -> None:
    assert isinstance(make_backend(PodWatcherSettings()), LocalBackend)
    with pytest.raises(StartupError, match="kubernetes backend is not implemented yet"):
        make_backend(PodWatcherSettings(backend="kubernetes"))
