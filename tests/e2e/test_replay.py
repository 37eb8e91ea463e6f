"""``stride replay`` as a user runs it: a trace through a live admission process on a fast
clock, its deadline ratio beside ``stride sim``'s on the same trace and cluster.

The first 20 jobs of the 195-job testbed trace take about 23,000 s of trace time (23 s of
wall time at 1,000x). The live service and the simulator run one policy class, so they must
agree; the clock is the wall clock sped up, so a decision's latency is multiplied by the
speedup, and the two may differ by at most one job here (the full trace's agreement is
measured in ``bench/results/replay-195job.txt``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stride.testing import SHARED_TRACES

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TRACE = SHARED_TRACES / "itp-ef" / "195job.csv"
CLUSTER = SHARED_TRACES / "cluster_specs" / "n16g8.csv"
CURVES = SHARED_TRACES / "throughputs_A100"


def replay(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stride.cli", "replay", *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=220,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        check=False,
    )


def test_the_live_admission_service_meets_the_deadlines_the_simulator_does(
    tmp_path: Path,
) -> None:
    done = replay(
        "--trace",
        str(TRACE),
        "--cluster",
        str(CLUSTER),
        "--curves",
        str(CURVES),
        "--window",
        "first:20",
        "--speedup",
        "1000",
        state=tmp_path / "replay",
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    cells = r"[\s│|]+"
    live = re.search(
        rf"live admission \(x1000\){cells}20{cells}20{cells}(\d+){cells}(\d+){cells}([\d.]+)",
        done.stdout,
    )
    sim = re.search(rf"stride sim{cells}20{cells}20{cells}([\d.]+)", done.stdout)
    assert live and sim, done.stdout
    refused, met, live_dsr = int(live[1]), int(live[2]), float(live[3])
    assert live_dsr == pytest.approx(met / 20)
    # The simulator meets 18 of the 20 deadlines and drops 2 (hand-checked with run_deadline).
    assert float(sim[1]) == pytest.approx(0.9)
    assert abs(met - 18) <= 1 and refused >= 1, done.stdout
    assert "difference:" in done.stdout
    # The admission service really ran: its database holds the 20 jobs and their ends.
    log = (tmp_path / "replay" / "admission.log").read_text()
    assert "replay clock" in log


def test_bad_input_is_named(tmp_path: Path) -> None:
    missing = replay(
        "--trace", str(tmp_path / "nope.csv"), "--cluster", str(CLUSTER), state=tmp_path / "a"
    )
    assert missing.returncode == 2 and "nope.csv" in missing.stderr, missing.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
        "a,0,100,no-such-model,1000,32,1,100\n"
    )
    unknown = replay(
        "--trace",
        str(bad),
        "--cluster",
        str(CLUSTER),
        "--curves",
        str(CURVES),
        state=tmp_path / "b",
    )
    assert unknown.returncode == 2 and "no-such-model" in unknown.stderr, unknown.stderr
    assert not (tmp_path / "b" / "admission.db").exists()  # refused before anything ran
