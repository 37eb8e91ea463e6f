"""The Kubernetes backend against a real API server (kine, kube-apiserver, controller
manager, scheduler, kwok: :mod:`stride.testing.kube`), each failure reason as Kubernetes
reports it, the pod's objects, tokens, resizes and drains."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from stride.podwatcher.adapters.outbound.backends.base import PodEnded, PodStart, ResizeRefused
from stride.podwatcher.adapters.outbound.backends.kubernetes.api import close_client
from stride.podwatcher.adapters.outbound.backends.kubernetes.backend import KubernetesBackend
from stride.podwatcher.adapters.outbound.backends.kubernetes.informer import Informer
from stride.podwatcher.adapters.outbound.backends.kubernetes.manifests import Owner, PodTemplate
from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.domain.reconcile import PodRecord
from stride.podwatcher.operator import api_client
from stride.podwatcher.settings import PodWatcherSettings
from stride.runtime import tls
from stride.runtime.tokens import JobIdentity, Signer, Verifier
from stride.testing.eventually import assert_eventually
from stride.testing.kube import KubeCluster
from stride.vocabulary import Role

pytestmark = [pytest.mark.timeout(300)]

GIB = 1024**3
TEMPLATE = PodTemplate(
    trainer_image="stride/trainer:test",
    agent_image="stride/agent:test",
    nats_url="nats://nats:4222",
    dispatcher_address="dispatcher:50055",
    ckptcache_address="ckptcache:50056",
    labels={"app.kubernetes.io/instance": "test"},
)


@pytest.fixture(scope="module")
def nodes(kube_cluster: KubeCluster) -> list[str]:
    kube_cluster.create_namespace("backend")
    return kube_cluster.add_nodes(3, cpu="4", memory="16Gi", prefix="backend-node")


@pytest.fixture
async def backend(kube_cluster: KubeCluster, nodes: list[str]) -> AsyncIterator[KubernetesBackend]:
    settings = PodWatcherSettings(backend="kubernetes", kube_config=kube_cluster.kubeconfig())
    material = tls.load("podwatcher")
    assert material is not None  # the test run's certificates
    made = KubernetesBackend(
        await api_client(settings),
        TEMPLATE,
        namespace="backend",
        signer=Signer(material),
        node_selector="type=kwok",
    )
    await made.open()
    try:
        yield made
    finally:
        await made.close()


def start(job: str, index: int, node: str, role: Role = Role.WORKER) -> PodStart:
    name = f"{job}-{role.value.replace('_', '-')}-{index}"
    record = PodRecord(name, job, role, index, 0, 0.5, GIB, node, PodPhase.PENDING)
    spec = json.dumps({"user": "someone", "model": {"name": "m"}})
    return PodStart(record, 7000 + index, 8000 + index, 1, spec, '{"ps": [], "worker": []}')


async def next_end(backend: KubernetesBackend, name: str) -> PodEnded:
    async def find() -> PodEnded:
        async for end in backend.ended():
            if end.name == name:
                return end
        raise AssertionError("ended() stopped")

    return await asyncio.wait_for(find(), 60)


async def running(kube: KubeCluster, name: str) -> None:
    await assert_eventually(
        lambda: kube.get("pod", name, "-n", "backend")["status"].get("phase") == "Running",
        timeout=60,
        interval=0.3,
        message=f"{name} running",
    )


def mark(kube: KubeCluster, name: str, status: dict[str, Any]) -> None:
    """Write a pod's status as a kubelet would (kwok leaves annotated pods alone)."""
    kube.kubectl("annotate", "pod", name, "-n", "backend", "kwok.x-k8s.io/status=custom")
    kube.kubectl("patch", "pod", name, "-n", "backend", "--subresource=status", "--type=merge",
                 "-p", json.dumps({"status": status}))  # fmt: skip


