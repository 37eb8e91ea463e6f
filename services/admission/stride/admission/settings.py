"""Admission settings (env prefix ``STRIDE_ADMISSION_``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.decisions.settings import DecisionSettings
from stride.runtime.settings import MIB, ServiceSettings


class AdmissionSettings(ServiceSettings, DecisionSettings):
    """Settings of the admission service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_ADMISSION_", extra="ignore")
    service_name: ClassVar[str] = "admission"

    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """The job API's well-known port (the CLI's default target)."""
    grpc_max_receive_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest request is SubmitJob's job spec, whose own limit is
    :data:`stride.vocabulary.jobspec.MAX_SPEC_BYTES` (256 KiB). This limit stays well above
    it on purpose: a spec over 256 KiB is then refused by validation, INVALID_ARGUMENT
    naming ``spec`` and the limit, rather than by gRPC with a bare RESOURCE_EXHAUSTED; past
    4 MiB (gRPC's default) a request is refused before it is decoded, so one call cannot
    make admission hold more than that."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answer is ListJobs (up to 1000 jobs with their specs); 4 MiB is what the
    CLI and any client with gRPC's defaults accepts, so a bigger page fails here with
    RESOURCE_EXHAUSTED rather than in the client's decoder."""
