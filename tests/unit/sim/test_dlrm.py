"""Invariants and a hand-computed case for environment B (DLRM jobs on CPUs)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from stride.policy.stages import ALMOST_BEST_FRACTION, JOB_CPU_LIMIT
from stride.policy.throughput import PAPER_PARAMETERS, throughput
from stride.sim.dlrm import (
    CALIBRATION_CPUS,
    CALIBRATION_MEMORY_GIB,
    MAX_OOM_KILLS,
    POLICIES,
    RESTART_SECONDS,
    SEAMLESS_TICK_SECONDS,
    Decision,
    DlrmJobSpec,
    DlroverHeuristicPolicy,
    EsPolicy,
    JobView,
    OptimusPolicy,
    Pods,
    StridePolicy,
    _config,
    calibration_jobs,
    expected_min_speed,
    generate_jobs,
    grid_throughput,
    load_straggler_covs,
    ps_memory_gib,
    ps_memory_need,
    run_dlrm,
    simulate,
    tuned_static_pods,
    warm_start_accuracy,
    within_search_space,
    worker_oom_pods,
)
from stride.sim.dlrm_baselines import (
    ES_STEP,
    OPTIMUS_PROFILE,
    OPTIMUS_PS_STEP,
    OPTIMUS_WORKER_STEP,
)
from stride.sim.engine import SimulationError
from stride.testing import SHARED_TRACES

COVS = SHARED_TRACES / "pai-minibatch-time" / "coefficient_variation.csv"


def _spec(total_samples: float) -> DlrmJobSpec:
    return DlrmJobSpec(
        job_id=0,
        submit_time=10.0,
        params=PAPER_PARAMETERS,
        batch_size=128,
        embedding_dim=4,
        model_bytes=1e7,
        total_samples=total_samples,
        hot_factor=1.0,
        straggler_cov=0.0,
        worker_mem_need_gib=2.0,
        ps_static_gib=2.0,
        embedding_final_gib=4.0,
        request=Pods(4, 8, 4, 2, 8, 8),
        model_name="dlrm-0",
    )


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_capacity_and_each_job_ends_once(policy: str) -> None:
    result = run_dlrm(40, 700, 4000, policy, 3, COVS)
    assert result.peak_cpu <= 700
    assert result.peak_memory_gib <= 4000
    assert result.ends == (1,) * 40
    assert result.completed + result.failed == 40
    assert 0.0 <= result.cpu_utilization <= 1.0
    assert 0.0 <= result.memory_utilization <= 1.0


@pytest.mark.parametrize("policy", ["stride", "optimus", "dlrover-heuristic"])
def test_same_seed_same_result(policy: str) -> None:
    first = run_dlrm(30, 700, 4000, policy, 5, COVS)
    assert first == run_dlrm(30, 700, 4000, policy, 5, COVS)
    assert first != run_dlrm(30, 700, 4000, policy, 6, COVS)


def test_hand_computed_static_job() -> None:
    spec = _spec(1.0)
    speed = throughput(PAPER_PARAMETERS, _config(spec.request, spec))
    one_hour = speed * 3600.0
    result = simulate([_spec(one_hour)], 100, 100, "static", 0)
    # Submitted at 10 s, placed at once, 120 s of pod start + init, then one hour of training.
    assert result.jcts[0] == pytest.approx(RESTART_SECONDS + 3600.0)
    assert result.completion_rate == 1.0
    assert result.oom_kills == 0
    assert result.scaling_events == 0


def test_under_provisioned_ps_memory_is_oom_killed_under_static() -> None:
    spec = _spec(1e6)
    small = DlrmJobSpec(**{**spec.__dict__, "request": Pods(4, 8, 4, 2, 8, 3)})
    # Peak per PS = (2 + 4) / 2 = 3 GiB... so 3 GiB is just enough; 2 GiB is not.
    tight = DlrmJobSpec(**{**spec.__dict__, "request": Pods(4, 8, 4, 2, 8, 2)})
    assert simulate([small], 100, 100, "static", 0).oom_kills == 0
    failed = simulate([tight], 100, 100, "static", 0)
    assert failed.failed == 1
    assert failed.oom_kills == 3
    assert math.isnan(failed.jcts[0])


def test_grid_throughput_matches_policy_model() -> None:
    spec = _spec(1.0)
    pods = Pods(6, 4, 4, 3, 2, 8)
    value = grid_throughput(
        PAPER_PARAMETERS,
        spec,
        1.0,
        np.array([6.0]),
        np.array([4.0]),
        np.array([3.0]),
        np.array([2.0]),
    )
    assert float(value[0]) == pytest.approx(throughput(PAPER_PARAMETERS, _config(pods, spec)))


def test_population_is_over_provisioned() -> None:
    jobs = generate_jobs(200, np.random.default_rng(0), (0.05, 0.3))
    # On an idle cluster the requests as given: over 80 % of jobs use less than half of their
    # cores and memory (000 sec. 2), and about 5 % run out of memory (002 sec. 2.2).
    result = simulate(jobs, 10_000, 100_000, "static", 0)
    assert result.low_utilization_jobs > 0.8
    assert 0.02 <= result.oom_failure_rate <= 0.08
    assert result.oom_failed == result.failed


def test_bad_input() -> None:
    with pytest.raises(SimulationError, match="policy_name"):
        run_dlrm(2, 700, 4000, "nope", 0, COVS)
    with pytest.raises(SimulationError, match="exceeds the cluster"):
        simulate([_spec(1e6)], 10, 100, "static", 0)


def _view(
    spec: DlrmJobSpec, pods: Pods, samples: tuple[tuple[Pods, float], ...], **extra: object
) -> JobView:
    fields: dict[str, object] = {
        "reason": "tick",
        "now": 1000.0,
        "spec": spec,
        "pods": pods,
        "consumed": 0.0,
        "samples": samples,
        "sample_count": len(samples),
        "worker_util": 0.5,
        "ps_util": 0.5,
        "worker_memory_used_gib": 2.0,
        "memory_points": (),
        "hot_detected": False,
        "history": (),
        "cluster_cpus": 10_000,
        "queued_jobs": 0,
    }
    fields.update(extra)
    return JobView(**fields)  # type: ignore[arg-type]


def test_optimus_starts_a_job_at_one_ps_and_one_worker() -> None:
    spec = _spec(1e9)
    policy = OptimusPolicy()
    start = policy.decide(_view(spec, spec.request, (), reason="arrival")).pods
    # The request is Pods(4, 8, 4, 2, 8, 8): per-pod cores 8 and 8 and worker memory 4 kept;
    # its total PS memory 2 x 8 = 16 GiB on the one PS.
    assert start == Pods(1, 8, 4, 1, 8, 16)
    # Later changes come from the cluster-wide allocate, never from a job's own tick.
    assert policy.decide(_view(spec, start, ((start, 100.0),))).pods is None


def _async_samples(
    request: Pods, theta: tuple[float, float, float, float], counts: tuple[tuple[int, int], ...]
) -> tuple[tuple[Pods, float], ...]:
    """Exact throughputs of Optimus's asynchronous model at (PS, workers) ``counts``."""
    t0, t1, t2, t3 = theta
    return tuple(
        (replace(request, ps=p, workers=w), w / (t0 + t1 * w / p + t2 * w + t3 * p))
        for p, w in counts
    )


