"""Admission control (ElasticFlow sec. 4.1, Algorithm 1): worked examples and guarantees."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stride.policy.elasticflow import ALGORITHMS
from stride.policy.elasticflow.admission import (
    PROGRESS_TOLERANCE,
    AdmissionControl,
    AdmissionDecision,
    AdmissionReply,
    AdmissionRequest,
    DeadlineJob,
    HeldReservation,
    InvalidAdmission,
    JobKind,
    admit_from_scratch,
    run,
)
from stride.policy.elasticflow.allocation import AllocationJob, AllocationRequest, allocate
from stride.policy.elasticflow.curves import NonConcaveCurve, ScalingCurve, curve_from_function
from stride.policy.elasticflow.quotas import UserQuota
from stride.policy.serialization import from_dict, to_dict

FIG3_CURVE = ScalingCurve((1, 2), (1.0, 1.5))
"""Fig. 3(a): 1 unit of throughput on one worker, 1.5 on two."""
FIG4_CURVE = ScalingCurve((1, 2, 4), (1.0, 1.5, 2.0))
"""Fig. 4(a): 1, 1.5 and 2 units on one, two and four GPUs."""


def hard(job_id: str, curve: ScalingCurve, iterations: float, deadline: float) -> DeadlineJob:
    return DeadlineJob(job_id, curve, iterations, deadline)


def edf_finish_times(jobs: list[DeadlineJob], workers: int) -> dict[str, float]:
    """EDF with the whole cluster as one logical worker (sec. 3.2): one job at a time."""
    clock = 0.0
    finish: dict[str, float] = {}
    for job in sorted(jobs, key=lambda item: item.deadline or math.inf):
        clock += job.remaining_iterations / job.curve.throughput(workers)
        finish[job.job_id] = clock
    return finish


def test_fig3_edf_misses_b_while_one_worker_each_meets_both() -> None:
    a = hard("A", FIG3_CURVE, 3, 3.0)
    b = hard("B", FIG3_CURVE, 3, 3.5)
    edf = edf_finish_times([a, b], workers=2)
    assert edf["A"] == 2.0  # meets 3
    assert edf["B"] == 4.0  # misses 3.5: EDF violates B's deadline (Fig. 3b)
    first = run(AdmissionRequest(capacity=2, now=0, slot_seconds=1, candidate=a))
    assert first.decision is AdmissionDecision.ADMITTED
    assert first.candidate_share == (1, 1, 1)
    second = run(
        AdmissionRequest(
            capacity=2, now=0, slot_seconds=1, candidate=b, admitted=first.reservations
        )
    )
    assert second.decision is AdmissionDecision.ADMITTED
    assert second.candidate_share == (1, 1, 1)  # one worker each meets both (Fig. 3c)
    assert admit_from_scratch(2, 0, 1, [a, b]) == [(1, 1, 1), (1, 1, 1)]


def test_fig4_job_c_needs_one_gpu_then_four() -> None:
    c = hard("C", FIG4_CURVE, 3, 2.0)
    alone = run(AdmissionRequest(capacity=4, now=0, slot_seconds=1, candidate=c))
    assert alone.candidate_share == (2, 2)  # Fig. 4(b): 4 units of GPU time
    held = (
        HeldReservation(hard("A", FIG4_CURVE, 1, 1.0), (1,)),
        HeldReservation(hard("B", FIG4_CURVE, 1.5, 1.0), (2,)),
    )
    busy = run(AdmissionRequest(capacity=4, now=0, slot_seconds=1, candidate=c, admitted=held))
    assert busy.decision is AdmissionDecision.ADMITTED
    assert busy.candidate_share == (1, 4)  # Fig. 4(c): 5 units of GPU time
    assert admit_from_scratch(4, 0, 1, [held[0].job, held[1].job, c]) == [(1,), (2,), (1, 4)]
    # With one more iteration no cap j can meet D_c = 2: the job is dropped.
    greedy = hard("C", FIG4_CURVE, 3.5, 2.0)
    dropped = run(
        AdmissionRequest(capacity=4, now=0, slot_seconds=1, candidate=greedy, admitted=held)
    )
    assert dropped.decision is AdmissionDecision.DROPPED
    assert dropped.reservations == held


def test_plan_is_trimmed_after_the_job_completes() -> None:
    job = hard("J", FIG4_CURVE, 2, 10.0)
    reply = run(AdmissionRequest(capacity=4, now=0, slot_seconds=1, candidate=job))
    assert reply.candidate_share == (1, 1)


def test_slots_and_seconds() -> None:
    # 2 iterations/s for 30 s slots: 60 iterations per slot; 100 s leave 3 whole slots.
    curve = ScalingCurve((1, 2), (2.0, 3.0))
    job = hard("J", curve, 180, 100.0)
    reply = run(AdmissionRequest(capacity=2, now=0, slot_seconds=30, candidate=job))
    assert reply.candidate_share == (1, 1, 1)
    late = hard("J", curve, 181, 100.0)
    # Algorithm 1 raises one cap j for every slot, so one more iteration needs 2 throughout.
    assert run(AdmissionRequest(2, 0, 30, late)).candidate_share == (2, 2, 2)


def test_rejected_inputs_name_the_field() -> None:
    with pytest.raises(InvalidAdmission) as caught:
        run(AdmissionRequest(4, now=10, slot_seconds=1, candidate=hard("C", FIG4_CURVE, 1, 5.0)))
    assert caught.value.field == "candidate.deadline"
    stale = HeldReservation(hard("A", FIG4_CURVE, 1, 5.0), (1,))
    with pytest.raises(InvalidAdmission) as caught:
        run(AdmissionRequest(4, 10, 1, hard("C", FIG4_CURVE, 1, 20.0), admitted=(stale,)))
    assert caught.value.field == "admitted[0].job.deadline"
    with pytest.raises(NonConcaveCurve) as non_concave:
        hard("C", ScalingCurve((1, 2), (1.0, 3.0)), 1, 5.0)
    assert non_concave.value.field == "curve.throughputs[1]"
    with pytest.raises(InvalidAdmission, match="capacity"):
        AdmissionControl(0, 0, 1)
    with pytest.raises(InvalidAdmission, match="slot_seconds"):
        AdmissionControl(4, 0, 0)
    with pytest.raises(InvalidAdmission, match="remaining_iterations"):
        hard("C", FIG4_CURVE, math.nan, 5.0)
    with pytest.raises(InvalidAdmission, match="deadline"):
        DeadlineJob("C", FIG4_CURVE, 1, None, JobKind.HARD)
    with pytest.raises(InvalidAdmission, match="best-effort"):
        DeadlineJob("C", FIG4_CURVE, 1, 5.0, JobKind.BEST_EFFORT)


def test_held_reservations_are_checked() -> None:
    candidate = hard("C", FIG4_CURVE, 1, 5.0)
    over = (
        HeldReservation(hard("A", FIG4_CURVE, 1, 2.0), (4,)),
        HeldReservation(hard("B", FIG4_CURVE, 1, 2.0), (1,)),
    )
    with pytest.raises(InvalidAdmission, match="capacity is 4"):
        run(AdmissionRequest(4, 0, 1, candidate, admitted=over))
    short = (HeldReservation(hard("A", FIG4_CURVE, 5, 2.0), (1, 1)),)
    with pytest.raises(InvalidAdmission, match="makes 2 iterations"):
        run(AdmissionRequest(4, 0, 1, candidate, admitted=short))
    odd = (HeldReservation(hard("A", FIG4_CURVE, 1, 2.0), (3,)),)
    with pytest.raises(InvalidAdmission) as caught:
        run(AdmissionRequest(4, 0, 1, candidate, admitted=odd))
    assert caught.value.field == "admitted[0].devices_per_slot[0]"
    beyond = (HeldReservation(hard("A", FIG4_CURVE, 1, 1.0), (0, 1)),)
    with pytest.raises(InvalidAdmission, match="deadline allows 1"):
        run(AdmissionRequest(4, 0, 1, candidate, admitted=beyond))


def test_soft_and_best_effort_jobs_never_reserve() -> None:
    full = (HeldReservation(hard("A", FIG4_CURVE, 8, 4.0), (4, 4, 4, 4)),)
    for job in (
        DeadlineJob("S", FIG4_CURVE, 100, 2.0, JobKind.SOFT),
        DeadlineJob("E", FIG4_CURVE, 100, None, JobKind.BEST_EFFORT),
    ):
        reply = run(AdmissionRequest(4, 0, 1, job, admitted=full))
        assert reply.decision is AdmissionDecision.BEST_EFFORT
        assert reply.reservations == full and reply.candidate_share == ()


def test_quota_is_checked_before_admission() -> None:
    quota = UserQuota(max_submissions_per_window=2, window_seconds=100, max_admitted_jobs=2)
    job = DeadlineJob("C", FIG4_CURVE, 1, 50.0, user="eve")
    reply = run(AdmissionRequest(4, 10, 1, job, quota=quota, user_submissions=(0.0, 5.0)))
    assert reply.decision is AdmissionDecision.OVER_QUOTA
    assert "3 submissions" in reply.reason
    # Submissions that left the window do not count.
    ok = run(
        AdmissionRequest(
            4,
            200,
            1,
            DeadlineJob("C", FIG4_CURVE, 1, 250.0, user="eve"),
            quota=quota,
            user_submissions=(0.0, 5.0),
        )
    )
    assert ok.decision is AdmissionDecision.ADMITTED
    held = tuple(
        HeldReservation(DeadlineJob(name, FIG4_CURVE, 1, 50.0, user="eve"), (1,))
        for name in ("A", "B")
    )
    reply = run(AdmissionRequest(4, 10, 1, job, admitted=held, quota=quota))
    assert reply.decision is AdmissionDecision.OVER_QUOTA
    assert "admitted jobs" in reply.reason


def test_cpu_jobs_use_the_same_logic() -> None:
    # Devices are CPU shares; the curve comes from another module's throughput model.
    curve = curve_from_function(lambda shares: 100 * shares / (1 + 0.05 * shares), range(1, 33))
    job = hard("etl", curve, 100 * 16 / 1.8 * 2, 2.0)
    reply = run(AdmissionRequest(64, 0, 1, job, resource_kind="cpu-share"))
    assert reply.decision is AdmissionDecision.ADMITTED
    assert reply.resource_kind == "cpu-share"
    assert reply.candidate_share == (16, 16)


def test_request_and_reply_round_trip() -> None:
    held = (HeldReservation(hard("A", FIG4_CURVE, 1, 1.0), (1,)),)
    request = AdmissionRequest(
        4, 0, 1, hard("C", FIG4_CURVE, 3, 2.0), held, "gpu", UserQuota(3), (0.0,)
    )
    assert from_dict(AdmissionRequest, to_dict(request)) == request
    reply = run(request)
    assert from_dict(AdmissionReply, to_dict(reply)) == reply
    spec = {spec.name: spec for spec in ALGORITHMS}["elasticflow-admission"]
    assert spec.run_dict(to_dict(request))["decision"] == "admitted"


@st.composite
def concave_curves(draw: st.DrawFn) -> ScalingCurve:
    sizes = draw(st.sampled_from([(1, 2, 4, 8), (1, 2, 3, 4, 5, 6), (2, 4), (1,)]))
    slope = draw(st.floats(0.5, 4))
    values: list[float] = []
    previous_size, total = 0, 0.0
    for size in sizes:
        slope *= draw(st.floats(0.3, 1.0))
        total += slope * (size - previous_size)
        values.append(total)
        previous_size = size
    return ScalingCurve(sizes, tuple(values))


@st.composite
def job_streams(draw: st.DrawFn) -> list[DeadlineJob]:
    count = draw(st.integers(1, 12))
    return [
        DeadlineJob(
            f"j{index}",
            draw(concave_curves()),
            draw(st.floats(0, 40)),
            draw(st.floats(0, 12)),
        )
        for index in range(count)
    ]


def nearly(iterations: float) -> float:
    """The admission module's notion of done: within PROGRESS_TOLERANCE of the work."""
    return iterations - PROGRESS_TOLERANCE * max(1.0, iterations)


