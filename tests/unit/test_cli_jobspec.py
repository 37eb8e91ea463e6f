"""Job spec files: what parses, and errors that name the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from stride.api.admission.v1 import admission_service_pb2 as admission_pb
from stride.cli.jobspec import MAX_FILE_BYTES, SpecError, load_spec, load_submission, parse_spec
from stride.cli.main import app, resubmission_note
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


def test_the_text_example_parses_and_names_its_entrypoint() -> None:
    """examples/criteo-text.yaml (its training: tests/e2e/test_training.py)."""
    spec = parse_spec((ROOT / "examples" / "criteo-text.yaml").read_text(), now=NOW)
    assert spec.model.entrypoint == "stride_examples.criteo_text:train"
    assert spec.dataset.record_count == 200_000 and not spec.HasField("deadline")


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
    with pytest.raises(SpecError, match="cannot read the file: No such file or directory"):
        load_spec(tmp_path / "nope.yaml")


# --- Any file: a spec or one error line naming the field, never a traceback -----------------

VALID_YAML = (
    (ROOT / "examples" / "wide-deep.yaml")
    .read_text()
    .replace("name: wide-deep-ctr\n", "name: wide-deep-ctr\nuser: alice\n", 1)
)
"""The example with a ``user:`` (which a spec may name; the example leaves it to the token)."""


def with_line(old: str, new: str) -> bytes:
    assert old in VALID_YAML
    return VALID_YAML.replace(old, new).encode()


BAD_FILES: list[tuple[str, bytes, str, str]] = [
    ("binary", bytes(range(256)) * 4, "spec", "not UTF-8 text"),
    ("latin-1", "name: café\n".encode("latin-1"), "spec", "not UTF-8 text"),
    ("unclosed-bracket", b"name: [oops\n", "spec", "malformed YAML at line 2"),
    ("nul-character", b"name: a\x00b\n", "spec", "malformed YAML at character"),
    ("tab-indent", b"model:\n\tname: x\n", "spec", "malformed YAML"),
    ("python-tag", b"name: !!python/object:os.system x\n", "spec", "malformed YAML"),
    ("month-13", b"name: 2024-13-45\n", "spec", "month must be in 1..12"),
    ("5000-digits", b"batch_size: " + b"1" * 5000 + b"\n", "spec", "thousands of digits"),
    ("nested-too-deeply", b"[" * 5_000, "spec", "nested too deeply"),
    ("top-level-list", b"- 1\n- 2\n", "spec", "expected a mapping"),
    ("empty", b"", "spec", "empty"),
    ("only-comments", b"# nothing\n", "spec", "empty"),
    (
        "31-digit-integer",
        with_line("batch_size: 512", "batch_size: 1234567890123456789012345678901"),
        "spec.batch_size",
        "at most 10,000,000",
    ),
    (
        "huge-negative-integer",
        with_line("embedding_dim: 16", "embedding_dim: -1234567890123456789012345678901"),
        "spec.model.embedding_dim",
        "not be negative",
    ),
    (
        "overflowing-relative-deadline",
        with_line("deadline: +6h", "deadline: +99999999d"),
        "spec.deadline",
        "more than 10 years ahead",
    ),
    (
        "absurd-relative-deadline",
        with_line("deadline: +6h", "deadline: +" + "9" * 400 + "d"),
        "spec.deadline",
        "more than 10 years ahead",
    ),
    (
        "year-9999",
        with_line("deadline: +6h", "deadline: 9999-12-31T23:59:59Z"),
        "spec.deadline",
        "more than 10 years ahead",
    ),
    (
        "year-1-east-of-utc",
        with_line("deadline: +6h", "deadline: 0001-01-01T00:00:00+05:00"),
        "spec.deadline",
        "years 1 to 9999",
    ),
    (
        "date-without-time",
        with_line("deadline: +6h", "deadline: 2030-01-01"),
        "spec.deadline",
        "no time of day",
    ),
    (
        "deadline-in-the-past",
        with_line("deadline: +6h", "deadline: +0m"),
        "spec.deadline",
        "future",
    ),
    ("mapping-for-a-message", with_line("batch_size: 512", "model: 5"), "spec.model", "mapping"),
    (
        "text-for-a-number",
        with_line("batch_size: 512", "batch_size: lots"),
        "spec.batch_size",
        "whole",
    ),
    (
        "float-for-a-number",
        with_line("batch_size: 512", "batch_size: 1.5"),
        "spec.batch_size",
        "whole",
    ),
    (
        "bool-for-a-number",
        with_line("batch_size: 512", "batch_size: true"),
        "spec.batch_size",
        "whole",
    ),
    (
        "text-for-a-bool",
        with_line("priority: normal", "soft_deadline: maybe"),
        "spec.soft_deadline",
        "true or false",
    ),
    (
        "list-for-a-map",
        with_line("  optimizer: adam", "  optimizer: [adam]"),
        "spec.hyperparameters.optimizer",
        "single value",
    ),
    ("mapping-for-text", with_line("user: alice", "user: {a: 1}"), "spec.user", "expected text"),
    (
        "bytes-for-text",
        with_line("user: alice", "user: !!binary aGk="),
        "spec.user",
        "expected text",
    ),
    (
        "lone-surrogate",
        with_line("user: alice", 'user: "\\uD800"'),
        "spec.user",
        "not valid Unicode",
    ),
    (
        "unknown-priority",
        with_line("priority: normal", "priority: 7"),
        "spec.priority",
        "unknown value 7",
    ),
    (
        "unknown-format",
        with_line("format: tfrecord", "format: zip"),
        "spec.dataset.format",
        "is not one of",
    ),
    (
        "resources",
        with_line("batch_size: 512", "batch_size: 512\nworkers: 8"),
        "spec.workers",
        "Stride chooses resources",
    ),
    (
        "long-unknown-key",
        with_line("batch_size: 512", "batch_size: 512\n" + "k" * 500 + ": 1"),
        "spec.'kkkk",
        "unknown field",
    ),
    (
        "negative-embedding",
        with_line("embedding_dim: 16", "embedding_dim: -7"),
        "spec.model.embedding_dim",
        "not be negative",
    ),
    (
        "bad-learning-rate",
        with_line("learning_rate: 0.001", "learning_rate: .nan"),
        "spec.hyperparameters.learning_rate",
        "(0, 10]",
    ),
    (
        "markup-in-a-value",
        with_line("user: alice", 'user: "[bold]x:smile:"'),
        "spec.user",
        "[bold]x:smile:",
    ),
    (
        "over-256-kib-spec",
        with_line("optimizer: adam", "optimizer: " + "a" * 300 * 1024),
        "spec",
        "over the 262,144-byte limit for a job spec",
    ),
]


@pytest.mark.parametrize(
    ("content", "field", "words"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_bad_files_are_one_spec_error(
    tmp_path: Path, content: bytes, field: str, words: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    with pytest.raises(SpecError) as raised:
        load_submission(path)
    assert raised.value.field.startswith(field), str(raised.value)
    assert words in str(raised.value)
    assert "\n" not in str(raised.value)
    assert len(str(raised.value)) < 300


def test_a_directory_and_a_huge_file_are_one_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read the file: Is a directory"):
        load_submission(tmp_path)
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(SpecError, match="over 16,777,216 bytes"):
        load_submission(huge)


def submit_cli(*args: str) -> Result:
    return CliRunner().invoke(app, ["submit", *args], env={"STRIDE_STATE_DIR": "/nonexistent"})


@pytest.mark.parametrize(
    ("content", "field", "words"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES]
)
def test_submit_prints_one_error_line_and_exits_2(
    tmp_path: Path, content: bytes, field: str, words: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(content)
    result = submit_cli(str(path))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path}: {field}"), lines[0]
    assert words in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["missing.yaml", "a directory", "new\nline.yaml"])
def test_submit_of_what_is_not_a_readable_file_is_one_line(tmp_path: Path, name: str) -> None:
    if name == "a directory":
        (tmp_path / name).mkdir()
    result = submit_cli(str(tmp_path / name))
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and ": spec: cannot read the file" in lines[0]


def test_new_and_request_id_together_are_refused(tmp_path: Path) -> None:
    result = submit_cli(str(ROOT / "examples" / "wide-deep.yaml"), "--new", "--request-id", "r")
    assert result.exit_code == 2
    assert result.stderr == "error: give --new or --request-id, not both\n"


# --- The idempotency key ----------------------------------------------------------------------


def request_id(tmp_path: Path, text: str, now: datetime = NOW) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_submission(path, now).request_id


def test_the_same_file_gives_the_same_request_id_whenever_it_is_submitted(tmp_path: Path) -> None:
    first = request_id(tmp_path, VALID_YAML, NOW)
    # A relative deadline counts as written: a retry minutes later is the same submission.
    assert request_id(tmp_path, VALID_YAML, NOW + timedelta(minutes=7)) == first
    assert first.startswith("spec-") and len(first) <= 200
    reordered = VALID_YAML.replace(
        "  learning_rate: 0.001\n  optimizer: adam\n", "  optimizer: adam\n  learning_rate: 0.001\n"
    )
    assert reordered != VALID_YAML
    assert request_id(tmp_path, reordered) == first


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("user: alice", "user: bob"),
        ("deadline: +6h", "deadline: +7h"),
        ("deadline: +6h", "deadline: 2030-01-01T00:00:00Z"),
        ("batch_size: 512", "batch_size: 256"),
        ("optimizer: adam", "optimizer: sgd"),
    ],
)
def test_a_different_user_or_spec_gives_another_request_id(
    tmp_path: Path, old: str, new: str
) -> None:
    assert request_id(tmp_path, VALID_YAML.replace(old, new)) != request_id(tmp_path, VALID_YAML)


def test_an_absolute_deadline_is_part_of_the_request_id(tmp_path: Path) -> None:
    text = VALID_YAML.replace("deadline: +6h", "deadline: 2030-01-01T00:00:00Z")
    assert request_id(tmp_path, text, NOW) == request_id(tmp_path, text, NOW + timedelta(days=1))
    later = text.replace("2030-01-01T00:00:00Z", "2030-01-01T00:00:01Z")
    assert request_id(tmp_path, later) != request_id(tmp_path, text)


def test_a_job_made_by_an_earlier_submission_is_called_so() -> None:
    job = admission_pb.Job(job_id="job-1", state=admission_pb.JOB_STATE_CANCELLED)
    job.submitted_at.FromDatetime(NOW)
    note = resubmission_note(job, NOW + timedelta(minutes=3))
    assert "submitted at 2026-11-21 12:00:00Z" in note
    assert "now cancelled" in note and "--new" in note
    assert resubmission_note(job, NOW + timedelta(seconds=1)) == ""


def test_a_deadline_given_on_the_command_line_replaces_the_files(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(VALID_YAML)
    now = datetime(2026, 11, 25, 6, 0, tzinfo=UTC)
    kept = load_submission(path, now=now)
    later = load_submission(path, now=now, deadline="+7h20m")
    assert later.spec.deadline.ToDatetime(tzinfo=UTC) == now + timedelta(hours=7, minutes=20)
    assert later.request_id != kept.request_id  # a new job, not the refused one back
    absolute = load_submission(path, now=now, deadline="2026-11-26T00:00:00Z")
    assert absolute.spec.deadline.ToDatetime(tzinfo=UTC) == datetime(2026, 11, 26, tzinfo=UTC)
    with pytest.raises(SpecError, match="--deadline"):
        load_submission(path, now=now, deadline="tomorrow")
