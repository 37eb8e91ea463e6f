"""Stride on Kubernetes, against a real API server (issue 38).

A real kube-apiserver (on kine), kube-controller-manager, kube-scheduler and kwok, built from
pinned Go modules (``make kube-tools``, :mod:`stride.testing.kube`). ``helm install`` puts
the chart in; the pod watcher then runs as the chart's Deployment says (its environment,
its ServiceAccount's token: exactly the chart's RBAC), outside the cluster since there is
no kubelet, twice (leader and standby), beside the other services on real NATS and
PostgreSQL. Users apply ``StrideJob``\\ s with ``kubectl``; kwok runs the pods.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.runtime.embedded_nats import NatsServer
from stride.testing.channels import aio_channel
from stride.testing.databases import create_database, drop_database
from stride.testing.eventually import assert_eventually
from stride.testing.kube import KubeCluster, KubectlError, ensure_kube_tools
from stride.testing.processes import SERVICES, ServiceProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "stride"
RELEASE, SYSTEM, TEAM = "stride", "stride-system", "team-a"
SPEC = yaml.safe_load((ROOT / "examples" / "wide-deep.yaml").read_text())
SPEC["model"]["image"] = "registry.example/team-a/wide-deep:1"  # its own image, no entrypoint
del SPEC["model"]["entrypoint"]
PODWATCHER_SERVICE = "stride.api.podwatcher.v1.PodWatcherService"
LOCAL = ("STRIDE_PODWATCHER_DISPATCHER_ADDRESS", "STRIDE_PODWATCHER_CKPTCACHE_ADDRESS")


def stridejob(name: str, **changes: Any) -> str:
    spec = {**SPEC, **changes}
    return json.dumps(
        {
            "apiVersion": "stride.io/v1alpha1",
            "kind": "StrideJob",
            "metadata": {"name": name, "namespace": TEAM},
            "spec": spec,
        }
    )


def sa_kubeconfig(cluster: KubeCluster, folder: Path) -> Path:
    """A kubeconfig of the chart's pod watcher ServiceAccount (a TokenRequest token)."""
    token = cluster.kubectl(
        "create", "token", f"{RELEASE}-podwatcher", "-n", SYSTEM, "--duration=2h"
    ).stdout.strip()
    path = folder / "podwatcher.kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": cluster.url,
                            "certificate-authority": str(cluster.ca_file),
                        },
                    }
                ],
                "users": [{"name": "podwatcher", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "podwatcher"}}],
                "current-context": "c",
            }
        )
    )
    return path


