"""Reading a job spec file (YAML) into the ``JobSpec`` message, with errors that name the field.

The file mirrors the proto field names. Enums may be written in short lower case
(``format: tfrecord``, ``priority: high``). The deadline is an RFC 3339 time or a relative
``+90m`` / ``+6h`` / ``+2d`` from now. There are no resource fields: a key such as
``workers`` or ``gpus`` is refused with a reminder that Stride chooses resources.

Whatever the file holds (binary data, broken YAML, a 31-digit number, ``+99999999d``), the
result is a spec or one :class:`SpecError` naming the field: never another exception. A
parsed spec is then checked by :func:`stride.vocabulary.jobspec.validate`, the rules
admission applies, so a bad spec is refused before any network call, in the same words.

:func:`load_submission` also derives the submission's idempotency key from the spec, so
that running the same ``stride submit`` again (after a timeout, say) finds the job the
first run created instead of making a second one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from stride.cli.imports import ANNOTATION, ForeignSpecError, Imported, convert, is_foreign
from stride.events.v1 import job_pb2
from stride.vocabulary import InvalidWord, echo
from stride.vocabulary.jobspec import (
    INTEGER_RULES,
    MAX_DEADLINE_AHEAD,
    MAX_SPEC_BYTES,
    Deadline,
    JobSpec,
    check_whole_number,
    deadline_too_far,
    validate,
)
from stride.vocabulary.quantities import parse_memory

RESOURCE_WORDS = frozenset(
    {
        "workers",
        "worker",
        "ps",
        "parameter_servers",
        "gpus",
        "gpu",
        "cpu",
        "cpus",
        "memory",
        "resources",
        "replicas",
        "data_workers",
    }
)
RELATIVE_DEADLINE = re.compile(r"^\+(?:\d+(?:\.\d+)?[dhm])+$")
_RELATIVE_PART = re.compile(r"(\d+(?:\.\d+)?)([dhm])")
_UNIT_SECONDS = {"m": 60, "h": 3600, "d": 86400}
_SHOWN_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

MAX_FILE_BYTES = 16 * 1024 * 1024
"""A spec file larger than this is not read at all. A valid spec serializes to at most
:data:`~stride.vocabulary.jobspec.MAX_SPEC_BYTES`; YAML's layout and comments add some,
never sixty-four times as much, and a bigger file is a wrong path (a dataset, an image)."""

REQUEST_ID_PREFIX = "spec-"
"""Request ids derived from a spec start with this; ``--request-id`` ones are the user's."""


class SpecError(ValueError):
    """A job spec file is not valid; ``field`` is the dotted path of the culprit.

    The message is always one line, so the CLI's error is one line whatever the input.
    """

    def __init__(self, field: str, problem: str) -> None:
        problem = " ".join(problem.split())
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Submission:
    """A valid spec read from a file, and the idempotency key of submitting it."""

    spec: job_pb2.JobSpec
    request_id: str
    """Derived from the user and the spec as written (see :func:`request_id_for`)."""
    warnings: tuple[str, ...] = ()
    """What an imported TFJob or ElasticJob said that Stride ignores, one line each."""


def _shown(key: str) -> str:
    """A key as a path segment: itself if it is short and plain, else an echo of it."""
    return key if _SHOWN_KEY.match(key) else echo(key)


