"""The optimizer's windowed view of a job, and the conversions around the stage step."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from stride.optimizer.domain import observations as obs
from stride.optimizer.domain.administrator import Administrator, JobStage, RootCause
from stride.optimizer.domain.tuning import (
    Explanation,
    on_stage_reply,
    pods_of,
    with_pods,
)
from stride.policy.plans import Plan, Role, RoleResources
from stride.policy.stages import (
    SAMPLES_PER_CONFIG,
    MemoryPoint,
    Pods,
    Sample,
    Stage,
    StageReply,
    search_space,
)

GIB = 1024**3
PODS = Pods(1, 8, 4, 2, 4, 8)
RULE = obs.WindowRule(tick_seconds=60.0)


def view() -> obs.Observations:
    return obs.Observations().for_plan(1, PODS, 0.0)


def report(
    at: float, rate: float = 100.0, version: int = 1, steps: int = 10, step: float = 3.0
) -> obs.StepReport:
    return obs.StepReport("job-1-chief-0", version, steps, rate, int(at * rate), at, step)


def test_a_window_closes_into_one_sample_after_the_tick_and_weights_by_steps() -> None:
    v = obs.add_steps(view(), report(30.0, rate=100.0), RULE)
    assert v.sample_count == 0 and v.window.steps == 10
    v = obs.add_steps(v, report(61.0, rate=200.0, steps=30), RULE)
    assert v.sample_count == 1 and v.pending == 1
    assert v.samples == (Sample(PODS, (100.0 * 10 + 200.0 * 30) / 40),)
    assert v.window == obs.Window()
    # While a decision is due, steps are not sampled (the step decides on what it has).
    assert obs.add_steps(v, report(130.0), RULE).window == obs.Window()


def test_redelivered_reports_change_nothing_and_older_ones_are_refused() -> None:
    v = obs.add_steps(view(), report(30.0), RULE)
    assert obs.add_steps(v, report(30.0), RULE) is v
    with pytest.raises(obs.MetricRefused, match="out of order"):
        obs.add_steps(v, report(29.0), RULE)
    for bad, field in (
        (replace(report(40.0), steps=0), "steps"),
        (replace(report(40.0), samples_per_second=float("nan")), "samples_per_second"),
        (replace(report(40.0), samples_consumed=-1), "samples_consumed"),
        (replace(report(40.0), plan_version=-1), "plan_version"),
    ):
        with pytest.raises(obs.MetricRefused, match=field):
            obs.add_steps(v, bad, RULE)


def test_another_plans_steps_are_not_sampled_but_move_progress() -> None:
    v = obs.add_steps(view(), report(90.0, version=2), RULE)
    assert v.window == obs.Window() and v.sample_count == 0 and v.consumed == 9000


def test_outliers_are_dropped_and_samples_are_bounded_per_configuration() -> None:
    v = view()
    at = 0.0
    for _ in range(7):
        at += 61.0
        v = replace(obs.add_steps(v, report(at, steps=1, step=61.0), RULE), pending=-1)
    assert v.sample_count == 7 and len(v.samples) == SAMPLES_PER_CONFIG
    at += 61.0
    wild = obs.add_steps(v, report(at, rate=1000.0, steps=1, step=61.0), RULE)
    assert wild.outliers == 1 and wild.sample_count == 7 and wild.pending == -1


def usage(role: str, memory_gib: float, cpu: float = 1.0, at: float = 1.0) -> obs.PodUsage:
    return obs.PodUsage(role, cpu, int(memory_gib * GIB), 4.0, 1, at)


def test_usage_gives_the_first_memory_point_measured_hot_ps_and_stragglers() -> None:
    v = obs.add_usage(view(), "w0", usage("worker", 2.5))
    v = obs.add_usage(v, "p0", usage("ps", 3.0, cpu=3.0))
    assert not obs.measured(v, RULE) and not v.memory_points
    v = obs.add_usage(v, "p1", usage("ps", 1.0, cpu=1.0))
    assert obs.measured(v, RULE)
    assert v.memory_points == (MemoryPoint(0.0, 4.0, 3.0),)
    assert obs.worker_memory_used_gib(v) == 2.5
    assert obs.hot_ps(v)
    # A usage sample of another plan, or an older one, is not kept.
    assert obs.add_usage(v, "w0", replace(usage("worker", 9.0), plan_version=2)) == v
    assert obs.add_usage(v, "w0", usage("worker", 9.0, at=0.5)) == v
    v2 = replace(view(), pods=replace(PODS, workers=3))
    for name, cpu in (("w0", 2.0), ("w1", 2.1), ("w2", 0.5)):
        v2 = obs.add_usage(v2, name, usage("worker", 1.0, cpu=cpu))
    assert obs.stragglers(v2) == ("w2",)
    with pytest.raises(obs.MetricRefused, match="cpu_used"):
        obs.add_usage(v, "w0", usage("worker", 1.0, cpu=-1.0))


def test_the_view_survives_its_storage_form() -> None:
    v = obs.add_usage(view(), "w0", usage("worker", 2.5))
    v = obs.add_steps(v, report(61.0, steps=1), RULE)
    v = replace(v, hold_until=5.0, last_fit_sample_count=3)
    assert obs.from_json(obs.to_json(v)) == v
    # A job read by steps: the newest report's input queue is kept, and survives too.
    queue = obs.InputQueue(2, 30.0, 31.5, 0.25, 7)
    v = obs.add_steps(v, replace(report(70.0, steps=1), input_queue=queue), RULE)
    assert v.input_queue == queue
    v = obs.add_steps(v, report(80.0, steps=1), RULE)  # a report without one keeps it
    assert v.input_queue == queue and obs.from_json(obs.to_json(v)) == v


def plan(workers: int = 1) -> Plan:
    return Plan(
        (
            RoleResources(Role.CHIEF, 1, 0.5, GIB),
            RoleResources(Role.WORKER, workers, 7.5, int(3.2 * GIB)),
            RoleResources(Role.PS, 2, 4.0, 8 * GIB),
        ),
        "cold start",
        "cold-start-plan/1",
    )


def test_plans_and_pods_convert_both_ways_keeping_other_roles() -> None:
    assert pods_of(plan()) == PODS  # cores and GiB rounded up
    grown = with_pods(plan(), replace(PODS, workers=4, worker_mem_gib=2), "sampling: probe")
    assert grown.role(Role.CHIEF) == plan().role(Role.CHIEF)
    worker = grown.role(Role.WORKER)
    assert worker is not None and (worker.count, worker.cpu, worker.memory_bytes) == (4, 8, 2 * GIB)
    assert grown.algorithm == "stride-stage-step/1"
    no_ps = Plan((RoleResources(Role.WORKER, 1, 1.0, GIB),), "r", "a/1")
    assert pods_of(no_ps) is None


def test_the_search_space_never_offers_a_pod_bigger_than_a_node() -> None:
    space = search_space(2.5, None)
    assert space.worker_cpu == (1, 2) and space.ps_cpu == (1, 2)
    assert search_space(0.5, 16).worker_cpu == (1,)
    assert search_space(None, 16).job_cpu_limit == 16


def test_a_held_decision_records_its_event_and_publishes_nothing() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    admin = Administrator("job-1", JobStage.COLD_START, 1)
    reply = StageReply(replace(PODS, worker_cpu=16), False, Stage.SAMPLING, "probe worker_cpu")
    why = Explanation("stride-stage-step/1", "sampling", "", "probe worker_cpu")
    step, explained = on_stage_reply(admin, plan(), reply, "e1", why, False, "held", now)
    assert not step.plans and explained is None
    assert step.after == Administrator("job-1", JobStage.SAMPLING, 1)
    assert step.events[0].detail == "probe worker_cpu; held: held"
    step, explained = on_stage_reply(admin, plan(), reply, "e1", why, False, "", now)
    assert step.plans[0].version == 2 and explained is not None
    assert explained.root_cause == RootCause.SAMPLING.value
    kept = StageReply(None, False, Stage.OPTIMIZING, "model: the current pods are within 10%")
    step, explained = on_stage_reply(admin, plan(), kept, "e2", why, True, "", now)
    assert not step.events and step.after is not None and step.after.stage is JobStage.STEADY


def test_a_due_decision_waits_for_usage_of_its_window_and_takes_its_memory_point() -> None:
    v = obs.add_usage(view(), "w0", usage("worker", 2.0))
    v = obs.add_usage(v, "p0", usage("ps", 1.0, at=1.0))
    v = obs.add_usage(v, "p1", usage("ps", 1.0, at=1.0))
    first = v.memory_points
    v = obs.add_steps(v, report(200.0, steps=1, step=61.0), RULE)
    assert v.pending == 1 and v.closed_at == 200.0
    # The PS usage is from before the window: the decision waits for this window's.
    assert not obs.measured(v, RULE)
    # Taken the moment the window began (the previous window's close): still the previous.
    v = obs.add_usage(v, "p0", usage("ps", 3.0, at=200.0 - RULE.tick_seconds))
    v = obs.add_usage(v, "p1", usage("ps", 3.0, at=200.0 - RULE.tick_seconds))
    assert not obs.measured(v, RULE)
    v = obs.add_usage(v, "p0", usage("ps", 3.0, at=199.0))
    assert not obs.measured(v, RULE)
    v = obs.add_usage(v, "p1", usage("ps", 2.0, at=199.5))
    assert obs.measured(v, RULE)
    taken = obs.with_memory_point(v)
    assert taken.memory_points == (*first, MemoryPoint(20000.0, 5.0, 3.0))


def test_the_first_memory_point_counts_even_when_the_first_window_closed_before_it() -> None:
    """Usage and steps travel on different streams: the PS usage taken as the pods loaded
    may be applied after the first window closed; it is still the first point, at 0."""
    v = obs.add_usage(view(), "w0", usage("worker", 2.0, at=5.0))
    v = obs.add_steps(v, report(200.0, steps=1, step=61.0), RULE)
    assert v.pending == 1 and v.started_at == 139.0 and not v.memory_points
    v = obs.add_usage(v, "p0", usage("ps", 1.0, at=5.0))
    v = obs.add_usage(v, "p1", usage("ps", 1.0, at=5.0))
    assert v.memory_points == (MemoryPoint(0.0, 2.0, 1.0),)
    v = obs.add_usage(v, "p0", usage("ps", 3.0, at=199.0))
    v = obs.add_usage(v, "p1", usage("ps", 2.0, at=199.5))
    assert obs.measured(v, RULE)
    assert obs.with_memory_point(v).memory_points == (
        MemoryPoint(0.0, 2.0, 1.0),
        MemoryPoint(20000.0, 5.0, 3.0),
    )
    # Usage taken after the first window began is not the loaded pods' point.
    late = obs.add_steps(
        obs.add_usage(view(), "w0", usage("worker", 2.0)), report(200.0, steps=1, step=61.0), RULE
    )
    late = obs.add_usage(late, "p0", usage("ps", 3.0, at=150.0))
    late = obs.add_usage(late, "p1", usage("ps", 2.0, at=150.0))
    assert not late.memory_points
    assert obs.from_json(obs.to_json(v)) == v


def test_the_first_plans_usage_applied_after_an_oom_plan_still_makes_the_first_point() -> None:
    """A PS OOM-killed right after the pods loaded: plan 2 is stored before plan 1's usage
    is applied. That usage is still the pods as loaded: it makes the first memory point."""
    v = obs.Observations().for_plan(1, PODS, 0.0).for_plan(2, replace(PODS, ps_mem_gib=16), 1.0)
    assert v.request == PODS and v.plan_version == 2
    v = obs.add_usage(v, "p0", usage("ps", 3.0, at=5.0))  # plan 1's
    assert not v.memory_points and v.loaded
    v = obs.add_usage(v, "w0", usage("worker", 2.0, at=5.0))  # a worker's: not needed
    v = obs.add_usage(v, "p1", usage("ps", 1.0, at=5.0))
    assert v.memory_points == (MemoryPoint(0.0, 4.0, 3.0),) and not v.loaded
    assert obs.from_json(obs.to_json(v)) == v
    # Once the first point exists, an old plan's usage changes nothing.
    assert obs.add_usage(v, "p0", usage("ps", 9.0, at=6.0)) == v
