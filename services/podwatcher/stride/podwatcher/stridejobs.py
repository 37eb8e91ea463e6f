"""``StrideJob``\\ s: ``kubectl apply`` submits a job (the operator's inbound side).

Each StrideJob is reconciled through a :class:`~stride.podwatcher.workqueue.WorkQueue`
keyed ``namespace/name``; the watch only adds keys. A pass:

1. **Deleted** (a deletion timestamp): cancel the job at admission, then drop the
   finalizer; the garbage collector removes its pods (they are owned by the StrideJob).
2. **New**: add the finalizer, parse the spec as a spec file is (:func:`stride.cli.jobspec.
   spec_from_mapping`: the same words as ``stride submit``), and submit it through admission
   as the namespace's tenant (``k8s.<namespace>``), with the StrideJob's uid as the request
   id, so a retry after a crash finds the job the first try made. A spec admission refuses
   is ``Invalid`` and not retried; an unreachable admission is retried with back-off.
3. **Known**: write the status: admission's decision and state (with the earliest deadline
   Stride could keep, when it refused), the newest plan's version, the ready pods, and how
   far the job is through its data (the dispatcher's epoch and shards).

Only the leading pod watcher runs this (the Lease), so two never submit or write at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.cli.jobspec import SpecError, spec_from_mapping
from stride.podwatcher.adapters.inbound.stridejob_crd import GROUP, PLURAL, VERSION
from stride.podwatcher.adapters.outbound.admission import AdmissionClient, Refused
from stride.podwatcher.adapters.outbound.backends.kubernetes.informer import Informer
from stride.podwatcher.adapters.outbound.backends.kubernetes.manifests import Owner
from stride.podwatcher.domain.progress import DataProgress, describe
from stride.podwatcher.workqueue import WorkQueue
from stride.vocabulary.tenants import namespace_tenant

log = structlog.get_logger(__name__)

FINALIZER = "stride.io/cancel-job"
MERGE_PATCH = "application/merge-patch+json"
"""Custom resources take JSON merge patches, not the strategic ones the client picks."""
JOB_ID_LABEL = "stride.io/job"
PHASES = {
    pb.JOB_STATE_SUBMITTED: "Submitted",
    pb.JOB_STATE_ADMITTED: "Running",
    pb.JOB_STATE_QUEUED: "Queued",
    pb.JOB_STATE_REJECTED: "Rejected",
    pb.JOB_STATE_SUCCEEDED: "Succeeded",
    pb.JOB_STATE_FAILED: "Failed",
    pb.JOB_STATE_CANCELLED: "Cancelled",
}
ENDED = frozenset({"Rejected", "Succeeded", "Failed", "Cancelled", "Invalid"})
RESYNC_SECONDS = 10.0
"""How often a running StrideJob's status is refreshed without an event."""
PodCounts = Callable[[str], Awaitable[tuple[int, int, int]]]
"""A job's (plan version, ready pods, pods)."""
ProgressLookup = Callable[[str], Awaitable[DataProgress | None]]
"""How far a job is through its data (the dispatcher's), None if nobody can say yet."""


