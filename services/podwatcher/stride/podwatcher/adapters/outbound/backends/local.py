"""The local backend: pods are supervised process groups on this machine.

Each pod is the trainer (``python -m stride.trainer``) and its agent sidecar (``python -m
stride.agent``), started by :mod:`.localpods` under kernel limits (cgroup v2 or v1; the
rlimit fallback where neither can be written) and split over virtual nodes, so placement,
admission and packing have a cluster to work with on one machine. Pods outlive the
podwatcher: a restarted podwatcher re-adopts them from the state directory.

The environment of a pod is built here: the pod's identity (job, pod name, role), the
addresses of the dispatcher, the checkpoint cache and its own agent, the job's spec and
the TensorFlow cluster. Nothing of the podwatcher's own configuration (its database URL,
say) reaches a pod: every ``STRIDE_`` variable of this process is dropped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from stride.podwatcher.adapters.outbound.backends.base import (
    PodEnded,
    PodStart,
    PodUsage,
    ResizeRefused,
)
from stride.podwatcher.adapters.outbound.backends.localpods import (
    Limits,
    LocalPods,
    PodLaunch,
    ProcessSpec,
)
from stride.podwatcher.adapters.outbound.backends.localpods import (
    ResizeRefused as RuntimeResizeRefused,
)
from stride.podwatcher.adapters.outbound.backends.localpods.firewall import TfFirewall
from stride.podwatcher.adapters.outbound.backends.localpods.sandbox import PodSandboxes
from stride.podwatcher.domain.nodes import NodeSpec
from stride.runtime.tokens import (
    JOB_TOKEN_FILE_ENV,
    JOB_TOKEN_TTL,
    Signer,
    TokenError,
    new_pod_key,
    read_pod_key,
    write_pod_key,
    write_token,
)
from stride.vocabulary import Role

log = structlog.get_logger(__name__)

MEMINFO = Path("/proc/meminfo")
LOOPBACK = "127.0.0.1"


def parse_meminfo_total(text: str) -> int | None:
    """Total memory in bytes from the text of ``/proc/meminfo`` (its ``MemTotal`` line)."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() != "MemTotal":
            continue
        parts = value.split()
        if not parts or not parts[0].isdigit():
            return None
        unit = parts[1].lower() if len(parts) > 1 else "b"
        factor = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}.get(unit)
        return None if factor is None else int(parts[0]) * factor
    return None


def total_memory_bytes() -> int:
    """This machine's memory: ``/proc/meminfo`` on Linux, else the page count times page size."""
    try:
        total = parse_meminfo_total(MEMINFO.read_text())
    except OSError:
        total = None
    if total is not None:
        return total
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def detect_local_node() -> NodeSpec:
    """This machine as one node: its host name, CPU count and total memory."""
    return NodeSpec(
        name=socket.gethostname() or "localhost",
        cpu=float(os.cpu_count() or 1),
        memory_bytes=total_memory_bytes(),
    )


@dataclass(frozen=True)
class PodEnvironment:
    """What every pod is told about the services around it."""

    nats_url: str
    dispatcher_address: str
    ckptcache_address: str
    checkpoint_every_steps: int
    jobs_dir: Path
    """Per-job files the trainer writes next to its pods (the chief's consumed-sample log)."""
    log_level: str = "INFO"
    verify_restores: bool = False
    """Trainers log digests of saved and restored variables (tests)."""
    step_report_seconds: float = 2.0
    """How long a step window spans before the chief reports it."""
    python: str = sys.executable
    trainer_module: str = "stride.trainer"


_POD_TLS = frozenset({"STRIDE_TLS_DIR", "STRIDE_INSECURE"})
"""The podwatcher's own TLS settings its pods keep (:mod:`stride.runtime.tls`): the agent
and the trainer's clients present the ``agent`` and ``trainer`` certificates, or run in
plain text when the suite does. The folder pods are given holds only the CA and those two
identities (:func:`pod_tls_folder`), not the keys that sign tokens."""

POD_IDENTITIES = ("agent", "trainer")


