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

TF_ROLES = ("chief", "ps", "worker")
"""The roles of the job's TensorFlow cluster, in task order."""
ROLES = (*TF_ROLES, "data_worker")
"""Every role the cluster lists: its data workers are not TensorFlow tasks (they serve
ready mini-batches over gRPC, :mod:`stride.trainer.dataworker`)."""


def parse_cluster(text: str) -> dict[str, list[str]]:
    """``{"chief": [...], "ps": [...], "worker": [...], "data_worker": [...]}`` of host:port
    addresses (data workers optional); raises ValueError naming what is wrong."""
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

    role: Literal["chief", "ps", "worker", "data_worker"]
    index: int = Field(default=0, ge=0)
    job_id: str = Field(min_length=1, max_length=64)
    pod_name: str = Field(min_length=1, max_length=253)
    cluster_json: str
    data_mode: Literal["auto", "shards"] = "auto"
    """How the chief reads the data in :meth:`TrainingContext.fit`: ``auto`` reads by steps
    (GoldMiner's data-worker mode, with or without data workers) when the model has a data
    half, else by shards; ``shards`` always by shards, with no data workers (what
    ``bench/agent_overhead.py`` measures)."""
    port: int = Field(default=0, ge=0, le=65535)
    """The pod's own port (its TensorFlow server's, or a data worker's gRPC server's)."""
    agent_address: str = "127.0.0.1:50058"
    ckptcache_address: str = "127.0.0.1:50056"
    spec_json: str = "{}"
    checkpoint_every_steps: int = Field(default=50, ge=1)
    report_every_steps: int = Field(default=10, ge=1)
    """A step window is reported once it has at least this many steps..."""
    report_interval_seconds: float = Field(default=2.0, ge=0, le=3600)
    """...and spans at least this long. The optimizer fits throughput to windows (DLRover
    sec. 4): a window of two seconds averages out single slow steps, and a fast model is
    not reported on eight times a second (each report is a bus message)."""
    consumed_log: Path | None = None
    dataset: str = "train"
    shard_batches: int = Field(default=16, ge=1)
    """Batches per shard of the datasets this trainer creates. The chief spreads a shard's
    steps over every worker, so a shard's size does not unbalance workers; what it sets is
    the cost of asking for shards (a call to the agent and one from the agent to the
    dispatcher per shard: ``bench/agent_overhead.py``) against how much a lost shard costs
    and how fine the checkpoints fall (between shards: see ``checkpoint_every_steps``)."""
    lease_heartbeat_seconds: float = Field(default=10.0, gt=0, le=600)
    """How often the chief reports it is still training a shard whose steps take long (a
    worker being relaunched): well inside the dispatcher's 60 s lease, so a live chief never
    loses its shard, while one that died loses it within a lease."""
    plan_version: int = Field(default=0, ge=0)
    """The plan version this pod was started for (the chief follows newer ones as it
    moves); its step reports carry the version in force."""
    pending_ack: str = ""
    """Set by the chief for itself when it re-executes to move to a new cluster:
    ``<plan_version>:<unix time the pause began>:<checkpoint id>``; the new process
    acknowledges it once its first step on the new cluster has finished."""
    standby: bool = False
    """A chief started as the replacement of a chief that still trains (its pod migrated):
    it loads TensorFlow and the job's code, then waits for RESUME to take over from the old
    chief's checkpoint, so the pause does not include its start-up (DLRover-RM sec. 5.2)."""
    verify_restores: bool = False
    """Log a digest of the variables saved before a move and of those restored after it
    (tests compare them bit for bit). Off by default: reading a large model back from its
    PS costs seconds, and it would count in the pause."""

    @field_validator("cluster_json")
    @classmethod
    def _check_cluster(cls, value: str) -> str:
        parse_cluster(value)
        return value

    @property
    def cluster(self) -> dict[str, list[str]]:
        """The parsed cluster."""
        return parse_cluster(self.cluster_json)