def _time(stamp: Any) -> str:
    if stamp is None or not stamp.seconds:
        return ""
    return datetime.fromtimestamp(stamp.seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _created(item: dict[str, Any]) -> datetime:
    text = (item.get("metadata") or {}).get("creationTimestamp") or ""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return datetime.now(UTC)


class StrideJobs:
    """Reconciles StrideJobs with admission (see the module docstring)."""

    def __init__(
        self,
        api: client.ApiClient,
        admission: AdmissionClient,
        counts: PodCounts,
        progress: ProgressLookup | None = None,
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.admission = admission
        self.counts = counts
        self.progress = progress
        self.queue = WorkQueue()
        self.informer = Informer("stridejobs", self._list, self._event)
        self._owners: dict[str, Owner] = {}
        self._keys: dict[str, str] = {}
        """Job id -> StrideJob key, for events that name a job."""

    async def _list(self, **options: Any) -> Any:
        return await self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, **options)

    def _event(self, kind: str, item: dict[str, Any]) -> None:
        key = Informer.key(item)
        job_id = (item.get("status") or {}).get("jobId")
        if job_id:
            meta = item["metadata"]
            self._owners[job_id] = Owner(meta["name"], meta["uid"], meta["namespace"])
            self._keys[job_id] = key
        if kind != "DELETED":
            self.queue.add(key)

    def owner(self, job_id: str) -> Owner | None:
        """The StrideJob of a job (its pods' owner), if it was submitted as one."""
        return self._owners.get(job_id)

    def job_changed(self, job_id: str) -> None:
        """A plan, pod or end of ``job_id`` happened: refresh its StrideJob's status."""
        key = self._keys.get(job_id)
        if key is not None:
            self.queue.add(key)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch StrideJobs and work the queue until ``stop``."""
        watch = asyncio.create_task(self.informer.run(stop))
        try:
            while not stop.is_set():
                getter = asyncio.ensure_future(self.queue.get())
                stopper = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    break
                stopper.cancel()
                key = getter.result()
                try:
                    await self.reconcile(key)
                    self.queue.forget(key)
                except Exception as error:
                    delay = self.queue.retry(key)
                    log.warning("stridejob pass failed", key=key, error=str(error), retry_in=delay)
                finally:
                    self.queue.done(key)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            self.queue.close()

    async def reconcile(self, key: str) -> None:
        item = self.informer.objects.get(key)
        if item is None:
            return
        meta = item["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        job_id = (item.get("status") or {}).get("jobId", "")
        if meta.get("deletionTimestamp"):
            if FINALIZER in (meta.get("finalizers") or []):
                if job_id:
                    await self.admission.cancel(job_id)
                kept = [f for f in meta["finalizers"] if f != FINALIZER]
                await self._patch(namespace, name, {"metadata": {"finalizers": kept or None}})
            return
        if FINALIZER not in (meta.get("finalizers") or []):
            finalizers = [*(meta.get("finalizers") or []), FINALIZER]
            await self._patch(namespace, name, {"metadata": {"finalizers": finalizers}})
        phase = (item.get("status") or {}).get("phase", "")
        if not job_id:
            if phase != "Invalid":
                await self._submit(item)
            return
        if phase in ENDED and (item.get("status") or {}).get("observedGeneration") == meta.get(
            "generation"
        ):
            return
        job = await self.admission.get(job_id)
        await self._write_status(item, job)
        if PHASES.get(job.state, "") not in ENDED:
            self.queue.add_after(key, RESYNC_SECONDS)

    async def _submit(self, item: dict[str, Any]) -> None:
        meta = item["metadata"]
        try:
            spec = spec_from_mapping(item.get("spec") or {}, _created(item))
        except SpecError as error:
            log.info("stridejob refused", stridejob=Informer.key(item), why=str(error))
            await self._status(item, {"phase": "Invalid", "message": str(error)}, "InvalidSpec")
            return
        spec.user = namespace_tenant(meta["namespace"])
        try:
            job = await self.admission.submit(spec, meta["uid"])
        except Refused as error:
            log.info("stridejob refused by admission", stridejob=Informer.key(item), why=str(error))
            await self._status(item, {"phase": "Invalid", "message": str(error)}, "Refused")
            return
        self._owners[job.job_id] = Owner(meta["name"], meta["uid"], meta["namespace"])
        self._keys[job.job_id] = Informer.key(item)
        log.info("stridejob submitted", stridejob=Informer.key(item), job_id=job.job_id)
        await self._write_status(item, job)

    async def _write_status(self, item: dict[str, Any], job: pb.Job) -> None:
        phase = PHASES.get(job.state, "Submitted")
        decision = job.decision
        fields: dict[str, Any] = {
            "jobId": job.job_id,
            "phase": phase,
            "message": decision.reason,
            "earliestDeadline": _time(decision.earliest_deadline) or None,
            "guaranteedFinish": _time(decision.guaranteed_finish) or None,
        }
        if phase not in ("Rejected", "Submitted"):
            version, ready, total = await self.counts(job.job_id)
            fields.update(planVersion=version, readyPods=ready, pods=total)
        found = await self.progress(job.job_id) if self.progress is not None else None
        if found is not None:
            words, percent = describe(found)
            fields.update(progress=words, percentDone=percent)
        admitted = phase not in ("Rejected", "Submitted", "Queued")
        await self._status(item, fields, "Admitted" if admitted else phase, admitted)

    async def _status(
        self,
        item: dict[str, Any],
        fields: dict[str, Any],
        reason: str,
        admitted: bool = False,
    ) -> None:
        meta = item["metadata"]
        old = item.get("status") or {}
        conditions = [c for c in old.get("conditions") or [] if c.get("type") != "Admitted"]
        before: dict[str, Any] = next(
            (c for c in old.get("conditions") or [] if c.get("type") == "Admitted"), {}
        )
        state = "True" if admitted else "False"
        conditions.append(
            {
                "type": "Admitted",
                "status": state,
                "reason": reason,
                "message": str(fields.get("message") or "")[:1000],
                "lastTransitionTime": before.get("lastTransitionTime")
                if before.get("status") == state
                else _now(),
            }
        )
        status = {**fields, "conditions": conditions, "observedGeneration": meta.get("generation")}
        if (
            all(old.get(k) == v for k, v in status.items() if k != "conditions")
            and old.get("conditions") == conditions
        ):
            return
        merge: Any = {"_content_type": MERGE_PATCH}
        await self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            {"status": status},
            **merge,
        )

    async def _patch(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        merge: Any = {"_content_type": MERGE_PATCH}
        try:
            await self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, body, **merge
            )
        except ApiException as error:
            if error.status != 404:
                raise
