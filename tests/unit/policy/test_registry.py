"""The algorithm registry: lookup by name and version, and dict in, dict out."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stride.policy.cold_start import ColdStartReply, ColdStartRequest
from stride.policy.registry import (
    AlgorithmSpec,
    InvalidRequest,
    Registry,
    UnknownAlgorithm,
    default_registry,
    from_dict,
)


@dataclass(frozen=True)
class Numbers:
    values: list[float]


@dataclass(frozen=True)
class Total:
    total: float


def summing(version: int, name: str = "sum") -> AlgorithmSpec[Numbers, Total]:
    return AlgorithmSpec(
        name,
        version,
        f"adds numbers v{version}",
        Numbers,
        Total,
        lambda request: Total(sum(request.values) * version),
    )


def test_newest_version_unless_one_is_pinned() -> None:
    registry = Registry()
    for version in (2, 1, 3):
        registry.register(summing(version))
    assert registry.get("sum").version == 3
    assert registry.get("sum", 0).version == 3
    assert registry.get("sum", 1).qualified_name == "sum/1"
    assert [spec.qualified_name for spec in registry.list()] == ["sum/1", "sum/2", "sum/3"]
    assert registry.get("sum", 2).run_dict({"values": [1, 2.5]}) == {"total": 7.0}


def test_unknown_name_and_version_say_what_exists() -> None:
    registry = Registry()
    registry.register(summing(1))
    with pytest.raises(UnknownAlgorithm, match=r"'nope'.*known: sum"):
        registry.get("nope")
    with pytest.raises(UnknownAlgorithm, match=r"'sum' version 4.*versions 1"):
        registry.get("sum", 4)


def test_registering_twice_or_badly_is_an_error() -> None:
    registry = Registry()
    registry.register(summing(1))
    with pytest.raises(ValueError, match="already registered"):
        registry.register(summing(1))
    with pytest.raises(ValueError, match="name"):
        summing(1, name="Has Spaces")
    with pytest.raises(ValueError, match="name"):
        summing(1, name="dotted.name")
    with pytest.raises(ValueError, match="version"):
        summing(0)


def test_bad_arguments_raise_invalid_request_naming_the_field() -> None:
    spec = summing(1)
    with pytest.raises(InvalidRequest) as raised:
        spec.run_dict({"values": [1, "two"]})
    assert raised.value.field == "values[1]"


def test_a_reply_of_the_wrong_type_is_a_bug() -> None:
    spec: AlgorithmSpec[Numbers, Total] = AlgorithmSpec(
        "broken",
        1,
        "returns the wrong type",
        Numbers,
        Total,
        lambda request: request,  # type: ignore[arg-type,return-value]
    )
    with pytest.raises(TypeError, match="returned Numbers"):
        spec.run_dict({"values": []})


def test_default_registry_runs_the_cold_start_plan_from_struct_like_numbers() -> None:
    spec = default_registry().get("cold-start-plan")
    assert (spec.name, spec.version) == ("cold-start-plan", 1)
    assert spec.request_type is ColdStartRequest and "DLRover" in spec.description
    arguments = {
        "features": {
            "model_name": "wdl",
            "record_count": 1e5,
            "batch_size": 512.0,
            "max_epochs": 2.0,
            "embedding_dim": 8.0,
        }
    }
    reply = from_dict(ColdStartReply, spec.run_dict(arguments))
    assert reply.plan.algorithm == "cold-start-plan/1"
    assert default_registry() is not default_registry()


def test_default_registry_ships_every_papers_algorithms() -> None:
    names = {spec.name for spec in default_registry().list()}
    assert {
        "cold-start-plan",
        "dlrover-initial-plan",
        "dlrover-adjust",
        "dlrover-throughput-fit",
        "dlrover-throughput-predict",
        "dlrover-oom-predict",
        "dlrover-pareto-candidates",
        "dlrover-weighted-greedy",
        "dlrover-warm-start",
        "elasticflow-admission",
        "elasticflow-allocation",
        "elasticflow-placement",
        "kod2-schedule",
        "kod2-placement",
        "goldminer-tune-step",
        "goldminer-cluster-allocation",
    } <= names
    for spec in default_registry().list():
        assert spec.description, spec.qualified_name
