"""Job spec rules: every invalid spec names its field; valid specs pass."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from stride.admission.domain.jobs import JobSpec, Priority, validate
from stride.admission.domain.policy import AdmitAll, Outcome
from stride.runtime.errors import InvalidArgument

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
VALID = JobSpec(
    name="wide-deep",
    user="alice",
    model_name="wide-and-deep",
    image="",
    entrypoint="pkg.mod:train",
    dataset_name="criteo",
    record_count=1000,
    batch_size=100,
    max_steps=0,
    max_epochs=3,
    deadline=NOW + timedelta(hours=1),
    priority=Priority.NORMAL,
)


def test_valid_spec_passes_and_counts_steps() -> None:
    validate(VALID, NOW)
    assert VALID.total_steps == 30
    assert replace(VALID, max_steps=7, max_epochs=0).total_steps == 7
    assert replace(VALID, record_count=1001).total_steps == 33


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": ""}, "spec.name"),
        ({"name": "has space"}, "spec.name"),
        ({"user": ""}, "spec.user"),
        ({"model_name": ""}, "spec.model.name"),
        ({"entrypoint": ""}, "spec.model"),
        ({"image": "img"}, "spec.model"),
        ({"entrypoint": "not an entrypoint"}, "spec.model.entrypoint"),
        ({"dataset_name": ""}, "spec.dataset.name"),
        ({"record_count": 0}, "spec.dataset.record_count"),
        ({"batch_size": -1}, "spec.batch_size"),
        ({"batch_size": 5000}, "spec.batch_size"),
        ({"max_epochs": -2}, "spec.termination.max_epochs"),
        ({"max_steps": -2}, "spec.termination.max_steps"),
        ({"max_steps": 10}, "spec.termination"),
        ({"max_epochs": 0}, "spec.termination"),
        ({"deadline": NOW}, "spec.deadline"),
        ({"deadline": NOW - timedelta(seconds=1)}, "spec.deadline"),
        ({"hyperparameters": {"": "x"}}, "spec.hyperparameters"),
    ],
)
def test_invalid_field_is_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate(replace(VALID, **changes), NOW)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_no_deadline_is_best_effort_and_valid() -> None:
    validate(replace(VALID, deadline=None), NOW)


def test_admit_all_is_the_marked_temporary_policy() -> None:
    decision = AdmitAll().decide(VALID, NOW)
    assert decision.outcome is Outcome.ADMITTED
    assert decision.policy == "admit-all/1"
    assert decision.minimum_share is not None and decision.minimum_share.workers == 1
