"""GoldMiner's cluster level, live (stride.optimizer.domain.allocation and the feeding's
part in it): which jobs take part, their curves, bounds and budget, and the data workers an
allocation becomes."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from stride.optimizer.domain.allocation import (
    budget,
    data_worker_sizes,
    elastic_job,
    remaining_steps,
    training_workers,
)
from stride.optimizer.domain.feeding import Feeding, FeedRule, with_data_workers
from stride.optimizer.settings import OptimizerSettings
from stride.policy.goldminer import (
    PipelineConfiguration,
    QueueObservation,
    TunerState,
    TuningPhase,
)
from stride.policy.plans import Plan, PodOverride, Role, RoleResources

GIB = 1024**3
RULE = FeedRule(interval_seconds=30.0, cpu_unit=0.5, max_data_worker_cpu=2.0, max_data_workers=4)
CHIEF = RoleResources(Role.CHIEF, 1, 1.0, 2 * GIB)
WORKER = RoleResources(Role.WORKER, 2, 1.0, 4 * GIB)


def plan(*roles: RoleResources) -> Plan:
    return Plan(roles=roles, reason="test", algorithm="test/1")


def converged(data_workers: int, size: int, *, fell_back: bool = False) -> TunerState:
    configuration = (
        PipelineConfiguration(data_workers, size, 1)
        if data_workers
        else PipelineConfiguration(0, 0, 1)
    )
    return TunerState(TuningPhase.CONVERGED, configuration, fell_back=fell_back)


def measuring(data_workers: int, size: int) -> Feeding:
    phase = TuningPhase.DATA_WORKER_SIZE if data_workers == 1 else TuningPhase.DATA_WORKER_COUNT
    state = TunerState(
        phase, PipelineConfiguration(data_workers, size, 1), size_throughputs=(0.0,) * (size - 1)
    )
    return Feeding(state=state)


def test_an_interval_from_data_workers_records_the_rate_per_cpu_and_the_ideal_rate() -> None:
    feeding = measuring(1, 2).measured(QueueObservation(0.5, 0.5, 1.0, 0.0, 8))
    assert (feeding.rate_per_cpu, feeding.ideal_rate) == (0.25, 1.0)
    # The best rate a CPU delivered stays (a throttled interval delivers less per CPU).
    merged = replace(measuring(2, 4), rate_per_cpu=feeding.rate_per_cpu).measured(
        QueueObservation(1.0, 1.0, 1.2, 8.0, 8)
    )
    assert (merged.rate_per_cpu, merged.ideal_rate) == (0.25, 1.2)
    # The baseline (no data workers) measures neither.
    baseline = Feeding(state=converged(0, 0)).measured(QueueObservation(0.3))
    assert (baseline.rate_per_cpu, baseline.ideal_rate) == (0.0, 0.0)


def test_only_a_finished_search_with_measured_data_workers_is_elastic() -> None:
    done = Feeding(state=converged(2, 4), rate_per_cpu=0.2, ideal_rate=1.0)
    assert done.elastic and done.given_sizes == (4, 4)
    assert not Feeding(state=converged(2, 4)).elastic  # nothing measured
    assert not Feeding(state=converged(0, 0, fell_back=True), rate_per_cpu=0.2).elastic
    operator = Feeding(state=converged(2, 4), rate_per_cpu=0.2, ideal_rate=1.0, held="operator")
    assert not operator.elastic
    searching = Feeding(state=measuring(1, 2).state, rate_per_cpu=0.2, ideal_rate=1.0)
    assert not searching.elastic


def test_an_allocation_becomes_data_workers_with_a_smaller_last_one_and_back() -> None:
    grown = with_data_workers(plan(CHIEF, WORKER), (4, 4, 1), RULE, "why", "alloc/1")
    (data,) = [r for r in grown.roles if r.role is Role.DATA_WORKER]
    assert (data.count, data.cpu, data.memory_bytes) == (3, 2.0, 4 * GIB)
    assert data.overrides == (PodOverride(2, 0.5, 4 * GIB),)
    assert data_worker_sizes(grown, RULE) == (4, 4, 1)
    # An OOM rule's bigger memory stays with its pod at the pod's new size.
    oom = RoleResources(Role.DATA_WORKER, 2, 2.0, GIB, overrides=(PodOverride(1, 2.0, 3 * GIB),))
    shrunk = with_data_workers(plan(CHIEF, oom), (3, 2), RULE, "why", "alloc/1")
    (data,) = [r for r in shrunk.roles if r.role is Role.DATA_WORKER]
    assert (data.cpu, data.overrides) == (1.5, (PodOverride(1, 1.0, 3 * GIB),))
    none = with_data_workers(shrunk, (), RULE, "why", "alloc/1")
    assert data_worker_sizes(none, RULE) == ()


def test_a_jobs_curve_is_bounded_by_its_share_beside_its_training_pods() -> None:
    feeding = Feeding(state=converged(2, 4), rate_per_cpu=0.2, ideal_rate=1.0)
    current = with_data_workers(plan(CHIEF, WORKER), (4, 4), RULE, "why", "a/1")
    assert training_workers(current) == 3
    free = elastic_job("j", 7, feeding, current, RULE, 90, None)
    assert free.sizes == (4, 4) and free.cpu == 8
    curve = free.curve
    assert (curve.throughput_at(1), curve.ideal, curve.gpus) == (0.2, 1.0, 3)
    assert (curve.remaining_steps, curve.max_data_worker_cpu, curve.max_cpu) == (90, 4, 16)
    # A share of 5.5 cores: 3 for the chief and workers leave 2.5, 5 units.
    shared = elastic_job("j", 7, feeding, current, RULE, 90, 5.5)
    assert shared.curve.max_cpu == 5
    # A share smaller than the training pods leaves none.
    assert elastic_job("j", 7, feeding, current, RULE, 90, 2.0).curve.max_cpu == 0


def test_the_budget_is_free_cpus_and_what_the_jobs_hold_or_their_whole_demand() -> None:
    feeding = Feeding(state=converged(1, 4), rate_per_cpu=0.2, ideal_rate=1.0)
    current = with_data_workers(plan(CHIEF, WORKER), (4,), RULE, "why", "a/1")
    jobs = [
        elastic_job("a", 2, feeding, current, RULE, 10, None),
        elastic_job("b", 2, feeding, current, RULE, 10, 4.5),  # room for 3 units
    ]
    assert budget(jobs, 1.25, RULE) == 2 + 4 + 4  # 1.25 cores: two whole units free
    assert budget(jobs, None, RULE) == 5 + 3  # to the ideal (5 units), or the bound


def test_remaining_steps_count_what_the_job_has_not_consumed() -> None:
    assert remaining_steps(100_000, 0, 512) == 196
    assert remaining_steps(100_000, 99_840, 512) == 1
    assert remaining_steps(100_000, 200_000, 512) == 1  # done, not yet finished


def test_settings_name_an_unknown_allocation_policy() -> None:
    with pytest.raises(ValidationError, match="data_worker_allocation"):
        OptimizerSettings(data_worker_allocation="biggest-first")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="allocation_interval_seconds"):
        OptimizerSettings(allocation_interval_seconds=0)
