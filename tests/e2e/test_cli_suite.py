"""`stride up` / `stride down` on a machine with nothing configured: embedded NATS, SQLite."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from stride.cli.endpoints import SuiteState, pid_alive
from stride.testing.processes import run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


stride = run_cli


def test_up_submit_status_down_with_the_embedded_defaults(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"})

    not_up = stride("status", env=env)
    assert not_up.returncode == 2
    assert "no running suite" in not_up.stderr and "stride up" in not_up.stderr

    up = stride("up", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    state = SuiteState.read(tmp_path / "state")
    assert state is not None and state.ready and state.embedded_nats
    assert state.database.startswith("sqlite files in")
    try:
        again = stride("up", env=env)
        assert again.returncode == 2 and "already running" in again.stderr

        submitted = stride("submit", str(ROOT / "examples" / "wide-deep.yaml"), "--wait", env=env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = re.search(r"job-[0-9a-f]{12}", submitted.stdout)
        assert job_id is not None
        assert "plan v1" in submitted.stdout and "recorded" in submitted.stdout

        listed = stride("status", env=env)
        assert job_id.group(0) in listed.stdout and "admitted" in listed.stdout
        assert (tmp_path / "state" / "db" / "admission.db").exists()
    finally:
        down = stride("down", env=env)
    assert down.returncode == 0, down.stderr
    assert "suite stopped" in down.stdout
    assert not pid_alive(state.supervisor_pid)
    assert SuiteState.read(tmp_path / "state") is None
    supervisor_log = (tmp_path / "state" / "supervisor.log").read_text()
    assert "suite stopped" in supervisor_log and "restarting" not in supervisor_log
