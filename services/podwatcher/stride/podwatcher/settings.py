"""Podwatcher settings (env prefix ``STRIDE_PODWATCHER_``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import MIB, ServiceSettings


class PodWatcherSettings(ServiceSettings):
    """Settings of the podwatcher service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_PODWATCHER_", extra="ignore")
    service_name: ClassVar[str] = "podwatcher"

    grpc_port: int = Field(default=50057, ge=0, le=65535)
    """The pod API's well-known port (the CLI's default target for pods and nodes)."""
    grpc_max_receive_message_bytes: int = Field(default=1 * MIB, ge=64 * 1024, le=2**31 - 1)
    """Requests name a job id or nothing, so 1 MiB is far above any real one while a flood
    of oversized calls is refused before it is decoded."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answers are a job's pods or the node inventory: kilobytes per hundred
    pods or nodes; 4 MiB is what a client with gRPC's defaults accepts."""
    backend: Literal["local", "kubernetes"] = "local"
    """What runs the pods. ``local`` (default: a one-machine run needs no cluster) treats
    this machine as the only node and will run pods as local processes; ``kubernetes``
    creates pods in ``namespace``. For now only ``local`` exists, and it records plans
    without creating pods; the backend issues add pod management to both."""
    agent_image: str = Field(default="stride/agent:latest", min_length=1)
    """Image of the agent sidecar the kubernetes backend adds to training pods. ``latest``
    suits a local build; Helm pins it to the release's tag."""
    namespace: str = Field(default="default", min_length=1, max_length=63)
    """Kubernetes namespace the kubernetes backend creates pods in (the cluster's default
    namespace unless Helm sets the release's)."""
