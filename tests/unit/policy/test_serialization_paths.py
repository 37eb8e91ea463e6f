"""Field paths in the policy library's input errors: a caller's odd key is shown escaped."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stride.policy.serialization import InvalidRequest, from_dict


@dataclass(frozen=True)
class _Arguments:
    features: int
    max_pod_cpu: float = 1.0


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("\x00", "arguments['?']"),
        ("a\nb", "arguments['a?b']"),
        ("it's", "arguments['it?s']"),
        ("é\u202e😀", "arguments['???']"),
        ("job-1", "arguments.job-1"),
        ("x\x01" * 50, "arguments['" + "x?" * 32 + "']"),  # cut at 64 characters
    ],
)
def test_an_unknown_key_is_named_without_raw_control_characters(key: str, shown: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        from_dict(_Arguments, {"features": 1, key: 2}, "arguments")
    assert raised.value.field == shown
    assert "unknown field (known: features, max_pod_cpu)" in str(raised.value)
    assert "\x00" not in str(raised.value) and "\n" not in str(raised.value)