def test_optimus_allocate_moves_running_jobs_by_the_fixed_steps() -> None:
    first = replace(_spec(1e9), job_id=0)
    second = replace(_spec(1e9), job_id=1)
    request = first.request  # Pods(4, 8, 4, 2, 8, 8): every pod 8 cores; limit 200 cores.
    distinct = ((1, 1), (1, 2), (2, 1), (2, 2))  # rows [1, w/p, w, p] of full rank
    # Job 0 at 1 PS + 1 worker, theta (0.001, 0.001, 0, 0): remaining time
    # R (0.001/w + 0.001/p), PS and workers alike. On a cluster far larger than both jobs
    # Optimus fills its 200 / 8 = 25 tasks, about half each: at least 3 PS and 5 workers.
    # One round moves it by 2 PS and 4 workers at most: (1 + 2, 1 + 4) = (3, 5), with the
    # 16 GiB of PS memory over 3 PS: ceil(16 / 3) = 6 GiB each.
    current_first = replace(request, ps=1, workers=1)
    view_first = _view(
        first, current_first, _async_samples(request, (0.001, 0.001, 0.0, 0.0), distinct)
    )
    # Job 1 at 10 PS + 10 workers, theta (0.001, 0, 0, 0): speed 1000 w, whatever the PS.
    # Optimus's target is 1 PS and (200 - 8) / 8 = 24 workers; one round moves it to
    # 10 - 2 = 8 PS and 10 + 4 = 14 workers, 16 / 8 = 2 GiB per PS.
    current_second = replace(request, ps=10, workers=10)
    view_second = _view(
        second,
        current_second,
        _async_samples(request, (0.001, 0.0, 0.0, 0.0), (*distinct, (10, 10))),
    )
    plans = OptimusPolicy().allocate([view_first, view_second], 10_000, 100_000)
    assert plans == {0: Pods(5, 8, 4, 3, 8, 6), 1: Pods(14, 8, 4, 8, 8, 2)}
    for view in (view_first, view_second):
        plan = plans[view.spec.job_id]
        assert abs(plan.ps - view.pods.ps) <= OPTIMUS_PS_STEP
        assert abs(plan.workers - view.pods.workers) <= OPTIMUS_WORKER_STEP


