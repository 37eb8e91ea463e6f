"""The local backend: this machine as a node, and what a pod's processes are told."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from stride.podwatcher.adapters.outbound.backends.base import PodStart
from stride.podwatcher.adapters.outbound.backends.local import (
    LocalBackend,
    PodEnvironment,
    detect_local_node,
    parse_meminfo_total,
    pod_tls_folder,
)
from stride.podwatcher.adapters.outbound.backends.localpods import Enforcement, LocalPods
from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.nodes import NodeSpec
from stride.podwatcher.domain.reconcile import PodRecord
from stride.runtime import tls
from stride.runtime.certs import init
from stride.runtime.tokens import JobIdentity, Signer, Verifier, read_pod_key
from stride.vocabulary import Role

GIB = 1024**3

MEMINFO = """MemTotal:       16314344 kB
MemFree:         1036544 kB
MemAvailable:    9123456 kB
"""


def test_meminfo_total_is_read_in_bytes() -> None:
    assert parse_meminfo_total(MEMINFO) == 16314344 * 1024


def test_meminfo_without_a_total_gives_none() -> None:
    assert parse_meminfo_total("MemFree: 12 kB\n") is None
    assert parse_meminfo_total("MemTotal: lots\n") is None
    assert parse_meminfo_total("MemTotal: 12 parsecs\n") is None


def test_the_local_node_is_this_machine() -> None:
    node = detect_local_node()
    assert node.name
    assert node.cpu == float(os.cpu_count() or 1)
    assert node.memory_bytes > 0


def pod_environment(tmp_path: Path) -> PodEnvironment:
    return PodEnvironment(
        nats_url="nats://127.0.0.1:4222",
        dispatcher_address="127.0.0.1:1",
        ckptcache_address="127.0.0.1:2",
        checkpoint_every_steps=7,
        jobs_dir=tmp_path / "jobs",
    )


def test_a_pod_runs_its_trainer_and_agent_with_its_identity_and_nothing_of_ours(
    tmp_path: Path,
) -> None:
    environment = pod_environment(tmp_path)
    backend = LocalBackend(
        LocalPods(tmp_path / "pods", enforcement=Enforcement.RLIMIT),
        (NodeSpec("node-0", 2.0, GIB),),
        environment,
        base_environment={"PATH": "/bin", "STRIDE_PODWATCHER_DATABASE_URL": "secret"},
    )
    record = PodRecord(
        "job-1-chief-0", "job-1", Role.CHIEF, 0, 0, 0.5, GIB, "node-0", PodPhase.PENDING
    )
    launch = backend.launch(PodStart(record, 4000, 4001, 3, "{}", '{"chief": ["127.0.0.1:4000"]}'))
    processes = {p.name: p for p in launch.processes}
    assert launch.main == "trainer" and launch.limits.memory_bytes == GIB
    trainer, agent = processes["trainer"], processes["agent"]
    assert trainer.argv[1:] == ("-m", "stride.trainer")
    assert agent.argv[1:] == ("-m", "stride.agent")
    assert agent.env["STRIDE_AGENT_POD_NAME"] == "job-1-chief-0"
    assert agent.env["STRIDE_AGENT_GRPC_PORT"] == "4001"
    assert trainer.env["STRIDE_TRAINER_AGENT_ADDRESS"] == "127.0.0.1:4001"
    assert trainer.env["STRIDE_TRAINER_CHECKPOINT_EVERY_STEPS"] == "7"
    assert trainer.env["STRIDE_TRAINER_CONSUMED_LOG"].endswith("jobs/job-1/consumed.jsonl")
    for process in launch.processes:
        assert "STRIDE_PODWATCHER_DATABASE_URL" not in process.env
        assert process.env["PATH"] == "/bin"


def test_each_pod_gets_a_job_token_for_itself_and_a_tls_folder_without_signing_keys(
    tmp_path: Path,
) -> None:
    """A pod's agent and trainer read a job token naming its (job, pod, role), signed by the
    pod watcher; it is rewritten for running pods and goes with the pod. The TLS folder pods
    are given holds only the agent's and the trainer's keys (not the podwatcher's or the
    users' key, which sign tokens)."""
    certificates = tmp_path / "tls"
    init(certificates)
    material = tls.load("podwatcher", {tls.TLS_DIR_ENV: str(certificates)})
    assert material is not None
    pod_tls = pod_tls_folder(certificates, tmp_path / "pod-tls")
    assert sorted(path.name for path in pod_tls.iterdir()) == [
        "agent.crt",
        "agent.key",
        "ca.crt",
        "trainer.crt",
        "trainer.key",
    ]
    environment = pod_environment(tmp_path)
    backend = LocalBackend(
        LocalPods(tmp_path / "pods", enforcement=Enforcement.RLIMIT),
        (NodeSpec("node-0", 2.0, GIB),),
        environment,
        base_environment={"STRIDE_TLS_DIR": str(pod_tls)},
        signer=Signer(material),
        tokens_dir=tmp_path / "tokens",
    )
    record = PodRecord(
        "job-1-worker-2", "job-1", Role.WORKER, 2, 0, 0.5, GIB, "node-0", PodPhase.PENDING
    )
    launch = backend.launch(PodStart(record, 4000, 4001, 3, "{}", "{}"))
    processes = {p.name: p for p in launch.processes}
    path = Path(processes["trainer"].env["STRIDE_JOB_TOKEN_FILE"])
    assert processes["agent"].env["STRIDE_AGENT_JOB_TOKEN_FILE"] == str(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "tokens").stat().st_mode & 0o777 == 0o700
    verifier = Verifier((certificates / "ca.crt").read_bytes())
    identity = verifier.verify(path.read_text().strip())
    assert isinstance(identity, JobIdentity)
    assert (identity.job_id, identity.pod, identity.role) == ("job-1", "job-1-worker-2", "worker")
    assert processes["trainer"].env["STRIDE_TLS_DIR"] == str(pod_tls)
    # The pod's own key, for its agent only, and bound by its token.
    key_path = Path(processes["agent"].env["STRIDE_AGENT_JOB_KEY_FILE"])
    assert "STRIDE_AGENT_JOB_KEY_FILE" not in processes["trainer"].env
    assert key_path.stat().st_mode & 0o777 == 0o600
    pod_key = read_pod_key(key_path)
    assert identity.key is not None
    assert identity.key.public_numbers() == pod_key.public_key().public_numbers()
    # Nothing runs in this test, so a refresh rewrites nothing; an issued token is rewritten
    # with a new id and binds the same key, and the pod's end takes both with it.
    assert asyncio.run(backend.refresh_tokens()) == 0
    first = path.read_text()
    backend.issue_token("job-1-worker-2", "job-1", "worker")
    assert path.read_text() != first
    again = verifier.verify(path.read_text().strip())
    assert isinstance(again, JobIdentity) and again.key is not None
    assert again.key.public_numbers() == pod_key.public_key().public_numbers()
    asyncio.run(backend.acknowledge("job-1-worker-2"))
    assert not path.exists() and not key_path.exists()


def test_without_tls_pods_get_no_token(tmp_path: Path) -> None:
    environment = pod_environment(tmp_path)
    backend = LocalBackend(
        LocalPods(tmp_path / "pods", enforcement=Enforcement.RLIMIT),
        (NodeSpec("node-0", 2.0, GIB),),
        environment,
        base_environment={"STRIDE_INSECURE": "1"},
    )
    record = PodRecord(
        "job-1-worker-0", "job-1", Role.WORKER, 0, 0, 0.5, GIB, "node-0", PodPhase.PENDING
    )
    launch = backend.launch(PodStart(record, 4000, 4001, 3, "{}", "{}"))
    for process in launch.processes:
        assert not any("TOKEN" in key for key in process.env)
