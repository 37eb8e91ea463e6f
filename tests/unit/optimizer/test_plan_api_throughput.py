"""The throughput GetPlan answers with (what `stride top` shows): the newest step metrics'
rate, from the open window or else the newest closed one."""

from __future__ import annotations

from dataclasses import replace

from stride.optimizer.adapters.inbound.grpc_api import newest_throughput
from stride.optimizer.domain import observations as obs
from stride.policy.stages import Pods, Sample

PODS = Pods(1, 8, 4, 2, 4, 8)
RULE = obs.WindowRule(tick_seconds=60.0)


def report(at: float, rate: float, steps: int = 10) -> obs.StepReport:
    return obs.StepReport("job-1-chief-0", 1, steps, rate, int(at * rate), at, 1.0)


def test_nothing_measured_is_zero() -> None:
    assert newest_throughput(None) == 0.0
    assert newest_throughput(obs.Observations().for_plan(1, PODS, 0.0)) == 0.0


def test_the_open_window_weighted_by_steps() -> None:
    view = obs.add_steps(obs.Observations().for_plan(1, PODS, 0.0), report(10.0, 100.0), RULE)
    view = obs.add_steps(view, report(40.0, 200.0, steps=30), RULE)
    assert view.window.steps == 40
    assert newest_throughput(view) == (100.0 * 10 + 200.0 * 30) / 40


def test_the_newest_closed_window_while_none_is_open() -> None:
    view = obs.add_steps(obs.Observations().for_plan(1, PODS, 0.0), report(10.0, 100.0), RULE)
    view = obs.add_steps(view, report(70.0, 300.0, steps=10), RULE)
    assert view.window.steps == 0 and view.pending == 1
    assert newest_throughput(view) == 200.0
    # Reports wait while the decision is due; the newest sample is the newest measurement.
    view = obs.add_steps(view, report(80.0, 999.0), RULE)
    assert newest_throughput(view) == 200.0
    older = replace(view, samples=(Sample(Pods(2, 8, 4, 2, 4, 8), 50.0), *view.samples))
    assert newest_throughput(older) == 200.0