def chart_env(cluster: KubeCluster) -> dict[str, str]:
    """The pod watcher's environment as the installed Deployment has it (values only)."""
    deployment = cluster.get("deployment", f"{RELEASE}-podwatcher", "-n", SYSTEM)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    # In the cluster each pod has its own ports and the migration Jobs migrate: here two
    # pod watchers share a machine and the test's database is new.
    return {
        key: value
        for key, value in env.items()
        if not key.endswith(("_METRICS_PORT", "_AUTO_MIGRATE", "_GRPC_PORT"))
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ensure_kube_tools()
    folder = tmp_path_factory.mktemp("kube")
    nats = NatsServer().start()
    postgres_url = create_database()
    nats_url = nats.url
    cluster = KubeCluster(folder / "cluster", users=("alice", "bob")).start()
    processes: dict[str, ServiceProcess] = {}
    try:
        cluster.create_namespace(SYSTEM)
        cluster.create_namespace(TEAM)
        cluster.helm(
            "install", RELEASE, str(CHART), "-n", SYSTEM,
            "--set", "tls.enabled=false", "--set", "tls.insecure=true",
            "--set", "nats.url=nats://nats:4222", "--set", "nats.lockdown.enabled=false",
            "--no-hooks", "--wait=false",
        )  # fmt: skip
        # alice may run StrideJobs in team-a (the ClusterRole a platform team would bind).
        cluster.kubectl("create", "role", "stridejobs", "-n", TEAM,
                        "--verb=get,list,watch,create,delete",
                        "--resource=stridejobs.stride.io")  # fmt: skip
        cluster.kubectl("create", "rolebinding", "alice-stridejobs", "-n", TEAM,
                        "--role=stridejobs", "--user=alice")  # fmt: skip
        nodes = cluster.add_nodes(4, cpu="8", memory="32Gi")
        env = {
            **chart_env(cluster),
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": postgres_url,
            "STRIDE_PODWATCHER_KUBE_CONFIG": str(sa_kubeconfig(cluster, folder)),
            "STRIDE_PODWATCHER_LEASE_SECONDS": "4",
            "STRIDE_PODWATCHER_INVENTORY_INTERVAL_SECONDS": "2",
            "STRIDE_PODWATCHER_OOM_REPLAN_SECONDS": "60",
            "STRIDE_OPTIMIZER_ACK_WAIT_SECONDS": "3",
            # The four kwok nodes, until the pod watcher's inventory of them arrives.
            "STRIDE_ADMISSION_CLUSTER_CPU": "32",
            "STRIDE_ADMISSION_CLUSTER_MEMORY_GIB": "128",
        }
        env.pop("STRIDE_INSECURE", None)  # the test suite's own TLS
        for name in SERVICES:
            if name in ("agent", "podwatcher"):
                continue
            processes[name] = ServiceProcess(name, env, folder)
        env["STRIDE_PODWATCHER_ADMISSION_ADDRESS"] = processes["admission"].address
        for key in LOCAL:
            env[key] = "127.0.0.1:1"
        processes["podwatcher"] = ServiceProcess("podwatcher", env, folder)
        standby = ServiceProcess("podwatcher", env, folder)
        standby.log_path = folder / "podwatcher-standby.log"
        processes["standby"] = standby
        for process in processes.values():
            process.start()
        yield {"cluster": cluster, "processes": processes, "nodes": nodes, "folder": folder}
    finally:
        for name, process in processes.items():
            process.terminate()
            if name in ("podwatcher", "standby", "admission"):
                print(f"--- {name} log ---\n{process.log_text()[-4000:]}")
        cluster.stop()
        nats.stop()
        drop_database(postgres_url)


def job_pods(cluster: KubeCluster, job_id: str) -> list[dict[str, Any]]:
    return list(cluster.get("pods", "-n", TEAM, "-l", f"stride.io/job={job_id}")["items"])


def status_of(cluster: KubeCluster, name: str) -> dict[str, Any]:
    return dict(cluster.get("stridejob", name, "-n", TEAM).get("status") or {})


async def running_job(cluster: KubeCluster, name: str) -> str:
    await assert_eventually(
        lambda: status_of(cluster, name).get("phase") == "Running",
        timeout=120,
        interval=0.5,
        message=f"StrideJob {name} running",
    )
    job_id = str(status_of(cluster, name)["jobId"])
    await assert_eventually(
        lambda: (
            (pods := job_pods(cluster, job_id))
            # Every role of plan 1 made (the pod watcher creates them one pass at a time)...
            and {p["metadata"]["labels"]["stride.io/role"] for p in pods}
            >= {"chief", "ps", "worker"}
            # ...and running.
            and all(p["status"].get("phase") == "Running" for p in pods)
        ),
        timeout=120,
        interval=0.5,
        message=f"pods of {job_id} running on kwok nodes",
    )
    return job_id


async def test_a_stridejob_applied_by_its_namespaces_user_runs_on_the_cluster(
    stack: dict[str, Any],
) -> None:
    cluster: KubeCluster = stack["cluster"]
    cluster.kubectl("apply", "-f", "-", input=stridejob("wide-deep"), user="alice")
    job_id = await running_job(cluster, "wide-deep")
    status = status_of(cluster, "wide-deep")
    assert status["planVersion"] >= 1
    admitted = next(c for c in status["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True"
    pods = job_pods(cluster, job_id)
    owner = cluster.get("stridejob", "wide-deep", "-n", TEAM)["metadata"]["uid"]
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeName"] in stack["nodes"]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == owner
        assert spec["securityContext"]["runAsNonRoot"] is True
        trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
        assert trainer["image"] == SPEC["model"]["image"]
        assert trainer["securityContext"]["readOnlyRootFilesystem"] is True
        assert trainer["resources"]["requests"] == trainer["resources"]["limits"]
        assert spec["subdomain"] == job_id and spec["hostname"] == pod["metadata"]["name"]
    service = cluster.get("service", job_id, "-n", TEAM)
    assert service["spec"]["clusterIP"] == "None"
    policy = cluster.get("networkpolicy", f"{job_id}-tensorflow", "-n", TEAM)
    assert policy["spec"]["podSelector"]["matchLabels"]["stride.io/job"] == job_id
    # The TensorFlow cluster addresses are the pods' DNS names through the Service.
    chief = next(p for p in pods if p["metadata"]["labels"]["stride.io/role"] == "chief")
    env = {e["name"]: e["value"] for e in chief["spec"]["containers"][1]["env"]}
    cluster_spec = json.loads(env["STRIDE_TRAINER_CLUSTER_JSON"])
    assert all(f".{job_id}.{TEAM}.svc.cluster.local:" in a for a in cluster_spec["ps"])
    table = cluster.kubectl("get", "stridejobs", "-n", TEAM, user="alice").stdout
    assert table.split()[:8] == [
        "NAME",
        "JOB",
        "PHASE",
        "PLAN",
        "READY",
        "PODS",
        "DONE%",
        "DEADLINE",
    ]
    assert job_id in table and "Running" in table


async def test_the_pod_watchers_account_may_do_what_it_uses_and_nothing_more(
    stack: dict[str, Any],
) -> None:
    """The chart's RBAC, asked of the real API server as the pod watcher's ServiceAccount."""
    cluster: KubeCluster = stack["cluster"]
    config = str(stack["folder"] / "podwatcher.kubeconfig")

    def can(*args: str) -> bool:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", config, "auth", "can-i", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip() == "yes"

    allowed = [
        ("create", "pods", "-n", TEAM),
        ("delete", "pods", "-n", TEAM),
        ("patch", "pods", "--subresource=resize", "-n", TEAM),
        ("create", "pods", "--subresource=eviction", "-n", TEAM),
        ("create", "services", "-n", TEAM),
        ("create", "networkpolicies.networking.k8s.io", "-n", TEAM),
        ("patch", "nodes"),
        ("watch", "stridejobs.stride.io", "--all-namespaces"),
        ("patch", "stridejobs.stride.io", "--subresource=status", "-n", TEAM),
        ("update", "leases.coordination.k8s.io", "-n", SYSTEM),
    ]
    refused = [
        ("get", "pods", "-n", TEAM),
        ("patch", "pods", "-n", TEAM),
        ("create", "pods", "--subresource=exec", "-n", TEAM),
        ("get", "configmaps", "-n", TEAM),
        ("delete", "nodes"),
        ("delete", "services", "-n", TEAM),
        ("create", "stridejobs.stride.io", "-n", TEAM),
        ("update", "leases.coordination.k8s.io", "-n", TEAM),
        ("create", "deployments.apps", "-n", SYSTEM),
        ("create", "rolebindings.rbac.authorization.k8s.io", "-n", TEAM),
    ]
    assert [a for a in allowed if not can(*a)] == []
    assert [r for r in refused if can(*r)] == []
    assert cluster.get("lease", f"{RELEASE}-podwatcher", "-n", SYSTEM)["spec"]["holderIdentity"]


async def test_a_user_without_rbac_in_the_namespace_cannot_submit(stack: dict[str, Any]) -> None:
    cluster: KubeCluster = stack["cluster"]
    with pytest.raises(KubectlError) as refused:
        cluster.kubectl("apply", "-f", "-", input=stridejob("bobs"), user="bob")
    assert "forbidden" in refused.value.stderr.lower()
    assert "bob" in refused.value.stderr


async def test_bad_specs_are_refused_naming_the_field(stack: dict[str, Any]) -> None:
    cluster: KubeCluster = stack["cluster"]
    with pytest.raises(KubectlError) as refused:
        cluster.kubectl("apply", "-f", "-", input=stridejob("wide", workers=4), user="alice")
    assert "workers" in refused.value.stderr  # the schema: Stride chooses resources
    cluster.kubectl("apply", "-f", "-", input=stridejob("zero", batch_size=0), user="alice")
    await assert_eventually(
        lambda: status_of(cluster, "zero").get("phase") == "Invalid",
        timeout=60,
        message="an invalid spec's StrideJob is Invalid",
    )
    assert "batch_size" in status_of(cluster, "zero")["message"]
    assert "jobId" not in status_of(cluster, "zero")


async def test_an_oom_killed_pod_gets_a_bigger_plan_and_a_replacement(
    stack: dict[str, Any],
) -> None:
    cluster: KubeCluster = stack["cluster"]
    job_id = str(status_of(cluster, "wide-deep")["jobId"])
    worker = next(
        p
        for p in job_pods(cluster, job_id)
        if p["metadata"]["labels"]["stride.io/role"] == "worker"
    )
    name = worker["metadata"]["name"]
    memory = int(next(c for c in worker["spec"]["containers"] if c["name"] == "trainer")[
        "resources"]["limits"]["memory"])  # fmt: skip
    version = status_of(cluster, "wide-deep")["planVersion"]
    # kwok leaves a pod's status alone once it is annotated so, as a kubelet would report
    # a container the kernel killed.
    cluster.kubectl("annotate", "pod", name, "-n", TEAM, "kwok.x-k8s.io/status=custom")
    oom = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "ready": False,
                    "restartCount": 0,
                    "image": "x",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
                }
            ],
        }
    }
    cluster.kubectl("patch", "pod", name, "-n", TEAM, "--subresource=status",
                    "--type=merge", "-p", json.dumps(oom))  # fmt: skip

    def replaced() -> bool:
        pods = {p["metadata"]["name"]: p for p in job_pods(cluster, job_id)}
        pod = pods.get(name)
        if pod is None or pod["status"].get("phase") != "Running":
            return False
        trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
        return int(trainer["resources"]["limits"]["memory"]) > memory

    await assert_eventually(replaced, timeout=120, interval=0.5, message="bigger replacement")
    assert status_of(cluster, "wide-deep")["planVersion"] > version


