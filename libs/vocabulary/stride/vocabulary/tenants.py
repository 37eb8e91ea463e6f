"""Which Stride user a Kubernetes namespace is (issue 38).

A ``StrideJob`` applied in namespace ``team-a`` is submitted as the user ``k8s.team-a``:
Kubernetes decided who may create it there (RBAC on ``stridejobs``), so the namespace is
the tenant, and its quotas, rate limit and jobs are that user's. The prefix keeps those
users apart from the ones tokens name, and admission lets the pod watcher (the operator
that submits ``StrideJob``\\ s) submit only for users that carry it. An admin may issue a
``stride`` token for ``k8s.team-a`` to let someone follow the namespace's jobs from the CLI.
"""

from __future__ import annotations

import re

KUBERNETES_TENANT_PREFIX = "k8s."
"""Users named ``k8s.<namespace>`` are Kubernetes namespaces."""

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")
"""A namespace name (an RFC 1123 label)."""


def namespace_tenant(namespace: str) -> str:
    """The user a namespace's ``StrideJob``\\ s are submitted as."""
    if not _NAMESPACE.match(namespace):
        raise ValueError(f"{namespace!r} is not a Kubernetes namespace name")
    return KUBERNETES_TENANT_PREFIX + namespace


def tenant_namespace(user: str) -> str | None:
    """The namespace a user stands for, or None for a user that is not a namespace."""
    if not user.startswith(KUBERNETES_TENANT_PREFIX):
        return None
    namespace = user[len(KUBERNETES_TENANT_PREFIX) :]
    return namespace if _NAMESPACE.match(namespace) else None
