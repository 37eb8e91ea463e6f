"""The Kubernetes backend: a job's pods are pods, watched through informers.

The pod watcher's use cases decide which pods a plan needs, where (KOD2) and how big, as
they do for the local backend; this backend makes them real on a cluster
(:mod:`.manifests`) and reports how each ends (:mod:`.status`), from two informers
(:mod:`.informer`): Stride's pods, in every namespace its jobs use, and the nodes. A job
submitted as a ``StrideJob`` runs in the namespace of its ``StrideJob``, which owns its
pods, Service, NetworkPolicy and token Secrets (deleting it deletes them); a job submitted
with ``stride submit`` runs in the pod watcher's namespace.

Ends. A pod whose status says it is over (:func:`.status.ending`) or that left the API is
reported once per pod uid through :meth:`ended`; acknowledging the end deletes what is
left of the pod, so a relaunch under the same name can be created. A restarted pod watcher
lists the pods again and reports the ends it finds (at least once); pods removed while it
was down are the use cases' sweep's (rows without a pod are lost, then relaunched).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from stride.podwatcher.adapters.outbound.backends.base import (
    PodEnded,
    PodStart,
    PodUsage,
    ResizeRefused,
)
from stride.podwatcher.adapters.outbound.backends.kubernetes import manifests, status
from stride.podwatcher.adapters.outbound.backends.kubernetes.api import (
    api_error,
    as_body,
    close_client,
    create,
    send,
)
from stride.podwatcher.adapters.outbound.backends.kubernetes.informer import Informer
from stride.podwatcher.adapters.outbound.backends.kubernetes.logs import TrainerLogs
from stride.podwatcher.adapters.outbound.backends.kubernetes.manifests import Owner, PodTemplate
from stride.podwatcher.adapters.outbound.backends.kubernetes.node_watch import NodeWatch
from stride.podwatcher.adapters.outbound.backends.kubernetes.tokens import PodTokens
from stride.podwatcher.domain.network import JOB_LABEL
from stride.podwatcher.domain.nodes import NodeSpec
from stride.runtime.tokens import JOB_TOKEN_TTL, Signer
from stride.vocabulary import Role
from stride.vocabulary.tenants import tenant_namespace

log = structlog.get_logger(__name__)

OwnerLookup = Callable[[str], Owner | None]
"""A job id's ``StrideJob``, if it was submitted as one."""
RECREATE_WAIT_SECONDS = 30.0
"""How long a relaunch waits for the old pod of its name to leave the API."""
GPU_ROLES = (Role.CHIEF, Role.WORKER)


def _namespace(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["namespace"])


