"""`stride up` as it comes, then `stride loadgen --env dlrm`: the simulator's jobs played
live against the whole suite, as a user runs the README's command. The live services decide
what `stride sim` decides on the same observations, the jobs end when the simulator's do, no
pod starts for a simulated job, and a bounded run ends with a partial report."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from stride.testing import SHARED_TRACES
from stride.testing.processes import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

stride = run_cli


def test_loadgen_on_a_default_suite_decides_and_ends_as_the_simulator(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"})
    up = stride("up", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        report_path = tmp_path / "report.json"
        # Seed 3's job 0 needs more worker memory than the live cold start gives: its
        # workers are OOM-killed at their first step and DLRover's rule doubles it, live
        # and in the simulator alike. One job (559 windows; three took four to seven minutes
        # of the full run's critical path): bench/results/loadgen_default_suite.txt plays
        # ten at once, and the bounded run below plays two.
        played = stride(
            "loadgen",
            "--env",
            "dlrm",
            "--jobs",
            "1",
            "--seed",
            "3",
            "--traces",
            str(SHARED_TRACES),
            "--out",
            str(report_path),
            env=env,
            timeout=420,
        )
        assert played.returncode == 0, played.stdout + played.stderr
        assert "Traceback" not in played.stdout + played.stderr
        assert "decisions equal to stride sim's" in played.stdout
        report = json.loads(report_path.read_text())
        assert report["comparable"], report["why"]
        assert report["completed"] == 1 and report["sim_completed"] == 1
        assert not [job for job in report["per_job"] if job["error"]], report["per_job"]
        assert report["agreement"] >= 0.95, report
        # The optimizer's window and grid, asked of it: a laptop's small pods.
        assert report["tick_seconds"] == 60.0
        assert sum(job["oom_kills"] for job in report["per_job"]) >= 1
        for stat in ("median_s", "p90_s"):
            live, sim = report["live"][stat], report["sim"][stat]
            assert math.isclose(live, sim, rel_tol=0.10), (stat, live, sim)
        # No pod was started for a simulated job.
        pods = tmp_path / "state" / "pods" / "pods"
        assert not pods.exists() or not any(pods.iterdir())

        # Bounded: every job stops where it is, and the report is partial, not a traceback.
        bounded_path = tmp_path / "bounded.json"
        bounded = stride(
            "loadgen",
            "--jobs",
            "2",
            "--seed",
            "5",
            "--max-wall-seconds",
            "4",
            "--traces",
            str(SHARED_TRACES),
            "--out",
            str(bounded_path),
            env=env,
            timeout=120,
        )
        assert bounded.returncode == 0, bounded.stdout + bounded.stderr
        assert "stopped by --max-wall-seconds" in bounded.stdout
        partial = json.loads(bounded_path.read_text())
        assert partial["completed"] < 2
        assert all(job["error"] for job in partial["per_job"] if not job["completed"])
    finally:
        down = stride("down", env=env)
        assert down.returncode == 0, down.stderr
