"""Job spec files: what parses, and errors that name the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from stride.cli.jobspec import SpecError, load_spec, parse_spec
from stride.events.v1 import job_pb2

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def test_example_parses_with_enums_maps_and_relative_deadline() -> None:
    spec = parse_spec((ROOT / "examples" / "wide-deep.yaml").read_text(), now=NOW)
    assert spec.dataset.format == job_pb2.DATASET_FORMAT_TFRECORD
    assert spec.priority == job_pb2.PRIORITY_NORMAL
    assert spec.hyperparameters["learning_rate"] == "0.001"
    assert spec.deadline.ToDatetime(tzinfo=UTC) == NOW + timedelta(hours=6)
    assert spec.termination.max_epochs == 2


def test_absolute_deadline() -> None:
    spec = parse_spec("name: a\ndeadline: 2027-01-02T03:04:05Z\n", now=NOW)
    assert spec.deadline.ToDatetime(tzinfo=UTC) == datetime(2027, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("name: a\nworkers: 8\n", "spec.workers", "Stride chooses resources"),
        ("name: a\nmodel:\n  gpus: 2\n", "spec.model.gpus", "Stride chooses resources"),
        ("name: a\nbatch_size: lots\n", "spec.batch_size", "whole number"),
        ("dataset: [1, 2]\n", "spec.dataset", "mapping"),
        ("priority: urgent\n", "spec.priority", "low, normal, high"),
        ("deadline: tomorrow\n", "spec.deadline", "RFC 3339"),
        ("name: [unclosed\n", "spec", "malformed YAML at line"),
        ("", "spec", "empty"),
        ("hyperparameters:\n  lr: [1]\n", "spec.hyperparameters.lr", "single value"),
    ],
)
def test_bad_specs_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(SpecError) as raised:
        parse_spec(text, now=NOW)
    assert raised.value.field == field
    assert words in str(raised.value)


def test_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")