async def test_a_pod_runs_with_its_objects_token_and_address(
    backend: KubernetesBackend, kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    await backend.start(start("job-objects", 0, nodes[0]))
    await running(kube_cluster, "job-objects-worker-0")
    pod = kube_cluster.get("pod", "job-objects-worker-0", "-n", "backend")
    assert pod["spec"]["nodeName"] == nodes[0] and pod["spec"]["restartPolicy"] == "Never"
    trainer = next(c for c in pod["spec"]["containers"] if c["name"] == "trainer")
    assert trainer["resources"]["limits"] == {"cpu": "500m", "memory": str(GIB)}
    assert trainer["image"] == TEMPLATE.trainer_image
    assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "test"
    secret = kube_cluster.get("secret", "job-objects-worker-0-token", "-n", "backend")
    token = base64.b64decode(secret["data"]["token"]).decode()
    certificates = Path(os.environ[tls.TLS_DIR_ENV])
    identity = Verifier((certificates / "ca.crt").read_bytes()).verify(token)
    assert isinstance(identity, JobIdentity)
    assert (identity.job_id, identity.pod) == ("job-objects", "job-objects-worker-0")
    assert (
        kube_cluster.get("service", "job-objects", "-n", "backend")["spec"]["clusterIP"] == "None"
    )
    assert backend.address("job-objects-worker-0", "job-objects", 7000) == (
        "job-objects-worker-0.job-objects.backend.svc.cluster.local:7000"
    )
    assert await backend.wait_ready([start("job-objects", 0, nodes[0])], 30)
    assert "job-objects-worker-0" in backend.running()
    # Starting it again while it runs leaves it as it is.
    uid = pod["metadata"]["uid"]
    await backend.start(start("job-objects", 0, nodes[0]))
    assert (
        kube_cluster.get("pod", "job-objects-worker-0", "-n", "backend")["metadata"]["uid"] == uid
    )
    assert await backend.refresh_tokens() >= 1


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (
            "OOMKilled",
            {"phase": "Failed", "containerStatuses": [{"name": "trainer", "ready": False,
             "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]},
        ),
        (
            "Preempted",
            {"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True",
             "reason": "PreemptionByScheduler", "message": "preempted by team-b/big"}]},
        ),
        (
            "ImagePullBackOff",
            {"containerStatuses": [{"name": "trainer", "ready": False, "restartCount": 0,
             "image": "x", "imageID": "", "state": {"waiting": {"reason": "ImagePullBackOff",
             "message": "Back-off pulling image \"nope\""}}}]},
        ),
        (
            "CrashLoopBackOff",
            {"containerStatuses": [{"name": "trainer", "ready": False, "restartCount": 5,
             "image": "x", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff",
             "message": "back-off 5m0s restarting failed container"}}}]},
        ),
        (
            "Error",
            {"phase": "Failed", "containerStatuses": [{"name": "trainer", "ready": False,
             "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 3, "reason": "Error"}}}]},
        ),
    ],
)  # fmt: skip
async def test_each_failure_is_named_from_the_pods_status_and_the_name_is_reusable(
    backend: KubernetesBackend,
    kube_cluster: KubeCluster,
    nodes: list[str],
    reason: str,
    status: dict[str, Any],
) -> None:
    job = f"job-{reason.lower()}"
    pod = start(job, 1, nodes[1])
    await backend.start(pod)
    await running(kube_cluster, pod.record.name)
    mark(kube_cluster, pod.record.name, status)
    end = await next_end(backend, pod.record.name)
    assert (end.reason, end.job_id) == (reason, job)
    if reason == "OOMKilled":
        assert end.exit_code == 137
    if reason == "Preempted":
        assert "team-b/big" in end.message
    if reason == "Error":
        assert end.exit_code == 3
    assert pod.record.name in backend.known() and pod.record.name not in backend.running()
    # Acknowledged, the pod and its token leave the API.
    await backend.acknowledge(pod.record.name)

    def gone() -> bool:
        left = (
            kube_cluster.kubectl(
                "get",
                "pod,secret",
                "-n",
                "backend",
                "-o",
                "name",
                "--field-selector",
                f"metadata.name={pod.record.name}",
                check=False,
            ).stdout
            + kube_cluster.kubectl(
                "get",
                "secret",
                f"{pod.record.name}-token",
                "-n",
                "backend",
                "-o",
                "name",
                check=False,
            ).stdout
        )
        return not left.strip()

    await assert_eventually(gone, timeout=60, interval=0.3, message="pod and token removed")
    assert pod.record.name not in backend.known()


async def test_deleted_by_the_pod_watcher_evicted_and_deleted_from_outside_are_told_apart(
    backend: KubernetesBackend, kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    ours, evicted, theirs = (start("job-ends", i, nodes[2]) for i in range(3))
    for pod in (ours, evicted, theirs):
        await backend.start(pod)
    for pod in (ours, evicted, theirs):
        await running(kube_cluster, pod.record.name)
    await backend.delete(ours.record.name)
    assert (await next_end(backend, ours.record.name)).reason == "Deleted"
    await backend.evict(evicted.record.name, "node maintenance")
    end = await next_end(backend, evicted.record.name)
    assert (end.reason, end.message) == ("Evicted", "node maintenance")
    first = kube_cluster.get("pod", theirs.record.name, "-n", "backend")["metadata"]["uid"]
    kube_cluster.kubectl("delete", "pod", theirs.record.name, "-n", "backend", "--wait=false")
    end = await next_end(backend, theirs.record.name)
    assert end.reason == "Error" and "outside Stride" in end.message
    # Acknowledged, it is relaunched under its own name (a new pod, the same address).
    await backend.acknowledge(theirs.record.name)
    await backend.start(theirs)

    def relaunched() -> bool:
        found = kube_cluster.get("pods", "-n", "backend", "--field-selector",
                                 f"metadata.name={theirs.record.name}")["items"]  # fmt: skip
        return (
            bool(found)
            and found[0]["metadata"]["uid"] != first
            and (found[0]["status"].get("phase") == "Running")
        )

    await assert_eventually(relaunched, timeout=60, interval=0.3, message="relaunched")


async def test_resize_goes_through_the_resize_subresource(
    backend: KubernetesBackend, kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    pod = start("job-resize", 0, nodes[0])
    await backend.start(pod)
    await running(kube_cluster, pod.record.name)
    await backend.resize(pod.record.name, 1.5, 2 * GIB)
    spec = kube_cluster.get("pod", pod.record.name, "-n", "backend")["spec"]
    trainer = next(c for c in spec["containers"] if c["name"] == "trainer")
    assert trainer["resources"]["limits"] == {"cpu": "1500m", "memory": str(2 * GIB)}
    # kwok plays the kubelet's part: the new size reaches the pod's status.
    await assert_eventually(
        lambda: (
            next(
                c
                for c in kube_cluster.get("pod", pod.record.name, "-n", "backend")["status"][
                    "containerStatuses"
                ]
                if c["name"] == "trainer"
            )["resources"]["limits"]["cpu"]
            == "1500m"
        ),
        timeout=30,
        message="resized in status",
    )
    with pytest.raises(ResizeRefused, match="not running"):
        await backend.resize("job-resize-worker-9", 1.0, GIB)


async def test_nodes_come_from_the_cluster_and_a_cordon_drains_one(
    backend: KubernetesBackend, kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    specs = {spec.name: (spec, drained) for spec, drained in backend.all_nodes()}
    assert set(nodes) <= set(specs)
    spec, drained = specs[nodes[0]]
    assert (spec.cpu, spec.memory_bytes, drained) == (4.0, 16 * GIB, False)
    pod = start("job-drain", 0, nodes[0])
    await backend.start(pod)
    await running(kube_cluster, pod.record.name)
    assert backend.set_drained(nodes[0], True)
    assert not backend.set_drained("no-such-node", True)
    end = await next_end(backend, pod.record.name)
    assert end.reason == "Evicted" and nodes[0] in end.message
    await assert_eventually(
        lambda: kube_cluster.get("node", nodes[0])["spec"].get("unschedulable") is True,
        timeout=30,
        message="cordoned",
    )
    assert nodes[0] not in {node.name for node in backend.nodes()}
    backend.set_drained(nodes[0], False)
    await assert_eventually(
        lambda: nodes[0] in {node.name for node in backend.nodes()},
        timeout=30,
        message="uncordoned",
    )
    # A taint that keeps new pods off drains the node for placement (pods stay).
    kube_cluster.kubectl("taint", "node", nodes[1], "dedicated=other:NoSchedule")
    try:
        await assert_eventually(
            lambda: nodes[1] not in {node.name for node in backend.nodes()},
            timeout=30,
            message="tainted node left out",
        )
    finally:
        kube_cluster.kubectl("taint", "node", nodes[1], "dedicated=other:NoSchedule-")


async def test_a_stridejobs_pods_run_in_its_namespace_and_belong_to_it(
    backend: KubernetesBackend, kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    kube_cluster.create_namespace("team-z")
    owner_map = {"job-owned": Owner("owned", "7c1e2a9e-0000-4000-8000-000000000001", "team-z")}
    backend.owners = owner_map.get
    pod = start("job-owned", 0, nodes[2])
    await backend.start(pod)
    found = kube_cluster.get("pod", pod.record.name, "-n", "team-z")
    assert found["metadata"]["ownerReferences"][0]["name"] == "owned"
    assert backend.address(pod.record.name, "job-owned", 1) == (
        "job-owned-worker-0.job-owned.team-z.svc.cluster.local:1"
    )


async def test_the_informer_lists_again_when_its_version_is_compacted_away(
    tmp_path: Path,
) -> None:
    """Resuming a watch from a version the store compacted away is ``410 Gone``: the
    informer lists again and reports what changed meanwhile, nothing lost or doubled."""
    with KubeCluster(tmp_path, controller_manager=False, scheduler=False, compaction=1) as kube:
        kube.create_namespace("gone")
        settings = PodWatcherSettings(backend="kubernetes", kube_config=kube.kubeconfig())
        api = await api_client(settings)
        try:
            core = client.CoreV1Api(api)
            seen: list[tuple[str, str]] = []

            async def lister(**options: Any) -> Any:
                return await core.list_namespaced_config_map("gone", **options)

            informer = Informer(
                "configmaps",
                lister,
                lambda kind, item: seen.append((kind, item["metadata"]["name"])),
            )

            def configmap(name: str) -> str:
                meta = {"name": name, "namespace": "gone"}
                return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})

            kube.kubectl("create", "-f", "-", input=configmap("before"))
            await informer.list()
            assert seen == [("ADDED", "before")]
            # While it does not watch (a partition, say), the store moves on and compacts.
            kube.kubectl("create", "-f", "-", input=configmap("during"))
            kube.kubectl("delete", "configmap", "before", "-n", "gone")
            await asyncio.sleep(3)
            stop = asyncio.Event()
            task = asyncio.create_task(informer.run(stop))
            await assert_eventually(lambda: informer.relists == 1, timeout=30, message="410")
            await assert_eventually(
                lambda: sorted(seen[1:]) == [("ADDED", "during"), ("DELETED", "before")],
                timeout=30,
                message="the changes meanwhile",
            )
            assert set(informer.objects) == {"gone/during"}
            kube.kubectl("create", "-f", "-", input=configmap("after"))
            await assert_eventually(
                lambda: ("ADDED", "after") in seen, timeout=30, message="watching again"
            )
            stop.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            await close_client(api)
