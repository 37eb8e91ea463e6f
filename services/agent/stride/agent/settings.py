"""Agent settings (env prefix ``STRIDE_AGENT_``).

The pod's identity (job, pod name, role) has no default: the podwatcher sets it in every
pod it starts, and a missing or malformed value stops the agent at startup with the
variable's name, e.g. ``STRIDE_AGENT_JOB_ID: Field required``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from stride.agent.domain.identity import JOB_ID_PATTERN, POD_NAME_PATTERN, Role, parse_role
from stride.runtime.settings import MIB, ServiceSettings


def _check_address(value: str) -> str:
    host, separator, port = value.rpartition(":")
    if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not a host:port address")
    return value


class AgentSettings(ServiceSettings):
    """Settings of the agent sidecar."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_AGENT_", extra="ignore")
    service_name: ClassVar[str] = "agent"
    needs_database: ClassVar[bool] = False

    job_id: str
    """The job this pod belongs to."""
    pod_name: str
    """This pod's name: the worker name at the dispatcher and on every metric."""
    role: Role
    """The pod's role: worker, ps, data-worker or chief."""
    dispatcher_address: str = "127.0.0.1:50055"
    """host:port of the shard dispatcher. The default fits the local process backend;
    Kubernetes pods get the dispatcher's service address."""
    ckptcache_address: str = "127.0.0.1:50056"
    """host:port of the checkpoint cache (same reasoning as the dispatcher's default)."""
    grpc_host: str = "127.0.0.1"
    """The trainer shares the pod's network namespace, so the agent listens on loopback
    only: nothing outside the pod can pull its shards or stop its training."""
    grpc_port: int = Field(default=50058, ge=0, le=65535)
    """The trainer-facing API's well-known port inside the pod."""
    grpc_max_receive_message_bytes: int = Field(default=16 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The agent forwards a trainer's checkpoint chunks to the cache unchanged, so it
    accepts what the cache accepts (16 MiB, also its upstream channels' limit); every other
    request is a few numbers."""
    grpc_max_send_message_bytes: int = Field(default=16 * MIB, ge=64 * 1024, le=2**31 - 1)
    """Load chunks and headers come from the cache unchanged: the cache's 16 MiB."""
    job_token_file: Path | None = None
    """The pod's job token (the pod watcher writes it and keeps it fresh), which the agent
    forwards to the dispatcher and the cache. Required over TLS."""
    job_key_file: Path | None = None
    """The pod's own key, which its job token binds (the pod watcher writes both): what
    the agent publishes (step metrics, control acks) is signed with it, so consumers know
    which job's pod sent it. Required over TLS."""
    upstream_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    """Deadline of each unary call to the dispatcher. The dispatcher answers in
    milliseconds; thirty seconds rides out its restart without hanging a trainer forever.
    Checkpoint streams instead inherit the trainer's own deadline, since their length
    depends on the checkpoint's size."""

    @field_validator("job_id")
    @classmethod
    def _check_job_id(cls, value: str) -> str:
        if not JOB_ID_PATTERN.match(value):
            raise ValueError(f"{value!r} is not a job id (1-64 letters, digits, '_' or '-')")
        return value

    @field_validator("pod_name")
    @classmethod
    def _check_pod_name(cls, value: str) -> str:
        if not POD_NAME_PATTERN.match(value):
            raise ValueError(f"{value!r} is not a pod name (1-253 letters, digits, '.', '_', '-')")
        return value

    @field_validator("role", mode="before")
    @classmethod
    def _parse_role(cls, value: Any) -> Any:
        return parse_role(value) if isinstance(value, str) else value

    @field_validator("dispatcher_address", "ckptcache_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        return _check_address(value)
