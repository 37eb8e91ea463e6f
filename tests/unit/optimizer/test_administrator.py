"""The job administrator's stage machine and the steps it takes on lifecycle facts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from stride.optimizer.domain.administrator import (
    NEXT_STAGES,
    Administrator,
    JobStage,
    RootCause,
    StageError,
    check_job_id,
    on_admitted,
    on_finished,
)
from stride.policy.cold_start import JobFeatures, cold_start_plan
from stride.policy.plans import Role
from stride.runtime.errors import InvalidArgument

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
FEATURES = JobFeatures(model_name="wdl", record_count=10_000, batch_size=100, max_epochs=1)
COLD_START = cold_start_plan(FEATURES)


def test_admission_creates_a_cold_start_administrator_with_plan_one() -> None:
    step = on_admitted(None, "job-1", COLD_START, NOW)
    assert step.changed
    assert step.after == Administrator("job-1", JobStage.COLD_START, plan_version=1)
    (event,) = step.events
    assert (event.event_id, event.root_cause, event.stage) == (
        "job-1.admitted",
        RootCause.COLD_START,
        JobStage.COLD_START,
    )
    (plan,) = step.plans
    assert (plan.version, plan.message_id, plan.created_at) == (1, "job-1.plan.1", NOW)
    assert plan.plan.reason == "cold start" and plan.plan.algorithm == "cold-start-plan/1"


def test_cold_start_plan_is_clamped_to_the_configured_pod_size() -> None:
    step = on_admitted(None, "job-1", cold_start_plan(FEATURES, max_pod_cpu=2.0), NOW)
    worker = step.plans[0].plan.role(Role.WORKER)
    assert worker is not None and worker.cpu == 2.0


@pytest.mark.parametrize(
    "existing",
    [Administrator("job-1", JobStage.COLD_START, 1), Administrator("job-1", JobStage.FINISHED, 0)],
)
def test_admission_seen_before_or_after_the_end_changes_nothing(existing: Administrator) -> None:
    step = on_admitted(existing, "job-1", COLD_START, NOW)
    assert not step.changed and step.events == () and step.plans == ()


def test_finish_is_idempotent_and_remembers_unseen_jobs() -> None:
    running = Administrator("job-1", JobStage.COLD_START, 1)
    step = on_finished(running, "job-1")
    assert step.changed and step.after == Administrator("job-1", JobStage.FINISHED, 1)
    assert not on_finished(step.after, "job-1").changed
    unseen = on_finished(None, "job-2")
    assert unseen.changed and unseen.after == Administrator("job-2", JobStage.FINISHED, 0)


def test_stage_machine_allows_only_listed_moves() -> None:
    administrator = Administrator("job-1", JobStage.COLD_START)
    sampling = administrator.advance(JobStage.SAMPLING)
    assert sampling.advance(JobStage.OPTIMIZING).advance(JobStage.STEADY).stage is JobStage.STEADY
    with pytest.raises(StageError, match="sampling -> cold_start"):
        sampling.advance(JobStage.COLD_START)
    finished = sampling.advance(JobStage.FINISHED)
    assert finished.advance(JobStage.FINISHED) is finished
    for stage in JobStage:
        if stage is not JobStage.FINISHED:
            assert JobStage.FINISHED in NEXT_STAGES[stage]
            with pytest.raises(StageError):
                finished.advance(stage)


def test_plans_are_numbered_one_up_and_never_after_the_end() -> None:
    administrator, first = Administrator("job-1", JobStage.COLD_START).publish(
        on_admitted(None, "job-1", COLD_START, NOW).plans[0].plan, NOW
    )
    administrator, second = administrator.publish(first.plan, NOW)
    assert (first.version, second.version, administrator.plan_version) == (1, 2, 2)
    with pytest.raises(StageError, match="finished"):
        administrator.advance(JobStage.FINISHED).publish(first.plan, NOW)


@pytest.mark.parametrize(
    ("job_id", "problem"),
    [
        ("", "is required"),
        ("job.1", "must be"),
        ("job 1", "must be"),
        ("-job", "must be"),
        ("j" * 65, "must be"),
    ],
)
def test_bad_job_ids_are_refused(job_id: str, problem: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_job_id(job_id)
    assert raised.value.field == "job_id" and problem in raised.value.problem


def test_good_job_ids_pass() -> None:
    assert check_job_id("job-0123abcd_x") == "job-0123abcd_x"
