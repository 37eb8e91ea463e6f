"""Optimizer settings (env prefix ``STRIDE_OPTIMIZER_``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import ServiceSettings


class OptimizerSettings(ServiceSettings):
    """Settings of the optimizer (the Brain)."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_OPTIMIZER_", extra="ignore")
    service_name: ClassVar[str] = "optimizer"

    grpc_port: int = Field(default=50052, ge=0, le=65535)
    """The plan API's well-known port (admission has 50051, the executor 50053)."""
    max_pod_cpu: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Most cores one pod can get in this cluster (its biggest node's allocatable CPU).
    Cold-start plans are clamped to it so they can be placed. Unset keeps the documented
    defaults of ``stride.policy.cold_start`` (8 cores for the sampling worker), which a
    cluster of laptops or small VMs should lower."""
    ack_wait_seconds: float = Field(default=30.0, gt=0, le=600)
    """How long a lifecycle message handed to a replica may stay unacknowledged before
    JetStream gives it to another (or the restarted) replica. It is the delay a crash adds
    to a job's first plan; 30 s leaves handlers, which take milliseconds, ample room on a
    slow database while a crashed replica's messages are retried well inside a minute."""