def test_es_scales_in_when_the_last_step_did_not_pay() -> None:
    spec = _spec(1e9)
    current = replace(spec.request, workers=12)
    samples = (
        # Another PS configuration: not ES's to compare (with it, 4 -> 8 would pass and ES
        # would scale in further, to max(1, 4 - 4) = 1).
        (replace(spec.request, ps=3, workers=4), 100.0),
        (replace(current, workers=8), 780.0),
        (replace(current, workers=8), 820.0),
        (current, 900.0),
    )
    # At the current PS: 8 workers 800 (the mean of 780 and 820), 12 workers 900.
    # 8 -> 12: ((900 - 800) / 4) / (800 / 8) = 25 / 100 = 0.25, not above 0.3: the first
    # pair fails, so ES scales in to 8 - 4 = 4 workers.
    decision = EsPolicy().decide(_view(spec, current, samples))
    assert decision.pods == replace(current, workers=8 - ES_STEP)
    assert ES_STEP == 4


def test_optimus_is_registered_and_runs() -> None:
    result = run_dlrm(30, 2000, 20_000, "optimus", 2, COVS)
    assert result.scaling_events > 0
    assert result.ends == (1,) * 30


def test_stride_raises_memory_before_a_growing_embedding_kills_the_ps() -> None:
    # The request holds 4 GiB per PS; the embedding grows to 3 + 24 / 2 = 15 GiB per PS.
    spec = replace(
        _spec(1.0), embedding_final_gib=24.0, ps_static_gib=6.0, request=Pods(4, 8, 4, 2, 8, 4)
    )
    speed = throughput(PAPER_PARAMETERS, _config(spec.request, spec))
    job = replace(spec, total_samples=speed * 4 * 3600.0)
    static = simulate([job], 100, 200, "static", 0)
    assert static.oom_kills == 3
    assert static.oom_failure_rate == 1.0
    stride = simulate([job], 100, 200, "stride", 0)
    assert stride.oom_kills == 0
    assert stride.completed == 1
    # Memory sized near the need, not doubled: used over allocated stays high.
    assert stride.memory_utilization > 0.4


def test_memory_need_extrapolates_the_linear_growth_with_headroom() -> None:
    spec = _spec(1000.0)
    pods = spec.request
    points = tuple(
        (c, 2.0 + 4.0 * c / 1000.0, ps_memory_gib(spec, 1.0, pods.ps, c)[0]) for c in (0, 100, 200)
    )
    need = ps_memory_need(_view(spec, pods, (), memory_points=points, consumed=200.0))
    assert need is not None
    # Peak total 6 GiB: 3 GiB per PS of 2, plus 10 %, in whole GiB; 2 GiB per PS of 4.
    assert need(2) == 4
    assert need(4) == 2
    assert ps_memory_need(_view(spec, pods, (), memory_points=points[:1])) is None


def test_dlrover_heuristic_multiplies_workers_by_overload_over_ps_utilization() -> None:
    spec = _spec(1e9)
    pods = Pods(4, 8, 4, 2, 8, 8)
    policy = DlroverHeuristicPolicy()
    # Busiest PS at 30 % of its cores: workers x 0.9 / 0.3 = x 3, sized to their use.
    decision = policy.decide(_view(spec, pods, ((pods, 100.0),), ps_util=0.3, worker_util=0.5))
    assert decision.pods is not None
    assert decision.pods.workers == 12
    assert decision.pods.worker_cpu == 4
    assert decision.pods.worker_mem_gib == 3
    # A saturated PS gets more cores instead.
    hot = policy.decide(_view(spec, pods, ((pods, 100.0),), ps_util=0.95))
    assert hot.pods is not None and hot.pods.ps_cpu > pods.ps_cpu
    assert hot.pods.workers == pods.workers
    # OOM: twice the memory.
    oom = policy.decide(_view(spec, pods, (), reason="oom"))
    assert oom.pods is not None and oom.pods.ps_mem_gib == 16


