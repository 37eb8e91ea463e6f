"""Stride's stage step: pure, serializable, and the same step the simulator runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.cold_start import JobFeatures
from stride.policy.registry import default_registry
from stride.policy.serialization import to_dict
from stride.policy.stages import (
    InvalidStageRequest,
    JobShape,
    MemoryPoint,
    Pods,
    Reason,
    Sample,
    SearchSpace,
    Stage,
    StageRequest,
    next_probe,
    stage_step,
)
from stride.policy.throughput import GIB
from stride.policy.warm_start import HistoricalJob, ResourceConfiguration

FEATURES = JobFeatures("dlrm-1", 10_000_000, 512, max_epochs=1, family="dlrm", embedding_dim=16)
SHAPE = JobShape(512, 16, 5e7, 1e7)
START = Pods(1, 8, 4, 2, 4, 8)


def tick(samples: tuple[Sample, ...], **extra: object) -> StageRequest:
    fields: dict[str, object] = {
        "reason": Reason.TICK,
        "features": FEATURES,
        "shape": SHAPE,
        "request": START,
        "pods": samples[-1].pods,
        "consumed": 1000.0,
        "samples": samples,
        "sample_count": len(samples),
        "worker_memory_used_gib": 2.0,
    }
    fields.update(extra)
    return StageRequest(**fields)  # type: ignore[arg-type]


def test_arrival_without_history_is_the_cold_default() -> None:
    reply = stage_step(StageRequest(Reason.ARRIVAL, FEATURES, SHAPE, START, START))
    assert reply.pods == START and reply.stage is Stage.COLD_START


def test_sampling_probes_one_dimension_then_the_model_decides() -> None:
    samples: tuple[Sample, ...] = (Sample(START, 1000.0),)
    seen = []
    last_fit = -1
    for _ in range(8):
        reply = stage_step(tick(samples, last_fit_sample_count=last_fit))
        seen.append(reply.stage)
        if reply.fitted_at >= 0:
            last_fit = reply.fitted_at
            assert reply.fit_rmsle >= 0 and reply.predicted_current > 0
        pods = reply.pods or samples[-1].pods
        samples = (*samples, Sample(pods, 1000.0 + 100 * len(samples)))
    assert seen[0] is Stage.SAMPLING and Stage.OPTIMIZING in seen
    first = stage_step(tick((Sample(START, 1000.0),)))
    # The cheapest move first: twice the workers (no pause under dynamic sharding).
    assert first.root_cause.startswith("probe workers") and first.pods is not None
    assert first.pods.workers == 2 and first.pods.worker_mem_gib == 3  # ceil(2.0 x 1.1)


def test_an_oom_doubles_ps_memory_before_growth_is_measured_and_predicts_after() -> None:
    oom = StageRequest(Reason.OOM, FEATURES, SHAPE, START, START)
    reply = stage_step(oom)
    assert reply.pods is not None and reply.pods.ps_mem_gib == 16
    points = (MemoryPoint(0.0, 4.0, 2.0), MemoryPoint(5e6, 12.0, 6.0))
    grown = stage_step(
        StageRequest(Reason.OOM, FEATURES, SHAPE, START, START, 5e6, memory_points=points)
    )
    # Growth of 8 GiB over half the job: 20 GiB at the end, 10 per PS, plus 10 %.
    assert grown.pods is not None and grown.pods.ps_mem_gib == 11


def test_the_executor_runs_it_from_a_plain_dict_with_the_same_result() -> None:
    spec = default_registry().get("stride-stage-step")
    request = tick((Sample(START, 1000.0),))
    assert spec.run_dict(to_dict(request)) == to_dict(stage_step(request))


def test_bad_requests_name_their_field() -> None:
    with pytest.raises(InvalidStageRequest, match="samples: a tick needs"):
        StageRequest(Reason.TICK, FEATURES, SHAPE, START, START)
    with pytest.raises(InvalidStageRequest, match=r"samples\[0\].throughput"):
        tick((Sample(START, 0.0),))
    with pytest.raises(InvalidStageRequest, match=r"Pods\.ps"):
        Pods(1, 1, 1, 0, 1, 1)
    with pytest.raises(InvalidStageRequest, match=r"space\.workers"):
        SearchSpace(workers=(4, 2))
    with pytest.raises(InvalidStageRequest, match=r"shape\.total_samples"):
        JobShape(512, 16, 5e7, 0.0)
    with pytest.raises(InvalidStageRequest, match="sample_count"):
        tick((Sample(START, 1.0),), sample_count=0)
    spec = default_registry().get("stride-stage-step")
    bad = to_dict(tick((Sample(START, 1000.0),)))
    bad["pods"]["workers"] = 0
    with pytest.raises(ValueError, match="workers"):
        spec.run_dict(bad)


pods_strategy = st.builds(
    Pods,
    workers=st.sampled_from((1, 2, 4, 8)),
    worker_cpu=st.sampled_from((1, 2)),
    worker_mem_gib=st.integers(1, 8),
    ps=st.sampled_from((1, 2, 4)),
    ps_cpu=st.sampled_from((1, 2)),
    ps_mem_gib=st.integers(1, 16),
)


@settings(max_examples=150, deadline=None)
@given(
    start=pods_strategy,
    rates=st.lists(st.floats(50.0, 50_000.0), min_size=1, max_size=12),
    limit=st.integers(4, 24),
    top=st.sampled_from((1, 2, 4)),
    memory=st.floats(0.1, 12.0),
)
def test_a_decision_never_exceeds_the_job_limit_or_a_node(
    start: Pods, rates: list[float], limit: int, top: int, memory: float
) -> None:
    """Whatever the job measured, the pods the step chooses fit the job's core limit (or
    its request, if that is larger) and no pod has more cores than the space's largest."""
    space = SearchSpace(
        worker_cpu=tuple(c for c in (1, 2, 4) if c <= top),
        ps_cpu=tuple(c for c in (1, 2, 4) if c <= top),
        job_cpu_limit=limit,
    )
    samples: tuple[Sample, ...] = ()
    pods = start
    last_fit = -1
    for count, rate in enumerate(rates, start=1):
        samples = (*samples, Sample(pods, rate))
        reply = stage_step(
            tick(
                samples,
                pods=pods,
                request=start,
                sample_count=count,
                worker_memory_used_gib=memory,
                last_fit_sample_count=last_fit,
                space=space,
            )
        )
        if reply.fitted_at >= 0:
            last_fit = reply.fitted_at
        if reply.pods is None:
            continue
        chosen = reply.pods
        assert chosen.cpu <= max(limit, start.cpu), (chosen, limit)
        for cores, before in ((chosen.worker_cpu, pods.worker_cpu), (chosen.ps_cpu, pods.ps_cpu)):
            assert cores <= max(top, before), (chosen, top)
        pods = chosen


