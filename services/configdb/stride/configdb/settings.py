"""Configdb settings (env prefix ``STRIDE_CONFIGDB_``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import ServiceSettings


class ConfigDbSettings(ServiceSettings):
    """Settings of the configdb service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_CONFIGDB_", extra="ignore")
    service_name: ClassVar[str] = "configdb"

    grpc_port: int = Field(default=50054, ge=0, le=65535)
    """The Config DB API's well-known port (the optimizer's and executor's default target)."""
    warm_start_candidates: int = Field(default=10_000, ge=1, le=1_000_000)
    """How many of the most recently finished, succeeded jobs a similar-job query compares.
    Ten thousand is months of history for one cluster and ranks in tens of milliseconds;
    older jobs ran on older code and hardware, so they matter least for warm start."""
