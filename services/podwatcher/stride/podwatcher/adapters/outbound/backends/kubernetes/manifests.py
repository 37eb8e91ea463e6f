"""The objects the Kubernetes backend creates for a job: its pods, its headless Service,
each pod's token Secret and the job's NetworkPolicy (plain dicts, as the API takes them).

A pod is a replica of the plan: the trainer (the job's own image, ``spec.model.image``, or
Stride's trainer image) and the agent sidecar, with the plan's CPU and memory as requests
and limits (so it is Guaranteed, and ``pods/resize`` changes both in place) and GPUs as
``nvidia.com/gpu``. Stride places pods itself (KOD2, :mod:`stride.podwatcher.domain.
reconcile`), so a pod names its node (``spec.nodeName``) and skips the scheduler, as
DLRover's operator does for a relaunch. Pods are never restarted by the kubelet
(``restartPolicy: Never``): a failed pod is relaunched by the pod watcher, under its relaunch
budget. They run as a non-root user on a read-only root filesystem, with no capability and
no service-account token.

Each pod is ``<pod>.<job>.<namespace>.svc.<domain>`` through the job's headless Service
(``hostname`` and ``subdomain``): the TensorFlow cluster's addresses. ``publishNotReady
Addresses`` lets a new PS be named before its server answers, as TensorFlow expects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stride.podwatcher.adapters.outbound.backends.base import PodStart
from stride.podwatcher.domain.network import JOB_LABEL, TENSORFLOW_PORT_NAME, job_network_policy
from stride.vocabulary import Role

MANAGED_BY = {"app.kubernetes.io/managed-by": "stride-podwatcher"}
"""The label every object of the backend carries: what it lists and watches."""
ROLE_LABEL = "stride.io/role"
INDEX_LABEL = "stride.io/index"
GENERATION_LABEL = "stride.io/generation"
PLAN_ANNOTATION = "stride.io/plan-version"
PORT_ANNOTATION = "stride.io/port"
AGENT_PORT_ANNOTATION = "stride.io/agent-port"
TOKEN_MOUNT = "/var/run/stride/job"
TLS_MOUNT = "/etc/stride/tls"
GPU_RESOURCE = "nvidia.com/gpu"
RUN_AS = 10001
"""The images' own non-root user."""
AGENT_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
"""The sidecar's share beside the plan's trainer: nodes' room is the plan's sizes plus this."""


@dataclass(frozen=True)
class Owner:
    """The ``StrideJob`` a job's objects belong to (deleting it deletes them)."""

    name: str
    uid: str
    namespace: str = ""
    """Where the StrideJob is, and so its pods (an owner is in its objects' namespace)."""

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": "stride.io/v1alpha1",
            "kind": "StrideJob",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": False,
        }


@dataclass(frozen=True)
class PodTemplate:
    """What every training pod gets besides its plan: images, addresses, labels, TLS."""

    trainer_image: str
    agent_image: str
    nats_url: str
    dispatcher_address: str
    ckptcache_address: str
    checkpoint_every_steps: int = 50
    step_report_seconds: float = 2.0
    log_level: str = "INFO"
    cluster_domain: str = "cluster.local"
    labels: Mapping[str, str] = field(default_factory=dict)
    """The release's training-pod labels (the chart's NetworkPolicy selects them)."""
    podwatcher_labels: Mapping[str, str] = field(default_factory=dict)
    """The pod watcher's own labels, which a job's NetworkPolicy admits (its probes)."""
    podwatcher_namespace: str = ""
    trainer_tls_secret: str = ""
    """The ``trainer`` identity's Secret in the pods' namespace (empty: plain text)."""
    agent_tls_secret: str = ""
    pull_policy: str = "IfNotPresent"


def quantity_cpu(cores: float) -> str:
    """Cores as a Kubernetes quantity in millicores, rounded up (never below 1m)."""
    return f"{max(1, math.ceil(round(cores * 1000, 6)))}m"


def address(pod: str, job_id: str, namespace: str, domain: str, port: int) -> str:
    """A pod's TensorFlow address through its job's headless Service."""
    return f"{pod}.{job_id}.{namespace}.svc.{domain}:{port}"


def job_labels(template: PodTemplate, job_id: str) -> dict[str, str]:
    return {**template.labels, **MANAGED_BY, JOB_LABEL: job_id}


def token_secret_name(pod: str) -> str:
    return f"{pod}-token"


