"""The pod watcher as a Kubernetes operator: the parts of its composition root that only
the Kubernetes backend has (the API client, the Lease, the StrideJobs).

Started in this order: the API client (a kubeconfig file, or the pod's service account),
then the Lease (a standby waits here, acting on nothing), then the backend's informers
(listed before anything reads them), and once the rest of the service is built, the
StrideJob controller and a task that stops the service if the Lease is lost.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import structlog
from kubernetes_asyncio import client, config

from stride.podwatcher.adapters.outbound.admission import AdmissionClient
from stride.podwatcher.adapters.outbound.backends.kubernetes.backend import KubernetesBackend
from stride.podwatcher.adapters.outbound.backends.kubernetes.leader import Leadership
from stride.podwatcher.adapters.outbound.backends.kubernetes.manifests import PodTemplate
from stride.podwatcher.adapters.outbound.dispatcher import DispatcherClient
from stride.podwatcher.domain.cluster import PodPhase
from stride.podwatcher.settings import PodWatcherSettings, parse_labels
from stride.podwatcher.stridejobs import StrideJobs
from stride.podwatcher.usecases import PodWatcher
from stride.runtime import tls
from stride.runtime.errors import StartupError
from stride.runtime.grpc_server import GrpcServer
from stride.runtime.lifecycle import ServiceHost
from stride.runtime.tokens import Signer

log = structlog.get_logger(__name__)


async def api_client(settings: PodWatcherSettings) -> client.ApiClient:
    """A client of the API server: the kubeconfig named, else the service account's."""
    configuration = client.Configuration()
    try:
        if settings.kube_config is not None:
            await config.load_kube_config(
                config_file=str(settings.kube_config),
                context=settings.kube_context or None,
                client_configuration=configuration,
            )
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError) as error:
        raise StartupError(
            f"the kubernetes backend cannot reach an API server: {error} (set "
            "STRIDE_PODWATCHER_KUBE_CONFIG outside a cluster)"
        ) from None
    return client.ApiClient(configuration)


def pod_template(settings: PodWatcherSettings) -> PodTemplate:
    return PodTemplate(
        trainer_image=settings.trainer_image,
        agent_image=settings.agent_image,
        nats_url=settings.require_nats_url(),
        dispatcher_address=settings.dispatcher_address,
        ckptcache_address=settings.ckptcache_address,
        checkpoint_every_steps=settings.checkpoint_every_steps,
        step_report_seconds=settings.step_report_seconds,
        log_level=settings.log_level,
        cluster_domain=settings.kube_cluster_domain,
        labels=parse_labels(settings.kube_pod_labels),
        podwatcher_labels=parse_labels(settings.kube_podwatcher_labels),
        podwatcher_namespace=settings.namespace,
        trainer_tls_secret=settings.kube_trainer_tls_secret,
        agent_tls_secret=settings.kube_agent_tls_secret,
    )


async def _released(host: str, port: int, timeout: float = 10.0) -> None:
    """Until the standby's port can be bound again (gRPC closes its listener after
    ``stop`` returns), so the service's own server takes it at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
            return
        except OSError:
            if loop.time() > deadline:
                return  # the server's own bind says what is wrong
            await asyncio.sleep(0.05)
        finally:
            probe.close()


@dataclass
class Operator:
    """The Kubernetes side of one pod watcher process."""

    settings: PodWatcherSettings
    api: client.ApiClient
    backend: KubernetesBackend
    leadership: Leadership | None

    @classmethod
    async def start(cls, settings: PodWatcherSettings, service_names: list[str]) -> Operator:
        """Connect, wait for the Lease, list pods and nodes. While it waits, a standby
        answers health checks on its port: alive (``""`` SERVING), not ready (its
        ``service_names`` NOT_SERVING), so its probes neither restart it nor route to it."""
        api = await api_client(settings)
        leadership = None
        if settings.leader_election:
            leadership = Leadership(
                api,
                settings.namespace,
                settings.lease_name,
                lease_seconds=settings.lease_seconds,
                # client-go's ratios (15 s, 10 s, 2 s); the client wants a retry over 1 s.
                renew_seconds=settings.lease_seconds * 2 / 3,
                retry_seconds=max(settings.lease_seconds / 8, 1.05),
            )
            standby = GrpcServer(
                service_names,
                settings.grpc_host,
                settings.grpc_port,
                tls=tls.load(settings.service_name),
            )
            port = await standby.start()
            try:
                await leadership.wait()
            finally:
                await standby.stop(0)
            await _released(settings.grpc_host, port)
        material = tls.load(settings.service_name)
        backend = KubernetesBackend(
            api,
            pod_template(settings),
            namespace=settings.namespace,
            node_selector=settings.kube_node_selector,
            signer=Signer(material) if material is not None else None,
        )
        await backend.open()
        log.info(
            "kubernetes pod backend",
            namespace=settings.namespace,
            nodes=len(backend.nodes()),
            pods=len(backend.running()),
            leader=leadership.identity if leadership else "no election",
        )
        return cls(settings, api, backend, leadership)

    def attach(self, host: ServiceHost, pods: PodWatcher) -> None:
        """Serve StrideJobs, follow node changes, and stop if the Lease is lost."""
        backend = self.backend

        nodes_dirty = asyncio.Event()
        backend.nodes_changed = nodes_dirty.set

        async def follow_nodes() -> None:
            """A node came, went, was cordoned or tainted: publish the inventory (and
            evict from drained nodes) once per burst of changes."""
            while not host.stop.is_set():
                waiter = asyncio.ensure_future(nodes_dirty.wait())
                stop = asyncio.ensure_future(host.stop.wait())
                await asyncio.wait({waiter, stop}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stop.cancel()
                if host.stop.is_set():
                    return
                await asyncio.sleep(0.5)
                nodes_dirty.clear()
                try:
                    await pods.check_inventory()
                except Exception:
                    log.exception("node inventory check failed")

        host.add_root_task("node-changes", follow_nodes)
        if self.settings.stridejobs:
            admission = AdmissionClient(self.settings.admission_address)

            async def counts(job_id: str) -> tuple[int, int, int]:
                try:
                    stored, views = await pods.job_pods(job_id)
                except Exception:
                    return 0, 0, 0
                live = [v for v in views if v.pod.record.phase is PodPhase.RUNNING]
                ready = sum(1 for v in live if backend.is_ready(v.pod.record.name))
                return stored.plan.version, ready, len(live)

            dispatcher = DispatcherClient(self.settings.dispatcher_address)
            jobs = StrideJobs(self.api, admission, counts, dispatcher.progress)
            backend.owners = jobs.owner
            backend.job_changed = jobs.job_changed
            host.add_root_task("stridejobs", lambda: jobs.run(host.stop))

        if self.leadership is not None:
            lost = self.leadership.lost

            async def follow_lease() -> None:
                stop = asyncio.ensure_future(host.stop.wait())
                gone = asyncio.ensure_future(lost.wait())
                await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                gone.cancel()
                if lost.is_set() and not host.stop.is_set():
                    log.error("the lease is lost: stopping")
                    host.stop.set()
                await host.stop.wait()

            host.add_root_task("lease", follow_lease)

    async def close(self) -> None:
        if self.leadership is not None:
            await self.leadership.close()