def simulate(capacity: int, slot: float, reservations: tuple[HeldReservation, ...]) -> None:
    """Run the reserved plans forward slot by slot; every hard deadline must hold."""
    horizon = max((len(item.devices_per_slot) for item in reservations), default=0)
    progress = {item.job.job_id: 0.0 for item in reservations}
    finish: dict[str, float] = {}
    for slot_index in range(horizon):
        in_use = 0
        for item in reservations:
            if slot_index < len(item.devices_per_slot):
                devices = item.devices_per_slot[slot_index]
                in_use += devices
                progress[item.job.job_id] += item.job.curve.throughput(devices) * slot
                if item.job.job_id not in finish and progress[item.job.job_id] >= nearly(
                    item.job.remaining_iterations
                ):
                    finish[item.job.job_id] = (slot_index + 1) * slot
        assert in_use <= capacity
    for item in reservations:
        done_at = finish.get(item.job.job_id, 0.0)
        assert progress[item.job.job_id] >= nearly(item.job.remaining_iterations)
        assert item.job.deadline is not None and done_at <= item.job.deadline + 1e-9


@settings(max_examples=150, deadline=None)
@given(job_streams(), st.integers(1, 10), st.sampled_from([0.5, 1.0, 2.0]))
def test_admitted_jobs_meet_every_deadline(
    jobs: list[DeadlineJob], capacity: int, slot: float
) -> None:
    held: tuple[HeldReservation, ...] = ()
    admitted: list[DeadlineJob] = []
    for job in jobs:
        reply = run(AdmissionRequest(capacity, 0, slot, job, held))
        if reply.decision is AdmissionDecision.ADMITTED:
            admitted.append(job)
        else:
            assert reply.reservations == held
        held = reply.reservations
        simulate(capacity, slot, held)
    assert [item.job for item in held] == admitted
    from_scratch = admit_from_scratch(capacity, 0, slot, admitted)
    if from_scratch is not None:
        simulate(
            capacity,
            slot,
            tuple(HeldReservation(j, p) for j, p in zip(admitted, from_scratch, strict=True)),
        )