def _enum_value(enum: Any, raw: object, path: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise SpecError(path, f"expected one of {_enum_choices(enum)}, got {echo(raw)}")
    if isinstance(raw, int):
        if raw not in enum.values_by_number:
            raise SpecError(path, f"unknown value {echo(raw)}; use one of {_enum_choices(enum)}")
        return raw
    prefix = _enum_prefix(enum)
    candidates = (raw, raw.upper(), f"{prefix}{raw.upper()}")
    for candidate in candidates:
        if candidate in enum.values_by_name and not candidate.endswith("_UNSPECIFIED"):
            return int(enum.values_by_name[candidate].number)
    raise SpecError(path, f"{echo(raw)} is not one of {_enum_choices(enum)}")


def _enum_prefix(enum: Any) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def _enum_choices(enum: Any) -> str:
    prefix = _enum_prefix(enum)
    return ", ".join(
        v.name.removeprefix(prefix).lower()
        for v in enum.values
        if not v.name.endswith("_UNSPECIFIED")
    )


class _Reader:
    """Fills a JobSpec from parsed YAML, remembering a relative deadline as written."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.relative_deadline: timedelta | None = None
        self.imported: Imported | None = None
        """Set when the file was a TFJob or an ElasticJob (converted before filling)."""

    def deadline(self, raw: object, path: str) -> Deadline:
        if isinstance(raw, datetime):
            return Deadline.of(raw)
        if isinstance(raw, date):
            raise SpecError(
                path, f"{raw.isoformat()} has no time of day; write {raw.isoformat()}T00:00:00Z"
            )
        if not isinstance(raw, str):
            raise SpecError(path, f"expected an RFC 3339 time or +<n>m/h/d, got {echo(raw)}")
        text = raw.strip()
        relative = RELATIVE_DEADLINE.match(text)
        if relative:
            seconds = sum(
                float(amount) * _UNIT_SECONDS[unit] for amount, unit in _RELATIVE_PART.findall(text)
            )
            # Compared before any datetime arithmetic, which overflows past the year 9999.
            if seconds > MAX_DEADLINE_AHEAD.total_seconds():
                raise SpecError(path, deadline_too_far(echo(text)))
            self.relative_deadline = timedelta(seconds=seconds)
            return Deadline.of(self.now + self.relative_deadline)
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise SpecError(path, f"{echo(raw)} is not an RFC 3339 time or +<n>m/h/d") from None
        return Deadline.of(parsed)

    def scalar(self, field: Any, raw: object, path: str) -> object:
        if field.type == FieldDescriptor.TYPE_STRING:
            return _text(raw, path)
        if field.type == FieldDescriptor.TYPE_BOOL:
            if not isinstance(raw, bool):
                raise SpecError(path, f"expected true or false, got {echo(raw)}")
            return raw
        if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            if isinstance(raw, bool) or not isinstance(raw, (int, float)):
                raise SpecError(path, f"expected a number, got {echo(raw)}")
            return float(raw)
        if field.name.endswith("_memory_bytes") and isinstance(raw, str):
            raw = _quantity(raw, path)
        if field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_INT32):
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise SpecError(path, f"expected a whole number, got {echo(raw)}")
            if not _INT64_MIN <= raw <= _INT64_MAX:
                if path in INTEGER_RULES:
                    try:
                        check_whole_number(path, raw)
                    except InvalidWord as error:
                        raise SpecError(error.field, error.problem) from None
                raise SpecError(path, f"{echo(raw)} does not fit in a 64-bit integer")
            return raw
        raise SpecError(path, "unsupported field type")

    def fill(self, message: Message, data: object, path: str) -> None:
        descriptor = message.DESCRIPTOR
        if not isinstance(data, dict):
            raise SpecError(path, f"expected a mapping, got {_kind(data)}")
        for key, raw in data.items():
            name = str(key)
            field_path = f"{path}.{_shown(name)}"
            field = descriptor.fields_by_name.get(name)
            if field is None:
                hint = (
                    " (Stride chooses resources: remove it)"
                    if name.lower() in RESOURCE_WORDS
                    else ""
                )
                known = ", ".join(f.name for f in descriptor.fields)
                raise SpecError(field_path, f"unknown field{hint}; known fields: {known}")
            if raw is None:
                continue
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                self.fill_map(getattr(message, field.name), raw, field_path)
            elif (
                field.message_type is not None
                and field.message_type.full_name == "google.protobuf.Timestamp"
            ):
                deadline = self.deadline(raw, field_path)
                target = getattr(message, field.name)
                target.seconds, target.nanos = deadline.seconds, deadline.nanos
            elif field.message_type is not None and field.is_repeated:
                if not isinstance(raw, list):
                    raise SpecError(field_path, f"expected a list, got {_kind(raw)}")
                for index, item in enumerate(raw):
                    self.fill(getattr(message, field.name).add(), item, f"{field_path}[{index}]")
            elif field.message_type is not None:
                self.fill(getattr(message, field.name), raw, field_path)
            elif field.enum_type is not None:
                setattr(message, field.name, _enum_value(field.enum_type, raw, field_path))
            else:
                setattr(message, field.name, self.scalar(field, raw, field_path))

    def fill_map(self, target: Any, raw: object, path: str) -> None:
        if not isinstance(raw, dict):
            raise SpecError(path, f"expected a mapping of names to values, got {_kind(raw)}")
        for key, value in raw.items():
            name = _text(key, path)
            entry_path = f"{path}.{_shown(name)}"
            if isinstance(value, bool):
                target[name] = str(value).lower()
            elif isinstance(value, (dict, list)) or value is None:
                raise SpecError(entry_path, f"expected a single value, got {_kind(value)}")
            else:
                target[name] = _text(value, entry_path)


def _quantity(raw: str, path: str) -> int:
    """Bytes from a Kubernetes-style quantity (``4Gi``, ``512Mi``, ``2G``)."""
    amount = parse_memory(raw)
    if amount is None:
        raise SpecError(path, f"{echo(raw)} is not a memory quantity (bytes, or 512Mi, 4Gi, 2G)")
    return amount


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return echo(value)


def _text(raw: object, path: str) -> str:
    if isinstance(raw, (dict, list, bytes)) or raw is None:
        raise SpecError(path, f"expected text, got {_kind(raw) if raw is not None else 'nothing'}")
    text = str(raw).lower() if isinstance(raw, bool) else str(raw)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(path, f"{echo(text)} is not valid Unicode text") from None
    return text


def _yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.reader.ReaderError):
        character = error.character
        code = character if isinstance(character, int) else ord(character)
        return f"malformed YAML at character {error.position + 1:,}: {error.reason} (#x{code:04x})"
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(error, "problem", None) or str(error)
    return f"malformed YAML{where}: {problem}"


def _parse(text: str, now: datetime) -> tuple[job_pb2.JobSpec, _Reader]:
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError("spec", _yaml_problem(error)) from None
    except RecursionError:
        raise SpecError("spec", "malformed YAML: nested too deeply") from None
    except ValueError as error:
        # PyYAML builds dates and numbers with Python's constructors: month 13 or an
        # integer of 5,000 digits raise ValueError, not a YAML error.
        problem = str(error)
        if "integer string conversion" in problem:
            problem = "a number has thousands of digits"
        raise SpecError("spec", f"malformed YAML: {problem[:120]}") from None
    if data is None:
        raise SpecError("spec", "the file is empty")
    spec = job_pb2.JobSpec()
    reader = _Reader(now)
    if is_foreign(data):
        try:
            imported = convert(data)
        except ForeignSpecError as error:
            raise SpecError(error.field, error.problem) from None
        reader.imported = imported
        try:
            reader.fill(spec, imported.data, "spec")
        except SpecError as error:
            raise _from_import(error, imported.source) from None
        return spec, reader
    reader.fill(spec, data, "spec")
    return spec, reader


def _from_import(error: SpecError, source: str) -> SpecError:
    """A Stride spec error on a converted TFJob/ElasticJob, with where to fix it."""
    return SpecError(
        error.field,
        f"{error.problem} (the {source} was converted; give Stride's fields under "
        f"metadata.annotations['{ANNOTATION}'])",
    )


def parse_spec(text: str, now: datetime | None = None) -> job_pb2.JobSpec:
    """Parse YAML text into a JobSpec; raises :class:`SpecError` naming the bad field.

    Only the form is checked (known fields, types, enums); :func:`load_spec` also applies
    the rules a spec must obey, as admission does.
    """
    spec, _ = _parse(text, now or datetime.now(UTC))
    return spec


def spec_from_mapping(
    data: object, created: datetime, now: datetime | None = None
) -> job_pb2.JobSpec:
    """A JobSpec from already parsed data (a ``StrideJob``'s ``spec``), checked as a spec
    file is, form and rules, without its user (admission sets it); raises
    :class:`SpecError` naming the field. Relative deadlines count from ``created``."""
    spec = job_pb2.JobSpec()
    _Reader(created).fill(spec, data, "spec")
    try:
        checked = dataclasses.replace(JobSpec.from_message(spec), user=TOKEN_USER_PLACEHOLDER)
        validate(checked, now or datetime.now(UTC))
    except InvalidWord as error:
        raise SpecError(error.field, error.problem) from None
    return spec


def read_spec_text(path: Path) -> str:
    """The text of a spec file; any problem reading it is a :class:`SpecError`."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise SpecError("spec", f"cannot read the file: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(
            "spec",
            f"the file is over {MAX_FILE_BYTES:,} bytes; a job spec is at most "
            f"{MAX_SPEC_BYTES:,} bytes",
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise SpecError(
            "spec",
            f"is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start:,}); "
            "is it a binary file?",
        ) from None


def request_id_for(spec: job_pb2.JobSpec, relative_deadline: timedelta | None = None) -> str:
    """The idempotency key of submitting ``spec``: the same user and spec give the same key.

    A hash of the spec's deterministic serialization (map entries in key order) with its
    user. A relative deadline (``+6h``) counts as written, not as the moment it came to,
    so running the same command again a minute later still finds the first job.
    """
    canonical = job_pb2.JobSpec()
    canonical.CopyFrom(spec)
    if relative_deadline is not None:
        written = Deadline.of(datetime(1970, 1, 1, tzinfo=UTC) + relative_deadline)
        canonical.deadline.seconds, canonical.deadline.nanos = written.seconds, written.nanos
    digest = hashlib.sha256()
    digest.update(b"stride.submit/1\0")
    digest.update(spec.user.encode() + b"\0")
    digest.update(b"relative\0" if relative_deadline is not None else b"absolute\0")
    digest.update(canonical.SerializeToString(deterministic=True))
    return REQUEST_ID_PREFIX + digest.hexdigest()[:40]


TOKEN_USER_PLACEHOLDER = "from-token"
"""Stands in for a spec's empty ``user`` while the CLI checks the rest: the user is the one
the submitter's token names (admission fills it in)."""


def load_submission(
    path: Path, now: datetime | None = None, deadline: str | None = None
) -> Submission:
    """Read, parse and validate a spec file; raises :class:`SpecError` naming the field.

    ``deadline`` (``+7h20m``, ``+2d`` or an RFC 3339 time) replaces the file's deadline: the
    one-command answer to a refusal that named a deadline Stride could guarantee.
    """
    moment = now or datetime.now(UTC)
    spec, reader = _parse(read_spec_text(path), moment)
    if deadline is not None:
        reader.relative_deadline = None
        written = reader.deadline(deadline, "--deadline")
        spec.deadline.seconds, spec.deadline.nanos = written.seconds, written.nanos
    try:
        checked = JobSpec.from_message(spec)
        if not spec.user:  # admission takes the user from the submitter's token
            checked = dataclasses.replace(checked, user=TOKEN_USER_PLACEHOLDER)
        validate(checked, moment)
    except InvalidWord as error:
        problem = SpecError(error.field, error.problem)
        if reader.imported is not None:
            problem = _from_import(problem, reader.imported.source)
        raise problem from None
    warnings = reader.imported.warnings if reader.imported is not None else ()
    return Submission(spec, request_id_for(spec, reader.relative_deadline), warnings)


def load_spec(path: Path, now: datetime | None = None) -> job_pb2.JobSpec:
    """Read, parse and validate a spec file (see :func:`load_submission`)."""
    return load_submission(path, now).spec