def test_expected_min_speed_matches_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    for cov, workers in ((0.3, 4), (1.0, 16)):
        sigma = math.sqrt(math.log(1 + cov * cov))
        draws = rng.lognormal(-sigma * sigma / 2, sigma, size=(50_000, workers))
        assert expected_min_speed(cov, workers) == pytest.approx(draws.min(axis=1).mean(), rel=0.01)
        # Mean speed 1: dynamic sharding loses nothing on average.
        assert draws.mean() == pytest.approx(1.0, rel=0.01)
    assert expected_min_speed(0.0, 8) == 1.0


def test_tuned_static_is_almost_the_best_within_the_job_limit() -> None:
    spec = replace(_spec(1e9), straggler_cov=0.3, hot_factor=2.0)
    pods = tuned_static_pods(spec)
    assert pods.cpu <= JOB_CPU_LIMIT

    def expected(p: Pods) -> float:
        factor = expected_min_speed(spec.straggler_cov, p.workers)
        return (
            float(
                grid_throughput(
                    spec.params,
                    spec,
                    spec.hot_factor,
                    np.array([float(p.workers)]),
                    np.array([float(p.worker_cpu)]),
                    np.array([float(p.ps)]),
                    np.array([float(p.ps_cpu)]),
                )[0]
            )
            * factor
        )

    # No configuration a user could reasonably try within the limit is much faster.
    for other in (Pods(8, 8, 4, 4, 8, 8), Pods(16, 4, 4, 8, 4, 8), Pods(24, 4, 4, 16, 2, 8)):
        assert other.cpu <= JOB_CPU_LIMIT
        assert expected(pods) >= ALMOST_BEST_FRACTION * expected(other) - 1e-9
    # Memory holds the true peak of the hottest PS with headroom.
    assert pods.ps_mem_gib >= ps_memory_gib(spec, 2.0, pods.ps, spec.total_samples)[0]


def test_warm_start_configurations_are_moved_into_the_search_space() -> None:
    spec = _spec(1e9)
    wild = Pods(40, 26, 4, 80, 3, 4)
    inside = within_search_space(wild, spec)
    assert inside.ps <= 16 and inside.workers <= 32
    assert inside.worker_cpu <= 16 and inside.ps_cpu <= 16
    assert inside.cpu <= JOB_CPU_LIMIT
    assert within_search_space(spec.request, spec) == spec.request


def test_warm_start_on_held_history_lands_near_the_best_found_pods() -> None:
    """DLRover-RM reports warm-started workers within 92 % and PS within 85 % of the final
    configuration; a job started from its similar jobs is far closer than its cold default."""
    specs = generate_jobs(300, np.random.default_rng(5), load_straggler_covs(COVS))
    warm, cold, history, new = warm_start_accuracy(specs, 0.2, 5)
    assert (history, new) == (240, 60)
    assert warm.throughput_rmsle < 0.5 * cold.throughput_rmsle
    assert warm.workers_within > 0.8 and warm.ps_within > 0.8
    with pytest.raises(SimulationError, match="held_out"):
        warm_start_accuracy(specs, 1.0, 5)


def test_stride_keeps_held_growths_as_claims_and_grants_them_when_capacity_frees() -> None:
    # A cluster too small for every growth: a growth that does not fit is kept as a claim
    # and granted by the weighted greedy when a job ends (stride.policy.contention), never
    # beyond the cluster (``_set_pods`` asserts it at every change).
    specs = generate_jobs(20, np.random.default_rng(3), load_straggler_covs(COVS))
    result = simulate(specs, 600, 3000, "stride", 3)
    assert result.claims_granted >= 1
    assert result.completed == 20 and set(result.ends) == {1}
    assert result.peak_cpu <= 600 and result.peak_memory_gib <= 3000
    # The baselines keep dropping what does not fit (no claims).
    assert simulate(specs, 600, 3000, "optimus", 3).claims_granted == 0


class _Recorder:
    """The request, never changed; records when it is consulted with a fresh sample."""

    name = "recorder"
    dynamic_sharding = True
    seamless = True

    def __init__(self, tick_seconds: float | None = None, worker_mem_gib: int = 0) -> None:
        if tick_seconds is not None:
            self.tick_seconds = tick_seconds
        self.worker_mem_gib = worker_mem_gib
        self.ticks: list[float] = []

    def decide(self, view: JobView) -> Decision:
        if view.reason == "arrival":
            if self.worker_mem_gib:
                return Decision(replace(view.spec.request, worker_mem_gib=self.worker_mem_gib))
            return Decision(view.spec.request)
        self.ticks.append(view.now)
        return Decision()