def pod_tls_folder(source: Path, target: Path) -> Path:
    """A TLS folder for pods: ``source``'s CA and the ``agent`` and ``trainer`` certificates
    and keys only (re-copied at every start, so renewed certificates reach new pods)."""
    target.mkdir(parents=True, exist_ok=True)
    os.chmod(target, 0o700)
    names = ["ca.crt"] + [f"{who}.{kind}" for who in POD_IDENTITIES for kind in ("crt", "key")]
    for name in names:
        data = (source / name).read_bytes()
        temporary = target / f".{name}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, target / name)
    return target


def _base_environment(source: Mapping[str, str]) -> dict[str, str]:
    return {
        key: value
        for key, value in source.items()
        if not key.startswith("STRIDE_") or key in _POD_TLS
    }


class LocalBackend:
    """Runs pods as local process groups through :class:`LocalPods`.

    **Job tokens.** With a ``signer`` (the pod watcher's own key: TLS is on), every pod gets
    a token for its (job, pod, role) in ``tokens_dir/<pod>.token`` (0600), named to both
    processes by ``STRIDE_JOB_TOKEN_FILE``. Tokens live :data:`~stride.runtime.tokens.
    JOB_TOKEN_TTL`; :meth:`refresh_tokens` rewrites the running pods' at half that age (the
    clients re-read a file that changed), and a pod's token goes when its end is
    acknowledged.
    """

    name = "local"

    def __init__(
        self,
        runtime: LocalPods,
        nodes: tuple[NodeSpec, ...],
        environment: PodEnvironment,
        base_environment: Mapping[str, str] | None = None,
        *,
        signer: Signer | None = None,
        tokens_dir: Path | None = None,
        token_ttl: float = JOB_TOKEN_TTL,
        sandboxes: PodSandboxes | None = None,
        firewall: TfFirewall | None = None,
    ) -> None:
        if signer is not None and tokens_dir is None:
            raise ValueError("tokens_dir: required with a signer")
        self.signer = signer
        self.tokens_dir = tokens_dir
        self.token_ttl = token_ttl
        if tokens_dir is not None:
            tokens_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(tokens_dir, 0o700)
        self.runtime = runtime
        self._nodes = nodes
        self._drained: set[str] = set()
        self.environment = environment
        self.base = _base_environment(os.environ if base_environment is None else base_environment)
        self.enforcement = runtime.enforcement.value
        self.enforcement_note = runtime.enforcement_note
        self.sandboxes = sandboxes
        """Confines each pod's processes to their own files (None: they are not)."""
        self.firewall = firewall
        """Lets only a job's own pods reach its TensorFlow ports (None: anyone may)."""

    def nodes(self) -> list[NodeSpec]:
        """The virtual nodes pods may be placed on (drained ones left out)."""
        return [node for node in self._nodes if node.name not in self._drained]

    def all_nodes(self) -> list[tuple[NodeSpec, bool]]:
        """Every virtual node and whether it is drained."""
        return [(node, node.name in self._drained) for node in self._nodes]

    def set_drained(self, name: str, drained: bool) -> bool:
        """Drain a virtual node or put it back; False if no node has that name. A drained
        node's pods are not stopped here: the caller evicts them (:meth:`evict`)."""
        if all(node.name != name for node in self._nodes):
            return False
        if drained:
            self._drained.add(name)
        else:
            self._drained.discard(name)
        return True

    async def evict(self, name: str, why: str) -> None:
        """Stop a pod as the node would evict it: its end comes through :meth:`ended` as
        Evicted, with ``why``."""
        if name in self.running():
            await self.runtime.evict(name, why)

    def address(self, name: str, job_id: str, port: int) -> str:
        """Pods of this backend reach each other on loopback."""
        return f"{LOOPBACK}:{port}"

    def _token_folder(self, pod: str) -> Path:
        """The pod's own folder of the tokens folder (its token and key, nothing else: what
        its sandbox may read; a folder, since a rewritten token is a new file)."""
        assert self.tokens_dir is not None
        return self.tokens_dir / pod

    def _token_path(self, pod: str) -> Path:
        return self._token_folder(pod) / "token"

    def _key_path(self, pod: str) -> Path:
        return self._token_folder(pod) / "key"

    def issue_token(self, pod: str, job_id: str, role: str) -> Path | None:
        """Write a fresh job token for ``pod`` (None: no signer, plain text), binding the
        pod's own key (``<pod>.key``, made with the pod's first token and kept until its
        end), which its agent signs what it publishes with (:mod:`stride.bus.signing`)."""
        if self.signer is None:
            return None
        key_path = self._key_path(pod)
        try:
            key = read_pod_key(key_path) if key_path.exists() else None
        except TokenError as error:
            log.warning("pod key unreadable; a new one", pod=pod, why=str(error))
            key = None
        if key is None:
            key_path.parent.mkdir(mode=0o700, exist_ok=True)
            key = new_pod_key()
            write_pod_key(key_path, key)
        path = self._token_path(pod)
        token = self.signer.job_token(
            job_id, pod, role, ttl=self.token_ttl, pod_key=key.public_key()
        )
        write_token(path, token)
        return path

    async def refresh_tokens(self) -> int:
        """Rewrite the job token of every running pod (and adopt those an earlier pod
        watcher started); returns how many were written."""
        if self.signer is None:
            return 0
        written = 0
        for status in self.runtime.pods():
            launch = status.launch
            self.issue_token(launch.pod, launch.job_id, launch.role)
            written += 1
        return written

    def launch(self, pod: PodStart) -> PodLaunch:
        """The processes of ``pod`` and their environments."""
        record = pod.record
        env = self.environment
        common = {
            **self.base,
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": self.base.get("TF_CPP_MIN_LOG_LEVEL", "2"),
        }
        token = self.issue_token(record.name, record.job_id, record.role.value)
        agent = {
            **common,
            "STRIDE_AGENT_JOB_ID": record.job_id,
            "STRIDE_AGENT_POD_NAME": record.name,
            "STRIDE_AGENT_ROLE": record.role.value,
            "STRIDE_AGENT_GRPC_HOST": LOOPBACK,
            "STRIDE_AGENT_GRPC_PORT": str(pod.agent_port),
            "STRIDE_AGENT_NATS_URL": env.nats_url,
            "STRIDE_AGENT_DISPATCHER_ADDRESS": env.dispatcher_address,
            "STRIDE_AGENT_CKPTCACHE_ADDRESS": env.ckptcache_address,
            "STRIDE_AGENT_LOG_LEVEL": env.log_level,
            "STRIDE_AGENT_LOG_JSON": "true",
        }
        if token is not None:
            agent["STRIDE_AGENT_JOB_TOKEN_FILE"] = str(token)
            agent["STRIDE_AGENT_JOB_KEY_FILE"] = str(self._key_path(record.name))
        trainer = {
            **common,
            "STRIDE_TRAINER_ROLE": record.role.value,
            "STRIDE_TRAINER_INDEX": str(record.index),
            "STRIDE_TRAINER_JOB_ID": record.job_id,
            "STRIDE_TRAINER_POD_NAME": record.name,
            "STRIDE_TRAINER_CLUSTER_JSON": pod.cluster_json,
            "STRIDE_TRAINER_PORT": str(pod.port),
            "STRIDE_TRAINER_AGENT_ADDRESS": f"{LOOPBACK}:{pod.agent_port}",
            "STRIDE_TRAINER_CKPTCACHE_ADDRESS": env.ckptcache_address,
            "STRIDE_TRAINER_SPEC_JSON": pod.spec_json,
            "STRIDE_TRAINER_CHECKPOINT_EVERY_STEPS": str(env.checkpoint_every_steps),
            "STRIDE_TRAINER_PLAN_VERSION": str(pod.plan_version),
            "STRIDE_TRAINER_VERIFY_RESTORES": "true" if env.verify_restores else "false",
            "STRIDE_TRAINER_REPORT_INTERVAL_SECONDS": str(env.step_report_seconds),
        }
        if token is not None:
            trainer[JOB_TOKEN_FILE_ENV] = str(token)
        if pod.standby:
            trainer["STRIDE_TRAINER_STANDBY"] = "true"
        job_dir = env.jobs_dir / record.job_id
        job_dir.mkdir(parents=True, exist_ok=True)
        if record.role is Role.CHIEF:
            trainer["STRIDE_TRAINER_CONSUMED_LOG"] = str(job_dir / "consumed.jsonl")
        processes: tuple[ProcessSpec, ...] = (
            ProcessSpec("trainer", (env.python, "-m", env.trainer_module), trainer),
            ProcessSpec("agent", (env.python, "-m", "stride.agent"), agent),
        )
        policy = None
        if self.sandboxes is not None:
            tokens = self._token_folder(record.name) if token is not None else None
            processes, policy = self.sandboxes.confine(
                processes, self.runtime.pod_dir(record.name), job_dir, tokens
            )
        return PodLaunch(
            pod=record.name,
            job_id=record.job_id,
            role=record.role.value,
            index=record.index,
            node=record.node,
            plan_version=pod.plan_version,
            limits=Limits(cpu=record.cpu, memory_bytes=record.memory_bytes),
            processes=processes,
            main="trainer",
            labels={"port": str(pod.port), "agent_port": str(pod.agent_port)},
            sandbox=policy,
            groups=(self.firewall.procs_file(record.job_id),) if self.firewall else (),
        )

    async def start(self, pod: PodStart) -> None:
        """Start the pod's processes (idempotent for a running pod); its TensorFlow port
        guarded first, so no other job's pod reaches it even for a moment."""
        if self.firewall is not None:
            self.firewall.guard(pod.record.name, pod.record.job_id, pod.port)
        await self.runtime.start(self.launch(pod))

    async def wait_ready(self, pods: Sequence[PodStart], timeout: float) -> bool:
        """Until every trainer's port accepts a TCP connection (its TensorFlow server is up)."""
        deadline = asyncio.get_running_loop().time() + timeout
        for pod in pods:
            while True:
                try:
                    _, writer = await asyncio.open_connection(LOOPBACK, pod.port)
                except OSError:
                    if asyncio.get_running_loop().time() > deadline:
                        return False
                    await asyncio.sleep(0.2)
                    continue
                writer.close()
                await writer.wait_closed()
                break
        return True

    async def resize(self, name: str, cpu: float, memory_bytes: int) -> None:
        """Resize in place through the pod's cgroup."""
        try:
            await self.runtime.resize(name, Limits(cpu=cpu, memory_bytes=memory_bytes))
        except RuntimeResizeRefused as error:
            raise ResizeRefused(str(error)) from error

    async def delete(self, name: str) -> None:
        """Stop the pod and remove its cgroup (its end comes through :meth:`ended`)."""
        if name in self.running():
            await self.runtime.delete(name)

    def adopt(self) -> list[str]:
        """Pods an earlier podwatcher started that still run (the guard's rules of any that
        ended meanwhile go)."""
        adopted = [status.launch.pod for status in self.runtime.adopt()]
        if self.firewall is not None:
            self.firewall.prune(self.runtime.known())
        return adopted

    def running(self) -> list[str]:
        """The pods running now."""
        return [status.launch.pod for status in self.runtime.pods()]

    def known(self) -> list[str]:
        """The pods running now and those whose end is not acknowledged yet."""
        return self.runtime.known()

    async def ended(self) -> AsyncIterator[PodEnded]:
        """Pod ends, as the runtime reports them."""
        async for end in self.runtime.exits():
            yield PodEnded(end.pod, end.job_id, end.reason.value, end.exit_code, end.message)

    async def acknowledge(self, name: str) -> None:
        """Forget a recorded end (and the pod's token)."""
        await self.runtime.acknowledge(name)
        if self.tokens_dir is not None and name not in self.running():
            self._token_path(name).unlink(missing_ok=True)
            self._key_path(name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._token_folder(name).rmdir()
        if self.firewall is not None and name not in self.running():
            self.firewall.release(name)
            self.firewall.forget_idle_jobs()

    def usage(self, name: str) -> PodUsage | None:
        """CPU and memory use from the pod's cgroup (or process tree)."""
        sample = self.runtime.usage(name)
        return None if sample is None else PodUsage(sample.cpu_cores, sample.memory_bytes)

    async def log_tail(self, name: str, lines: int) -> list[str]:
        """The last lines of the pod's processes' logs."""
        return self.runtime.log_tail(name, lines)

    def follow_logs(self, name: str) -> AsyncIterator[list[str]]:
        """New log lines until the pod has ended."""
        return self.runtime.follow_logs(name)

    async def close(self) -> None:
        """Stop watching; the pods keep running (and their ports stay guarded; with none
        left, the guard's rules and groups go)."""
        if self.firewall is not None and not self.runtime.known():
            self.firewall.remove()
        await self.runtime.close()