async def test_deleted_pods_are_relaunched_and_a_standby_takes_over_without_duplicates(
    stack: dict[str, Any],
) -> None:
    cluster: KubeCluster = stack["cluster"]
    processes: dict[str, ServiceProcess] = stack["processes"]
    job_id = str(status_of(cluster, "wide-deep")["jobId"])
    before = sorted(p["metadata"]["name"] for p in job_pods(cluster, job_id))
    uids = {p["metadata"]["uid"] for p in job_pods(cluster, job_id)}
    cluster.kubectl("delete", "pods", "-n", TEAM, "-l", f"stride.io/job={job_id}", "--wait=false")

    def relaunched() -> bool:
        pods = job_pods(cluster, job_id)
        return (
            sorted(p["metadata"]["name"] for p in pods) == before
            and not uids & {p["metadata"]["uid"] for p in pods}
            and all(p["status"].get("phase") == "Running" for p in pods)
        )

    await assert_eventually(relaunched, timeout=120, interval=0.5, message="pods relaunched")
    lease = cluster.get("lease", f"{RELEASE}-podwatcher", "-n", SYSTEM)
    leader = lease["spec"]["holderIdentity"]
    active, standby = processes["podwatcher"], processes["standby"]
    if standby.process is not None and leader.endswith(f"-{standby.process.pid}"):
        active, standby = standby, active
    # The standby waits alive but not ready: its probes neither restart it nor route to it.
    async with aio_channel(standby.address, "podwatcher") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        alive = await health.Check(health_pb2.HealthCheckRequest(service=""))
        ready = await health.Check(health_pb2.HealthCheckRequest(service=PODWATCHER_SERVICE))
    assert alive.status == health_pb2.HealthCheckResponse.SERVING
    assert ready.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert active.process is not None
    active.process.send_signal(signal.SIGKILL)
    active.process.wait()

    def taken_over() -> bool:
        holder = cluster.get("lease", f"{RELEASE}-podwatcher", "-n", SYSTEM)["spec"]
        return bool(holder.get("holderIdentity")) and holder["holderIdentity"] != leader

    await assert_eventually(taken_over, timeout=60, interval=0.5, message="standby leads")
    victim = before[-1]
    cluster.kubectl("delete", "pod", victim, "-n", TEAM, "--wait=false")
    await assert_eventually(relaunched_one(cluster, job_id, victim), timeout=90, interval=0.5)
    names = [p["metadata"]["name"] for p in job_pods(cluster, job_id)]
    assert sorted(names) == before and len(names) == len(set(names))
    active.start()  # back as the standby