class KubernetesBackend:
    """Runs pods on a Kubernetes cluster (see the module docstring)."""

    name = "kubernetes"
    enforcement = "kubelet"
    enforcement_note = "limits enforced by each node's kubelet (requests = limits: Guaranteed)"

    def __init__(
        self,
        api: client.ApiClient,
        template: PodTemplate,
        *,
        namespace: str,
        node_selector: str = "",
        signer: Signer | None = None,
        owners: OwnerLookup | None = None,
        token_ttl: float = JOB_TOKEN_TTL,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.networking = client.NetworkingV1Api(api)
        self.template = template
        self.namespace = namespace
        self.logs = TrainerLogs(self.core)
        self.tokens = PodTokens(self.core, template, signer, token_ttl) if signer else None
        """Each pod's job token Secret (None: plain text, pods get none)."""
        self.owners = owners or (lambda job_id: None)
        selector = ",".join(
            f"{key}={value}" for key, value in {**template.labels, **manifests.MANAGED_BY}.items()
        )
        self.pods = Informer(
            "pods", self.core.list_pod_for_all_namespaces, self._pod_event, label_selector=selector
        )
        # Late bound: the operator sets nodes_changed after the backend is made.
        self.node_watch = NodeWatch(
            self.core,
            node_selector,
            self._empty,
            lambda: self.nodes_changed(),  # noqa: PLW0108
        )
        self._names: dict[str, str] = {}
        """Pod name -> informer key (``namespace/name``)."""
        self._reported: set[str] = set()
        """Uids whose end was reported: a pod ends once."""
        self._ended: dict[str, PodEnded] = {}
        self._ends: asyncio.Queue[PodEnded] = asyncio.Queue()
        self._deleting: set[str] = set()
        self._evicting: dict[str, str] = {}
        self._jobs_ready: set[str] = set()
        self._job_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._job_namespaces: dict[str, str] = {}
        """Job id -> the namespace its pods are in (from the watch and from starts)."""
        self._unseen: set[str] = set()
        """Pods created whose first watch event has not come yet."""
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.nodes_changed: Callable[[], None] = lambda: None
        """Called when a node comes, goes or changes (the use cases check the inventory)."""
        self.job_changed: Callable[[str], None] = lambda job_id: None
        """Called when one of a job's pods changes (its StrideJob's status follows)."""

    # --- informers -------------------------------------------------------------------

    async def open(self, timeout: float = 60.0) -> None:
        """Start watching pods and nodes; returns once both are listed."""
        for informer in (self.pods, self.node_watch.informer):
            self._tasks.append(asyncio.create_task(informer.run(self._stop)))
        async with asyncio.timeout(timeout):
            await self.pods.synced.wait()
            await self.node_watch.informer.synced.wait()

    def _pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        name, uid = meta.get("name", ""), meta.get("uid", "")
        if kind == "DELETED":
            self._names.pop(name, None)
            why = self._evicting.pop(name, None)
            if uid not in self._reported:
                gone = (
                    status.Ending("Evicted", None, why)
                    if why is not None
                    else status.deleted_ending(pod, by_us=name in self._deleting)
                )
                self._report(pod, gone)
            self._deleting.discard(name)
        else:
            self._names[name] = Informer.key(pod)
            self._unseen.discard(name)
            job = (meta.get("labels") or {}).get(JOB_LABEL)
            if job:
                self._job_namespaces[job] = meta.get("namespace", self.namespace)
            ending = status.ending(pod)
            if ending is not None and uid not in self._reported:
                self._report(pod, ending)
        self._changed.set()
        job_id = (meta.get("labels") or {}).get(JOB_LABEL)
        if job_id:
            self.job_changed(job_id)

    async def _empty(self, node: str) -> None:
        """Evict Stride's pods from a node being drained (cordoned or NoExecute)."""
        names = [
            pod["metadata"]["name"]
            for pod in list(self.pods.objects.values())
            if (pod.get("spec") or {}).get("nodeName") == node and self._live(pod)
        ]
        for name in names:
            await self.evict(name, f"node {node} is drained (cordoned or tainted NoExecute)")
        if names:
            log.warning("node drained: pods evicted", node=node, pods=len(names))

    def _report(self, pod: dict[str, Any], ending: status.Ending) -> None:
        meta = pod.get("metadata") or {}
        name = meta.get("name", "")
        self._reported.add(meta.get("uid", ""))
        job_id = (meta.get("labels") or {}).get(JOB_LABEL, "")
        end = PodEnded(name, job_id, ending.reason, ending.exit_code, ending.message[:2000])
        self._ended[name] = end
        self._ends.put_nowait(end)
        log.info("pod ended", pod=name, reason=ending.reason, message=ending.message[:200])

    def _pod(self, name: str) -> dict[str, Any] | None:
        key = self._names.get(name)
        return None if key is None else self.pods.objects.get(key)

    async def _until(self, done: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
        """Until ``done()`` holds, checked at every watch event (at least every ``step``);
        whether it did before ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, step))
        return True

    async def _seen(self, name: str, timeout: float = 10.0) -> dict[str, Any] | None:
        """The pod from the cache, waiting for one this backend just created to arrive
        through the watch (a delete right after a create must find it)."""
        await self._until(lambda: name not in self._unseen, timeout)
        return self._pod(name)

    async def _gone(self, name: str, uid: str, timeout: float = RECREATE_WAIT_SECONDS) -> None:
        """Until the pod ``uid`` of this name has left the API (as the watch tells), so a
        relaunch under the name never races the old pod's last deletion step (a node
        agent deleting by name, as kwok does, would take the new pod with it)."""

        def left() -> bool:
            current = self._pod(name)
            return current is None or current["metadata"].get("uid") != uid

        await self._until(left, timeout)

    def _live(self, pod: dict[str, Any]) -> bool:
        uid = (pod.get("metadata") or {}).get("uid", "")
        return uid not in self._reported and not (pod.get("metadata") or {}).get(
            "deletionTimestamp"
        )

    # --- nodes (:class:`.node_watch.NodeWatch`) ---------------------------------------

    def all_nodes(self) -> list[tuple[NodeSpec, bool]]:
        return self.node_watch.all_nodes()

    def nodes(self) -> list[NodeSpec]:
        return self.node_watch.nodes()

    def set_drained(self, name: str, drained: bool) -> bool:
        return self.node_watch.set_drained(name, drained)

    # --- pods ------------------------------------------------------------------------

    def address(self, name: str, job_id: str, port: int) -> str:
        pod = self._pod(name)
        namespace = (pod or {}).get("metadata", {}).get("namespace") or self._namespace_of(job_id)
        return manifests.address(name, job_id, namespace, self.template.cluster_domain, port)

    def _namespace_of(self, job_id: str, user: str = "") -> str:
        """A job's pod namespace: its StrideJob's, its user's tenant namespace, where its
        pods are, else the pod watcher's own."""
        owner = self.owners(job_id)
        if owner is not None and owner.namespace:
            return owner.namespace
        owner_namespace = tenant_namespace(user) if user else None
        if owner_namespace:
            return owner_namespace
        return self._job_namespaces.get(job_id, self.namespace)

    async def _prepare_job(self, job_id: str, namespace: str, owner: Owner | None) -> None:
        """The job's headless Service and NetworkPolicy, once (one start at a time)."""
        async with self._job_locks[job_id]:
            if job_id in self._jobs_ready:
                return
            template = self.template
            await create(
                self.core.create_namespaced_service,
                manifests.service_manifest(template, job_id, namespace, owner),
            )
            await create(
                self.networking.create_namespaced_network_policy,
                manifests.network_policy(template, job_id, namespace, owner),
            )
            self._jobs_ready.add(job_id)
        self._job_locks.pop(job_id, None)

    async def start(self, pod: PodStart) -> None:
        """Create the pod (its Service, NetworkPolicy and token first); a pod of that name
        that still runs is left as it is, one on its way out is waited for."""
        record = pod.record
        existing = self._pod(record.name)
        if existing is not None and self._live(existing):
            return
        spec = json.loads(pod.spec_json) if pod.spec_json else {}
        namespace = self._namespace_of(record.job_id, spec.get("user", ""))
        self._job_namespaces[record.job_id] = namespace
        owner = self.owners(record.job_id)
        await self._prepare_job(record.job_id, namespace, owner)
        if self.tokens is not None:
            await self.tokens.write(record.name, record.job_id, record.role.value, namespace, owner)
        gpu_job = spec.get("resourceKind") == "RESOURCE_KIND_GPU"
        gpus = 1 if gpu_job and record.role in GPU_ROLES else 0
        body = manifests.pod_manifest(
            pod,
            self.template,
            namespace,
            image=(spec.get("model") or {}).get("image", ""),
            gpus=gpus,
            owner=owner,
            token=self.tokens is not None,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECREATE_WAIT_SECONDS
        while True:
            try:
                await send(self.core.create_namespaced_pod, namespace, as_body(body))
                if self._pod(record.name) is None or not self._live(self._pod(record.name) or {}):
                    self._unseen.add(record.name)
                return
            except ApiException as error:
                if error.status != 409 or loop.time() > deadline:
                    raise RuntimeError(f"creating pod {record.name}: {api_error(error)}") from None
            # The pod of this name before it (failed, acknowledged) is still being deleted.
            await self._until(lambda: False, 1.0, 1.0)

    def is_ready(self, name: str) -> bool:
        pod = self._pod(name)
        return pod is not None and self._live(pod) and status.ready(pod)

    async def wait_ready(self, pods: Sequence[PodStart], timeout: float) -> bool:
        """Until every pod's Ready condition is true (its TensorFlow port answers the
        kubelet's probe); False if ``timeout`` passed first."""

        def ready() -> bool:
            found = [self._pod(start.record.name) for start in pods]
            return all(pod is not None and status.ready(pod) for pod in found)

        return await self._until(ready, timeout, 1.0)

    async def resize(self, name: str, cpu: float, memory_bytes: int) -> None:
        """Resize the trainer in place through ``pods/resize``; refused (the use case then
        migrates) where the server has no such subresource or will not take the change."""
        pod = await self._seen(name)
        if pod is None:
            raise ResizeRefused(f"pod {name} is not running")
        size = {"cpu": manifests.quantity_cpu(cpu), "memory": str(memory_bytes)}
        patch = {
            "spec": {
                "containers": [{"name": "trainer", "resources": {"requests": size, "limits": size}}]
            }
        }
        try:
            await self.core.patch_namespaced_pod_resize(name, pod["metadata"]["namespace"], patch)
        except ApiException as error:
            raise ResizeRefused(
                f"the API server refused the in-place resize ({error.status}): {api_error(error)}"
            ) from None

    async def delete(self, name: str) -> None:
        """Delete the pod; its end comes through :meth:`ended` as ``Deleted``."""
        pod = await self._seen(name)
        if pod is None or not self._live(pod):
            return
        self._deleting.add(name)
        await self._delete_pod(name, pod["metadata"]["namespace"])

    async def _delete_pod(self, name: str, namespace: str, grace: int | None = None) -> None:
        try:
            options: dict[str, Any] = {} if grace is None else {"grace_period_seconds": grace}
            await self.core.delete_namespaced_pod(name, namespace, **options)
        except ApiException as error:
            if error.status != 404:
                raise

    async def evict(self, name: str, why: str) -> None:
        """Evict through the Eviction API (disruption budgets apply); the end is Evicted."""
        pod = await self._seen(name)
        if pod is None or not self._live(pod):
            return
        namespace = pod["metadata"]["namespace"]
        self._evicting[name] = why
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            await self.core.create_namespaced_pod_eviction(name, namespace, as_body(body))
        except ApiException as error:
            self._evicting.pop(name, None)
            log.warning("eviction refused", pod=name, why=api_error(error))

    def adopt(self) -> list[str]:
        """The pods running now (the informer listed them at :meth:`open`)."""
        return self.running()

    def running(self) -> list[str]:
        return sorted(
            pod["metadata"]["name"] for pod in self.pods.objects.values() if self._live(pod)
        )

    def known(self) -> list[str]:
        return sorted({*self.running(), *self._ended})

    async def ended(self) -> AsyncIterator[PodEnded]:
        while True:
            end = await self._ends.get()
            if end.name in self._ended:
                yield end

    async def acknowledge(self, name: str) -> None:
        """Forget a recorded end: delete what is left of the pod and its token."""
        end = self._ended.pop(name, None)
        pod = self._pod(name)
        namespace = (pod or {}).get("metadata", {}).get("namespace")
        if namespace is None and end is not None:
            namespace = self._namespace_of(end.job_id)
        if pod is not None and pod["metadata"].get("uid") in self._reported:
            await self._delete_pod(name, namespace, grace=0)
            await self._gone(name, pod["metadata"].get("uid", ""))
        if self.tokens is not None and namespace and name not in self.running():
            await self.tokens.remove(name, namespace)

    async def refresh_tokens(self) -> int:
        """Rewrite the job token Secret of every running pod; how many."""
        if self.tokens is None:
            return 0
        written = 0
        for pod in list(self.pods.objects.values()):
            if not self._live(pod):
                continue
            meta = pod["metadata"]
            labels = meta.get("labels") or {}
            role = manifests.role_of(labels)
            if role is None:
                continue
            owner = self.owners(labels.get(JOB_LABEL, ""))
            await self.tokens.write(
                meta["name"], labels.get(JOB_LABEL, ""), role.value, meta["namespace"], owner
            )
            written += 1
        return written

    def usage(self, name: str) -> PodUsage | None:
        """Not sampled on Kubernetes (no metrics API is assumed): the optimizer works from
        the agents' step reports and the pods' ends."""
        return None

    async def log_tail(self, name: str, lines: int) -> list[str]:
        pod = self._pod(name)
        return [] if pod is None else await self.logs.tail(name, _namespace(pod), lines)

    async def follow_logs(self, name: str) -> AsyncIterator[list[str]]:
        pod = self._pod(name)
        if pod is not None:
            async for lines in self.logs.follow(name, _namespace(pod)):
                yield lines

    async def close(self) -> None:
        """Stop watching; the pods keep running."""
        self._stop.set()
        self._tasks.extend(self.node_watch.tasks)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await close_client(self.api)