def test_a_sample_needs_a_minute_after_the_pause_whatever_the_tick() -> None:
    spec = _spec(1e9)
    # Start at 10 s, first progress at 130 s (restart pause); a sample needs 60 s more.
    slow = _Recorder()  # the default three-minute tick: 190, 370, ...
    simulate([spec], 700, 4000, "recorder", 1, policy=slow)
    assert slow.ticks[:2] == [190.0, 370.0]
    fast = _Recorder(tick_seconds=SEAMLESS_TICK_SECONDS)  # 70 and 130 have no full minute
    simulate([spec], 700, 4000, "recorder", 1, policy=fast)
    assert fast.ticks[:3] == [190.0, 250.0, 310.0]
    assert StridePolicy.tick_seconds == SEAMLESS_TICK_SECONDS == 60.0
    assert not hasattr(OptimusPolicy, "tick_seconds") and not hasattr(EsPolicy, "tick_seconds")


def test_workers_below_their_memory_need_are_oom_killed_at_their_first_step() -> None:
    # A policy that keeps its workers below their need (2 GiB) sees them killed at their
    # first step (after the 120 s start), again after every restart, until the job fails.
    result = simulate([_spec(1e9)], 700, 4000, "recorder", 1, policy=_Recorder(worker_mem_gib=1))
    assert result.oom_kills == MAX_OOM_KILLS and result.oom_failed == 1
    assert math.isnan(result.jcts[0])


def test_strides_workers_below_their_need_get_dlrovers_oom_rule_and_complete() -> None:
    # DLRover's rule doubles the killed worker's memory (sec. 4.2), as the live optimizer
    # applies it: 1 GiB -> 2 GiB holds the need, and the job completes after one kill.
    assert worker_oom_pods(Pods(4, 8, 1, 2, 8, 8)) == Pods(4, 8, 2, 2, 8, 8)
    starved = replace(_spec(1e6), request=Pods(4, 8, 1, 2, 8, 8))
    result = simulate([starved], 700, 4000, "stride", 1)
    assert result.oom_kills == 1 and result.oom_failed == 0
    assert not math.isnan(result.jcts[0])


def test_memory_follows_the_model_within_ten_percent() -> None:
    jobs = generate_jobs(400, np.random.default_rng(3), load_straggler_covs(COVS))
    by_model: dict[str, list[DlrmJobSpec]] = {}
    for job in jobs:
        by_model.setdefault(job.model_name, []).append(job)
    assert len(by_model) == 8
    for same in by_model.values():
        for field in ("worker_mem_need_gib", "ps_static_gib", "embedding_final_gib"):
            values = [getattr(job, field) for job in same]
            # +-10 % around one footprint: the extremes are at most 1.1 / 0.9 apart.
            assert max(values) / min(values) <= 1.1 / 0.9 + 1e-9


def test_calibration_jobs_run_alone_calm_and_as_long_as_model_x() -> None:
    jobs = calibration_jobs(generate_jobs(5, np.random.default_rng(4), load_straggler_covs(COVS)))
    assert [j.submit_time for j in jobs] == [i * 86_400.0 for i in range(5)]
    assert all(j.straggler_cov == 0.0 for j in jobs)
    result = simulate(jobs, CALIBRATION_CPUS, CALIBRATION_MEMORY_GIB, "tuned-static", 4)
    # Alone on the cluster, no stragglers: 120 s of start, then 27.4 minutes of training
    # (pod failures aside, which add a restart).
    runs = sorted(result.jcts)
    assert runs[0] == pytest.approx(RESTART_SECONDS + 27.4 * 60.0, rel=1e-6)


def test_optimus_profiles_before_it_starts_and_then_grows_by_marginal_gain() -> None:
    spec = replace(_spec(1e9), straggler_cov=0.0)
    configs, seconds = OptimusPolicy().profile(spec)
    assert [(p.ps, p.workers) for p in configs] == list(OPTIMUS_PROFILE)
    assert seconds == 8 * 30.0
    result = simulate([spec], 700, 4000, "optimus", 2)
    # It starts at one PS and one worker and the first rounds add tasks: a restart each.
    assert result.scaling_events >= 1 and result.completed == 1