def _meta(name: str, namespace: str, labels: dict[str, str], owner: Owner | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [owner.reference()]
    return meta


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _env(values: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": key, "value": value} for key, value in values.items()]


def _pod_metadata(
    start: PodStart, template: PodTemplate, namespace: str, owner: Owner | None
) -> dict[str, Any]:
    record = start.record
    labels = {
        **job_labels(template, record.job_id),
        ROLE_LABEL: record.role.value.replace("_", "-"),
        INDEX_LABEL: str(record.index),
        GENERATION_LABEL: str(record.generation),
    }
    meta = _meta(record.name, namespace, labels, owner)
    meta["annotations"] = {
        PLAN_ANNOTATION: str(start.plan_version),
        PORT_ANNOTATION: str(start.port),
        AGENT_PORT_ANNOTATION: str(start.agent_port),
    }
    return meta


def _trainer_env(start: PodStart, template: PodTemplate) -> dict[str, str]:
    record = start.record
    env = {
        "STRIDE_TRAINER_ROLE": record.role.value,
        "STRIDE_TRAINER_INDEX": str(record.index),
        "STRIDE_TRAINER_JOB_ID": record.job_id,
        "STRIDE_TRAINER_POD_NAME": record.name,
        "STRIDE_TRAINER_CLUSTER_JSON": start.cluster_json,
        "STRIDE_TRAINER_PORT": str(start.port),
        "STRIDE_TRAINER_AGENT_ADDRESS": f"127.0.0.1:{start.agent_port}",
        "STRIDE_TRAINER_CKPTCACHE_ADDRESS": template.ckptcache_address,
        "STRIDE_TRAINER_SPEC_JSON": start.spec_json,
        "STRIDE_TRAINER_CHECKPOINT_EVERY_STEPS": str(template.checkpoint_every_steps),
        "STRIDE_TRAINER_PLAN_VERSION": str(start.plan_version),
        "STRIDE_TRAINER_REPORT_INTERVAL_SECONDS": str(template.step_report_seconds),
        "PYTHONUNBUFFERED": "1",
    }
    if start.standby:
        env["STRIDE_TRAINER_STANDBY"] = "true"
    return env


def _agent_env(start: PodStart, template: PodTemplate) -> dict[str, str]:
    record = start.record
    return {
        "STRIDE_AGENT_JOB_ID": record.job_id,
        "STRIDE_AGENT_POD_NAME": record.name,
        "STRIDE_AGENT_ROLE": record.role.value,
        "STRIDE_AGENT_GRPC_HOST": "127.0.0.1",
        "STRIDE_AGENT_GRPC_PORT": str(start.agent_port),
        "STRIDE_AGENT_NATS_URL": template.nats_url,
        "STRIDE_AGENT_DISPATCHER_ADDRESS": template.dispatcher_address,
        "STRIDE_AGENT_CKPTCACHE_ADDRESS": template.ckptcache_address,
        "STRIDE_AGENT_LOG_LEVEL": template.log_level,
        "STRIDE_AGENT_LOG_JSON": "true",
    }


@dataclass
class _Files:
    """The pod's volumes, and what each container mounts and is told of them."""

    volumes: list[dict[str, Any]]
    mounts: dict[str, list[dict[str, Any]]]
    env: dict[str, dict[str, str]]


def _files(pod: str, template: PodTemplate, token: bool) -> _Files:
    """/tmp, the job token Secret (``token``) and each container's TLS identity."""
    shared: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    files = _Files([{"name": "tmp", "emptyDir": {}}], {}, {"trainer": {}, "agent": {}})
    if token:
        token_file = f"{TOKEN_MOUNT}/token"
        files.env["trainer"]["STRIDE_JOB_TOKEN_FILE"] = token_file
        files.env["agent"]["STRIDE_AGENT_JOB_TOKEN_FILE"] = token_file
        files.env["agent"]["STRIDE_AGENT_JOB_KEY_FILE"] = f"{TOKEN_MOUNT}/key"
        files.volumes.append(
            {
                "name": "job-token",
                "secret": {"secretName": token_secret_name(pod), "defaultMode": 0o440},
            }
        )
        shared.append({"name": "job-token", "mountPath": TOKEN_MOUNT, "readOnly": True})
    for who, secret in (
        ("trainer", template.trainer_tls_secret),
        ("agent", template.agent_tls_secret),
    ):
        files.mounts[who] = list(shared)
        if secret:
            files.volumes.append(
                {"name": f"{who}-tls", "secret": {"secretName": secret, "defaultMode": 0o440}}
            )
            files.mounts[who].append(
                {"name": f"{who}-tls", "mountPath": TLS_MOUNT, "readOnly": True}
            )
            files.env[who].update(
                {
                    "STRIDE_TLS_CERT_FILE": f"{TLS_MOUNT}/tls.crt",
                    "STRIDE_TLS_KEY_FILE": f"{TLS_MOUNT}/tls.key",
                    "STRIDE_TLS_CA_FILE": f"{TLS_MOUNT}/ca.crt",
                }
            )
    return files


def _trainer(
    start: PodStart, template: PodTemplate, image: str, gpus: int, files: _Files
) -> dict[str, Any]:
    record = start.record
    size: dict[str, str] = {"cpu": quantity_cpu(record.cpu), "memory": str(record.memory_bytes)}
    if gpus:
        size[GPU_RESOURCE] = str(gpus)
    return {
        "name": "trainer",
        "image": image or template.trainer_image,
        "imagePullPolicy": template.pull_policy,
        "command": ["python", "-m", "stride.trainer"],
        "ports": [{"name": TENSORFLOW_PORT_NAME, "containerPort": start.port, "protocol": "TCP"}],
        "env": _env({**_trainer_env(start, template), **files.env["trainer"]}),
        "resources": {"requests": size, "limits": size},
        "resizePolicy": [
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "NotRequired"},
        ],
        "readinessProbe": {"tcpSocket": {"port": start.port}, "periodSeconds": 2},
        "securityContext": _security(),
        "volumeMounts": files.mounts["trainer"],
    }


def _agent(start: PodStart, template: PodTemplate, files: _Files) -> dict[str, Any]:
    return {
        "name": "agent",
        "image": template.agent_image,
        "imagePullPolicy": template.pull_policy,
        "command": ["python", "-m", "stride.agent"],
        "env": _env({**_agent_env(start, template), **files.env["agent"]}),
        "resources": AGENT_RESOURCES,
        "securityContext": _security(),
        "volumeMounts": files.mounts["agent"],
    }


def pod_manifest(
    start: PodStart,
    template: PodTemplate,
    namespace: str,
    image: str = "",
    gpus: int = 0,
    owner: Owner | None = None,
    token: bool = True,
) -> dict[str, Any]:
    """The pod of one replica (see the module docstring); ``token``: mount the pod's job
    token Secret (none in plain text)."""
    record = start.record
    files = _files(record.name, template, token)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _pod_metadata(start, template, namespace, owner),
        "spec": {
            "nodeName": record.node,
            "hostname": record.name,
            "subdomain": record.job_id,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 10,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS,
                "runAsGroup": RUN_AS,
                "fsGroup": RUN_AS,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            # The agent first: the trainer talks to it from its first step.
            "containers": [
                _agent(start, template, files),
                _trainer(start, template, image, gpus, files),
            ],
            "volumes": files.volumes,
            # Stride places pods on the nodes it chose and drained ones are not among them;
            # a taint that comes later evicts them, and they are relaunched elsewhere.
            "tolerations": [],
        },
    }


