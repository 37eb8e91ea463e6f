"""Environment B's "waits for memory" rule (stride.sim.dlrm, issue 39): an OOM fix that
does not fit is asked of admission's functions (contention.answer); queued, the job
releases its pods, makes no progress and is not killed again, and when a job ends the
settlement (contention.settle) grants the fix first; the job resumes with it after a
restart. Tiny hand-sized clusters, a scripted policy, every event checked against the
cluster's capacity."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest

from stride.policy.contention import Claim
from stride.policy.throughput import PAPER_PARAMETERS
from stride.sim.dlrm import (
    MAX_OOM_KILLS,
    RESTART_SECONDS,
    Decision,
    DlrmJobSpec,
    JobView,
    Pods,
    _Env,
    _one,
    simulate,
)
from stride.sim.engine import Event, EventKind, Simulation

CPUS, MEMORY_GIB = 40, 40
OOM_JOB = Pods(workers=1, worker_cpu=4, worker_mem_gib=2, ps=1, ps_cpu=4, ps_mem_gib=6)
"""8 cores, 8 GiB: its PS peaks at 2 + 8 = 10 GiB, so 6 GiB is killed at half its samples."""
FIXED = replace(OOM_JOB, ps_mem_gib=12)
"""The OOM fix (DLRover's doubling): 8 cores, 14 GiB."""
BIG_JOB = Pods(workers=1, worker_cpu=4, worker_mem_gib=2, ps=1, ps_cpu=4, ps_mem_gib=28)
"""8 cores, 30 GiB, never killed: with the OOM job, 38 of the 40 GiB are held."""


def spec(
    job_id: int, request: Pods, embedding_gib: float, hours: float, at: float = 0.0
) -> DlrmJobSpec:
    """A calm job (no hot PS, no stragglers) that trains ``hours`` at ``request``."""
    made = DlrmJobSpec(
        job_id=job_id,
        submit_time=at,
        params=PAPER_PARAMETERS,
        batch_size=128,
        embedding_dim=4,
        model_bytes=1e7,
        total_samples=1.0,
        hot_factor=1.0,
        straggler_cov=0.0,
        worker_mem_need_gib=2.0,
        ps_static_gib=2.0,
        embedding_final_gib=embedding_gib,
        request=request,
        model_name="dlrm-0",
    )
    speed = _one(PAPER_PARAMETERS, made, 1.0, request)[0]
    return replace(made, total_samples=speed * hours * 3600.0)


class OomFixes:
    """The request on arrival, nothing on ticks, and on each OOM kill the next of ``fixes``
    (PS GiB) as new pods with a safety claim (``claims`` False: the pods alone, dropped
    when they do not fit, as the baselines do)."""

    name = "oom-fixes"
    dynamic_sharding = True
    seamless = True

    def __init__(self, *fixes: int, claims: bool = True) -> None:
        self.fixes = list(fixes)
        self.claims = claims
        self.kills: list[tuple[int, float]] = []

    def decide(self, view: JobView) -> Decision:
        if view.reason == "arrival":
            return Decision(view.spec.request)
        if view.reason != "oom":
            return Decision()
        self.kills.append((view.spec.job_id, view.now))
        wanted = replace(view.pods, ps_mem_gib=self.fixes.pop(0))
        claim = Claim(
            job_id=str(view.spec.job_id),
            held=view.pods,
            wanted=wanted,
            throughput_now=100.0,
            throughput_wanted=100.0,
            remaining_samples=view.spec.total_samples - view.consumed,
            pause_seconds=0.0,
            safety=True,
            cause="OOM: PS above its limit",
        )
        return Decision(wanted, claim=claim if self.claims else None)


@dataclass
class Moment:
    """The OOM job (id 0) after one event."""

    now: float
    kind: EventKind
    job_id: object
    waiting: bool
    consumed: float
    oom_kills: int


@dataclass
class Run:
    env: _Env
    sim: Simulation
    moments: list[Moment] = field(default_factory=list)

    def play(self, until: float = math.inf) -> None:
        self.sim.run(self.handle, until=until)

    def handle(self, sim: Simulation, event: Event) -> None:
        env = self.env
        env.handle(sim, event)
        # Usage is what the running pods hold, a waiting job's none, never beyond capacity.
        holding = [
            job.pods
            for job in env.jobs.values()
            if job.pods is not None and job.end is None and not job.waiting
        ]
        assert env.used_cpu == sum(p.cpu for p in holding) <= env.cpus
        assert env.used_mem == sum(p.memory_gib for p in holding) <= env.mem
        job = env.jobs[0]
        self.moments.append(
            Moment(sim.now, event.kind, event.job_id, job.waiting, job.consumed, job.oom_kills)
        )


def start(
    jobs: list[DlrmJobSpec], policy: OomFixes, cpus: int = CPUS, memory_gib: int = MEMORY_GIB
) -> Run:
    sim = Simulation(0)
    env = _Env(jobs, cpus, memory_gib, policy, sim, tick=60.0, pod_failures=False)
    for job in jobs:
        sim.schedule(job.submit_time, EventKind.ARRIVAL, job.job_id)
    return Run(env, sim)


def waits(run: Run) -> list[Moment]:
    return [m for m in run.moments if m.waiting]


def test_an_oom_fix_with_no_room_waits_without_pods_and_resumes_when_a_job_ends() -> None:
    # The OOM job trains one hour at its request; the big job two. Killed at half its
    # samples (120 s start + 1800 s), the OOM job's fix needs 6 GiB more and 2 are free:
    # queued, so the job releases its 8 cores and 8 GiB and waits (the fix from nothing, 14
    # GiB, does not fit in the 10 then free). The big job ends at 120 + 7200 s; the fix is
    # granted at once, and the job's second half starts 120 s later.
    oom, big = spec(0, OOM_JOB, 8.0, 1.0), spec(1, BIG_JOB, 1.0, 2.0)
    run = start([oom, big], OomFixes(12))
    run.play(until=2000.0)
    env, job = run.env, run.env.jobs[0]
    assert job.waiting and job.oom_kills == 1 and job.pods == OOM_JOB
    assert (env.used_cpu, env.used_mem) == (8, 30)  # the big job's pods alone
    assert set(env.claims) == {0} and env.claims[0].safety and env.claims[0].wanted == FIXED
    run.play()
    killed_at, ended_at = RESTART_SECONDS + 1800.0, RESTART_SECONDS + 7200.0
    assert env.jobs[1].end == ended_at and not env.jobs[1].failed
    assert job.end == pytest.approx(ended_at + RESTART_SECONDS + 1800.0)
    assert not job.failed and not job.failed_by_oom and not job.waiting
    assert job.pods == FIXED
    assert job.oom_kills == env.oom_kills == 1 < MAX_OOM_KILLS
    assert env.granted == 1 and env.claims == {}
    assert env.ends == {0: 1, 1: 1}
    # It waited from the kill to the big job's end, exactly, and made no progress meanwhile.
    waited = waits(run)
    assert waited[0].now == killed_at and waited[-1].now < ended_at
    assert [m.consumed for m in waited] == [pytest.approx(oom.total_samples / 2)] * len(waited)
    assert {m.oom_kills for m in waited} == {1}
    # Its stale completion (due at 120 + 3600 s at the old pods) came while it waited, and
    # was void: the job's version had moved on.
    stale = [m for m in waited if m.kind is EventKind.COMPLETION and m.job_id == 0]
    assert [m.now for m in stale] == [RESTART_SECONDS + 3600.0]
    assert env.peak_cpu <= CPUS and env.peak_mem <= MEMORY_GIB


def test_a_waiting_jobs_pending_events_are_void_by_version() -> None:
    oom, big = spec(0, OOM_JOB, 8.0, 1.0), spec(1, BIG_JOB, 1.0, 2.0)
    run = start([oom, big], OomFixes(12))
    run.play(until=2000.0)
    job = run.env.jobs[0]
    assert job.waiting
    # Every version the job had before it waited: a kill, a pod failure or a completion
    # scheduled for the pods it released is void.
    for version in range(job.version):
        run.sim.schedule(2100.0, EventKind.FAILURE, 0, ("oom", version))
        run.sim.schedule(2100.0, EventKind.FAILURE, 0, ("pod", version))
        run.sim.schedule(2100.0, EventKind.COMPLETION, 0, version)
    run.play()
    assert job.oom_kills == run.env.oom_kills == 1
    assert job.end == pytest.approx(2 * RESTART_SECONDS + 7200.0 + 1800.0)
    assert not job.failed and run.env.ends[0] == 1


def test_a_job_at_its_last_kill_but_one_waits_and_is_not_failed() -> None:
    # First kill at 6 GiB: +2 GiB fits (2 are free). Second kill at 8 GiB (three quarters
    # through): doubling needs 8 more and none is free, so it waits. A third kill would fail
    # the job; waiting, it gets none, and completes with the fix once the big job ends.
    oom, big = spec(0, OOM_JOB, 8.0, 1.0), spec(1, BIG_JOB, 1.0, 3.0)
    policy = OomFixes(8, 16)
    run = start([oom, big], policy)
    run.play()
    job = run.env.jobs[0]
    assert [job_id for job_id, _ in policy.kills] == [0, 0]
    assert job.oom_kills == MAX_OOM_KILLS - 1
    assert not job.failed and not job.failed_by_oom and job.end is not None
    assert job.pods == replace(OOM_JOB, ps_mem_gib=16)
    waited = waits(run)
    assert waited and waited[0].now == policy.kills[1][1]
    assert [m.consumed for m in waited] == [pytest.approx(oom.total_samples * 3 / 4)] * len(waited)
    assert job.end > run.env.jobs[1].end  # type: ignore[operator]
    assert run.env.granted == 1


def test_without_the_wait_the_same_job_is_killed_until_it_fails() -> None:
    # The contrast: the same fix without a claim is dropped (it does not fit), the job
    # restarts in the pods that were killed and is killed again until the budget runs out.
    oom, big = spec(0, OOM_JOB, 8.0, 1.0), spec(1, BIG_JOB, 1.0, 2.0)
    result = simulate(
        [oom, big],
        CPUS,
        MEMORY_GIB,
        "oom-fixes",
        0,
        policy=OomFixes(12, 12, 12, claims=False),
        pod_failures=False,
    )
    assert result.oom_kills == MAX_OOM_KILLS and result.oom_failed == 1
    assert math.isnan(result.jcts[0]) and result.completed == 1
    # With the claim, the same run completes both jobs after one kill.
    waited = simulate(
        [oom, big], CPUS, MEMORY_GIB, "oom-fixes", 0, policy=OomFixes(12), pod_failures=False
    )
    assert waited.oom_kills == 1 and waited.oom_failed == 0 and waited.completed == 2
    assert waited.claims_granted == 1
    assert waited.peak_cpu <= CPUS and waited.peak_memory_gib <= MEMORY_GIB


def test_an_oom_fix_bigger_than_the_cluster_is_refused_and_never_waited_for() -> None:
    # 13 GiB in all: the fix's 14 GiB could never be held, so the job does not wait (it
    # would wait forever); it restarts in its pods and the kills run their course.
    oom = spec(0, OOM_JOB, 8.0, 1.0)
    run = start([oom], OomFixes(12, 12, 12), cpus=CPUS, memory_gib=13)
    run.play()
    job = run.env.jobs[0]
    assert waits(run) == []
    assert job.oom_kills == MAX_OOM_KILLS and job.failed_by_oom
    assert run.env.claims == {} and run.env.granted == 0
    assert (run.env.used_cpu, run.env.used_mem) == (0, 0)


def test_the_pods_a_waiting_job_releases_start_a_queued_job() -> None:
    # A third job (8 cores, 10 GiB) arrives at 100 s and finds 2 GiB free: queued. The OOM
    # job's wait frees 8 GiB, so it starts at the kill; the fix (14 GiB) is granted when the
    # big job ends, beside it.
    oom, big = spec(0, OOM_JOB, 8.0, 1.0), spec(1, BIG_JOB, 1.0, 2.0)
    third = spec(2, replace(OOM_JOB, ps_mem_gib=8), 1.0, 4.0, at=100.0)
    run = start([oom, big, third], OomFixes(12))
    run.play()
    env = run.env
    killed_at = RESTART_SECONDS + 1800.0
    assert env.jobs[2].start == killed_at
    assert env.jobs[0].end == pytest.approx(RESTART_SECONDS + 7200.0 + RESTART_SECONDS + 1800.0)
    assert [env.jobs[i].failed for i in range(3)] == [False, False, False]
    assert env.jobs[0].oom_kills == 1 and env.ends == {0: 1, 1: 1, 2: 1}
