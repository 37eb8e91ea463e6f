"""Executor settings (env prefix ``STRIDE_EXECUTOR_``)."""

from __future__ import annotations

import socket
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from stride.runtime.settings import MIB, ServiceSettings


class ExecutorSettings(ServiceSettings):
    """Settings of an algorithm-executor replica."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_EXECUTOR_", extra="ignore")
    service_name: ClassVar[str] = "executor"
    needs_database: ClassVar[bool] = False

    grpc_port: int = Field(default=50053, ge=0, le=65535)
    """The direct API's well-known port (admission 50051, optimizer 50052)."""
    grpc_max_receive_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """RunAlgorithm carries an algorithm's arguments: throughput samples, a cluster's nodes,
    a population of jobs; hundreds of kilobytes at the scales the policies are evaluated
    at. 4 MiB (gRPC's default) holds that with room; the pool's other entry point, NATS,
    is bounded tighter still by the server's 1 MB default payload."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """A reply is a result and its proposed plans (a Pareto front at most); 4 MiB is what a
    client with gRPC's defaults accepts."""
    replica_name: str = Field(default_factory=socket.gethostname, min_length=1, max_length=128)
    """Which replica ran a request, in logs and spans. The host name by default: the pod
    name on Kubernetes, so a slow or failing run can be traced to its pod."""
    request_time_limit_seconds: float = Field(default=120.0, gt=0, le=3600, allow_inf_nan=False)
    """Longest one request may run. Each of the ``request_concurrency`` slots is a worker
    process; a run past this is stopped (its worker killed and replaced) and answered
    DEADLINE_EXCEEDED. The optimizer's NSGA-II search at its defaults takes about a second;
    two minutes leaves room for a loaded node without letting one request hold a core for
    good. At most an hour: a run tells its requester every second that it goes on, and
    NATS lets a replica send ``EXECUTOR_RUN.max_replies`` (4,096) messages per request."""
    registry: str = Field(
        default="stride.policy.registry:default_registry", pattern=r"^[\w.]+:\w+$"
    )
    """``module:function`` that makes the algorithm registry, in the service and in each
    worker process (tests add their own algorithms this way)."""
    request_concurrency: int = Field(default=4, ge=1, le=64)
    """Requests one replica runs at once. Each is its own subscription in the queue group,
    because a NATS subscription hands its messages to the handler one after another. Four
    lets short algorithms pass a long NSGA-II run on a small pod without oversubscribing
    its cores; add replicas, not concurrency, for more throughput."""
