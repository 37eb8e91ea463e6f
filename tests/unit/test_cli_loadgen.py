"""`stride loadgen`'s pure parts: the jobs it submits, its comparison, its bad input."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from stride.cli.loadgen import Decided, DecisionWatch, Played, compare, job_spec
from stride.cli.main import app
from stride.events.v1 import optimization_pb2, plan_pb2
from stride.sim.dlrm import DlrmJobSpec, generate_jobs, load_straggler_covs, simulate
from stride.testing import SHARED_TRACES
from stride.vocabulary.jobspec import JobSpec, validate

COVS = SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"


def population(count: int) -> list[DlrmJobSpec]:
    return generate_jobs(count, np.random.default_rng(4), load_straggler_covs(COVS))


def test_the_jobs_are_valid_specs_marked_simulated() -> None:
    for index, spec in enumerate(population(5)):
        message = job_spec(index, spec, "loadgen-s4")
        assert message.simulated and message.user == "loadgen"
        validate(JobSpec.from_message(message), None)  # admission's own rules
        assert message.dataset.record_count == int(spec.total_samples)
        assert message.model.parameter_count == round(spec.model_bytes / 4)


def test_the_comparison_runs_the_simulator_on_the_same_jobs_from_the_same_start() -> None:
    jobs = population(4)
    started = [replace(spec, submit_time=0.0) for spec in jobs]
    truth = simulate(started, 10**6, 10**7, "stride", 4, 180.0)
    played = [
        Played(i, f"job-{i}", True, jct, 10, 3, 9, 0, start=spec.request)
        for i, (spec, jct) in enumerate(zip(jobs, truth.jcts, strict=True))
    ]
    report = compare(played, jobs, 4, 180.0)
    assert report["completed"] == 4 and report["windows"] == 40
    assert report["agreement"] == 0.9
    assert math.isclose(report["live"]["median_s"], report["sim"]["median_s"])
    assert math.isclose(report["live"]["p90_s"], report["sim"]["p90_s"])


def test_bad_input_is_named(tmp_path: Path) -> None:
    runner = CliRunner()
    env = {"STRIDE_STATE_DIR": str(tmp_path / "none")}
    wrong_env = runner.invoke(app, ["loadgen", "--env", "deadline"], env=env)
    assert wrong_env.exit_code != 0 and "--env: only dlrm" in wrong_env.output
    no_traces = runner.invoke(app, ["loadgen", "--traces", str(tmp_path)], env=env)
    assert no_traces.exit_code != 0 and "--traces" in no_traces.output
    no_suite = runner.invoke(app, ["loadgen", "--traces", str(SHARED_TRACES)], env=env)
    assert no_suite.exit_code != 0 and "no running suite" in no_suite.output
    zero = runner.invoke(app, ["loadgen", "--jobs", "0"], env=env)
    assert zero.exit_code != 0
    negative = runner.invoke(app, ["loadgen", "--window-seconds", "-1"], env=env)
    assert negative.exit_code != 0 and "--window-seconds" in negative.output


async def test_the_decision_watch_keeps_each_jobs_newest_plan_and_window() -> None:
    watch = DecisionWatch()
    wake = watch.event("job-a")
    watch.plan("job-a", plan_pb2.ResourcePlan(job_id="job-a", version=3))
    watch.plan("job-a", plan_pb2.ResourcePlan(job_id="job-a", version=2))  # late, older
    assert watch.plans["job-a"].version == 3 and wake.is_set()
    wake.clear()
    decided = optimization_pb2.WindowDecided(job_id="job-a", window=5, plan_version=3)
    watch.window("job-a", decided)
    watch.window("job-a", optimization_pb2.WindowDecided(job_id="job-a", window=4))
    assert watch.decided["job-a"] == Decided(5, 3) and wake.is_set()
    assert "job-b" not in watch.plans and not watch.event("job-b").is_set()