def service_manifest(
    template: PodTemplate, job_id: str, namespace: str, owner: Owner | None
) -> dict[str, Any]:
    """The job's headless Service: DNS names for its pods, no virtual IP."""
    labels = job_labels(template, job_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job_id, namespace, labels, owner),
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: job_id, **MANAGED_BY},
            "publishNotReadyAddresses": True,
        },
    }


def token_secret(
    template: PodTemplate,
    record_name: str,
    job_id: str,
    namespace: str,
    token: str,
    key_pem: bytes,
    owner: Owner | None,
) -> dict[str, Any]:
    """A pod's job token and the key it binds (``stride.runtime.tokens``), as a Secret."""
    labels = job_labels(template, job_id)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(token_secret_name(record_name), namespace, labels, owner),
        "stringData": {"token": token, "key": key_pem.decode()},
    }


def network_policy(
    template: PodTemplate, job_id: str, namespace: str, owner: Owner | None
) -> dict[str, Any]:
    """The job's NetworkPolicy (:func:`~stride.podwatcher.domain.network.job_network_policy`),
    also admitting the pod watcher when the pods live outside its namespace."""
    policy = job_network_policy(job_id, namespace, {**template.labels, **MANAGED_BY})
    if owner is not None:
        policy["metadata"]["ownerReferences"] = [owner.reference()]
    if template.podwatcher_labels and namespace != template.podwatcher_namespace:
        policy["spec"]["ingress"].append(
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {
                                "kubernetes.io/metadata.name": template.podwatcher_namespace
                            }
                        },
                        "podSelector": {"matchLabels": dict(template.podwatcher_labels)},
                    }
                ]
            }
        )
    return policy


def role_of(labels: Mapping[str, str]) -> Role | None:
    value = labels.get(ROLE_LABEL, "").replace("-", "_")
    try:
        return Role(value)
    except ValueError:
        return None
