"""Dispatcher settings (env prefix ``STRIDE_DISPATCHER_``)."""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import ServiceSettings


class DispatcherSettings(ServiceSettings):
    """Settings of the shard dispatcher."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_DISPATCHER_", extra="ignore")
    service_name: ClassVar[str] = "dispatcher"

    grpc_port: int = Field(default=50055, ge=0, le=65535)
    """The shard API's well-known port (agents dial it)."""
    lease_seconds: float = Field(default=60.0, gt=0, le=3600)
    """How long a shard lease lasts without a progress report; RegisterWorker tells workers.
    A minute is four missed heartbeats at the agent's 15 s cadence: long enough not to take
    shards from a worker in a GC pause, short enough that a lost worker's shards come back
    quickly (DLRover-RM sec. 5.1). Expiry is enforced with the shard dispatcher issue;
    until then leases are recorded and renewed, and lost workers are released explicitly."""

    @property
    def lease_duration(self) -> timedelta:
        """``lease_seconds`` as a timedelta."""
        return timedelta(seconds=self.lease_seconds)
