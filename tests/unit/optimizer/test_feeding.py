"""GoldMiner's tuner, live (stride.optimizer.domain.feeding): when an interval is measured,
what its observation is, and the data-worker role a configuration asks for."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stride.optimizer.domain import observations as obs
from stride.optimizer.domain.feeding import (
    Feeding,
    FeedRule,
    QueueWindow,
    add_window,
    configuration_of,
    observation,
    with_configuration,
)
from stride.optimizer.settings import OptimizerSettings
from stride.policy.goldminer import (
    PipelineConfiguration,
    TunerRequest,
    TunerState,
    TuningPhase,
    tune_step,
)
from stride.policy.plans import Plan, PodOverride, Role, RoleResources

GIB = 1024**3
RULE = FeedRule(interval_seconds=30.0, cpu_unit=0.5, max_data_worker_cpu=2.0, max_data_workers=4)


def window(seconds: float = 10.0, rate: float = 2.0, length: int = 0) -> QueueWindow:
    return QueueWindow(seconds, rate, rate, 5.0, length, 8)


def started() -> Feeding:
    """After the search's first step: the baseline, measured with no data workers."""
    first = tune_step(TunerRequest(config=RULE.config()))
    return Feeding(state=first.state)


def test_the_tuner_config_fixes_the_training_worker_and_counts_half_cores() -> None:
    config = RULE.config()
    assert (config.initial_training_worker_cpu, config.max_training_worker_cpu) == (1, 1)
    assert config.data_worker_container_cpu == 4  # 2 cores of 0.5
    assert (config.training_workers, config.max_data_workers) == (1, 4)


def test_the_first_report_of_a_queue_starts_the_search_at_once() -> None:
    fed = add_window(Feeding(), window(), 0, RULE)
    assert fed.due and fed.windows == ()
    assert observation(fed, 0.5) is None  # the first step needs no observation


def test_an_interval_is_due_once_its_windows_of_the_plans_data_workers_add_up() -> None:
    feeding = started()
    feeding = add_window(feeding, window(10.0), 0, RULE)
    feeding = add_window(feeding, window(10.0), 1, RULE)  # another plan's data workers
    assert not feeding.due and len(feeding.windows) == 1
    feeding = add_window(feeding, window(10.0), 0, RULE)
    assert not feeding.due
    feeding = add_window(feeding, window(10.0), 0, RULE)
    assert feeding.due and len(feeding.windows) == 3
    # Due: later windows wait for the step.
    assert add_window(feeding, window(), 0, RULE) == feeding


def test_a_new_plan_starts_a_new_interval() -> None:
    feeding = add_window(started(), window(20.0), 0, RULE)
    moved = feeding.for_plan(2)
    assert moved.windows == () and moved.data_workers == 2 and not moved.due
    # The very first step stays due across a plan (it needs no interval).
    assert add_window(Feeding(), window(), 0, RULE).for_plan(0).due


def test_the_observation_weighs_windows_by_their_training_time() -> None:
    feeding = Feeding(
        state=started().state,
        windows=(window(10.0, 1.0, 2), window(30.0, 3.0, 6)),
    )
    seen = observation(feeding, 1.7)
    assert seen is not None
    assert seen.throughput == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert seen.dequeue_rate == 5.0  # the same in every window: kept exactly
    assert seen.queue_length == pytest.approx(4.0)  # the mean of the windows' ends
    assert seen.queue_capacity == 8
    assert seen.training_cpu_utilization == 1.0  # capped


def test_a_search_that_converged_or_ended_takes_no_more_windows() -> None:
    state = started().state
    assert state is not None
    converged = Feeding(state=TunerState(TuningPhase.CONVERGED, state.configuration))
    assert add_window(converged, window(60.0), 0, RULE) == converged
    ended = Feeding(state=state, held="an operator's plan set the data workers")
    assert not ended.tuning and add_window(ended, window(60.0), 0, RULE) == ended


def plan(*roles: RoleResources) -> Plan:
    return Plan(roles=roles, reason="test", algorithm="test/1")


CHIEF = RoleResources(Role.CHIEF, 1, 1.0, 2 * GIB)
WORKER = RoleResources(Role.WORKER, 2, 1.0, 4 * GIB)


def test_a_configuration_becomes_the_data_worker_role_and_back() -> None:
    before = plan(CHIEF, WORKER)
    assert configuration_of(before, RULE) == PipelineConfiguration(0, 0, 1)
    grown = with_configuration(before, PipelineConfiguration(2, 3, 1), RULE, "why", "alg/1")
    (data,) = [r for r in grown.roles if r.role is Role.DATA_WORKER]
    # 3 units of half a core; a worker's memory (the pre-processing it takes over).
    assert (data.count, data.cpu, data.memory_bytes) == (2, 1.5, 4 * GIB)
    assert grown.roles[:2] == (CHIEF, WORKER) and grown.algorithm == "alg/1"
    assert configuration_of(grown, RULE) == PipelineConfiguration(2, 3, 1)


def test_fewer_data_workers_keep_their_size_and_drop_overrides_of_gone_pods() -> None:
    held = RoleResources(Role.DATA_WORKER, 3, 1.0, GIB, overrides=(PodOverride(2, 1.0, 2 * GIB),))
    fallen = with_configuration(
        plan(CHIEF, WORKER, held), PipelineConfiguration(0, 0, 1), RULE, "back", "a/1"
    )
    (data,) = [r for r in fallen.roles if r.role is Role.DATA_WORKER]
    assert (data.count, data.cpu, data.overrides) == (0, 1.0, ())
    assert configuration_of(fallen, RULE) == PipelineConfiguration(0, 0, 1)


def test_the_view_keeps_its_tuning_through_json() -> None:
    feeding = add_window(started(), window(12.0, 1.5, 3), 0, RULE)
    view = obs.Observations(plan_version=3, feeding=feeding)
    assert obs.from_json(obs.to_json(view)) == view
    # A view stored before the tuner existed reads as one with nothing tuned.
    old = obs.to_json(obs.Observations(plan_version=2)).replace(', "feeding"', ', "unused"')
    assert obs.from_json(old).feeding == Feeding()


def test_settings_refuse_a_data_worker_smaller_than_one_unit() -> None:
    with pytest.raises(ValidationError, match="max_data_worker_cpu"):
        OptimizerSettings(data_worker_cpu_unit=2.0, max_data_worker_cpu=1.0)
    with pytest.raises(ValidationError, match="tuning_interval_seconds"):
        OptimizerSettings(tuning_interval_seconds=0)
