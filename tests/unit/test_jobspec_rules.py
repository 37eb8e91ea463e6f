"""The one validation of a job spec (stride.vocabulary.jobspec): every rule names its field,
the limits hold at their edges, and the view reads the generated message faithfully."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

import pytest

from stride.events.v1 import job_pb2
from stride.vocabulary import InvalidWord
from stride.vocabulary.jobspec import (
    DATASET_FORMAT_BY_NUMBER,
    MAX_BATCH_SIZE,
    MAX_DEADLINE_AHEAD,
    MAX_EMBEDDING_DIM,
    MAX_HYPERPARAMETERS,
    MAX_LIST_RECORDS,
    MAX_RECORD_COUNT,
    MAX_SPEC_BYTES,
    PRIORITY_BY_NUMBER,
    DatasetFormat,
    DatasetSpec,
    Deadline,
    JobSpec,
    ModelReference,
    Priority,
    ProfilePoint,
    ScalingProfile,
    Termination,
    validate,
    validate_values,
)

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
VALID = JobSpec(
    name="wide-deep",
    user="alice",
    model=ModelReference(
        name="Wide & Deep", entrypoint="trainers.wide_deep:main", family="dlrm", embedding_dim=16
    ),
    dataset=DatasetSpec(name="criteo", uri="s3://bucket/criteo", record_count=2_000_000, format=1),
    batch_size=512,
    hyperparameters=MappingProxyType({"learning_rate": "0.001", "optimizer": "adam"}),
    termination=Termination(max_epochs=2),
    deadline=Deadline.of(NOW + timedelta(hours=6)),
    soft_deadline=True,
    priority=3,
    serialized_size=200,
)


def model(**changes: object) -> ModelReference:
    return replace(VALID.model, **changes)  # type: ignore[arg-type]


def dataset(**changes: object) -> DatasetSpec:
    return replace(VALID.dataset, **changes)  # type: ignore[arg-type]


def hyper(**entries: str) -> MappingProxyType[str, str]:
    return MappingProxyType({**VALID.hyperparameters, **entries})


def refused(spec: JobSpec, now: datetime | None = NOW) -> InvalidWord:
    with pytest.raises(InvalidWord) as raised:
        validate(spec, now)
    return raised.value


def test_a_valid_spec_passes_and_reads_as_words() -> None:
    validate(VALID, NOW)
    assert VALID.priority_level is Priority.HIGH
    assert VALID.dataset_format is DatasetFormat.TFRECORD
    assert VALID.deadline_at == NOW + timedelta(hours=6)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"serialized_size": 2_097_200}, "spec", "2,097,200 bytes is over the 262,144-byte"),
        ({"name": ""}, "spec.name", "is required"),
        ({"name": "x" * 129}, "spec.name", "1-128"),
        ({"user": ""}, "spec.user", "quotas are per user"),
        ({"user": "a/b"}, "spec.user", "1-128"),
        ({"model": model(name="")}, "spec.model.name", "is required"),
        ({"model": model(name="x" * 129)}, "spec.model.name", "at most 128 characters"),
        ({"model": model(name="a\nb")}, "spec.model.name", "control character"),
        ({"model": model(entrypoint="")}, "spec.model", "exactly one of image"),
        ({"model": model(image="reg.io/t:1")}, "spec.model", "exactly one of image"),
        ({"model": model(entrypoint="", image="Reg/UPPER")}, "spec.model.image", "image"),
        ({"model": model(entrypoint="", image="a b")}, "spec.model.image", "image"),
        ({"model": model(entrypoint="", image="a" * 600)}, "spec.model.image", "at most 512"),
        ({"model": model(entrypoint="a..b:c")}, "spec.model.entrypoint", "package.module"),
        ({"model": model(family="f" * 65)}, "spec.model.family", "at most 64"),
        ({"model": model(embedding_dim=-7)}, "spec.model.embedding_dim", "not be negative"),
        (
            {"model": model(embedding_dim=MAX_EMBEDDING_DIM + 1)},
            "spec.model.embedding_dim",
            "65,536",
        ),
        ({"model": model(parameter_count=-1)}, "spec.model.parameter_count", "not be negative"),
        ({"model": model(parameter_count=10**15)}, "spec.model.parameter_count", "at most"),
        ({"dataset": dataset(name="")}, "spec.dataset.name", "is required"),
        ({"dataset": dataset(uri="no scheme")}, "spec.dataset.uri", "not a URI"),
        ({"dataset": dataset(uri="s3://" + "b" * 3000)}, "spec.dataset.uri", "at most 2,048"),
        ({"dataset": dataset(record_count=0)}, "spec.dataset.record_count", "is required"),
        ({"dataset": dataset(record_count=-1)}, "spec.dataset.record_count", "positive"),
        ({"dataset": dataset(record_count=10**13)}, "spec.dataset.record_count", "at most"),
        (
            {"dataset": dataset(record_count=2_000_001)},
            "spec.dataset.record_count",
            "2,000,001 records is over the limit of 2,000,000 (MAX_LIST_RECORDS) for a job that "
            "trains",
        ),
        ({"dataset": dataset(format=99)}, "spec.dataset.format", "unknown format 99"),
        ({"batch_size": 0}, "spec.batch_size", "is required"),
        ({"batch_size": MAX_BATCH_SIZE + 1}, "spec.batch_size", "at most 10,000,000"),
        ({"batch_size": 4_000_001}, "spec.batch_size", "larger than the dataset"),
        ({"hyperparameters": hyper(**{"bad key": "1"})}, "spec.hyperparameters", "key 'bad key'"),
        ({"hyperparameters": hyper(note="v" * 1025)}, "spec.hyperparameters.note", "at most 1,024"),
        ({"hyperparameters": hyper(note="a\x00b")}, "spec.hyperparameters.note", "control"),
        (
            {"hyperparameters": {f"k{i}": "1" for i in range(MAX_HYPERPARAMETERS + 1)}},
            "spec.hyperparameters",
            "at most 100",
        ),
        (
            {"hyperparameters": {f"k{i}": "v" * 1000 for i in range(20)}},
            "spec.hyperparameters",
            "at most 16,384",
        ),
        (
            {"hyperparameters": hyper(learning_rate="fast")},
            "spec.hyperparameters.learning_rate",
            "(0, 10]",
        ),
        (
            {"hyperparameters": hyper(learning_rate="-0.1")},
            "spec.hyperparameters.learning_rate",
            "(0, 10]",
        ),
        (
            {"hyperparameters": hyper(learning_rate="0")},
            "spec.hyperparameters.learning_rate",
            "(0, 10]",
        ),
        (
            {"hyperparameters": hyper(learning_rate="nan")},
            "spec.hyperparameters.learning_rate",
            "(0, 10]",
        ),
        (
            {"hyperparameters": hyper(learning_rate="1e9")},
            "spec.hyperparameters.learning_rate",
            "(0, 10]",
        ),
        ({"hyperparameters": hyper(momentum="1")}, "spec.hyperparameters.momentum", "[0, 1)"),
        ({"termination": Termination()}, "spec.termination", "exactly one"),
        (
            {"termination": Termination(max_steps=1, max_epochs=1)},
            "spec.termination",
            "exactly one",
        ),
        ({"termination": Termination(max_steps=-1)}, "spec.termination.max_steps", "negative"),
        ({"termination": Termination(max_steps=10**12)}, "spec.termination.max_steps", "at most"),
        ({"termination": Termination(max_epochs=10**6)}, "spec.termination.max_epochs", "at most"),
        ({"deadline": Deadline.of(NOW)}, "spec.deadline", "not in the future"),
        ({"deadline": Deadline.of(NOW + timedelta(days=3660))}, "spec.deadline", "10 years"),
        ({"deadline": Deadline(253_402_300_799)}, "spec.deadline", "10 years"),
        ({"deadline": Deadline(10**12)}, "spec.deadline", "years 1 to 9999"),
        ({"deadline": Deadline(-(10**12))}, "spec.deadline", "years 1 to 9999"),
        ({"deadline": Deadline(1_900_000_000, nanos=-5)}, "spec.deadline", "nanos"),
        ({"deadline": Deadline(1_900_000_000, nanos=10**9)}, "spec.deadline", "nanos"),
        ({"deadline": None, "soft_deadline": True}, "spec.soft_deadline", "no deadline"),
        ({"priority": 7}, "spec.priority", "unknown priority 7"),
        ({"priority": -1}, "spec.priority", "unknown priority"),
    ],
)
def test_every_bad_value_names_its_field(
    changes: dict[str, object], field: str, words: str
) -> None:
    error = refused(replace(VALID, **changes))  # type: ignore[arg-type]
    assert error.field == field
    assert words in error.problem, error.problem
    assert str(error).startswith(f"{field}: ")


def test_a_huge_bad_value_is_echoed_in_a_few_dozen_characters() -> None:
    error = refused(replace(VALID, model=model(name="x" * 1_000_000)))
    assert len(str(error)) < 200
    assert "1000000 characters" in str(error)


def test_limits_hold_exactly_at_their_edges() -> None:
    validate(replace(VALID, serialized_size=MAX_SPEC_BYTES), NOW)
    assert refused(replace(VALID, serialized_size=MAX_SPEC_BYTES + 1)).field == "spec"
    validate(replace(VALID, model=model(embedding_dim=MAX_EMBEDDING_DIM)), NOW)
    validate(replace(VALID, deadline=Deadline.of(NOW + MAX_DEADLINE_AHEAD)), NOW)
    validate(replace(VALID, hyperparameters=hyper(learning_rate="10", momentum="0")), NOW)


def test_a_job_that_trains_has_at_most_the_records_its_dispatcher_dataset_may_hold() -> None:
    """Finding 7 of issue 37: the trainer creates an index-list dataset, which the shard
    dispatcher refuses past MAX_LIST_RECORDS; a simulated job creates none."""
    at_the_limit = replace(VALID, dataset=dataset(record_count=MAX_LIST_RECORDS))
    validate(at_the_limit, NOW)
    over = replace(VALID, dataset=dataset(record_count=4_000_000))
    assert "4,000,000 records is over the limit" in refused(over).problem
    validate(replace(over, simulated=True), NOW)
    validate(replace(over, simulated=True, dataset=dataset(record_count=MAX_RECORD_COUNT)), NOW)
    validate_values(over)  # a partial spec (a similarity query) is no job that trains


def test_without_a_clock_only_the_moment_dependent_rules_are_skipped() -> None:
    # An admitted spec is read again later, after its deadline may have passed.
    past = replace(VALID, deadline=Deadline.of(NOW - timedelta(days=1)))
    validate(past, None)
    assert refused(replace(past, deadline=Deadline(0, nanos=-1)), None).field == "spec.deadline"
    assert refused(replace(VALID, batch_size=0), None).field == "spec.batch_size"


def test_partial_specs_check_only_the_values_given() -> None:
    validate_values(JobSpec(model=ModelReference(name="dlrm"), batch_size=512))
    validate_values(JobSpec())
    with pytest.raises(InvalidWord) as raised:
        validate_values(JobSpec(model=ModelReference(embedding_dim=-7)))
    assert raised.value.field == "spec.model.embedding_dim"
    with pytest.raises(InvalidWord) as raised:
        validate_values(JobSpec(serialized_size=MAX_SPEC_BYTES + 1))
    assert raised.value.field == "spec"


def test_whatever_validate_accepts_validate_values_accepts() -> None:
    validate(VALID, NOW)
    validate_values(VALID)


def test_the_view_reads_every_field_of_the_message() -> None:
    message = job_pb2.JobSpec(
        name="n",
        user="u",
        model=job_pb2.ModelReference(
            name="m", image="i", entrypoint="e", family="f", embedding_dim=3, parameter_count=4
        ),
        dataset=job_pb2.DatasetSpec(
            name="d", uri="u:x", record_count=5, format=job_pb2.DATASET_FORMAT_CSV
        ),
        batch_size=6,
        hyperparameters={"k": "v"},
        termination=job_pb2.Termination(max_steps=7, max_epochs=8),
        soft_deadline=True,
        priority=job_pb2.PRIORITY_LOW,
        simulated=True,
        profile=job_pb2.ScalingProfile(
            kind=job_pb2.RESOURCE_KIND_CPU,
            points=[job_pb2.ProfilePoint(workers=1, ps=2, steps_per_second=3.5)],
            worker_cpu=1.5,
            worker_memory_bytes=11,
            ps_cpu=0.5,
            ps_memory_bytes=12,
        ),
        resource_kind=job_pb2.RESOURCE_KIND_GPU,
    )
    message.deadline.seconds, message.deadline.nanos = 9, 10
    view = JobSpec.from_message(message)
    assert view == JobSpec(
        name="n",
        user="u",
        model=ModelReference("m", "i", "e", "f", 3, 4),
        dataset=DatasetSpec("d", "u:x", 5, 2),
        batch_size=6,
        hyperparameters={"k": "v"},
        termination=Termination(7, 8),
        deadline=Deadline(9, 10),
        soft_deadline=True,
        priority=1,
        simulated=True,
        profile=ScalingProfile(2, (ProfilePoint(1, 2, 3.5),), 1.5, 11, 0.5, 12),
        resource_kind=1,
        serialized_size=message.ByteSize(),
    )
    # Every field of the message has a home in the view: a new proto field must be added.
    assert {f.name for f in job_pb2.JobSpec.DESCRIPTOR.fields} == {
        "name",
        "user",
        "model",
        "dataset",
        "batch_size",
        "hyperparameters",
        "termination",
        "deadline",
        "soft_deadline",
        "profile",
        "resource_kind",
        "priority",
        "simulated",
    }
    assert JobSpec.from_message(job_pb2.JobSpec()).deadline is None


def test_enum_numbers_match_the_proto() -> None:
    assert set(PRIORITY_BY_NUMBER) == set(job_pb2.Priority.values())
    for number, level in PRIORITY_BY_NUMBER.items():
        if number:
            assert job_pb2.Priority.Name(number) == f"PRIORITY_{level.name}"  # type: ignore[arg-type]
    assert set(DATASET_FORMAT_BY_NUMBER) == set(job_pb2.DatasetFormat.values())
    for number, form in DATASET_FORMAT_BY_NUMBER.items():
        if form is not None:
            assert job_pb2.DatasetFormat.Name(number) == f"DATASET_FORMAT_{form.name}"  # type: ignore[arg-type]


def test_deadline_round_trips_through_the_wire_form() -> None:
    moment = datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert Deadline.of(moment).moment() == moment
    before_epoch = datetime(1960, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)
    assert Deadline.of(before_epoch) == Deadline(-315619200, 500_000_000)
    assert Deadline.of(before_epoch).moment() == before_epoch
