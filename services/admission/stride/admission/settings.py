"""Admission settings (env prefix ``STRIDE_ADMISSION_``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import ServiceSettings


class AdmissionSettings(ServiceSettings):
    """Settings of the admission service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_ADMISSION_", extra="ignore")
    service_name: ClassVar[str] = "admission"

    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """The job API's well-known port (the CLI's default target)."""