@settings(max_examples=100, deadline=None)
@given(job_streams(), st.integers(1, 10), st.lists(st.integers(0, 3), min_size=12, max_size=12))
def test_admit_allocate_and_run_forward_meets_every_deadline(
    jobs: list[DeadlineJob], capacity: int, gaps: list[int]
) -> None:
    """Jobs arrive between slots; each slot runs Algorithm 2 on top of the reservations."""
    slot = 1.0
    now = 0.0
    held: tuple[HeldReservation, ...] = ()
    best_effort = DeadlineJob(
        "be", ScalingCurve((1, 2), (1.0, 1.5)), 1e6, None, JobKind.BEST_EFFORT
    )
    for job, gap in zip(jobs, gaps, strict=False):
        shifted = DeadlineJob(
            job.job_id, job.curve, job.remaining_iterations, (job.deadline or 0) + now
        )
        held = run(AdmissionRequest(capacity, now, slot, shifted, held)).reservations
        for _ in range(gap):
            held, now = step_one_slot(capacity, now, slot, held, best_effort)
    while held:
        held, now = step_one_slot(capacity, now, slot, held, best_effort)


def step_one_slot(
    capacity: int,
    now: float,
    slot: float,
    held: tuple[HeldReservation, ...],
    best_effort: DeadlineJob,
) -> tuple[tuple[HeldReservation, ...], float]:
    """Allocate the next slot with Algorithm 2, run it, and shift the reservations."""
    jobs = [
        AllocationJob(
            item.job.job_id,
            item.job.curve,
            item.devices_per_slot[0] if item.devices_per_slot else 0,
        )
        for item in held
    ]
    jobs.append(AllocationJob("be", best_effort.curve, 0, JobKind.BEST_EFFORT))
    request = AllocationRequest(capacity, tuple(jobs))
    devices = allocate(request)
    assert sum(devices) <= capacity
    now += slot
    survivors: list[HeldReservation] = []
    for item, count in zip(held, devices, strict=False):
        if nearly(item.job.remaining_iterations) <= 0:
            continue  # done before this slot (admitted with nothing left)
        assert count >= (item.devices_per_slot[0] if item.devices_per_slot else 0)
        left = item.job.remaining_iterations - item.job.curve.throughput(count) * slot
        assert item.job.deadline is not None
        if left <= item.job.remaining_iterations - nearly(item.job.remaining_iterations):
            assert now <= item.job.deadline + 1e-9  # finished by its deadline
            continue
        job = DeadlineJob(item.job.job_id, item.job.curve, left, item.job.deadline)
        survivors.append(HeldReservation(job, item.devices_per_slot[1:]))
    return tuple(survivors), now


