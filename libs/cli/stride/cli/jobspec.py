"""Reading a job spec file (YAML) into the ``JobSpec`` message, with errors that name the field.

The file mirrors the proto field names. Enums may be written in short lower case
(``format: tfrecord``, ``priority: high``). The deadline is an RFC 3339 time or a relative
``+90m`` / ``+6h`` / ``+2d`` from now. There are no resource fields: a key such as
``workers`` or ``gpus`` is refused with a reminder that Stride chooses resources.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from stride.events.v1 import job_pb2

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
RELATIVE_DEADLINE = re.compile(r"^\+(\d+(?:\.\d+)?)([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


class SpecError(ValueError):
    """A job spec file is not valid; ``field`` is the dotted path of the culprit."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def _enum_value(enum: Any, raw: object, path: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise SpecError(path, f"expected one of {_enum_choices(enum)}, got {raw!r}")
    if isinstance(raw, int):
        if raw not in enum.values_by_number:
            raise SpecError(path, f"unknown value {raw}")
        return raw
    prefix = _enum_prefix(enum)
    candidates = (raw, raw.upper(), f"{prefix}{raw.upper()}")
    for candidate in candidates:
        if candidate in enum.values_by_name and not candidate.endswith("_UNSPECIFIED"):
            return int(enum.values_by_name[candidate].number)
    raise SpecError(path, f"{raw!r} is not one of {_enum_choices(enum)}")


def _enum_prefix(enum: Any) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"


def _enum_choices(enum: Any) -> str:
    prefix = _enum_prefix(enum)
    return ", ".join(
        v.name.removeprefix(prefix).lower()
        for v in enum.values
        if not v.name.endswith("_UNSPECIFIED")
    )


def _deadline(raw: object, path: str, now: datetime) -> datetime:
    if isinstance(raw, datetime):
        return raw if raw.tzinfo else raw.replace(tzinfo=UTC)
    if not isinstance(raw, str):
        raise SpecError(path, f"expected an RFC 3339 time or +<n>m/h/d, got {raw!r}")
    relative = RELATIVE_DEADLINE.match(raw.strip())
    if relative:
        amount, unit = float(relative.group(1)), _UNITS[relative.group(2)]
        return now + timedelta(**{unit: amount})
    try:
        parsed = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SpecError(path, f"{raw!r} is not an RFC 3339 time or +<n>m/h/d") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _scalar(field: Any, raw: object, path: str) -> object:
    if field.type == FieldDescriptor.TYPE_STRING:
        if isinstance(raw, (dict, list)) or raw is None:
            raise SpecError(path, f"expected text, got {raw!r}")
        return str(raw)
    if field.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(raw, bool):
            raise SpecError(path, f"expected true or false, got {raw!r}")
        return raw
    if field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_INT32):
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise SpecError(path, f"expected a whole number, got {raw!r}")
        return raw
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise SpecError(path, f"expected a number, got {raw!r}")
        return float(raw)
    raise SpecError(path, "unsupported field type")


def _fill(message: Message, data: object, path: str, now: datetime) -> None:
    descriptor = message.DESCRIPTOR
    if not isinstance(data, dict):
        raise SpecError(path, f"expected a mapping, got {type(data).__name__}")
    for key, raw in data.items():
        field_path = f"{path}.{key}"
        field = descriptor.fields_by_name.get(str(key))
        if field is None:
            hint = (
                " (Stride chooses resources: remove it)"
                if str(key).lower() in RESOURCE_WORDS
                else ""
            )
            known = ", ".join(f.name for f in descriptor.fields)
            raise SpecError(field_path, f"unknown field{hint}; known fields: {known}")
        if raw is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if not isinstance(raw, dict):
                raise SpecError(field_path, "expected a mapping of names to values")
            target = getattr(message, field.name)
            for name, value in raw.items():
                if isinstance(value, (dict, list)) or value is None:
                    raise SpecError(
                        f"{field_path}.{name}", f"expected a single value, got {value!r}"
                    )
                target[str(name)] = str(value).lower() if isinstance(value, bool) else str(value)
        elif (
            field.message_type is not None
            and field.message_type.full_name == "google.protobuf.Timestamp"
        ):
            getattr(message, field.name).FromDatetime(_deadline(raw, field_path, now))
        elif field.message_type is not None:
            _fill(getattr(message, field.name), raw, field_path, now)
        elif field.enum_type is not None:
            setattr(message, field.name, _enum_value(field.enum_type, raw, field_path))
        else:
            setattr(message, field.name, _scalar(field, raw, field_path))


def parse_spec(text: str, now: datetime | None = None) -> job_pb2.JobSpec:
    """Parse YAML text into a JobSpec; raises :class:`SpecError` naming the bad field."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise SpecError("spec", f"malformed YAML{where}: {problem}") from None
    if data is None:
        raise SpecError("spec", "the file is empty")
    spec = job_pb2.JobSpec()
    _fill(spec, data, "spec", now or datetime.now(UTC))
    return spec


def load_spec(path: Path) -> job_pb2.JobSpec:
    """Read and parse a spec file."""
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError("spec", f"cannot read {path}: {error.strerror}") from None
    return parse_spec(text)
