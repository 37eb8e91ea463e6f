"""Admission settings (env prefix ``STRIDE_ADMISSION_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from stride.admission.domain.gputree import GpuTree, TreeError
from stride.decisions.settings import DecisionSettings
from stride.runtime.settings import MIB, ServiceSettings
from stride.vocabulary.jobspec import MAX_SPEC_BYTES

SUBMIT_ENVELOPE_BYTES = 8 * 1024
"""What a SubmitJobRequest holds beside a spec at its limit: its request id (at most 200
characters, 800 bytes of UTF-8), two field keys and lengths (under 10 bytes), with room to
spare, so a spec a few KiB over :data:`MAX_SPEC_BYTES` is still decoded and refused by name."""
SUBMIT_REQUEST_BYTES = MAX_SPEC_BYTES + SUBMIT_ENVELOPE_BYTES
"""SubmitJob's request limit, the admission server's receive limit (and its proto's
``max_request_bytes``, which ``tests/unit/admission/test_limits.py`` holds equal)."""

LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""Addresses a stepped replay clock may be served on."""


class AdmissionSettings(ServiceSettings, DecisionSettings):
    """Settings of the admission service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_ADMISSION_", extra="ignore")
    service_name: ClassVar[str] = "admission"

    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """The job API's well-known port (the CLI's default target)."""
    grpc_max_receive_message_bytes: int = Field(
        default=SUBMIT_REQUEST_BYTES, ge=64 * 1024, le=2**31 - 1
    )
    """The largest request is SubmitJob's (:data:`SUBMIT_REQUEST_BYTES`: a spec at its own
    limit, :data:`~stride.vocabulary.jobspec.MAX_SPEC_BYTES`, and its envelope). A bigger
    one is refused by gRPC, RESOURCE_EXHAUSTED, before it is decoded, so a call makes
    admission hold at most this much (issue 37: at gRPC's 4 MiB default, 100 concurrent
    3.9 MB requests grew it to 834 MiB). A spec just over its limit still fits the envelope
    and is refused by validation, INVALID_ARGUMENT naming ``spec`` and the limit."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answer is ListJobs (up to 1000 jobs with their specs); 4 MiB is what the
    CLI and any client with gRPC's defaults accepts, so a bigger page fails here with
    RESOURCE_EXHAUSTED rather than in the client's decoder."""

    capacity_source: Literal["nodes", "settings"] = "nodes"
    """Where the cluster's capacity comes from. ``nodes`` (default): the podwatcher's node
    inventory (``stride.cluster.v1.nodes``), so a node lost, drained or added changes it and
    the guarantees are re-checked; the ``cluster_*`` settings below only count until the
    first inventory arrives. ``settings``: the ``cluster_*`` settings, always (an operator
    pins what guaranteed jobs may use; Helm does when ``admission.cluster`` is set)."""
    cluster_gpus: int = Field(default=0, ge=0, le=1_000_000)
    """GPUs admission plans GPU jobs on (0: a GPU job's deadline cannot be guaranteed)."""
    cluster_topology: str | None = None
    """How ``cluster_gpus`` are wired, ``switches x nodes per switch x GPUs per node`` (e.g.
    ``2x8x8``, an ElasticFlow ``cluster_specs`` shape): GPU jobs are then placed on that tree
    (buddy allocation with migration, ElasticFlow sec. 4.3) as ``stride sim`` places them.
    Unset: the tree of the node inventory's GPU nodes, or GPUs counted, not placed."""
    cluster_cpu: float | None = Field(default=None, gt=0, le=10_000_000, allow_inf_nan=False)
    """Cores admission plans PS/worker jobs on. Unset: this machine's (the embedded default
    runs every pod here). Set it, with ``cluster_memory_gib``, to the cores of the nodes
    guaranteed jobs may use (Helm: ``admission.cluster``)."""
    cluster_memory_gib: float | None = Field(
        default=None, gt=0, le=1_000_000_000, allow_inf_nan=False
    )
    """GiB of memory admission plans PS/worker jobs on (as ``cluster_cpu``)."""
    cpu_unit_cores: float = Field(default=1.0, gt=0, le=1024, allow_inf_nan=False)
    """Cores of one CPU unit, what admission counts for PS/worker jobs
    (:mod:`stride.policy.elasticflow.units`)."""
    cpu_unit_memory_gib: float | None = Field(default=None, gt=0, le=16384, allow_inf_nan=False)
    """GiB of memory of one CPU unit. Unset: the cluster's own memory per core
    (``cluster_memory_gib / cluster_cpu``, else this machine's, rounded down to 1/4 GiB), so
    cores and memory run out together and a plan lean on memory does not waste units (with
    a fixed 4 GiB, a 2-core machine with 23 GiB had 5 units for 8 virtual cores)."""
    curves_dir: Path | None = None
    """A folder of ElasticFlow throughput tables (``<model>.csv``): GPU jobs of a model and
    batch size found there need no declared profile."""

    configdb_address: str | None = Field(default=None, min_length=3, max_length=300)
    """host:port of the config DB: a PS/worker job that declares no profile is planned on a
    curve warm-started from what the most similar finished jobs measured. Unset: such a job
    has no curve (a deadline is refused, naming the profile to declare)."""
    quotas_file: Path | None = None
    """A YAML file of user and team quotas (``quotas: [{scope: team:ranking, members:
    [alice, bob], max_active_jobs: 8, max_submissions: 50, window_seconds: 86400}]``),
    loaded at start; the admin API's SetQuota wins for the same scope."""
    submit_rate_per_second: float = Field(default=5.0, ge=0, le=1e6, allow_inf_nan=False)
    """Jobs a second one user may submit, sustained, as verified by their token (a token
    bucket per user; past it and ``submit_rate_burst``, SubmitJob is RESOURCE_EXHAUSTED
    saying when to retry). 0 turns it off. Admins are not limited (replays and load
    generators submit thousands for many users), nor is plain text (nobody is verified).
    Five a second is 18,000 an hour, more than any person or sweep submits, while one
    user's flood takes at most 1/20 of what admission stores on this machine (about 100
    jobs a second, ``bench/submit_load.py``), so other users' submissions keep their
    latency (``bench/submit_flood.py``). The server-wide ``grpc_rate_per_second`` (500)
    bounds every call, not submissions: it never triggered on a flood of 1,000 jobs."""
    submit_rate_burst: int = Field(default=20, ge=1, le=1_000_000)
    """Jobs one user may submit at once above ``submit_rate_per_second``: a script
    submitting a directory of specs, or a sweep of 20, goes through without waiting."""
    default_max_active_jobs: int = Field(default=50, ge=0, le=1_000_000)
    """Jobs one user may hold active (admitted or queued) at once when no quota of their
    own (``user:<name>``) sets ``max_active_jobs``; past it SubmitJob is RESOURCE_EXHAUSTED
    naming the limit and the user's active jobs. 0 turns it off. Admins' submissions are
    not counted against it (as ``submit_rate_per_second``). 50 is far more than one person
    watches at once, and small enough that one user cannot fill the books, the pools and
    every round's work for everyone else; a team that needs more gets a quota."""
    replay_speedup: float = Field(default=1.0, ge=1.0, le=100_000.0, allow_inf_nan=False)
    """``stride replay`` only: admission's clock runs this many times faster than the wall
    clock from ``replay_origin``, so a trace's days pass in minutes (its slot-boundary
    rounds are timed on that clock). 1: the wall clock."""
    replay_origin: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """Unix seconds at which the replay clock equals the wall clock (set with
    ``replay_speedup``; unset: the service's start). With ``replay_stepped``: where the
    stepped clock starts."""
    replay_stepped: bool = False
    """``stride replay --clock stepped`` only: admission's clock stands still and moves
    only when the replay calls ``ReplayClockService.Advance`` (served only then, and only
    on a loopback address), so no decision waits on the wall clock and a replay makes the
    simulator's decisions at any speed."""

    @model_validator(mode="after")
    def _capacity_pair(self) -> AdmissionSettings:
        if (self.cluster_cpu is None) != (self.cluster_memory_gib is None):
            raise ValueError(
                "cluster_cpu and cluster_memory_gib: set both (the cluster's capacity) or neither"
            )
        if self.quotas_file is not None and not self.quotas_file.is_file():
            raise ValueError(f"quotas_file: {self.quotas_file} is not a file")
        if self.curves_dir is not None and not self.curves_dir.is_dir():
            raise ValueError(f"curves_dir: {self.curves_dir} is not a folder")
        if self.cluster_topology is not None:
            try:
                tree = GpuTree.parse(self.cluster_topology)
            except TreeError as error:
                raise ValueError(f"cluster_topology: {error}") from None
            if tree.gpus != self.cluster_gpus:
                raise ValueError(
                    f"cluster_topology: {tree.shape} holds {tree.gpus} GPUs, cluster_gpus is "
                    f"{self.cluster_gpus}"
                )
        if self.replay_stepped:
            if self.replay_speedup != 1.0:
                raise ValueError("replay_stepped: a stepped clock has no replay_speedup; unset it")
            if self.replay_origin is None:
                raise ValueError("replay_stepped: set replay_origin, where the clock starts")
            if self.grpc_host not in LOOPBACK:
                raise ValueError(
                    f"replay_stepped: the clock API is served on loopback only, not on "
                    f"grpc_host {self.grpc_host!r} (use 127.0.0.1)"
                )
        return self
