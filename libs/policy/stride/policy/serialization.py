"""Typed requests and replies to and from plain dicts of JSON-compatible values.

Algorithms take and return frozen dataclasses; the executor carries them as a protobuf
``Struct``, and JSON is what any other tool speaks. :func:`to_dict` and :func:`from_dict`
are the one bridge, and they are strict in the ways the wire is not:

- a ``Struct`` has only doubles, so an ``int`` field arrives as ``4.0``: it becomes ``4``,
  and ``4.5`` is rejected rather than truncated;
- a missing required field, an unknown field and a wrongly-typed value each raise
  :class:`InvalidRequest` naming the dotted path (``features.batch_size``);
- a dataclass that validates itself in ``__post_init__`` (a :class:`~stride.policy.plans.Plan`)
  is validated on the way in, and its error is reported at its path.

Supported field types: dataclasses, ``Enum`` (by value), ``str``, ``int``, ``float``,
``bool``, ``X | None``, ``list[X]``, ``tuple[X, ...]`` and ``dict[str, X]``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any, TypeVar

from stride.policy.errors import PolicyError

T = TypeVar("T")

MAX_EXACT_INTEGER = 2**53
"""Integers beyond this do not survive a JSON number or a Struct double exactly."""


class InvalidRequest(PolicyError):
    """A request dict does not fit its type; ``field`` is the dotted path of the culprit."""


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.\-\[\]]+")
"""Keys and field paths shown as they are (``features``, ``job-1``, ``curve.sizes[2]``)."""
_SHOWN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-. ")
"""Characters of an odd key shown in an error; any other is ``?``."""


def field_path(path: str, name: str) -> str:
    """``path.name``; a caller's key that is not a plain name is shown quoted, cut at 64
    characters, with any character but letters, digits, ``_-.`` and space as ``?``
    (``arguments['?']``): a NUL, a newline or a bidi override from a request must not reach
    an error message or a log line raw."""
    if _PLAIN_KEY.fullmatch(name):
        return f"{path}.{name}" if path else name
    shown = "".join(c if c in _SHOWN else "?" for c in name[:64])
    return f"{path}['{shown}']" if path else f"['{shown}']"


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's init fields (string annotations evaluated)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def to_dict(value: Any) -> dict[str, Any]:
    """A dataclass instance as a dict of JSON-compatible values (enums by value)."""
    if not dataclasses.is_dataclass(value) or isinstance(value, type):
        raise TypeError(f"to_dict needs a dataclass instance, got {type(value).__name__}")
    converted = _to_plain(value, "")
    assert isinstance(converted, dict)
    return converted


def _to_plain(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, Enum):
        return _to_plain(value.value, path)
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INTEGER:
            raise ValueError(f"{path or 'value'}: {value} is too large to carry exactly")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{path or 'value'}: {value} is not a JSON number")
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _to_plain(getattr(value, f.name), field_path(path, f.name))
            for f in dataclasses.fields(value)
            if f.init
        }
    if isinstance(value, list | tuple):
        return [_to_plain(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        plain: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{path or 'value'}: key {key!r} is not a string")
            plain[key] = _to_plain(item, field_path(path, key))
        return plain
    raise TypeError(f"{path or 'value'}: cannot serialize {type(value).__name__}")


def from_dict(cls: type[T], data: Any, path: str = "") -> T:
    """Build a ``cls`` dataclass from plain data, or raise :class:`InvalidRequest`.

    ``path`` prefixes every field name in errors (e.g. ``"arguments"``).
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"from_dict needs a dataclass type, got {cls!r}")
    result = _from_plain(cls, data, path)
    return typing.cast(T, result)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _problem(path: str, problem: str) -> InvalidRequest:
    return InvalidRequest(path or "request", problem)


