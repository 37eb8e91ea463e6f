"""Two executor replicas on real NATS: the queue group spreads work, errors come back typed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stride.api.executor.v1 import executor_service_pb2 as pb
from stride.api.executor.v1 import executor_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import optimization_pb2 as events
from stride.executor.adapters.convert import dict_to_struct, struct_to_dict
from stride.executor.app import SERVICE_NAME, build
from stride.executor.settings import ExecutorSettings
from stride.policy.cold_start import ColdStartReply
from stride.policy.registry import default_registry, from_dict
from stride.runtime.lifecycle import ServiceHost
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.inprocess import running_service

if TYPE_CHECKING:
    from stride.api.executor.v1.executor_service_pb2_grpc import ExecutorServiceAsyncStub as Stub

pytestmark = pytest.mark.integration

REPLICAS = ("replica-a", "replica-b")
FEATURES = {
    "model_name": "wide-and-deep",
    "record_count": 100_000,
    "batch_size": 512,
    "max_epochs": 2,
    "embedding_dim": 8,
}


def algorithm_request(
    arguments: dict[str, Any],
    algorithm: str = "cold-start-plan",
    version: int = 0,
    request_id: str = "r",
) -> events.AlgorithmRequest:
    return events.AlgorithmRequest(
        request_id=request_id,
        algorithm=algorithm,
        version=version,
        job_id="job-1",
        arguments=dict_to_struct(arguments),
    )


@pytest.fixture
async def executors(nats_url: str) -> AsyncIterator[list[ServiceHost]]:
    async with AsyncExitStack() as stack:
        hosts = []
        for replica in REPLICAS:
            settings = ExecutorSettings(
                nats_url=nats_url,
                grpc_port=0,
                grpc_host="127.0.0.1",
                replica_name=replica,
                request_concurrency=2,
                health_interval_seconds=0.2,
                shutdown_grace_seconds=2,
            )
            hosts.append(await stack.enter_async_context(running_service(build, settings)))
        yield hosts


@pytest.fixture
async def bus(executors: list[ServiceHost], nats_url: str) -> AsyncIterator[Bus]:
    connected = await producer_bus(nats_url, name="test-optimizer")
    try:
        yield connected
    finally:
        await connected.close()


@pytest.fixture
async def stub(executors: list[ServiceHost]) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{executors[0].server.port}", "executor") as channel:
        yield pb_grpc.ExecutorServiceStub(channel)


async def run_over_nats(bus: Bus, message: events.AlgorithmRequest) -> events.AlgorithmReply:
    payload = await bus.request(topics.EXECUTOR_RUN, message.algorithm or "x", message, timeout=5)
    return events.AlgorithmReply.FromString(payload)


async def test_requests_are_spread_over_both_replicas(
    bus: Bus, spans: InMemorySpanExporter
) -> None:
    count = 40
    replies = await asyncio.gather(
        *(
            run_over_nats(bus, algorithm_request({"features": FEATURES}, request_id=f"r-{i}"))
            for i in range(count)
        )
    )
    assert [reply.request_id for reply in replies] == [f"r-{i}" for i in range(count)]
    for reply in replies:
        assert reply.status == events.ALGORITHM_STATUS_OK, reply.error
        assert reply.algorithm == "cold-start-plan/1"
        plan = from_dict(ColdStartReply, struct_to_dict(reply.result)).plan
        assert plan.reason == "cold start" and len(reply.plans) == 1
    runs = [span for span in spans.get_finished_spans() if span.name == "run cold-start-plan/1"]
    served_by = [str((span.attributes or {})["stride.executor.replica"]) for span in runs]
    assert len(served_by) == count
    # Random placement over 2 replicas: all 40 on one has probability 2 * 2**-40.
    assert set(served_by) == set(REPLICAS)


async def test_unknown_algorithm_and_bad_arguments_over_nats(bus: Bus) -> None:
    missing = await run_over_nats(bus, algorithm_request({}, algorithm="nsga2"))
    assert missing.status == events.ALGORITHM_STATUS_NOT_FOUND
    assert "'nsga2'" in missing.error and "cold-start-plan" in missing.error
    old = await run_over_nats(bus, algorithm_request({"features": FEATURES}, version=7))
    assert old.status == events.ALGORITHM_STATUS_NOT_FOUND

    bad = await run_over_nats(bus, algorithm_request({"features": {**FEATURES, "batch_size": 0.5}}))
    assert bad.status == events.ALGORITHM_STATUS_INVALID_ARGUMENT
    assert bad.error.startswith("arguments.features.batch_size: must be a whole number")
    assert not bad.HasField("result") and not bad.plans


async def test_undecodable_requests_get_a_reply_and_do_not_stop_the_pool(bus: Bus) -> None:
    subject = topics.EXECUTOR_RUN.subject("cold-start-plan")
    for payload, headers in [
        (b"not protobuf", None),
        (b'{"algorithm": "cold-start-plan"}', {"Stride-Type": "stride.events.v1.AlgorithmRequest"}),
        (
            events.AlgorithmRequest().SerializeToString(),
            {"Stride-Type": "stride.events.v1.JobFinished"},
        ),
    ]:
        reply = events.AlgorithmReply.FromString(
            (await bus.nc.request(subject, payload, timeout=5, headers=headers)).data
        )
        assert reply.status == events.ALGORITHM_STATUS_INVALID_ARGUMENT
        assert reply.error.startswith("request: ")
    empty = events.AlgorithmReply.FromString((await bus.nc.request(subject, b"", timeout=5)).data)
    assert empty.status == events.ALGORITHM_STATUS_INVALID_ARGUMENT
    assert empty.error == "algorithm: is required"
    good = await run_over_nats(bus, algorithm_request({"features": FEATURES}))
    assert good.status == events.ALGORITHM_STATUS_OK


async def test_run_and_list_over_grpc(stub: Stub, executors: list[ServiceHost]) -> None:
    response = await stub.RunAlgorithm(
        pb.RunAlgorithmRequest(request=algorithm_request({"features": FEATURES}, version=1))
    )
    assert response.reply.status == events.ALGORITHM_STATUS_OK
    assert response.reply.plans[0].algorithm == "cold-start-plan/1"

    listed = await stub.ListAlgorithms(pb.ListAlgorithmsRequest())
    listed_names = [(a.name, list(a.versions)) for a in listed.algorithms]
    expected = [(spec.name, [spec.version]) for spec in default_registry().list()]
    assert listed_names == expected
    assert ("cold-start-plan", [1]) in listed_names and (
        "elasticflow-admission",
        [1],
    ) in listed_names
    assert all(a.description for a in listed.algorithms)

    async with aio_channel(f"127.0.0.1:{executors[1].server.port}", "executor") as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        )
    assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize(
    ("request_message", "code", "detail"),
    [
        (
            pb.RunAlgorithmRequest(request=algorithm_request({}, algorithm="nsga2")),
            grpc.StatusCode.NOT_FOUND,
            "no algorithm 'nsga2'",
        ),
        (
            pb.RunAlgorithmRequest(
                request=algorithm_request({"features": {**FEATURES, "batch_size": -1}})
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "arguments.features.batch_size: ",
        ),
        (
            pb.RunAlgorithmRequest(request=algorithm_request({"features": FEATURES, "extra": 1})),
            grpc.StatusCode.INVALID_ARGUMENT,
            "arguments.extra: unknown field",
        ),
        (pb.RunAlgorithmRequest(), grpc.StatusCode.INVALID_ARGUMENT, "request: is required"),
    ],
)
async def test_errors_over_grpc(
    stub: Stub, request_message: pb.RunAlgorithmRequest, code: grpc.StatusCode, detail: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.RunAlgorithm(request_message)
    assert raised.value.code() == code
    assert (raised.value.details() or "").startswith(detail)


@pytest.fixture
async def limited(nats_url: str) -> AsyncIterator[ServiceHost]:
    """One replica with one worker process and a one-second limit per request."""
    settings = ExecutorSettings(
        nats_url=nats_url,
        grpc_port=0,
        grpc_host="127.0.0.1",
        replica_name="limited",
        request_concurrency=1,
        request_time_limit_seconds=1.0,
        registry="stride.testing.algorithms:registry",
        health_interval_seconds=0.2,
        shutdown_grace_seconds=2,
    )
    async with running_service(build, settings) as host:
        yield host


async def test_a_run_past_the_time_limit_is_stopped_and_the_slot_serves_again(
    limited: ServiceHost, nats_url: str
) -> None:
    """A request that would hold a core for a minute is stopped at the limit (its worker
    process killed, DEADLINE_EXCEEDED through gRPC, the same status on NATS); the slot's
    new worker then answers as before, and failures inside a worker stay INTERNAL."""
    async with aio_channel(f"127.0.0.1:{limited.server.port}", "executor") as channel:
        stub: Stub = pb_grpc.ExecutorServiceStub(channel)
        started = asyncio.get_running_loop().time()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.RunAlgorithm(
                pb.RunAlgorithmRequest(request=algorithm_request({"seconds": 60.0}, "test-spin"))
            )
        waited = asyncio.get_running_loop().time() - started
        assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "time limit of 1 s" in (raised.value.details() or "")
        assert 1.0 <= waited < 10.0, waited
        # The slot's worker was replaced: a short run is answered (after its imports).
        reply = await stub.RunAlgorithm(
            pb.RunAlgorithmRequest(request=algorithm_request({"seconds": 0.05}, "test-spin"))
        )
        assert reply.reply.status == events.ALGORITHM_STATUS_OK
        assert struct_to_dict(reply.reply.result)["spun_seconds"] >= 0.05
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.RunAlgorithm(
                pb.RunAlgorithmRequest(request=algorithm_request({}, "test-explode"))
            )
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert "ZeroDivisionError: this algorithm always fails" in (failed.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await stub.RunAlgorithm(
                pb.RunAlgorithmRequest(request=algorithm_request({"seconds": "long"}, "test-spin"))
            )
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bus = await producer_bus(nats_url, name="test-optimizer")
    try:
        over = algorithm_request({"seconds": 60.0}, "test-spin", request_id="over")
        answer = events.AlgorithmReply.FromString(
            await bus.request(topics.EXECUTOR_RUN, over.algorithm, over, timeout=30)
        )
    finally:
        await bus.close()
    assert answer.status == events.ALGORITHM_STATUS_DEADLINE_EXCEEDED
    assert answer.request_id == "over" and "time limit" in answer.error