def test_algorithms_register() -> None:
    from stride.policy.registry import Registry

    registry = Registry()
    for spec in ALGORITHMS:
        registry.register(spec)
        assert spec.version == 1 and "ElasticFlow sec. 4" in spec.description
    assert [spec.name for spec in registry.list()] == [
        "elasticflow-admission",
        "elasticflow-allocation",
        "elasticflow-placement",
    ]


def test_cpu_job_admitted_on_the_dlrover_rm_throughput_model() -> None:
    # The devices are workers of 4 CPU each; the curve is the 8-parameter model with the
    # paper's coefficients (DLRover-RM sec. 4.1) with two PS of 8 CPU. (Growing the PS count
    # with the workers makes the curve jump where a PS is added: not concave.)
    from stride.policy.throughput import PAPER_PARAMETERS, Configuration, throughput

    def samples_per_second(workers: int) -> float:
        config = Configuration(
            workers=workers,
            parameter_servers=2,
            worker_cpu=4.0,
            ps_cpu=8.0,
            batch_size=512,
            embedding_dim=16,
            model_bytes=50e6,
        )
        return throughput(PAPER_PARAMETERS, config)

    curve = curve_from_function(samples_per_second, [1, 2, 4, 8, 16])
    needed = samples_per_second(4) * 2  # two slots' work at four workers
    reply = run(
        AdmissionRequest(16, 0, 1, hard("dlrm", curve, needed, 2.0), resource_kind="cpu-worker")
    )
    assert reply.decision is AdmissionDecision.ADMITTED
    assert max(reply.candidate_share) <= 4


