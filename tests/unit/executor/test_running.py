"""The runner on protobuf requests, without NATS: statuses, errors by field, Struct numbers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from google.protobuf.struct_pb2 import Struct

from stride.events.v1 import optimization_pb2 as events
from stride.events.v1 import plan_pb2
from stride.executor.adapters.convert import dict_to_struct, struct_to_dict
from stride.executor.usecases import AlgorithmFailed, AlgorithmRunner
from stride.policy.cold_start import ColdStartReply
from stride.policy.registry import AlgorithmSpec, Registry, default_registry, from_dict
from stride.runtime.errors import InvalidArgument, NotFound

FEATURES = {"model_name": "wdl", "record_count": 100_000, "batch_size": 512, "max_epochs": 2}


def request(
    arguments: dict[str, Any], algorithm: str = "cold-start-plan", version: int = 0
) -> events.AlgorithmRequest:
    return events.AlgorithmRequest(
        request_id="r-1",
        algorithm=algorithm,
        version=version,
        job_id="job-1",
        arguments=dict_to_struct(arguments),
    )


@dataclass(frozen=True)
class Empty:
    """A request and reply with no fields."""


def exploding(_: Empty) -> Empty:
    raise ZeroDivisionError("boom")


def runner_with_broken_algorithm() -> AlgorithmRunner:
    registry = default_registry()
    registry.register(AlgorithmSpec("broken", 1, "always fails", Empty, Empty, exploding))
    return AlgorithmRunner(registry, "test")


async def test_cold_start_runs_and_returns_result_and_plan() -> None:
    reply = await AlgorithmRunner(default_registry(), "test").run(request({"features": FEATURES}))
    assert reply.status == events.ALGORITHM_STATUS_OK
    assert (reply.request_id, reply.algorithm) == ("r-1", "cold-start-plan/1")
    assert reply.elapsed_seconds > 0
    result = from_dict(ColdStartReply, struct_to_dict(reply.result))
    assert result.plan.reason == "cold start"
    (plan,) = reply.plans
    assert (plan.job_id, plan.version, plan.algorithm) == ("job-1", 0, "cold-start-plan/1")
    assert {r.role for r in plan.roles} == {
        plan_pb2.ROLE_CHIEF,
        plan_pb2.ROLE_PS,
        plan_pb2.ROLE_WORKER,
    }


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (request({"features": {**FEATURES, "batch_size": 2.5}}), "arguments.features.batch_size"),
        (request({"features": {**FEATURES, "colour": "red"}}), "arguments.features.colour"),
        (request({}), "arguments.features"),
        (request({"features": FEATURES, "max_pod_cpu": -1}), "arguments.max_pod_cpu"),
        (request({"features": FEATURES}, algorithm=""), "algorithm"),
        (request({"features": FEATURES}, version=-1), "version"),
    ],
)
async def test_bad_requests_name_the_field(message: events.AlgorithmRequest, field: str) -> None:
    runner = AlgorithmRunner(default_registry(), "test")
    with pytest.raises(InvalidArgument) as raised:
        await runner.run(message)
    assert raised.value.field == field
    reply = await runner.reply_to(message)
    assert reply.status == events.ALGORITHM_STATUS_INVALID_ARGUMENT
    assert reply.error.startswith(f"{field}: ")
    assert not reply.HasField("result")


async def test_unknown_algorithm_or_version_is_not_found() -> None:
    runner = AlgorithmRunner(default_registry(), "test")
    for message in (request({}, algorithm="nsga2"), request({}, version=9)):
        with pytest.raises(NotFound):
            await runner.run(message)
        reply = await runner.reply_to(message)
        assert reply.status == events.ALGORITHM_STATUS_NOT_FOUND
        assert "no algorithm" in reply.error


async def test_a_crashing_algorithm_is_internal_with_its_error() -> None:
    runner = runner_with_broken_algorithm()
    with pytest.raises(AlgorithmFailed, match="broken/1 failed: ZeroDivisionError: boom"):
        await runner.run(request({}, algorithm="broken"))
    reply = await runner.reply_to(request({}, algorithm="broken"))
    assert reply.status == events.ALGORITHM_STATUS_INTERNAL and "boom" in reply.error


def test_struct_round_trip_keeps_nesting_and_nulls() -> None:
    values = {"a": 1, "b": [1.5, "x", None, True], "c": {"d": {}}}
    struct = dict_to_struct(values)
    assert isinstance(struct, Struct)
    assert struct_to_dict(struct) == {"a": 1.0, "b": [1.5, "x", None, True], "c": {"d": {}}}


def test_registry_listing_is_what_the_runner_offers() -> None:
    registry = Registry()
    assert AlgorithmRunner(registry, "test").algorithms() == []
