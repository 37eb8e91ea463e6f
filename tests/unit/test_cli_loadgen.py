"""`stride loadgen`'s pure parts: the jobs it submits, its comparison, its bad input."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest
from grpc.aio import Metadata
from typer.testing import CliRunner

from stride.cli.loadgen import (
    Decided,
    DecisionWatch,
    JobPlayer,
    Played,
    PlayOptions,
    Tally,
    compare,
    job_spec,
)
from stride.cli.main import app
from stride.events.v1 import optimization_pb2, plan_pb2
from stride.policy.stages import search_space
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
    truth = simulate(started, 10**6, 10**7, "stride", 4, 180.0, pod_failures=False)
    played = [
        Played(i, f"job-{i}", True, jct, 10, 3, 9, 0, start=spec.request)
        for i, (spec, jct) in enumerate(zip(jobs, truth.jcts, strict=True))
    ]
    report = compare(played, jobs, 4, 180.0)
    assert report["completed"] == 4 and report["windows"] == 40
    assert report["agreement"] == 0.9
    assert math.isclose(report["live"]["median_s"], report["sim"]["median_s"])
    assert math.isclose(report["live"]["p90_s"], report["sim"]["p90_s"])
    assert report["comparable"] and report["sim_completed"] == 4


def test_a_comparison_the_simulator_cannot_run_says_why_instead_of_failing() -> None:
    jobs = population(2)
    # Plan 1 as the live services started it has more cores than the cluster the
    # comparison runs on could ever hold: the simulator refuses the jobs, and the report
    # says so in a line instead of a traceback.
    huge = replace(jobs[0].request, workers=10**6)
    played = [
        Played(0, "job-0", False, math.nan, 3, 1, 3, 0, start=huge),
        Played(1, "job-1", False, math.nan, 0, 0, 0, 0, error="stopped by --max-wall-seconds"),
    ]
    report = compare(played, jobs, 4, 180.0)
    assert not report["comparable"]
    assert "stride sim cannot run these jobs" in report["why"] and "exceeds" in report["why"]
    assert report["windows"] == 3 and report["agreement"] == 1.0
    assert report["per_job"][1]["error"] == "stopped by --max-wall-seconds"


def test_partial_runs_compare_run_times_over_the_jobs_that_completed_live() -> None:
    jobs = population(3)
    started = [replace(spec, submit_time=0.0) for spec in jobs]
    truth = simulate(started, 10**6, 10**7, "stride", 4, 180.0, pod_failures=False)
    played = [
        Played(0, "job-0", True, truth.jcts[0], 5, 2, 5, 0, start=jobs[0].request),
        Played(1, "job-1", False, math.nan, 2, 1, 2, 0, start=jobs[1].request, error="stopped"),
        Played(2, "job-2", True, truth.jcts[2], 5, 2, 5, 0, start=jobs[2].request),
    ]
    report = compare(played, jobs, 4, 180.0)
    assert report["completed"] == 2 and report["comparable"]
    assert math.isclose(report["live"]["median_s"], report["sim"]["median_s"])
    assert math.isclose(report["sim"]["median_s"], (truth.jcts[0] + truth.jcts[2]) / 2)


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
    bound = runner.invoke(app, ["loadgen", "--max-wall-seconds", "0"], env=env)
    assert bound.exit_code != 0 and "--max-wall-seconds" in bound.output


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


class _BusyOptimizer:
    """A plan API that answers each poll with ``code``."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.asked = 0

    async def GetPlan(self, request: object, timeout: float) -> object:
        self.asked += 1
        raise grpc.aio.AioRpcError(self.code, Metadata(), Metadata(), "said the optimizer", None)


async def test_a_poll_the_optimizer_cannot_answer_now_waits_for_the_next_one() -> None:
    """A player's fallback poll answered "too busy" or "unreachable" is asked again later (the
    window's deadline bounds it); any other error ends the run with it."""
    options = PlayOptions(1, 180.0, 5.0, search_space(None, None))
    spec = population(1)[0]
    for code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
        busy = _BusyOptimizer(code)
        player = JobPlayer(
            cast(Any, None), busy, "job-a", spec, options, DecisionWatch(), Tally(), asyncio.Event()
        )
        await player._poll()
        assert busy.asked == 1 and "job-a" not in player.watch.plans
    refused = JobPlayer(
        cast(Any, None),
        _BusyOptimizer(grpc.StatusCode.PERMISSION_DENIED),
        "job-a",
        spec,
        options,
        DecisionWatch(),
        Tally(),
        asyncio.Event(),
    )
    with pytest.raises(grpc.aio.AioRpcError, match="said the optimizer"):
        await refused._poll()