def _history(job_id: str, model: str, worker_gib: int, ps_gib: int) -> HistoricalJob:
    return HistoricalJob(
        job_id,
        JobFeatures(model, 10_000_000, 512, max_epochs=1, family="dlrm", embedding_dim=16),
        ResourceConfiguration(8, 4.0, worker_gib * GIB, 2, 4.0, ps_gib * GIB),
    )


def test_warm_start_takes_memory_from_finished_jobs_of_the_same_model_only() -> None:
    request = Pods(8, 8, 20, 2, 8, 40)
    same = _history("a", "dlrm-1", 4, 10)
    # Same model: workers 4 GiB x 1.25 = 5; PS 2 x 10 GiB x 1.10 = 22 GiB over 2 PS = 11.
    reply = stage_step(
        StageRequest(Reason.ARRIVAL, FEATURES, SHAPE, request, request, history=(same,))
    )
    assert reply.stage is Stage.WARM_START and reply.pods is not None
    assert (reply.pods.worker_mem_gib, reply.pods.ps * reply.pods.ps_mem_gib) == (5, 22)
    # Only another model finished: its tables say nothing of this job's, the request stands.
    other = _history("b", "dlrm-2", 4, 10)
    reply = stage_step(
        StageRequest(Reason.ARRIVAL, FEATURES, SHAPE, request, request, history=(other,))
    )
    assert reply.pods is not None and reply.pods.worker_mem_gib == 20
    assert reply.pods.ps * reply.pods.ps_mem_gib >= 2 * 40


def test_probes_take_the_cheapest_moves_that_make_the_fit_identifiable() -> None:
    space = SearchSpace()
    pods = Pods(8, 4, 4, 4, 4, 8)
    sampled = {pods}
    seen = []
    while (probe := next_probe(pods, space, 200, sampled, SHAPE)) is not None:
        seen.append((probe.workers, probe.worker_cpu, probe.ps, probe.ps_cpu))
        sampled.add(probe)
        pods = probe
    # Workers x2 (no pause), a worker's cores x2 (30 s), twice the PS at half the cores
    # (60 s), the workers back (no pause): five configurations, two pauses, and the rows of
    # eq. 2-5's terms span all five coefficients.
    assert seen == [(16, 4, 4, 4), (16, 8, 4, 4), (16, 8, 8, 2), (8, 8, 8, 2)]
    # Without an embedding there are four coefficients: four configurations suffice.
    flat = JobShape(512, 0, 5e7, 1e7)
    pods, sampled, count = Pods(8, 4, 4, 4, 4, 8), {Pods(8, 4, 4, 4, 4, 8)}, 0
    while (probe := next_probe(pods, space, 200, sampled, flat)) is not None:
        sampled.add(probe)
        pods, count = probe, count + 1
    assert count == 3
