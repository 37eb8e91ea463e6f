"""Who may reach a job's TensorFlow servers on Kubernetes (pure: the manifest only).

The chart's NetworkPolicy (``deploy/helm/stride/templates/training-networkpolicy.yaml``)
admits only the pod watcher to any training pod. Each job adds this one as its pods are
created: the job's pods (``stride.io/job: <job>``) admit each other on the port named
``tensorflow``. Another job's pod, or anything else in the cluster, is not admitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JOB_LABEL = "stride.io/job"
"""The label every training pod carries: its job's id."""
TENSORFLOW_PORT_NAME = "tensorflow"
"""The name of a training container's TensorFlow server port."""


def job_network_policy(job_id: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """The NetworkPolicy of ``job_id``'s pods; ``labels``: the release's training-pod
    selector labels (the chart's ``stride.selectorLabels`` for ``training-pod``)."""
    selector = {**labels, JOB_LABEL: job_id}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{job_id}-tensorflow",
            "namespace": namespace,
            "labels": selector,
        },
        "spec": {
            "podSelector": {"matchLabels": selector},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector}}],
                    "ports": [{"protocol": "TCP", "port": TENSORFLOW_PORT_NAME}],
                }
            ],
        },
    }
