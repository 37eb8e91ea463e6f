"""Each training pod's job token and key, as a Secret it mounts (:mod:`stride.runtime.tokens`).

The key is made with the pod's first token and kept until its end; a rewritten token (at a
quarter of its life) binds the same key, read back from the Secret after a restart.
"""

from __future__ import annotations

import base64
import contextlib
from typing import Any

from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from stride.podwatcher.adapters.outbound.backends.kubernetes import manifests
from stride.podwatcher.adapters.outbound.backends.kubernetes.api import as_body
from stride.podwatcher.adapters.outbound.backends.kubernetes.manifests import Owner, PodTemplate
from stride.runtime.tokens import JOB_TOKEN_TTL, Signer, new_pod_key


class PodTokens:
    """Writes, rewrites and removes pods' token Secrets."""

    def __init__(
        self,
        core: client.CoreV1Api,
        template: PodTemplate,
        signer: Signer,
        ttl: float = JOB_TOKEN_TTL,
    ) -> None:
        self.core = core
        self.template = template
        self.signer = signer
        self.ttl = ttl
        self._keys: dict[str, Any] = {}

    async def write(
        self, name: str, job_id: str, role: str, namespace: str, owner: Owner | None
    ) -> None:
        """A fresh token for pod ``name``, binding its key."""
        key = self._keys.get(name) or await self._read_key(name, namespace) or new_pod_key()
        self._keys[name] = key
        token = self.signer.job_token(job_id, name, role, ttl=self.ttl, pod_key=key.public_key())
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        body = manifests.token_secret(self.template, name, job_id, namespace, token, pem, owner)
        try:
            await self.core.create_namespaced_secret(namespace, as_body(body))
        except ApiException as error:
            if error.status != 409:
                raise
            await self.core.replace_namespaced_secret(
                body["metadata"]["name"], namespace, as_body(body)
            )

    async def remove(self, name: str, namespace: str) -> None:
        """The pod has ended for good: its token and key go."""
        self._keys.pop(name, None)
        with contextlib.suppress(ApiException):
            await self.core.delete_namespaced_secret(manifests.token_secret_name(name), namespace)

    async def _read_key(self, name: str, namespace: str) -> Any:
        try:
            secret = await self.core.read_namespaced_secret(
                manifests.token_secret_name(name), namespace
            )
        except ApiException:
            return None
        pem = base64.b64decode((secret.data or {}).get("key", ""))
        try:
            return serialization.load_pem_private_key(pem, password=None)
        except ValueError:
            return None
