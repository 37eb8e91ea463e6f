"""``stride replay`` as a user runs it: a trace through a live admission process, its
deadline ratio beside ``stride sim``'s on the same trace and cluster.

On the stepped clock (the default) the replay moves admission's clock from event to event,
so the live service must make exactly the simulator's decisions: the same jobs refused, the
same deadlines met (the whole trace is recorded in ``bench/results/replay-195job.txt``). On
the accelerated clock (the first 20 jobs take about 23,000 s of trace time, 46 s of wall
time at 500x) a decision's latency is multiplied by the speedup, so on a loaded machine the
two may differ by a job or two.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from stride.testing import SHARED_TRACES
from stride.testing.eventually import assert_eventually

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


CELLS = r"[\s│|]+"


def test_the_live_admission_service_makes_the_simulators_decisions_on_the_stepped_clock(
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
        "first:60",
        state=tmp_path / "replay",
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    live = re.search(
        rf"live admission \(stepped\){CELLS}60{CELLS}60{CELLS}(\d+){CELLS}(\d+){CELLS}([\d.]+)",
        done.stdout,
    )
    sim = re.search(rf"stride sim{CELLS}60{CELLS}60{CELLS}([\d.]+)", done.stdout)
    assert live and sim, done.stdout
    refused, met = int(live[1]), int(live[2])
    # Checked with run_deadline on the same 60 jobs: 56 met, 4 dropped.
    assert (met, refused) == (56, 4), done.stdout
    assert float(sim[1]) == float(live[3]) == pytest.approx(56 / 60, abs=1e-4)
    assert "difference: +0.00 percentage points" in done.stdout
    assert "jobs decided differently: 0" in done.stdout
    log = (tmp_path / "replay" / "admission.log").read_text()
    assert "replay clock: stepped" in log


def test_the_accelerated_clock_stays_within_two_jobs_of_the_simulator(tmp_path: Path) -> None:
    done = replay(
        "--trace",
        str(TRACE),
        "--cluster",
        str(CLUSTER),
        "--curves",
        str(CURVES),
        "--window",
        "first:20",
        "--clock",
        "accelerated",
        "--speedup",
        "500",
        state=tmp_path / "replay",
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    live = re.search(
        rf"live admission \(x500\){CELLS}20{CELLS}20{CELLS}(\d+){CELLS}(\d+){CELLS}([\d.]+)",
        done.stdout,
    )
    sim = re.search(rf"stride sim{CELLS}20{CELLS}20{CELLS}([\d.]+)", done.stdout)
    assert live and sim, done.stdout
    refused, met, live_dsr = int(live[1]), int(live[2]), float(live[3])
    assert live_dsr == pytest.approx(met / 20)
    # The simulator meets 18 of the 20 deadlines and drops 2 (hand-checked with run_deadline).
    assert float(sim[1]) == pytest.approx(0.9)
    assert abs(met - 18) <= 2 and refused >= 1, done.stdout
    log = (tmp_path / "replay" / "admission.log").read_text()
    assert "time runs faster than the wall clock" in log


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


async def test_admission_sigkilled_mid_replay_loses_and_repeats_no_decision(
    tmp_path: Path,
) -> None:
    """SIGKILL the admission service halfway through the first 60 jobs, start it again: the
    replay goes on (calls retried, submissions with the same request id, ends waiting in
    JetStream), every job is decided exactly once, and the pools come back from storage.

    The stepped clock stands still while admission is down, so no deadline passes during
    the outage and every job is decided by one of the two processes."""
    from stride.cli.replay import AdmissionProcess, SteppedReplay, track
    from stride.runtime.embedded_nats import NatsServer
    from stride.sim.traces import TraceWindow, load_curves, load_deadline_trace

    jobs = load_deadline_trace(TRACE, TraceWindow(first_n=60))
    library = load_curves(CURVES)
    server = NatsServer(tmp_path / "nats").start()
    admission = AdmissionProcess(tmp_path, server.url, 128, CURVES, 1.0, stepped=True)
    try:
        admission.start()
        tracked = track(jobs, library, jobs[0].submission_time)
        replay = SteppedReplay(tracked, admission.address, server.url)
        replay.token = admission.token
        running = asyncio.create_task(replay.run())

        async def halfway() -> bool:
            return sum(1 for job in tracked if job.done) >= 25

        await assert_eventually(halfway, timeout=120, interval=0.01)
        admission.kill()
        killed_at = replay.now()
        await asyncio.sleep(1.0)  # the replay's calls fail and are retried meanwhile
        await asyncio.to_thread(admission.start)
        result = await asyncio.wait_for(running, 300)
    finally:
        admission.stop()
        server.stop()
    assert result.jobs == 60 and all(job.done for job in tracked)
    # Jobs that arrived after the kill were decided by the restarted service, and jobs it
    # held before ran to their ends (their share versions went on from storage, or this
    # replay, which ignores a version it has seen, would never have seen them end).
    after = [job for job in tracked if job.arrival > killed_at]
    assert after and not any(job.late for job in tracked)
    assert any(job.finished_at is not None and job.arrival < killed_at for job in tracked)
    assert result.rejected + sum(1 for job in tracked if job.finished_at is not None) == 60
    # The restarted planner rebuilt its guarantees from storage: it still keeps within a
    # job of the simulator's 56 met deadlines.
    assert abs(result.met - 56) <= 1, result
    with sqlite3.connect(tmp_path / "admission.db") as db:
        names = [row[0] for row in db.execute("select name from jobs order by name")]
        assert sorted(names) == sorted(job.name for job in tracked)  # none twice, none lost
        states = dict(db.execute("select name, state from jobs").fetchall())
        assert set(states.values()) <= {"SUCCEEDED", "REJECTED"}, states
        repeated = db.execute(
            "select job_id, count(*) from decisions group by job_id having count(*) > 1"
        ).fetchall()
    # A job may get a second decision only by being admitted from the queue; none is queued
    # here (every trace job has a deadline), so each has exactly one.
    assert repeated == []
