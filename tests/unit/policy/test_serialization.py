"""to_dict / from_dict: exact round trips, Struct's float-only numbers, and errors by path."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest
from hypothesis import given

from stride.policy.cold_start import ColdStartReply, ColdStartRequest, JobFeatures
from stride.policy.plans import Plan, Role
from stride.policy.serialization import InvalidRequest, from_dict, to_dict

from .strategies import job_features, plans


class Color(Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner:
    weight: float
    tags: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Outer:
    count: int
    color: Color
    inner: Inner
    items: tuple[Inner, ...] = ()
    limit: int | None = None
    labels: dict[str, int] = field(default_factory=dict)
    enabled: bool = False


def as_struct_numbers(value: Any) -> Any:
    """What a protobuf Struct gives back: every number a float."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return [as_struct_numbers(item) for item in value]
    return {key: as_struct_numbers(item) for key, item in value.items()}


def test_nested_values_round_trip_through_json_and_float_numbers() -> None:
    value = Outer(
        count=3,
        color=Color.BLUE,
        inner=Inner(0.5, ["a"]),
        items=(Inner(1.0), Inner(2.5, ["x", "y"])),
        limit=7,
        labels={"k": 2},
        enabled=True,
    )
    plain = to_dict(value)
    assert plain["color"] == "blue" and plain["items"][1] == {"weight": 2.5, "tags": ["x", "y"]}
    assert json.loads(json.dumps(plain)) == plain
    restored = from_dict(Outer, as_struct_numbers(plain))
    assert restored == value
    assert isinstance(restored.count, int) and isinstance(restored.labels["k"], int)
    assert isinstance(restored.items, tuple) and isinstance(restored.inner.tags, list)


def test_defaults_fill_missing_optional_fields_and_null_is_none() -> None:
    restored = from_dict(Outer, {"count": 1, "color": "red", "inner": {"weight": 1}, "limit": None})
    assert restored == Outer(count=1, color=Color.RED, inner=Inner(1.0))
    assert isinstance(restored.inner.weight, float)


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({"color": "red", "inner": {"weight": 1}}, "count", "is required"),
        ({"count": 1.5, "color": "red", "inner": {"weight": 1}}, "count", "whole number"),
        ({"count": True, "color": "red", "inner": {"weight": 1}}, "count", "whole number"),
        ({"count": "1", "color": "red", "inner": {"weight": 1}}, "count", "whole number"),
        (
            {"count": 1, "color": "green", "inner": {"weight": 1}},
            "color",
            "must be one of 'red', 'blue'",
        ),
        ({"count": 1, "color": "red", "inner": {"weight": "heavy"}}, "inner.weight", "number"),
        (
            {"count": 1, "color": "red", "inner": {"weight": 1, "extra": 2}},
            "inner.extra",
            "unknown field",
        ),
        ({"count": 1, "color": "red", "inner": []}, "inner", "must be an object"),
        ({"count": 1, "color": "red", "inner": None}, "inner", "is required"),
        (
            {"count": 1, "color": "red", "inner": {"weight": 1}, "items": [{"weight": 1}, {}]},
            "items[1].weight",
            "is required",
        ),
        (
            {"count": 1, "color": "red", "inner": {"weight": 1}, "items": "abc"},
            "items",
            "must be a list",
        ),
        (
            {"count": 1, "color": "red", "inner": {"weight": 1}, "labels": {"a": 0.5}},
            "labels.a",
            "whole number",
        ),
        (
            {"count": 1, "color": "red", "inner": {"weight": 1}, "enabled": 1},
            "enabled",
            "true or false",
        ),
        ({"count": 2.0**60, "color": "red", "inner": {"weight": 1}}, "count", "too large"),
        ({"count": 1, "color": "red", "inner": {"weight": float("nan")}}, "inner.weight", "finite"),
    ],
)
def test_bad_fields_are_named_by_path(data: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        from_dict(Outer, data, path="arguments")
    assert raised.value.field == f"arguments.{field}"
    assert problem in raised.value.problem


def test_a_non_object_request_is_blamed_on_the_request() -> None:
    with pytest.raises(InvalidRequest) as raised:
        from_dict(Outer, [1, 2])
    assert raised.value.field == "request"


def test_validation_inside_dataclasses_is_reported_at_its_path() -> None:
    plain = {
        "plan": {
            "roles": [{"role": "ps", "count": 1, "cpu": -1, "memory_bytes": 1}],
            "reason": "r",
            "algorithm": "a/1",
        }
    }
    with pytest.raises(InvalidRequest) as raised:
        from_dict(ColdStartReply, plain)
    assert raised.value.field == "plan.roles[0].cpu"
    features = {"model_name": "m", "record_count": 10, "batch_size": 2}
    with pytest.raises(InvalidRequest) as raised:
        from_dict(ColdStartRequest, {"features": features})
    assert raised.value.field == "features.max_steps"


def test_to_dict_refuses_values_json_cannot_carry() -> None:
    with pytest.raises(ValueError, match="too large"):
        to_dict(Outer(count=2**60, color=Color.RED, inner=Inner(1.0)))
    with pytest.raises(ValueError, match="not a JSON number"):
        to_dict(Inner(float("inf")))
    with pytest.raises(TypeError):
        to_dict({"not": "a dataclass"})


@given(plans())
def test_plans_round_trip_exactly(plan: Plan) -> None:
    plain = to_dict(plan)
    assert json.loads(json.dumps(plain)) == plain
    assert from_dict(Plan, as_struct_numbers(plain)) == plan
    assert all(role["role"] in {r.value for r in Role} for role in plain["roles"])


@given(job_features())
def test_requests_round_trip_exactly(features: JobFeatures) -> None:
    request = ColdStartRequest(features=features, max_pod_cpu=4.0)
    assert from_dict(ColdStartRequest, as_struct_numbers(to_dict(request))) == request
