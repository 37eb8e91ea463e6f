"""Secrets kept out of logs and error messages.

A URL may carry credentials (``nats://user:password@host``, a NATS token as
``nats://token@host``, ``postgresql://user:password@host/db``), and settings and errors
repeat the URL they were given. :func:`redact` masks them in any text; the log pipeline
(:mod:`stride.obs.logging`) runs every line through :func:`redact_event`, so no service has
to remember to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

MASK = "***"

_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s/:@'\"]*)(?P<colon>:?)"
    r"(?P<secret>[^\s/@'\"]*)@"
)
"""``scheme://userinfo@``: the userinfo's password (after a colon), or for NATS the whole
of a userinfo without one (a token: NATS reads ``nats://token@host`` so)."""

_SECRET_KEYS = re.compile(
    r"(^|_)(pass|password|passwd|secret|token|api_?key|authorization|credentials?)($|_)", re.I
)
"""Log fields whose whole value is a secret."""


_TOKEN_SCHEMES = frozenset({"nats://", "tls://", "ws://", "wss://"})
"""Schemes whose userinfo without a password is a token (NATS token authentication);
elsewhere it is a user name, which is kept."""


def _masked(match: re.Match[str]) -> str:
    scheme, user, colon = match["scheme"], match["user"], match["colon"]
    if colon:
        return f"{scheme}{user}:{MASK}@"
    if user and scheme.lower() in _TOKEN_SCHEMES:
        return f"{scheme}{MASK}@"
    return match[0]


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it masked."""
    if "@" not in text:
        return text
    return _URL_CREDENTIALS.sub(_masked, text)


def secret_key(key: str) -> bool:
    """Whether a field named ``key`` holds a secret as a whole (``password``, ``token``...)."""
    return bool(_SECRET_KEYS.search(key))


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: MASK if secret_key(str(key)) else _redact_value(v) for key, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, bytes | bytearray):
        return [_redact_value(item) for item in value]
    if isinstance(value, BaseException):
        return redact(f"{type(value).__name__}: {value}")
    return value


def redact_event(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> dict[str, Any]:
    """A structlog processor: masks secret fields and credentials in every value."""
    return {
        key: MASK if secret_key(key) and value is not None else _redact_value(value)
        for key, value in event_dict.items()
    }
