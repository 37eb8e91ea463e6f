"""The Kubernetes test harness (:mod:`stride.testing.kube`) against its real servers.

What later tests of the pod watcher and the Helm chart rely on: RBAC refuses what a role
does not grant, pods on kwok nodes run and go away, the scheduler and the Deployment
controllers work, owner references cascade, service-account tokens are accepted, and the
``resize`` subresource takes a CPU change. Each test keeps to a namespace of its own on the
module's cluster.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from stride.testing.kube import KubeCluster, KubeToolsMissing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WAIT = "--timeout=60s"
"""What ``kubectl wait`` allows: kwok and the controllers answer within a second or two, the
rest is room for a loaded 2-core machine."""
IMAGE = "registry.invalid/stride/none:1"
"""Never pulled: kwok only plays the pods' statuses."""


def pod(name: str, node: str | None = None, resources: Any = None) -> dict[str, Any]:
    """A pod with one container ``main``, bound to ``node`` if given."""
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if resources is not None:
        container["resources"] = resources
    spec: dict[str, Any] = {"containers": [container]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(
    cluster: KubeCluster, namespace: str, manifest: dict[str, Any], user: str = "admin"
) -> subprocess.CompletedProcess[str]:
    """``kubectl create`` the manifest as ``user``, returning kubectl's result unchecked."""
    return cluster.kubectl(
        "create", "-n", namespace, "-f", "-", user=user, input=json.dumps(manifest), check=False
    )


def wait(cluster: KubeCluster, namespace: str, condition: str, target: str) -> None:
    """``kubectl wait --for=<condition> <target>``; fails the test if it times out."""
    cluster.kubectl("wait", "-n", namespace, f"--for={condition}", target, WAIT)


@pytest.fixture(scope="module")
def nodes(kube_cluster: KubeCluster) -> list[str]:
    """Two Ready kwok nodes."""
    return kube_cluster.add_nodes(2, cpu="8", memory="32Gi")


def test_a_role_lets_alice_create_pods_and_bob_is_forbidden(kube_cluster: KubeCluster) -> None:
    namespace = kube_cluster.create_namespace("rbac")
    kube_cluster.kubectl(
        "create", "role", "maker", "--verb=create", "--resource=pods", "-n", namespace
    )
    kube_cluster.kubectl(
        "create", "rolebinding", "alice", "--role=maker", "--user=alice", "-n", namespace
    )

    by_alice = create(kube_cluster, namespace, pod("by-alice"), user="alice")
    by_bob = create(kube_cluster, namespace, pod("by-bob"), user="bob")

    assert by_alice.returncode == 0, by_alice.stderr
    assert by_bob.returncode != 0
    assert "(Forbidden)" in by_bob.stderr
    assert 'User "bob" cannot create resource "pods"' in by_bob.stderr
    assert [
        item["metadata"]["name"] for item in kube_cluster.get("pods", "-n", namespace)["items"]
    ] == ["by-alice"]


def test_a_pod_on_a_kwok_node_runs_with_an_ip_and_its_deletion_finishes(
    kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("running")
    create(kube_cluster, namespace, pod("runner", node=nodes[0]))

    wait(kube_cluster, namespace, "jsonpath={.status.phase}=Running", "pod/runner")
    status = kube_cluster.get("pod", "runner", "-n", namespace)["status"]
    assert status["podIP"]
    assert status["hostIP"]
    assert status["containerStatuses"][0]["ready"] is True

    kube_cluster.kubectl("delete", "pod", "runner", "-n", namespace, WAIT)
    assert kube_cluster.get("pods", "-n", namespace)["items"] == []


def test_kwok_leaves_the_status_of_a_pod_annotated_custom_alone(
    kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("custom")
    custom = pod("custom", node=nodes[0])
    custom["metadata"]["annotations"] = {"kwok.x-k8s.io/status": "custom"}
    create(kube_cluster, namespace, custom)
    create(kube_cluster, namespace, pod("played", node=nodes[0]))

    wait(kube_cluster, namespace, "jsonpath={.status.phase}=Running", "pod/played")

    status = kube_cluster.get("pod", "custom", "-n", namespace)["status"]
    assert status["phase"] == "Pending"
    assert "podIP" not in status


def test_the_scheduler_places_a_deployments_pods_on_kwok_nodes(
    kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("deployment")
    kube_cluster.kubectl(
        "create", "deployment", "web", f"--image={IMAGE}", "--replicas=3", "-n", namespace
    )

    wait(kube_cluster, namespace, "condition=Available", "deployment/web")

    pods = kube_cluster.get("pods", "-n", namespace, "-l", "app=web")["items"]
    assert len(pods) == 3
    assert {item["spec"]["nodeName"] for item in pods} <= set(nodes)
    assert {item["status"]["phase"] for item in pods} == {"Running"}


def test_the_garbage_collector_deletes_a_pod_whose_owner_is_deleted(
    kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("owners")
    kube_cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    uid = kube_cluster.get("configmap", "owner", "-n", namespace)["metadata"]["uid"]
    owned = pod("owned", node=nodes[1])
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
    ]
    create(kube_cluster, namespace, owned)
    wait(kube_cluster, namespace, "jsonpath={.status.phase}=Running", "pod/owned")

    kube_cluster.kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=background")

    wait(kube_cluster, namespace, "delete", "pod/owned")


def test_a_service_account_token_is_accepted(kube_cluster: KubeCluster) -> None:
    namespace = kube_cluster.create_namespace("tokens")
    kube_cluster.kubectl("create", "serviceaccount", "robot", "-n", namespace)

    token = kube_cluster.kubectl("create", "token", "robot", "-n", namespace).stdout.strip()
    who = kube_cluster.kubectl("auth", "whoami", f"--token={token}", "-o", "json").stdout

    assert json.loads(who)["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{namespace}:robot"
    )


def test_the_resize_subresource_takes_a_cpu_change(
    kube_cluster: KubeCluster, nodes: list[str]
) -> None:
    namespace = kube_cluster.create_namespace("resize")
    resources = {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "200m", "memory": "64Mi"},
    }
    create(kube_cluster, namespace, pod("elastic", node=nodes[0], resources=resources))
    wait(kube_cluster, namespace, "jsonpath={.status.phase}=Running", "pod/elastic")
    cpu = {"requests": {"cpu": "150m"}, "limits": {"cpu": "300m"}}

    kube_cluster.kubectl(
        "patch", "pod", "elastic", "-n", namespace, "--subresource=resize",
        f"--patch={json.dumps({'spec': {'containers': [{'name': 'main', 'resources': cpu}]}})}",
    )  # fmt: skip

    stored = kube_cluster.get("pod", "elastic", "-n", namespace)["spec"]["containers"][0]
    assert stored["resources"]["requests"] == {"cpu": "150m", "memory": "64Mi"}
    assert stored["resources"]["limits"] == {"cpu": "300m", "memory": "64Mi"}
    # kwok's pod-resize stage (stride/testing/kwok_stages.yaml) plays the kubelet's part.
    wait(
        kube_cluster,
        namespace,
        "jsonpath={.status.containerStatuses[0].resources.requests.cpu}=150m",
        "pod/elastic",
    )


def test_a_missing_binary_names_itself_and_the_make_target(tmp_path: Path) -> None:
    cluster = KubeCluster(tmp_path / "cluster", bin_dir=tmp_path / "empty")

    with pytest.raises(KubeToolsMissing, match=r"kine is not built .*`make kube-tools`"):
        cluster.start()
