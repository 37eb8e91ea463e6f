"""Trainer settings (env prefix ``STRIDE_TRAINER_``), set by the podwatcher in every pod.

The pod's identity and its cluster have no defaults: a missing or malformed one stops the
trainer at once with the variable's name, before TensorFlow is even imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ROLES = ("chief", "ps", "worker")


def parse_cluster(text: str) -> dict[str, list[str]]:
    """``{"chief": [...], "ps": [...], "worker": [...]}`` of host:port addresses; raises
    ValueError naming what is wrong."""
    try:
        cluster = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"is not JSON: {error.msg}") from None
    if not isinstance(cluster, dict):
        raise ValueError("must be an object of role -> list of host:port")
    for role, addresses in cluster.items():
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ValueError(f"{role}: must be a list of host:port strings")
        for address in addresses:
            host, separator, port = address.rpartition(":")
            if not separator or not host or not port.isdigit():
                raise ValueError(f"{role}: {address!r} is not host:port")
    if len(cluster.get("chief", [])) != 1:
        raise ValueError("needs exactly one chief")
    if not cluster.get("ps") or not cluster.get("worker"):
        raise ValueError("needs at least one ps and one worker")
    return {role: list(cluster.get(role, [])) for role in ROLES}


class TrainerSettings(BaseSettings):
    """What a trainer process is told by its pod."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_TRAINER_", extra="ignore")

    role: Literal["chief", "ps", "worker"]
    index: int = Field(default=0, ge=0)
    job_id: str = Field(min_length=1, max_length=64)
    pod_name: str = Field(min_length=1, max_length=253)
    cluster_json: str
    agent_address: str = "127.0.0.1:50058"
    ckptcache_address: str = "127.0.0.1:50056"
    spec_json: str = "{}"
    checkpoint_every_steps: int = Field(default=50, ge=1)
    report_every_steps: int = Field(default=10, ge=1)
    consumed_log: Path | None = None
    dataset: str = "train"
    shard_batches: int = Field(default=4, ge=1)
    pending_ack: str = ""
    """Set by the chief for itself when it re-executes to move to a new cluster:
    ``<plan_version>:<unix time the pause began>``; the new process acknowledges it once it
    has restored and can train again."""

    @field_validator("cluster_json")
    @classmethod
    def _check_cluster(cls, value: str) -> str:
        parse_cluster(value)
        return value

    @property
    def cluster(self) -> dict[str, list[str]]:
        """The parsed cluster."""
        return parse_cluster(self.cluster_json)