def _from_plain(kind: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(kind)
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(kind)
        others = [member for member in members if member is not type(None)]
        if len(others) != 1 or len(members) != 2:
            raise TypeError(f"{path}: only 'X | None' unions are supported, got {kind!r}")
        return None if data is None else _from_plain(others[0], data, path)
    if data is None:
        raise _problem(path, "is required (got null)")
    if origin in (list, tuple):
        return _sequence(kind, origin, data, path)
    if origin is dict:
        return _mapping(kind, data, path)
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass(kind, data, path)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return _enum(kind, data, path)
    if kind is bool:
        if not isinstance(data, bool):
            raise _problem(path, f"must be true or false, got {_describe(data)}")
        return data
    if kind is int:
        return _integer(data, path)
    if kind is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise _problem(path, f"must be a number, got {_describe(data)}")
        if not math.isfinite(data):
            raise _problem(path, f"must be a finite number, got {data!r}")
        return float(data)
    if kind is str:
        if not isinstance(data, str):
            raise _problem(path, f"must be a string, got {_describe(data)}")
        return data
    if kind is Any:
        return data
    raise TypeError(f"{path}: unsupported field type {kind!r}")


def _enum(kind: type[Enum], data: Any, path: str) -> Enum:
    for member in kind:
        if type(data) is type(member.value) and data == member.value:
            return member
    allowed = ", ".join(repr(member.value) for member in kind)
    raise _problem(path, f"must be one of {allowed}; got {_describe(data)}")


def _integer(data: Any, path: str) -> int:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise _problem(path, f"must be a whole number, got {_describe(data)}")
    if isinstance(data, float) and not (math.isfinite(data) and data.is_integer()):
        raise _problem(path, f"must be a whole number, got {data!r}")
    if abs(data) > MAX_EXACT_INTEGER:
        raise _problem(path, f"{data!r} is too large to be carried exactly")
    return int(data)


def _sequence(kind: Any, origin: type, data: Any, path: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(data, list | tuple):
        raise _problem(path, f"must be a list, got {_describe(data)}")
    args = typing.get_args(kind)
    if origin is tuple:
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"{path}: only 'tuple[X, ...]' is supported, got {kind!r}")
        return tuple(_from_plain(args[0], item, f"{path}[{i}]") for i, item in enumerate(data))
    item_type = args[0] if args else Any
    return [_from_plain(item_type, item, f"{path}[{i}]") for i, item in enumerate(data)]


def _mapping(kind: Any, data: Any, path: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise _problem(path, f"must be an object, got {_describe(data)}")
    key_type, value_type = typing.get_args(kind) or (str, Any)
    if key_type is not str:
        raise TypeError(f"{path}: only dict[str, X] is supported, got {kind!r}")
    result: dict[str, Any] = {}
    for key, item in data.items():
        if not isinstance(key, str):
            raise _problem(path, f"keys must be strings, got {_describe(key)}")
        result[key] = _from_plain(value_type, item, field_path(path, key))
    return result


def _dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise _problem(path, f"must be an object, got {_describe(data)}")
    types_by_name = _field_types(cls)
    unknown = sorted(str(key) for key in data if key not in types_by_name)
    if unknown:
        known = ", ".join(types_by_name)
        raise _problem(field_path(path, unknown[0]), f"unknown field (known: {known})")
    arguments: dict[str, Any] = {}
    for item in dataclasses.fields(cls):
        if not item.init:
            continue
        if item.name not in data:
            has_default = (
                item.default is not dataclasses.MISSING
                or item.default_factory is not dataclasses.MISSING
            )
            if has_default:
                continue
            raise _problem(field_path(path, item.name), "is required")
        arguments[item.name] = _from_plain(
            types_by_name[item.name], data[item.name], field_path(path, item.name)
        )
    try:
        return cls(**arguments)
    except InvalidRequest:
        raise
    except PolicyError as error:
        raise _problem(field_path(path, error.field), error.problem) from error
    except (ValueError, TypeError) as error:
        # A __post_init__ check that does not name a field: blame the object as a whole.
        raise _problem(path, str(error)) from error
