"""Configdb settings (env prefix ``STRIDE_CONFIGDB_``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import MIB, ServiceSettings


class ConfigDbSettings(ServiceSettings):
    """Settings of the configdb service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_CONFIGDB_", extra="ignore")
    service_name: ClassVar[str] = "configdb"

    grpc_port: int = Field(default=50054, ge=0, le=65535)
    """The Config DB API's well-known port (the optimizer's and executor's default target)."""
    grpc_max_receive_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest request is FindSimilarJobs' job spec, the same spec admission accepts, so
    the same 4 MiB limit as admission's."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answer is a page of job records with their plans (ListJobRecords, up to
    1000); 4 MiB is what a client with gRPC's defaults accepts, so a bigger page fails here
    with RESOURCE_EXHAUSTED rather than in the client's decoder."""
    warm_start_candidates: int = Field(default=10_000, ge=1, le=1_000_000)
    """How many of the most recently finished, succeeded jobs a similar-job query compares.
    Ten thousand is months of history for one cluster and ranks in tens of milliseconds;
    older jobs ran on older code and hardware, so they matter least for warm start."""
