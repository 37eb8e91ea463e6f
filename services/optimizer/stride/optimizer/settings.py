"""Optimizer settings (env prefix ``STRIDE_OPTIMIZER_``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from stride.decisions.settings import DecisionSettings
from stride.runtime.settings import MIB, ServiceSettings


class OptimizerSettings(ServiceSettings, DecisionSettings):
    """Settings of the optimizer (the Brain)."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_OPTIMIZER_", extra="ignore")
    service_name: ClassVar[str] = "optimizer"

    grpc_port: int = Field(default=50052, ge=0, le=65535)
    """The plan API's well-known port (admission has 50051, the executor 50053)."""
    grpc_max_receive_message_bytes: int = Field(default=1 * MIB, ge=64 * 1024, le=2**31 - 1)
    """Every request of the plan API names only a job id (and reflection's are as small),
    so 1 MiB is far above any real one while a flood of oversized calls is refused before
    it is decoded."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answers are a long job's every plan version (ListPlans) or optimization
    event; 4 MiB (what a client with gRPC's defaults accepts) is thousands of them."""
    max_pod_cpu: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Most cores one pod can get in this cluster (its biggest node's allocatable CPU).
    Cold-start plans are clamped to it so they can be placed. Unset keeps the documented
    defaults of ``stride.policy.cold_start`` (8 cores for the sampling worker), which a
    cluster of laptops or small VMs should lower."""
    ack_wait_seconds: float = Field(default=5.0, gt=0, le=600)
    """How long a lifecycle message handed to a replica may stay unacknowledged before
    JetStream gives it to another (or the restarted) replica. It is the delay a crash adds
    to a job's first plan, so it is short; a handler that takes longer (a decision in the
    executor pool) is not redelivered under it, because the consumer reports progress every
    third of it."""
    tick_seconds: float = Field(default=60.0, gt=0, le=86400, allow_inf_nan=False)
    """Training time one throughput sample covers: when a job's step metrics under its
    current plan span this long, the window closes and the stage step decides. The
    simulator ticks every 180 s (its pods take 120 s to start); live pods start in seconds
    here, so a minute measures a configuration and keeps a short job's sampling short."""
    min_plan_interval_seconds: float = Field(default=60.0, ge=0, le=86400, allow_inf_nan=False)
    """A job gets at most one plan from the stage step per this interval, so it is not
    resized more often than a migration's pause can pay for (DLRover-RM eq. 8). A decision
    inside it is recorded as held. An OOM rule or an operator's plan is never held."""
    override_hold_seconds: float = Field(default=900.0, ge=0, le=7 * 86400, allow_inf_nan=False)
    """After an operator's plan (``stride scale``) the stage step's changes to the job are
    held this long: the operator's choice is not undone at the next window."""
    max_job_cpu: int | None = Field(default=None, ge=1, le=100_000)
    """Most cores the stage step gives one job (the job's request if larger). Unset keeps
    the policy's 200 (000 sec. 6.1)."""
    configdb_address: str | None = Field(default=None, min_length=3, max_length=300)
    """host:port of the config DB: a new job starts from the configurations of the most
    similar finished jobs (warm start). Unset: every job starts from the cold default."""
    admission_address: str | None = Field(default=None, min_length=3, max_length=300)
    """host:port of admission: a plan beyond a job's share is asked for there (its
    RequestShare), and goes out at once when admission grants it; an OOM fix admission
    queues suspends the job until it is granted. Unset: such a plan is held until admission
    raises the share of its own accord."""
    cluster_cpu: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Cores the running jobs may hold together. A plan that would take more than is free
    is held (the stage step's, an OOM rule's) or refused (an operator's), and
    ``stride explain`` says so. Unset: not bounded by the optimizer (admission's shares
    bound jobs once admission grants them)."""
    cluster_memory_gib: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """GiB the running jobs may hold together (as ``cluster_cpu``); both or neither."""
    enforce_shares: bool = True
    """Keep every plan within the share admission publishes for its job (DESIGN: admission
    owns the share, the optimizer the plan): a plan beyond it is held, a smaller share
    shrinks the plan into it. A share counts the chief, and the units no job's curve can use
    are lent to running jobs as headroom, so a job alone on a quiet cluster may still grow
    past its declared profile. A share of zero suspends the job whatever this says. Off:
    shares only bound plan 1 and the reservations of guaranteed jobs (for clusters whose
    admission capacity is not what the optimizer places on)."""

    tune_data_workers: bool = True
    """Size each job's data workers from its input queue (GoldMiner's job-level tuner,
    ``stride.optimizer.domain.feeding``): a job whose chief reads by steps gets the data
    workers that pay. Off: a job gets data workers only from an operator
    (``stride scale --data-workers``)."""
    tuning_interval_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    """Training time one data-worker tuning interval measures (GoldMiner sec. 5.5: 30 s)."""
    data_worker_cpu_unit: float = Field(default=1.0, gt=0, le=64, allow_inf_nan=False)
    """Cores per CPU of the tuner's search: a data worker grows one unit at a time. A
    cluster of small nodes (a laptop) lowers it."""
    max_data_worker_cpu: float = Field(default=8.0, gt=0, le=256, allow_inf_nan=False)
    """Most cores one data worker grows to (GoldMiner sec. 3.4.1: the node's CPU-GPU ratio;
    8 on its testbed). At least one unit."""
    max_data_workers: int = Field(default=16, ge=1, le=1024)
    """Most data workers the tuner gives one job."""
    data_worker_allocation: Literal["srtf", "maxtp", "fair", "off"] = "srtf"
    """How the tuned jobs share the data-worker CPUs (GoldMiner's cluster level, sec.
    3.4.2): shortest remaining time first (the lowest JCT in its Table 5), the most
    cluster throughput, or equal normalized speed. Off: each job keeps what its own
    search found."""
    allocation_interval_seconds: float = Field(default=30.0, gt=0, le=86400, allow_inf_nan=False)
    """Seconds between the cluster level's rounds (one also runs when a job's search ends
    and when a job finishes)."""

    @model_validator(mode="after")
    def _data_worker_sizes(self) -> OptimizerSettings:
        if self.max_data_worker_cpu < self.data_worker_cpu_unit:
            raise ValueError(
                f"max_data_worker_cpu ({self.max_data_worker_cpu:g}) must be at least "
                f"data_worker_cpu_unit ({self.data_worker_cpu_unit:g}): one unit per data worker"
            )
        return self

    @model_validator(mode="after")
    def _capacity_pair(self) -> OptimizerSettings:
        if (self.cluster_cpu is None) != (self.cluster_memory_gib is None):
            raise ValueError(
                "cluster_cpu and cluster_memory_gib: set both (the cluster's capacity) or neither"
            )
        return self
