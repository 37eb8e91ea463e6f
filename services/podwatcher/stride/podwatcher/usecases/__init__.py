"""The podwatcher's use cases: run each admitted job's pods as its newest plan says, report
how they end, relaunch them within a budget, and end the job.

The life of a job here (DLRover sec. 5.1, DLRover-RM sec. 5.2):

1. ``admitted`` stores the job's spec; a plan on the bus is recorded if it is the job's
   newest (a stale or duplicate version changes nothing, whatever order they arrive in).
2. ``apply`` reconciles the pods with the newest plan (:func:`~stride.podwatcher.domain.
   reconcile.reconcile`): new pods are written PENDING, then started, then RUNNING with a
   ``started`` event through the outbox. Resizes happen in place. When the TensorFlow
   cluster changes (scale out or in, a migrated PS), the chief is sent a RECONFIGURE
   command with the new cluster; the pods it no longer needs are removed only once it
   confirms (its agent's ack), so a scale-in or migration never pulls a PS or worker from
   under a running step. New pods start before the chief pauses, so the pause never
   includes a start-up. A chief that must move gets a new pod that starts as a standby
   (TensorFlow and the job's code loaded, waiting); when the old chief has saved and
   handed over (its ack), or has ended without doing so, the standby is sent RESUME with
   the checkpoint and the new cluster, and the old chief is removed.
3. ``pod_ended`` records how a pod ended, publishes ``failed``/``succeeded``/``deleted``
   with the reason (OOMKilled read from the cgroup, Evicted, Error with the exit code and
   log tail), and then:
   - the chief succeeded: every shard of the last epoch is done, so the job SUCCEEDED,
     its other pods are removed and ``finished`` is published;
   - a pod failed within the relaunch budget: it is relaunched under its own name and
     address (a PS or worker is found again where it was). An OOM-killed pod first waits
     (``oom_replan_seconds``) for the optimizer's next plan, which gives it more memory by
     the policy's OOM rule; without one it is relaunched as it was;
   - over budget: the job FAILED with the reason, its pods are removed, ``finished``.
4. ``job_finished`` (a cancel from admission) removes the job's pods; checkpoints stay in
   the cache.
5. A plan with no pods **suspends** the job (admission preempted it, or gave its units to
   guaranteed jobs): the chief is sent PAUSE, which finishes its steps, flushes the data
   feed and saves a flash checkpoint (with the dispatcher's shard positions) before it
   answers; then every pod is removed. The seamless-migration path's order (checkpoint,
   then remove), so the job resumes where it stopped: when a plan with pods comes again,
   the new pods start and the chief restores that checkpoint, and the dispatcher puts its
   shards back as they were, nothing lost or repeated. Without a running chief, or without
   an answer in ``reconfigure_timeout_seconds``, the pods are removed all the same and the
   job resumes from its newest periodic checkpoint.

**The reconcile loop** (KOD2 sec. 4.2; Ray autoscaler v2's instance manager). Events do
not apply plans themselves: a recorded plan, an admission, a pod's end, a node restored or
a sweep only put the job's id in a rate-limited work queue (:class:`~stride.podwatcher.
workqueue.WorkQueue`), and :meth:`PodWatcher.reconcile_loop`'s workers take ids one at a
time and run a pass, :meth:`PodWatcher.apply`: read the newest plan and the job's pods,
compare them through the pure :func:`~stride.podwatcher.domain.reconcile.reconcile`, take
the step it gives and record it. A pass that fails is queued again after a back-off per
job; an OOM-killed pod's job is queued for after its wait. A job queued many times before a
worker takes it gets one pass, and one job never has two passes at once.

Each job is handled under its own lock, so a plan, a pod's end and an ack never interleave
for one job. Every step is idempotent: the database says what was done, and running it
again after a crash or a redelivery does nothing twice.
"""

from __future__ import annotations

from stride.podwatcher.usecases.common import (
    FAILURE_REASONS,
    JobNotAdmitted,
    NodeView,
    PodView,
    PortPicker,
    Timing,
    free_port,
    now_utc,
)
from stride.podwatcher.usecases.inventory import Inventory
from stride.runtime.errors import FailedPrecondition


class PodWatcher(Inventory):
    """Runs jobs' pods through a backend, as their newest plans say. Its rooms, each a
    class the next extends: :mod:`.core` (state, shared steps), :mod:`.moves` (resizes,
    the chief's handovers), :mod:`.ends` (pod ends, relaunches), :mod:`.applying` (the
    reconcile loop), :mod:`.intake` (plans and admissions), :mod:`.inventory` (start-up,
    nodes, views)."""


__all__ = [
    "FAILURE_REASONS",
    "FailedPrecondition",
    "JobNotAdmitted",
    "NodeView",
    "PodView",
    "PodWatcher",
    "PortPicker",
    "Timing",
    "free_port",
    "now_utc",
]
