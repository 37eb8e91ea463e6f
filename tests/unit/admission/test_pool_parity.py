"""Admission's pool decides what ``stride sim --env deadline`` decides, on a real trace.

The live service keeps its books in :class:`~stride.admission.domain.ledger.Pool`; the
simulator in its own environment. Both run ``GuaranteePolicy``. Driven by the same
arrivals, completions and wakeups (here by a small event loop over the pool, as the
simulator orders them: completions, then arrivals, then one round, then timers), they must
drop the same jobs and finish every other one at the same moment.
"""

from __future__ import annotations

import math

import pytest

from stride.admission.domain.ledger import Entry, Pool
from stride.policy.elasticflow.units import JobCurve
from stride.sim.deadline import DeadlineCluster, run_deadline
from stride.sim.traces import CurveLibrary, TraceJob, load_curves, load_deadline_trace
from stride.testing import SHARED_TRACES

JOBS = 80
GPUS = 32


def _pool_run(jobs: list[TraceJob], curves: CurveLibrary) -> tuple[set[str], dict[str, float]]:
    pool = Pool(GPUS)
    arrivals = sorted(jobs, key=lambda job: job.submission_time)  # stable: trace order
    dropped: set[str] = set()
    finished: dict[str, float] = {}
    timer = math.inf
    index = 0
    while index < len(arrivals) or pool.entries:
        now = min(
            arrivals[index].submission_time if index < len(arrivals) else math.inf,
            timer,
            *(
                max(pool.clock, entry.paused_until) + entry.remaining / entry.rate()
                for entry in pool.entries.values()
                if entry.units
            ),
        )
        assert math.isfinite(now)
        pool.advance(now)
        decided = False
        for entry in list(pool.entries.values()):
            if entry.units and entry.remaining <= 1e-9 * max(1.0, entry.total_steps):
                finished[entry.job_id] = now
                pool.leave(now, entry.job_id)
                decided = True
        while index < len(arrivals) and arrivals[index].submission_time == now:
            trace = arrivals[index]
            index += 1
            entry = Entry(
                trace.job_id,
                JobCurve(curves.curve(trace), {}, "curves-table"),
                trace.deadline,
                now,
                trace.iterations,
                trace.iterations,
            )
            if pool.join(now, entry):
                decided = True
            else:
                dropped.add(trace.job_id)
        if timer <= now:
            timer = math.inf
            decided = True
        if decided:
            pool.round(now)
            if pool.wakeup is not None:
                timer = min(timer, pool.wakeup)  # a later wakeup never cancels an earlier one
    return dropped, finished


@pytest.mark.parametrize("start", [0, 80])
def test_the_pool_and_the_simulator_agree_job_by_job(start: int) -> None:
    curves = load_curves(SHARED_TRACES / "throughputs_A100")
    jobs = load_deadline_trace(SHARED_TRACES / "itp-ef" / "195job.csv")[start : start + JOBS]
    simulated = run_deadline(jobs, DeadlineCluster(GPUS), "stride", 0, curves)
    dropped, finished = _pool_run(jobs, curves)
    assert dropped == set(simulated.dropped)
    assert len(dropped) < len(jobs)
    for job_id, moment in simulated.finish_times.items():
        if moment is None:
            continue
        assert finished[job_id] == pytest.approx(moment, rel=1e-9, abs=1e-6), job_id
