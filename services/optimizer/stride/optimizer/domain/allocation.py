"""GoldMiner's cluster level, live (sec. 3.4.2): what the optimizer reads of each job whose
data workers are elastic, and the request that divides the data-worker CPUs among them.

A job takes part once its job-level search is over with data workers it measured
(:attr:`~stride.optimizer.domain.feeding.Feeding.elastic`). Its curve is the paper's
optimistic one, built by :func:`stride.policy.goldminer.linear_curve` as the simulator
builds it: each tuner CPU adds the best rate one delivered during the search, up to the
training worker's rate when never starved.

The allocation is :func:`stride.policy.goldminer.allocate_data_worker_cpus`, through the
``tune_data_workers`` port, with the policy the optimizer is configured with (SRTF by
default: the lowest JCT of the three in Table 5).

Stride's additions to sec. 3.4.2, each because another owner decides the number:

- **Within admission's shares.** A job never gets more data-worker CPUs than its share
  leaves beside its training pods (``max_cpu`` of its curve): admission's guarantees are
  made on those shares.
- **The budget.** With a cluster capacity configured, the CPUs no plan holds plus those
  the elastic jobs' data workers hold now. Without one, nothing is contended: each job's
  demand up to its ideal rate, its share and its ``max_data_workers``.
- **Remaining steps** (``n`` of SRTF) come from the admitted spec's termination and the
  samples the job consumed; ``g`` of MaxTP is the job's training workers (chief and
  workers: Stride's jobs train on CPUs, each a share of the step the data feeds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stride.optimizer.domain.feeding import Feeding, FeedRule
from stride.policy.goldminer import JobThroughputCurve, linear_curve
from stride.policy.plans import Plan, Role

_EPSILON = 1e-9


@dataclass(frozen=True)
class ElasticJob:
    """One job as the cluster level sees it, and what it was seen at."""

    job_id: str
    plan_version: int
    feeding: Feeding
    sizes: tuple[int, ...]
    """Its plan's data workers, in tuner CPUs each."""
    curve: JobThroughputCurve

    @property
    def cpu(self) -> int:
        """Tuner CPUs its data workers hold now."""
        return sum(self.sizes)


def data_worker_sizes(plan: Plan, rule: FeedRule) -> tuple[int, ...]:
    """The plan's data workers, in whole tuner CPUs each, largest first."""
    role = next((r for r in plan.roles if r.role is Role.DATA_WORKER), None)
    if role is None:
        return ()
    units = [max(1, round(cpu / rule.cpu_unit)) for cpu, _ in role.pod_sizes()]
    return tuple(sorted(units, reverse=True))


def training_workers(plan: Plan) -> int:
    """Pods that train (chief and workers): ``g`` of MaxTP."""
    return max(1, sum(r.count for r in plan.roles if r.role in (Role.CHIEF, Role.WORKER)))


def remaining_steps(total_samples: float, consumed: int, batch_size: int) -> int:
    """Steps the job has left (``n`` of SRTF), at least 1 while it runs."""
    left = max(0.0, total_samples - consumed)
    return max(1, math.ceil(left / max(1, batch_size) - _EPSILON))


def elastic_job(
    job_id: str,
    plan_version: int,
    feeding: Feeding,
    plan: Plan,
    rule: FeedRule,
    remaining: int,
    share_cpu: float | None,
) -> ElasticJob:
    """The job's view for a round; ``share_cpu``: the cores its admission share allows
    (None: no share bounds it)."""
    assert feeding.state is not None, "an elastic job has a tuner state"
    size = feeding.state.configuration.data_worker_cpu
    sizes = data_worker_sizes(plan, rule)
    most = rule.max_data_workers * size
    if share_cpu is not None:
        beside = plan.total_cpu() - sum(sizes) * rule.cpu_unit
        most = min(most, max(0, math.floor((share_cpu - beside) / rule.cpu_unit + _EPSILON)))
    curve = linear_curve(
        job_id,
        feeding.rate_per_cpu,
        feeding.ideal_rate,
        gpus=training_workers(plan),
        remaining_steps=remaining,
        max_data_worker_cpu=size,
        max_cpu=most,
    )
    return ElasticJob(job_id, plan_version, feeding, sizes, curve)


def budget(jobs: Sequence[ElasticJob], free_cores: float | None, rule: FeedRule) -> int:
    """Tuner CPUs the round divides: what is free and what the jobs' data workers hold
    (``free_cores`` None: no capacity bound, so each job's whole demand)."""
    if free_cores is not None:
        held = sum(job.cpu for job in jobs)
        return max(0, math.floor(free_cores / rule.cpu_unit + _EPSILON)) + held
    return sum(_demand(job.curve) for job in jobs)


def _demand(curve: JobThroughputCurve) -> int:
    """Tuner CPUs that bring the job to its ideal rate (or its bound)."""
    rate = curve.throughput_at(1)
    wanted = math.ceil(curve.ideal / rate - _EPSILON) if rate > 0 else 0
    return wanted if curve.max_cpu is None else min(wanted, curve.max_cpu)
