"""Podwatcher settings (env prefix ``STRIDE_PODWATCHER_``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from stride.podwatcher.domain.nodes import parse_nodes
from stride.runtime.errors import InvalidArgument
from stride.runtime.settings import MIB, ServiceSettings


def parse_labels(text: str) -> dict[str, str]:
    """``key=value,...`` as a dict; raises ValueError naming a pair that is not one."""
    labels = {}
    for pair in filter(None, (part.strip() for part in text.split(","))):
        key, separator, value = pair.partition("=")
        if not separator or not key.strip():
            raise ValueError(f"{pair!r} is not a key=value label")
        labels[key.strip()] = value.strip()
    return labels


class PodWatcherSettings(ServiceSettings):
    """Settings of the podwatcher service."""

    model_config = SettingsConfigDict(env_prefix="STRIDE_PODWATCHER_", extra="ignore")
    service_name: ClassVar[str] = "podwatcher"

    grpc_port: int = Field(default=50057, ge=0, le=65535)
    """The pod API's well-known port (the CLI's default target for pods and nodes)."""
    grpc_max_receive_message_bytes: int = Field(default=1 * MIB, ge=64 * 1024, le=2**31 - 1)
    """Requests name a job id or nothing, so 1 MiB is far above any real one while a flood
    of oversized calls is refused before it is decoded."""
    grpc_max_send_message_bytes: int = Field(default=4 * MIB, ge=64 * 1024, le=2**31 - 1)
    """The largest answers are a job's pods or the node inventory: kilobytes per hundred
    pods or nodes; 4 MiB is what a client with gRPC's defaults accepts."""
    backend: Literal["local", "kubernetes"] = "local"
    r"""What runs the pods. ``local`` (default: a one-machine run needs no cluster) runs
    each pod as a supervised group of processes (trainer and agent sidecar) on this machine,
    with kernel-enforced limits; ``kubernetes`` creates pods on a cluster
    (:mod:`...backends.kubernetes`), takes a Lease before it acts and serves
    ``StrideJob``\ s."""
    local_nodes: str = ""
    """Split this machine into virtual nodes for placement, e.g. ``4x(cpu=2,memory=4Gi)``.
    Empty: one node with this machine's cores and memory."""
    local_state_dir: Path = Path("stride-pods")
    """Where the local backend keeps each pod's state and logs (``stride up`` puts it in
    its state directory). Pods outlive a podwatcher restart, which re-adopts them from
    here."""
    local_enforcement: Literal["auto", "cgroup-v2", "cgroup-v1", "rlimit"] = "auto"
    """How the local backend enforces limits: ``auto`` takes cgroup v2, else v1, else the
    rlimit fallback (memory by sampling, no CPU quota), and says which at start-up."""
    local_sandbox: Literal["auto", "landlock", "off"] = "auto"
    """Whether local pods are isolated from the suite and from each other: confined to
    their own files, without privileges (localpods.sandbox: Landlock ABI 6 and ``setpriv``),
    and their TensorFlow ports reachable only by their own job's pods (localpods.firewall:
    nftables and a cgroup v2 hierarchy, as root). ``auto`` does what the machine allows and
    says at start what it cannot; ``landlock`` refuses to start without both; ``off`` runs
    pods with the pod watcher's own rights and open ports (a machine whose users trust
    every job)."""
    eviction_threshold_bytes: int = Field(default=256 * MIB, ge=0)
    """The local backend evicts a pod when the machine's available memory falls below this,
    as the kubelet does under memory pressure (0: never)."""
    dispatcher_address: str = "127.0.0.1:50055"
    """host:port of the shard dispatcher, given to every pod's agent."""
    ckptcache_address: str = "127.0.0.1:50056"
    """host:port of the checkpoint cache, given to every pod's agent and trainer."""
    relaunch_budget: int = Field(default=3, ge=0, le=100)
    """How many times one pod is relaunched after failures before its job fails (DLRover's
    default relaunch count is 3)."""
    oom_replan_seconds: float = Field(default=30.0, ge=0, le=3600)
    """How long an OOM-killed pod waits for the optimizer's next plan (more memory by the
    policy's OOM rule) before it is relaunched as it was."""
    reconfigure_timeout_seconds: float = Field(default=180.0, gt=0, le=3600)
    """How long the podwatcher waits for the chief to confirm a new cluster before it
    removes the old pods anyway and marks the plan FAILED."""
    cluster_name: str = Field(default="local", pattern=r"^[A-Za-z0-9_-]{1,63}$")
    """The cluster's name in the node inventory's subject (``stride.cluster.v1.nodes.<name>``)."""
    inventory_interval_seconds: float = Field(default=10.0, gt=0, le=3600)
    """How often the node inventory is checked; a change is published at once (a drain
    through the API is published when it happens)."""
    usage_interval_seconds: float = Field(default=5.0, gt=0, le=600)
    """How often pods' CPU and memory use is sampled and published."""
    trainer_module: str = Field(default="stride.trainer", pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")
    """The Python module each pod runs as its trainer (``python -m <module>``). The default
    runs the job's entrypoint under TensorFlow; another module suits a custom runtime."""
    checkpoint_every_steps: int = Field(default=50, ge=1, le=10**9)
    """The trainer's flash-checkpoint interval in steps (also how much a restore repeats
    at most)."""
    step_report_seconds: float = Field(default=2.0, ge=0, le=3600)
    """How long a window of training steps each chief measures before it reports it (the
    optimizer's throughput samples): two seconds average out single slow steps without
    flooding the bus from fast models."""
    nats_callout_seed_file: Path | None = None
    """The seed of the account nkey that signs training pods' NATS users (the pod watcher
    answers NATS's auth callout, stride.bus.callout). Default: ``nats-callout.nk`` in the
    certificate folder (``STRIDE_TLS_DIR``), where ``stride certs init`` writes it."""
    verify_restores: bool = False
    """Have trainers log a digest of the variables saved before a move and restored after
    it, to prove restores bit-identical (the end-to-end tests). Off by default: reading a
    large model back from its PS takes seconds, inside the pause."""

    @field_validator("local_nodes")
    @classmethod
    def _check_nodes(cls, value: str) -> str:
        if value.strip():
            try:
                parse_nodes(value)
            except (ValueError, InvalidArgument) as error:
                raise ValueError(str(error)) from None
        return value

    @field_validator("dispatcher_address", "ckptcache_address", "admission_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        host, separator, port = value.rpartition(":")
        if not separator or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{value!r} is not a host:port address")
        return value

    agent_image: str = Field(default="stride/agent:latest", min_length=1)
    """Image of the agent sidecar the kubernetes backend adds to training pods. ``latest``
    suits a local build; Helm pins it to the release's tag."""
    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """Kubernetes namespace the kubernetes backend creates the pods of ``stride submit``'s
    jobs in, and holds its Lease in (a StrideJob's pods run in its own namespace)."""
    trainer_image: str = Field(default="stride/trainer:latest", min_length=1)
    """The trainer image of a job whose spec names none (``spec.model.image``)."""
    kube_config: Path | None = None
    """A kubeconfig file to reach the API server with (outside a cluster); unset: the pod's
    service account (in a cluster)."""
    kube_context: str = ""
    """The kubeconfig context (empty: its current one)."""
    kube_node_selector: str = ""
    """A label selector of the nodes Stride places pods on (``stride.io/pool=training``);
    empty: every node."""
    kube_pod_labels: str = ""
    """Labels every training pod gets (``key=value,...``): the chart's training-pod
    selector labels, which its NetworkPolicy selects."""
    kube_podwatcher_labels: str = ""
    """The pod watcher's own pod labels (``key=value,...``), which each job's NetworkPolicy
    admits when the job's pods run in another namespace."""
    kube_cluster_domain: str = Field(default="cluster.local", min_length=1)
    kube_trainer_tls_secret: str = ""
    """The Secret with the ``trainer`` identity's certificate, in each pod namespace
    (empty: pods run in plain text)."""
    kube_agent_tls_secret: str = ""
    leader_election: bool = True
    """Hold the Lease ``lease_name`` before acting (the Kubernetes backend)."""
    lease_name: str = Field(default="stride-podwatcher", min_length=1, max_length=253)
    lease_seconds: int = Field(default=15, ge=3, le=600)
    """How long a leader that stops renewing keeps the Lease (a standby waits that long)."""
    stridejobs: bool = True
    r"""Serve ``StrideJob``\ s (the Kubernetes backend): submit them through admission."""
    admission_address: str = "127.0.0.1:50051"
    """host:port of admission, which StrideJobs are submitted to."""

    @field_validator("kube_pod_labels", "kube_podwatcher_labels")
    @classmethod
    def _check_labels(cls, value: str) -> str:
        parse_labels(value)
        return value