@settings(max_examples=300, deadline=None)
@given(
    concave_curves(),
    st.floats(0, 200),
    st.integers(1, 40),
    st.integers(1, 12),
    st.lists(st.integers(0, 12), max_size=50),
    st.sampled_from([None, 0.25, 0.5, 1.0]),
)
def test_compiled_fill_answers_as_the_numpy_reference(
    curve: ScalingCurve,
    iterations: float,
    slots: int,
    capacity: int,
    reserved: list[int],
    first: float | None,
) -> None:
    """The compiled progressive filling (stride.policy.elasticflow.kernels) gives the
    numpy form's plan, or its refusal, whatever the reservations: shorter or longer than
    the job's window, full slots, partial first slots, jobs larger than the cluster."""
    timeline = AdmissionControl(capacity, 0.0, 1.0, first_slot=first)
    if curve.sizes[0] > capacity:
        return  # prepare refuses such a job before any fill
    planned = timeline.prepare(hard("j", curve, iterations, slots - 1 + timeline.first_slot))
    used = np.minimum(np.asarray(reserved, dtype=np.int64), capacity)
    compiled = planned.fill(used, capacity)
    reference = planned.fill_reference(timeline._free(used, planned.slots))
    assert (compiled is None) == (reference is None)
    if compiled is not None and reference is not None:
        assert compiled.tolist() == reference.tolist()
    if compiled is not None and compiled.size:  # and it fits what the reservations leave
        assert np.all(compiled <= timeline._free(used, compiled.size))
