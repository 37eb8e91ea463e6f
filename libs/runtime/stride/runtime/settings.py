"""Typed service settings read from the environment (pydantic-settings).

Every service has its own prefix (``STRIDE_ADMISSION_``, ...). The connection settings
that a whole deployment shares (NATS URL, database URL, OTLP endpoint, log level) may also
be given once without the service part (``STRIDE_NATS_URL``); the per-service variable
wins. Settings are built in ``main()`` and passed down, never read at import time.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from stride.runtime.errors import StartupError

KIB = 1024
MIB = 1024 * KIB
GRPC_MESSAGE_LIMIT_MIN = 64 * KIB
"""Smallest message limit a setting may ask for: health, reflection and any error status
must still fit."""
GRPC_MESSAGE_LIMIT_MAX = 2**31 - 1
"""gRPC keeps message limits in a signed 32-bit integer."""

SHARED_FIELDS = frozenset({"nats_url", "database_url", "otlp_endpoint", "log_level", "log_json"})


class _SharedEnvSource(EnvSettingsSource):
    """``STRIDE_<FIELD>`` for the deployment-wide fields only."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name not in SHARED_FIELDS:
            return None, field_name, False
        return super().get_field_value(field, field_name)


class ServiceSettings(BaseSettings):
    """Settings every service process has. Subclasses set ``env_prefix`` and add their own."""

    model_config = SettingsConfigDict(extra="ignore", validate_default=True)

    service_name: ClassVar[str] = "stride"
    """The service's short name; also its database schema and log ``service`` field."""
    needs_database: ClassVar[bool] = True
    """Whether the service owns tables (executor and agent do not)."""

    grpc_host: str = "0.0.0.0"
    """Interface to serve gRPC on. All interfaces by default, because in a container the
    probes and peers arrive on the pod's address; `stride up` binds 127.0.0.1."""
    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC port. Each service's subclass sets its well-known default; 0 picks a free port."""
    grpc_max_receive_message_bytes: int = Field(
        default=4 * MIB, ge=GRPC_MESSAGE_LIMIT_MIN, le=GRPC_MESSAGE_LIMIT_MAX
    )
    """Largest request message the gRPC server accepts; a bigger one is refused with
    RESOURCE_EXHAUSTED before it is decoded. It bounds the memory one call can make the
    server hold. 4 MiB is gRPC's own default; each service's subclass sets its default from
    its largest legitimate request."""
    grpc_max_send_message_bytes: int = Field(
        default=4 * MIB, ge=GRPC_MESSAGE_LIMIT_MIN, le=GRPC_MESSAGE_LIMIT_MAX
    )
    """Largest response message the gRPC server sends; a call whose answer is bigger ends
    with RESOURCE_EXHAUSTED instead (gRPC itself has no send limit). 4 MiB is what a client
    with gRPC's defaults accepts, so anything bigger would fail at the client anyway; each
    service's subclass sets its default from its largest response."""
    grpc_rate_per_second: float = Field(default=500.0, ge=0, le=1e6)
    """Calls per second one identity (a user, a pod's job token, a service) may make to this
    server, sustained; past it (and its burst) a call is RESOURCE_EXHAUSTED with when to
    retry. 0 turns the limit off. Generous on purpose: it stops one caller from starving
    the others, not normal use (a ShardSession's messages are one call)."""
    grpc_rate_burst: int = Field(default=1000, ge=1, le=10_000_000)
    """Calls one identity may make at once above the sustained rate."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus port. Off (0) by default because several services on one host would
    collide on any fixed default; compose and Helm set 9464 per container."""
    nats_url: str | None = None
    """NATS server URL(s), comma-separated. Required: `stride up` supplies an embedded one."""
    database_url: str | None = None
    """SQLAlchemy URL of the service's database, ``postgresql://...`` or ``sqlite:///path``.
    On PostgreSQL each service uses its own schema named after the service."""
    otlp_endpoint: str | None = None
    """OTLP/gRPC collector (``host:4317``). Unset: spans are made and propagated, not exported."""
    log_level: str = "INFO"
    """Minimum log level."""
    log_json: bool = True
    """JSON log lines (machines read service logs); the CLI renders for humans instead."""
    shutdown_grace_seconds: float = Field(default=10.0, gt=0, le=120)
    """Time for in-flight RPCs and messages to finish on SIGTERM. Ten seconds fits inside
    Kubernetes' default 30 s termination grace with room for the hard-exit watchdog."""
    connect_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    """How long startup waits for NATS and the database before failing with a clear error."""
    health_interval_seconds: float = Field(default=2.0, gt=0, le=60)
    """How often NATS and the database are pinged to keep the health status truthful."""
    auto_migrate: bool = True
    """Run Alembic migrations at startup. On by default so one-machine runs need no extra
    step; compose and Helm turn it off and migrate in a separate one-shot."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        shared = _SharedEnvSource(settings_cls, env_prefix="STRIDE_")
        return init_settings, env_settings, shared, dotenv_settings, file_secret_settings

    @field_validator("nats_url")
    @classmethod
    def _check_nats_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        for server in value.split(","):
            if not server.strip().startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(f"{server.strip()!r} is not a nats://host:port URL")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("postgresql", "sqlite")):
            raise ValueError(f"{value!r} must be a postgresql:// or sqlite:/// URL")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        if value.upper() not in levels:
            raise ValueError(f"{value!r} is not one of {', '.join(levels)}")
        return value.upper()

    def require_nats_url(self) -> str:
        """The NATS URL, or a startup error that says how to set it."""
        if not self.nats_url:
            prefix = self.model_config.get("env_prefix", "STRIDE_")
            raise StartupError(
                f"no NATS URL: set STRIDE_NATS_URL (or {prefix}NATS_URL), "
                "or start the whole suite with `stride up`"
            )
        return self.nats_url

    def require_database_url(self) -> str:
        """The database URL, or a startup error that says how to set it."""
        if not self.database_url:
            prefix = self.model_config.get("env_prefix", "STRIDE_")
            raise StartupError(
                f"no database URL: set STRIDE_DATABASE_URL (or {prefix}DATABASE_URL) to "
                "postgresql://... or sqlite:///path"
            )
        return self.database_url


SettingsT = TypeVar("SettingsT", bound=ServiceSettings)


def load_settings(settings_class: type[SettingsT]) -> SettingsT:
    """Build settings from the environment, turning validation errors into one clear line."""
    from pydantic import ValidationError

    try:
        return settings_class()
    except ValidationError as error:
        prefix = settings_class.model_config.get("env_prefix", "STRIDE_")
        problems = "; ".join(
            f"{prefix}{'.'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in error.errors()
        )
        raise StartupError(f"invalid settings: {problems}") from None
