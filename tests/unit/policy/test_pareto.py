"""NSGA-II Pareto candidates of one job (DLRover-RM sec. 4.2-4.3, eq. 7-9)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy import pareto
from stride.policy.pareto import (
    ClusterLimits,
    InvalidSearch,
    ParetoReply,
    ParetoRequest,
    SearchBounds,
    candidates,
    configuration_of,
    evaluate,
    job_candidates,
)
from stride.policy.serialization import from_dict, to_dict
from stride.policy.throughput import (
    PAPER_PARAMETERS,
    Configuration,
    resource_cost,
    throughput_gain,
)

GIB = 1024**3

CURRENT = Configuration(
    workers=4,
    parameter_servers=2,
    worker_cpu=4.0,
    ps_cpu=8.0,
    batch_size=512,
    worker_memory_bytes=8 * GIB,
    ps_memory_bytes=16 * GIB,
    embedding_dim=16,
    model_bytes=2e8,
)


def bounds(**changes: int) -> SearchBounds:
    values = {
        "min_workers": 1, "max_workers": 32, "min_parameter_servers": 1,
        "max_parameter_servers": 8, "min_worker_cpu": 1, "max_worker_cpu": 16,
        "min_ps_cpu": 1, "max_ps_cpu": 16, "min_worker_memory_gib": 8,
        "max_worker_memory_gib": 16, "min_ps_memory_gib": 16, "max_ps_memory_gib": 32,
    }  # fmt: skip
    values.update(changes)
    return SearchBounds(**values)


CLUSTER = ClusterLimits(
    cpu_cores=200.0, memory_bytes=2000 * GIB, max_pod_cpu=32.0, max_pod_memory_bytes=256 * GIB
)


def request(**changes: object) -> ParetoRequest:
    values: dict[str, object] = {
        "params": PAPER_PARAMETERS,
        "current": CURRENT,
        "bounds": bounds(),
        "cluster": CLUSTER,
    }
    values.update(changes)
    return ParetoRequest(**values)  # type: ignore[arg-type]


def test_vectorized_objectives_match_the_throughput_module() -> None:
    req = request()
    rng = np.random.default_rng(7)
    rows = np.column_stack(
        [rng.integers(low, high + 1, 50) for low, high in zip(*pareto.search_box(req), strict=True)]
    )
    rows[0] = [4, 2, 4, 8, 8, 16]  # the current configuration: no cost, no gain
    values = evaluate(req, rows)
    for row, (cost, negative_gain) in zip(rows, values["F"], strict=True):
        config = configuration_of(CURRENT, row)
        assert cost == pytest.approx(resource_cost(config, req.prices, CURRENT))
        expected = throughput_gain(PAPER_PARAMETERS, CURRENT, config, req.horizon_seconds)
        assert -negative_gain == pytest.approx(expected)
    assert values["F"][0] == pytest.approx([0.0, 0.0])


def test_candidates_are_deterministic_feasible_and_mutually_non_dominated() -> None:
    reply = candidates(request())
    assert reply == candidates(request())
    assert len(reply.candidates) >= 5
    costs = [c.resource_cost for c in reply.candidates]
    assert costs == sorted(costs)
    for c in reply.candidates:
        k = c.configuration
        assert 1 <= k.workers <= 32 and 1 <= k.parameter_servers <= 8
        total_cpu = k.workers * k.worker_cpu + k.parameter_servers * k.ps_cpu
        assert total_cpu <= CLUSTER.cpu_cores
        for other in reply.candidates:
            assert not (
                other.resource_cost <= c.resource_cost
                and other.throughput_gain >= c.throughput_gain
                and (other.resource_cost, other.throughput_gain)
                != (c.resource_cost, c.throughput_gain)
            )
    # Memory does not raise throughput (eq. 1-6), so the front keeps it near its minimum.
    assert min(c.configuration.worker_memory_bytes for c in reply.candidates) == 8 * GIB


def test_a_different_seed_may_differ_but_is_also_reproducible() -> None:
    first = candidates(request(seed=1))
    assert first == candidates(request(seed=1))


def test_front_approaches_the_exhaustive_front_on_a_small_grid() -> None:
    small = bounds(max_workers=8, max_parameter_servers=4, max_worker_cpu=6, max_ps_cpu=6,
                   max_worker_memory_gib=8, max_ps_memory_gib=16)  # fmt: skip
    req = request(bounds=small, cluster=ClusterLimits(60.0, 2000 * GIB, 32.0, 256 * GIB))
    lower, upper = pareto.search_box(req)
    grid = np.array(
        list(itertools.product(*(range(lo, hi + 1) for lo, hi in zip(lower, upper, strict=True))))
    )
    values = evaluate(req, grid)
    feasible = np.all(values["G"] <= 0, axis=1)
    best_gain = float(-values["F"][feasible, 1].min())
    reply = candidates(req)
    found_gain = max(c.throughput_gain for c in reply.candidates)
    # NSGA-II (40 x 40) reaches at least 95 % of the best throughput gain that fits.
    assert found_gain >= 0.95 * best_gain
    assert found_gain <= best_gain * (1 + 1e-12)


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: bounds(min_workers=0), "min_workers"),
        (lambda: bounds(min_workers=9, max_workers=8), "max_workers"),
        (lambda: ClusterLimits(0.0, GIB, 1.0, GIB), "cpu_cores"),
        (lambda: ClusterLimits(1.0, 0, 1.0, GIB), "memory_bytes"),
        (lambda: request(horizon_seconds=0.0), "horizon_seconds"),
        (lambda: request(seed=-1), "seed"),
        (lambda: request(population_size=2), "population_size"),
        (lambda: request(generations=0), "generations"),
        # The work one request may ask for is bounded (an executor slot is shared).
        (lambda: request(population_size=10**9), "population_size"),
        (lambda: request(generations=10**9), "generations"),
        (lambda: request(population_size=1_000, generations=1_000), "generations"),
        (lambda: request(bounds=None), "bounds"),
    ],
)
def test_bad_inputs_name_their_field(build: object, field: str) -> None:
    with pytest.raises(InvalidSearch) as raised:
        build()  # type: ignore[operator]
    assert raised.value.field == field


def test_limits_that_leave_nothing_to_search_are_refused() -> None:
    with pytest.raises(InvalidSearch) as raised:
        candidates(request(cluster=ClusterLimits(200.0, 2000 * GIB, 0.5, 256 * GIB)))
    assert raised.value.field == "cluster.max_pod_cpu"
    with pytest.raises(InvalidSearch) as raised:
        candidates(request(cluster=ClusterLimits(1.0, 2000 * GIB, 32.0, 256 * GIB)))
    assert raised.value.field == "cluster.cpu_cores"
    with pytest.raises(InvalidSearch) as raised:
        candidates(request(cluster=ClusterLimits(200.0, 8 * GIB, 32.0, 256 * GIB)))
    assert raised.value.field == "cluster.memory_bytes"


def test_job_candidates_keep_plans_that_cost_and_gain() -> None:
    reply = candidates(request())
    job = job_candidates("job-1", 1e7, reply)
    assert job.job_id == "job-1" and job.remaining_samples == 1e7
    kept = [c for c in reply.candidates if c.resource_cost > 0 and c.throughput_gain > 0]
    assert len(job.candidates) == len(kept) > 0
    for plan, source in zip(job.candidates, kept, strict=True):
        assert list(plan.resources) == pytest.approx(
            [max(0.0, source.additional_cpu), max(0.0, source.additional_memory_bytes / GIB)]
        )
        assert plan.throughput_gain == source.throughput_gain


def test_request_and_reply_round_trip_through_dicts() -> None:
    req = request(population_size=8, generations=3)
    assert from_dict(ParetoRequest, to_dict(req)) == req
    reply = candidates(req)
    assert from_dict(ParetoReply, to_dict(reply)) == reply
    assert pareto.ALGORITHMS[0].run_dict(to_dict(req)) == to_dict(reply)


@settings(max_examples=25, deadline=None)
@given(
    max_workers=st.integers(1, 20),
    max_ps=st.integers(1, 6),
    pod_cpu=st.integers(1, 16),
    cluster_cpu=st.integers(4, 120),
    seed=st.integers(0, 1000),
)
def test_candidates_always_respect_job_and_cluster_limits(
    max_workers: int, max_ps: int, pod_cpu: int, cluster_cpu: int, seed: int
) -> None:
    req = request(
        bounds=bounds(max_workers=max_workers, max_parameter_servers=max_ps),
        cluster=ClusterLimits(float(cluster_cpu), 2000 * GIB, float(pod_cpu), 64 * GIB),
        population_size=12,
        generations=8,
        seed=seed,
    )
    for c in candidates(req).candidates:
        k = c.configuration
        assert 1 <= k.workers <= max_workers and 1 <= k.parameter_servers <= max_ps
        assert k.worker_cpu <= pod_cpu and k.ps_cpu <= pod_cpu
        assert k.workers * k.worker_cpu + k.parameter_servers * k.ps_cpu <= cluster_cpu
        assert k.worker_memory_bytes <= 64 * GIB and k.ps_memory_bytes <= 64 * GIB
