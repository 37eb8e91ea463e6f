"""Contended plans (stride.policy.contention): claims, their settlement by the weighted
greedy, and plans kept within a share. Hand-computed cases, then properties."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.cluster_round import RoundJob, job_front
from stride.policy.cold_start import JobFeatures
from stride.policy.contention import (
    Claim,
    InvalidClaim,
    ShareBound,
    claim_of,
    growth_candidate,
    settle,
    within_share,
)
from stride.policy.stages import (
    JobShape,
    Pods,
    Reason,
    Sample,
    SearchSpace,
    Stage,
    StageReply,
    StageRequest,
)
from stride.policy.throughput import ThroughputParameters

SMALL = Pods(workers=2, worker_cpu=2, worker_mem_gib=4, ps=1, ps_cpu=2, ps_mem_gib=8)
"""6 cores, 16 GiB."""
BIG = Pods(workers=4, worker_cpu=2, worker_mem_gib=4, ps=1, ps_cpu=2, ps_mem_gib=8)
"""10 cores, 24 GiB: 4 cores and 8 GiB more than SMALL."""


def claim(
    job_id: str, remaining: float = 1e6, now: float = 100.0, later: float = 180.0, **changes: object
) -> Claim:
    values: dict[str, object] = {
        "job_id": job_id,
        "held": SMALL,
        "wanted": BIG,
        "throughput_now": now,
        "throughput_wanted": later,
        "remaining_samples": remaining,
        "pause_seconds": 0.0,
    }
    return Claim(**(values | changes))  # type: ignore[arg-type]


def test_a_claim_is_scored_by_eq_8_gain_over_eq_7_cost() -> None:
    # No pause: TG = 180 - 100 = 80 samples/s; RC = 4 cores + 0.125 x 8 GiB = 5.
    candidate = claim("a").candidate()
    assert candidate.resources == (4.0, 8.0)
    assert candidate.throughput_gain == pytest.approx(80.0)
    assert candidate.resource_cost == pytest.approx(5.0)
    # A 60 s pause over the 600 s horizon costs a tenth of the new speed: 80 - 18 = 62.
    paused = growth_candidate(SMALL, BIG, 100.0, 180.0, 1e9, 60.0)
    assert paused.throughput_gain == pytest.approx(62.0)
    # A job 300 s from its end has a 300 s horizon: the same pause costs a fifth.
    short = growth_candidate(SMALL, BIG, 100.0, 180.0, 30_000.0, 60.0)
    assert short.throughput_gain == pytest.approx(80.0 - 180.0 * 60 / 300)


def test_freed_capacity_goes_to_the_shorter_job_first_with_rho_2_5() -> None:
    # Room for one of two equal growths: rho 2.5 weighs the job nearer its end higher.
    long, short = claim("long", remaining=1e7), claim("short", remaining=1e5)
    done = settle([long, short], free_cpu=5.0, free_memory_gib=10.0)
    assert [g.claim.job_id for g in done.granted] == ["short"]
    assert [c.job_id for c in done.left] == ["long"]
    assert done.free_cpu == pytest.approx(1.0) and done.free_memory_gib == pytest.approx(2.0)
    # With rho 0 both weigh the same; then the efficiency decides: the larger gain wins.
    faster = claim("long", remaining=1e7, later=300.0)
    done = settle([faster, short], free_cpu=5.0, free_memory_gib=10.0, rho=0.0)
    assert [g.claim.job_id for g in done.granted] == ["long"]
    assert "weighted greedy" in done.granted[0].why


def test_safety_claims_go_before_any_speed_up() -> None:
    fast = claim("fast", remaining=1e4, later=1000.0)
    memory = Pods(2, 2, 4, 1, 2, 16)  # the PS's memory raised by 8 GiB
    oom = claim("oom", wanted=memory, later=100.0, safety=True)
    done = settle([fast, oom], free_cpu=4.0, free_memory_gib=8.0)
    assert [g.claim.job_id for g in done.granted] == ["oom"]
    assert done.granted[0].why.startswith("OOM safety")
    assert [c.job_id for c in done.left] == ["fast"]


def test_a_claim_with_no_gain_is_never_granted_and_nothing_is_overcommitted() -> None:
    useless = claim("useless", later=90.0)  # slower than now: a negative gain
    assert settle([useless], 100.0, 100.0).granted == ()
    assert settle([claim("a")], 3.9, 100.0).granted == ()  # one core short
    assert settle([claim("a")], 4.0, 7.9).granted == ()  # memory short


def test_bad_claims_and_free_capacity_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidClaim, match="throughput_now"):
        claim("a", now=math.nan)
    with pytest.raises(InvalidClaim, match="pause_seconds"):
        claim("a", pause_seconds=-1.0)
    with pytest.raises(InvalidClaim, match="free_cpu"):
        settle([claim("a")], math.inf, 1.0)
    with pytest.raises(InvalidClaim, match="two claims of job 'a'"):
        settle([claim("a"), claim("a")], 10.0, 10.0)
    with pytest.raises(InvalidClaim, match=r"share\.cpu"):
        ShareBound(-1.0, 4.0)


def test_cluster_round_fronts_price_candidates_as_claims_do() -> None:
    shape = JobShape(batch_size=512, embedding_dim=16, model_bytes=5e7, total_samples=1e8)
    params = ThroughputParameters(1e-4, 1e-6, 1e-3, 1e-5, 1e-4, 1e-3, 1e-5, 0.01)
    job = RoundJob("j", shape, SMALL, 1e8, 4, 8.0, core_limit=64, params=params)
    front = job_front(job, SearchSpace())
    assert front.candidates
    for pods, candidate in zip(front.pods, front.candidates, strict=True):
        again = growth_candidate(
            SMALL,
            pods,
            front.current_throughput,
            candidate.throughput,
            1e8,
            _pause(SMALL, pods, shape),
        )
        assert again == candidate


def _pause(held: Pods, wanted: Pods, shape: JobShape) -> float:
    from stride.policy.stages import configuration
    from stride.policy.throughput import overhead_seconds

    return overhead_seconds(configuration(held, shape), configuration(wanted, shape))


def _request(reason: Reason = Reason.TICK, samples: tuple[Sample, ...] = ()) -> StageRequest:
    features = JobFeatures(
        model_name="dlrm",
        family="dlrm",
        embedding_dim=16,
        record_count=10_000_000,
        batch_size=512,
        max_epochs=1,
    )
    shape = JobShape(batch_size=512, embedding_dim=16, model_bytes=5e7, total_samples=1e7)
    return StageRequest(
        reason=reason,
        features=features,
        shape=shape,
        request=SMALL,
        pods=SMALL,
        consumed=4e6,
        samples=samples or (Sample(SMALL, 200.0),),
        sample_count=len(samples) or 1,
    )


def test_claim_of_reads_only_the_step_and_prices_unfitted_probes_linearly() -> None:
    request = _request()
    keep = StageReply(None, False, Stage.STEADY, "the plan holds")
    assert claim_of("j", request, keep) is None
    probe = StageReply(BIG, False, Stage.SAMPLING, "probe workers (1 of 5)")
    made = claim_of("j", request, probe)
    assert made is not None
    assert made.throughput_now == 200.0
    assert made.throughput_wanted == pytest.approx(200.0 * 10 / 6)  # cores 6 -> 10
    assert made.remaining_samples == 6e6 and not made.safety
    assert made.pause_seconds == 0.0  # workers join in place (overhead_seconds)
    fitted = replace(probe, predicted_throughput=260.0, predicted_current=190.0)
    made = claim_of("j", request, fitted)
    assert made is not None and (made.throughput_now, made.throughput_wanted) == (190.0, 260.0)
    raised = StageReply(
        replace(SMALL, ps_mem_gib=12), False, Stage.STEADY, "OOM predicted", bound="OOM margin"
    )
    made = claim_of("j", request, raised)
    assert made is not None and made.safety
    oom = claim_of("j", _request(Reason.OOM), raised)
    assert oom is not None and oom.safety


def test_a_plan_is_shrunk_into_its_share_workers_first() -> None:
    share = ShareBound(cpu=7.0, memory_gib=40.0)
    # BIG (10 cores) plus a 1-core chief: 11 -> one worker fewer is 9, two fewer is 7.
    fitted = within_share(BIG, share, extra_cpu=1.0, extra_memory_gib=2.0)
    assert fitted == replace(BIG, workers=2)
    # Cores per worker go next, then the PS's cores; memory is never cut.
    assert within_share(BIG, ShareBound(3.0, 40.0)) == replace(
        BIG, workers=1, worker_cpu=1, ps_cpu=2
    )
    assert within_share(BIG, ShareBound(100.0, 10.0)) is None
    assert share.excess(9.0, 30.0).startswith("admission share: the plan needs 9 cores")
    assert share.excess(7.0, 40.0) == ""


@st.composite
def claims(draw: st.DrawFn) -> list[Claim]:
    count = draw(st.integers(0, 8))
    made = []
    for index in range(count):
        held = Pods(
            draw(st.integers(1, 8)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 8)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 16)),
        )
        wanted = Pods(
            draw(st.integers(1, 16)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 8)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 4)),
            draw(st.integers(1, 32)),
        )
        made.append(
            Claim(
                f"job-{index}",
                held,
                wanted,
                draw(st.floats(0, 1e4)),
                draw(st.floats(0, 1e4)),
                draw(st.floats(0, 1e9)),
                draw(st.floats(0, 600)),
                draw(st.booleans()),
            )
        )
    return made


@settings(max_examples=300, deadline=None)
@given(claims(), st.floats(0, 200), st.floats(0, 400), st.randoms())
def test_a_settlement_never_grants_more_than_is_free_whatever_the_order(
    made: list[Claim], free_cpu: float, free_memory: float, shuffler: object
) -> None:
    done = settle(made, free_cpu, free_memory)
    taken_cpu = sum(max(0.0, g.claim.extra_cpu) for g in done.granted)
    taken_memory = sum(max(0.0, g.claim.extra_memory_gib) for g in done.granted)
    assert taken_cpu <= free_cpu + 1e-6 and taken_memory <= free_memory + 1e-6
    assert {g.claim.job_id for g in done.granted} | {c.job_id for c in done.left} == {
        c.job_id for c in made
    }
    reordered = list(made)
    shuffler.shuffle(reordered)  # type: ignore[attr-defined]
    again = settle(reordered, free_cpu, free_memory)
    assert [g.claim.job_id for g in again.granted] == [g.claim.job_id for g in done.granted]
    # Every safety claim that fit in what was left when it was visited was taken first.
    ranks = [g.claim.safety for g in done.granted]
    assert ranks == sorted(ranks, reverse=True)


@st.composite
def pods(draw: st.DrawFn) -> Pods:
    return Pods(
        draw(st.integers(1, 32)),
        draw(st.integers(1, 8)),
        draw(st.integers(1, 16)),
        draw(st.integers(1, 8)),
        draw(st.integers(1, 8)),
        draw(st.integers(1, 64)),
    )


@settings(max_examples=300, deadline=None)
@given(pods(), st.floats(0, 300), st.floats(0, 2000), st.floats(0, 4), st.floats(0, 16))
def test_a_plan_fitted_into_a_share_is_within_it_and_only_ever_smaller(
    start: Pods, cpu: float, memory: float, chief_cpu: float, chief_memory: float
) -> None:
    share = ShareBound(cpu, memory)
    fitted = within_share(start, share, chief_cpu, chief_memory)
    if fitted is None:
        # Only when even the smallest shape (one 1-core worker, 1-core PS) does not fit.
        smallest = replace(start, workers=1, worker_cpu=1, ps_cpu=1)
        assert not share.holds(smallest.cpu + chief_cpu, smallest.memory_gib + chief_memory)
        return
    assert share.holds(fitted.cpu + chief_cpu, fitted.memory_gib + chief_memory)
    assert fitted.workers <= start.workers and fitted.worker_cpu <= start.worker_cpu
    assert fitted.ps_cpu <= start.ps_cpu
    assert (fitted.ps, fitted.ps_mem_gib, fitted.worker_mem_gib) == (
        start.ps,
        start.ps_mem_gib,
        start.worker_mem_gib,
    )
    if share.holds(start.cpu + chief_cpu, start.memory_gib + chief_memory):
        assert fitted == start
