"""Admission's edge of the job spec rules: every invalid spec is an InvalidArgument that
names its field (the rules themselves are tested in tests/unit/test_jobspec_rules.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from stride.admission.domain.jobs import JobSpec, Priority, check_request_id, validate
from stride.admission.domain.policy import in_words
from stride.runtime.errors import InvalidArgument
from stride.vocabulary.jobspec import DatasetSpec, Deadline, ModelReference, Termination

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
VALID = JobSpec(
    name="wide-deep",
    user="alice",
    model=ModelReference(name="wide-and-deep", entrypoint="pkg.mod:train"),
    dataset=DatasetSpec(name="criteo", record_count=1000),
    batch_size=100,
    termination=Termination(max_epochs=3),
    deadline=Deadline.of(NOW + timedelta(hours=1)),
)


def test_valid_spec_passes_and_counts_steps() -> None:
    validate(VALID, NOW)
    assert VALID.priority_level is Priority.NORMAL
    assert VALID.total_steps == 30
    assert replace(VALID, termination=Termination(max_steps=7)).total_steps == 7
    assert replace(VALID, dataset=DatasetSpec(name="c", record_count=1001)).total_steps == 33


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": ""}, "spec.name"),
        ({"name": "has space"}, "spec.name"),
        ({"user": ""}, "spec.user"),
        ({"model": ModelReference(entrypoint="a:b")}, "spec.model.name"),
        ({"model": ModelReference(name="m")}, "spec.model"),
        ({"model": ModelReference(name="m", image="i", entrypoint="a:b")}, "spec.model"),
        ({"model": ModelReference(name="m", entrypoint="not one")}, "spec.model.entrypoint"),
        (
            {"model": ModelReference(name="m", entrypoint="a:b", embedding_dim=-7)},
            "spec.model.embedding_dim",
        ),
        ({"dataset": DatasetSpec(record_count=10)}, "spec.dataset.name"),
        ({"dataset": DatasetSpec(name="d")}, "spec.dataset.record_count"),
        ({"batch_size": -1}, "spec.batch_size"),
        ({"batch_size": 5000}, "spec.batch_size"),
        ({"termination": Termination(max_epochs=-2)}, "spec.termination.max_epochs"),
        ({"termination": Termination(max_steps=-2)}, "spec.termination.max_steps"),
        ({"termination": Termination(max_steps=10, max_epochs=1)}, "spec.termination"),
        ({"termination": Termination()}, "spec.termination"),
        ({"deadline": Deadline.of(NOW)}, "spec.deadline"),
        ({"deadline": Deadline.of(NOW - timedelta(seconds=1))}, "spec.deadline"),
        ({"deadline": Deadline(253402300799)}, "spec.deadline"),
        ({"deadline": Deadline(NOW.second, nanos=-5)}, "spec.deadline"),
        ({"hyperparameters": {"": "x"}}, "spec.hyperparameters"),
        ({"priority": 9}, "spec.priority"),
        ({"serialized_size": 2 * 1024 * 1024}, "spec"),
    ],
)
def test_invalid_field_is_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        validate(replace(VALID, **changes), NOW)  # type: ignore[arg-type]
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_no_deadline_is_best_effort_and_valid() -> None:
    validate(replace(VALID, deadline=None), NOW)


@pytest.mark.parametrize("request_id", ["\x00", "a\x00b", "r" * 201, "a\nb"])
def test_a_request_id_postgresql_cannot_store_is_an_invalid_argument(request_id: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_request_id(request_id)
    assert raised.value.field == "request_id"


@pytest.mark.parametrize("request_id", ["", "r-1", "spec-" + "f" * 40, "r" * 200])
def test_usual_request_ids_pass(request_id: str) -> None:
    check_request_id(request_id)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [(60, "+1m"), (4_801, "+1h21m"), (26_400, "+7h20m"), (86_400, "+1d"), (183_601, "+2d4h")],
)
def test_durations_are_written_as_a_relative_deadline_never_earlier(
    seconds: float, words: str
) -> None:
    assert in_words(seconds) == words
