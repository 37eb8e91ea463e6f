"""Leader election on a ``coordination.k8s.io`` Lease, so two pod watchers never act at once.

A pod watcher of the Kubernetes backend waits here until it holds the Lease, then builds
and runs everything that acts (the bus consumers, the reconcile passes, the StrideJobs). It
renews the Lease while it runs; if it cannot (its API server is unreachable for longer than
the renew deadline, or another replica took the Lease), ``lost`` is set and it stops: its
standby, which kept trying, takes over within the lease duration. The Lease's holder is the
pod's name and process id, so a restarted process is a new candidate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.leaderelection.electionconfig import Config
from kubernetes_asyncio.leaderelection.leaderelection import LeaderElection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

log = structlog.get_logger(__name__)


class Leadership:
    """Holds (or waits for) the Lease ``name`` in ``namespace``."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        *,
        lease_seconds: float = 15.0,
        renew_seconds: float = 10.0,
        retry_seconds: float = 2.0,
    ) -> None:
        self.identity = f"{socket.gethostname()}-{os.getpid()}"
        self.acquired = asyncio.Event()
        self.lost = asyncio.Event()
        self._config = Config(
            LeaseLock(name, namespace, self.identity, api),
            lease_duration=lease_seconds,
            renew_deadline=renew_seconds,
            retry_period=retry_seconds,
            onstarted_leading=self._started,
            onstopped_leading=self._stopped,
        )
        self._task: asyncio.Task[None] | None = None
        self.where = f"{namespace}/{name}"

    async def _started(self) -> None:
        log.info("leading: holding the lease", lease=self.where, identity=self.identity)
        self.acquired.set()
        await asyncio.Event().wait()  # cancelled by the election when the lease is lost

    async def _stopped(self) -> None:
        log.error("lost the lease: stopping so a standby takes over", lease=self.where)
        self.lost.set()

    async def wait(self) -> None:
        """Return once this process holds the Lease."""
        self._task = asyncio.create_task(self._run())
        log.info("waiting for the lease", lease=self.where, identity=self.identity)
        await self.acquired.wait()

    async def _run(self) -> None:
        try:
            await LeaderElection(self._config).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("leader election failed", lease=self.where)
        self.lost.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