def relaunched_one(cluster: KubeCluster, job_id: str, name: str) -> Any:
    first = {p["metadata"]["name"]: p["metadata"]["uid"] for p in job_pods(cluster, job_id)}

    def check() -> bool:
        pods = {p["metadata"]["name"]: p for p in job_pods(cluster, job_id)}
        pod = pods.get(name)
        return (
            pod is not None
            and pod["metadata"]["uid"] != first.get(name)
            and pod["status"].get("phase") == "Running"
        )

    return check


async def test_a_cordoned_node_is_drained_its_pods_move_to_other_nodes(
    stack: dict[str, Any],
) -> None:
    cluster: KubeCluster = stack["cluster"]
    job_id = str(status_of(cluster, "wide-deep")["jobId"])
    pods = job_pods(cluster, job_id)
    node = pods[0]["spec"]["nodeName"]
    moving = sorted(p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == node)
    cluster.kubectl("cordon", node)
    try:

        def moved() -> bool:
            now = {p["metadata"]["name"]: p for p in job_pods(cluster, job_id)}
            return all(
                name in now
                and now[name]["spec"]["nodeName"] != node
                and now[name]["status"].get("phase") == "Running"
                for name in moving
            )

        await assert_eventually(moved, timeout=120, interval=0.5, message=f"pods off {node}")
        assert all(p["spec"]["nodeName"] != node for p in job_pods(cluster, job_id))
    finally:
        cluster.kubectl("uncordon", node)


async def test_deleting_the_stridejob_cancels_it_and_removes_its_pods(
    stack: dict[str, Any],
) -> None:
    cluster: KubeCluster = stack["cluster"]
    job_id = str(status_of(cluster, "wide-deep")["jobId"])
    cluster.kubectl("delete", "stridejob", "wide-deep", "-n", TEAM, user="alice", timeout=90)
    await assert_eventually(
        lambda: not job_pods(cluster, job_id), timeout=90, interval=0.5, message="pods removed"
    )
    assert cluster.get("stridejobs", "-n", TEAM)["items"] == [
        item
        for item in cluster.get("stridejobs", "-n", TEAM)["items"]
        if item["metadata"]["name"] != "wide-deep"
    ]
