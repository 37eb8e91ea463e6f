"""Admission's pool decides what ``stride sim --env deadline`` decides, on a real trace.

The live service keeps its books in :class:`~stride.admission.domain.ledger.Pool`; the
simulator in its own environment. Both run ``GuaranteePolicy``. Driven by the same
arrivals, completions and wakeups (here by a small event loop over the pool, as the
simulator orders them: completions, then arrivals, then one round, then timers), they must
drop the same jobs and finish every other one at the same moment.

The service runs a round on every event, not one per instant; the pool rewinds its books
before a second round at the same instant, so driving it that way ("per event") must decide
the same. With the cluster's tree, both place GPUs with buddy allocation and charge the
jobs they move the same pause.
"""

from __future__ import annotations

import math
import random

import pytest

from stride.admission.domain.ledger import Entry, Pool
from stride.policy.elasticflow.placement import Topology
from stride.policy.elasticflow.units import JobCurve
from stride.sim.deadline import DeadlineCluster, run_deadline
from stride.sim.traces import CurveLibrary, TraceJob, load_curves, load_deadline_trace
from stride.testing import SHARED_TRACES

JOBS = 80
GPUS = 32
TREE = (1, 4, 8)
"""One switch of 4 nodes of 8 GPUs (32 GPUs)."""


def _pool_run(
    jobs: list[TraceJob], curves: CurveLibrary, per_event: bool, placed: bool
) -> tuple[set[str], dict[str, float], int]:
    pool = Pool(GPUS, topology=Topology(TREE) if placed else None)
    moves = 0
    arrivals = sorted(jobs, key=lambda job: job.submission_time)  # stable: trace order
    dropped: set[str] = set()
    finished: dict[str, float] = {}
    # As the live service does, the pool knows jobs by ids drawn at random (the simulator by
    # the trace's): no decision may depend on them.
    rng = random.Random(len(jobs))
    traced: dict[str, str] = {}
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

        def event_round(now: float = now) -> None:
            """As the service: a round on every event that changes the pool."""
            nonlocal timer
            pool.round(now)
            if pool.wakeup is not None:
                timer = min(timer, pool.wakeup)

        for entry in list(pool.entries.values()):
            if entry.units and entry.remaining <= 1e-9 * max(1.0, entry.total_steps):
                finished[traced[entry.job_id]] = now
                pool.leave(now, entry.job_id)
                decided = True
                if per_event:
                    event_round()
        while index < len(arrivals) and arrivals[index].submission_time == now:
            trace = arrivals[index]
            index += 1
            live_id = f"job-{rng.getrandbits(48):012x}"
            traced[live_id] = trace.job_id
            entry = Entry(
                live_id,
                JobCurve(curves.curve(trace), {}, "curves-table"),
                trace.deadline,
                now,
                trace.iterations,
                trace.iterations,
            )
            if pool.join(now, entry):
                decided = True
                if per_event:
                    event_round()
            else:
                dropped.add(trace.job_id)
                if per_event:  # as the service: no round for a refusal; the last one stands
                    pool.settle(now)
        if timer <= now:
            timer = math.inf
            decided = True
        elif per_event:
            decided = False  # every event had its round already
        if decided:
            before = {job_id: pool.devices(job_id) for job_id in pool.entries}
            changed = pool.round(now)
            moves += sum(
                1
                for job_id in changed
                if before.get(job_id) and len(before[job_id]) == len(pool.devices(job_id))
            )
            if pool.wakeup is not None:
                timer = min(timer, pool.wakeup)  # a later wakeup never cancels an earlier one
    return dropped, finished, moves


@pytest.mark.parametrize("placed", [False, True], ids=["counted", "buddy"])
@pytest.mark.parametrize("per_event", [False, True], ids=["per-instant", "per-event"])
@pytest.mark.parametrize("start", [0, 80])
def test_the_pool_and_the_simulator_agree_job_by_job(
    start: int, per_event: bool, placed: bool
) -> None:
    curves = load_curves(SHARED_TRACES / "throughputs_A100")
    jobs = load_deadline_trace(SHARED_TRACES / "itp-ef" / "195job.csv")[start : start + JOBS]
    cluster = DeadlineCluster(GPUS, fanouts=TREE if placed else None)
    simulated = run_deadline(jobs, cluster, "stride", 0, curves)
    assert simulated.placement == ("buddy" if placed else "counted")
    dropped, finished, moves = _pool_run(jobs, curves, per_event, placed)
    if placed and not per_event:
        assert moves == simulated.migrations  # the same jobs moved, each paying the pause
    assert dropped == set(simulated.dropped)
    assert len(dropped) < len(jobs)
    for job_id, moment in simulated.finish_times.items():
        if moment is None:
            continue
        assert finished[job_id] == pytest.approx(moment, rel=1e-9, abs=1e-6), job_id
