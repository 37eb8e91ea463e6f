"""The agent with a real dispatcher, checkpoint cache, NATS and database, driven through the
trainer-facing API: shards, progress, checkpoints, step metrics and control."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from nats.aio.msg import Msg

from stride.agent.app import SERVICE_NAME
from stride.agent.app import build as build_agent
from stride.agent.settings import AgentSettings
from stride.api.agent.v1 import agent_service_pb2 as pb
from stride.api.agent.v1 import agent_service_pb2_grpc as pb_grpc
from stride.api.ckptcache.v1 import ckptcache_service_pb2 as ckpt_pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as ckpt_grpc
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as disp_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as disp_grpc
from stride.bus import topics
from stride.bus.signing import logical_message_id
from stride.ckptcache.app import build as build_ckptcache
from stride.ckptcache.domain.checksum import checksum
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.dispatcher.app import build as build_dispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import checkpoint_pb2, control_pb2, metrics_pb2, shard_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.testing.channels import aio_channel, job_token_file, pod_key_file
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service
from stride.testing.streams import stream_messages

pytestmark = pytest.mark.integration

JOB = "job-agent01"
POD = "job-agent01-worker-0"


@dataclass
class Stack:
    agent_host: ServiceHost
    agent: pb_grpc.AgentServiceAsyncStub
    dispatcher: disp_grpc.DispatcherServiceAsyncStub
    ckptcache: ckpt_grpc.CheckpointCacheServiceAsyncStub
    channel: grpc.aio.Channel


def agent_settings(nats_url: str, dispatcher: str, ckptcache: str, tokens: Path) -> AgentSettings:
    return AgentSettings(
        job_id=JOB,
        pod_name=POD,
        role="worker",  # type: ignore[arg-type]
        dispatcher_address=dispatcher,
        ckptcache_address=ckptcache,
        nats_url=nats_url,
        grpc_port=0,
        health_interval_seconds=0.2,
        upstream_timeout_seconds=5,
        job_token_file=(token_file := job_token_file(tokens, JOB, POD)),
        job_key_file=pod_key_file(token_file),
    )


@pytest.fixture
async def stack(nats_url: str, database_url: str, tmp_path: Path) -> AsyncIterator[Stack]:
    dispatcher_settings = DispatcherSettings(
        database_url=database_url,
        nats_url=nats_url,
        grpc_port=0,
        grpc_host="127.0.0.1",
        health_interval_seconds=0.2,
    )
    ckptcache_settings = CheckpointCacheSettings(
        store_dir=tmp_path / "store",
        shm_dir=tmp_path / "shm",  # removed with tmp_path
        chunk_bytes=64 * 1024,
        nats_url=nats_url,
        grpc_port=0,
        grpc_host="127.0.0.1",
        health_interval_seconds=0.2,
    )
    async with (
        running_service(build_dispatcher, dispatcher_settings) as dispatcher,
        running_service(build_ckptcache, ckptcache_settings) as ckptcache,
    ):
        dispatcher_address = f"127.0.0.1:{dispatcher.server.port}"
        ckptcache_address = f"127.0.0.1:{ckptcache.server.port}"
        settings = agent_settings(nats_url, dispatcher_address, ckptcache_address, tmp_path)
        async with (
            running_service(build_agent, settings) as agent,
            aio_channel(f"127.0.0.1:{agent.server.port}", "agent") as agent_channel,
            aio_channel(dispatcher_address, "dispatcher") as dispatcher_channel,
            aio_channel(ckptcache_address, "ckptcache") as ckptcache_channel,
        ):
            yield Stack(
                agent,
                pb_grpc.AgentServiceStub(agent_channel),
                disp_grpc.DispatcherServiceStub(dispatcher_channel),
                ckpt_grpc.CheckpointCacheServiceStub(ckptcache_channel),
                agent_channel,
            )


async def expect_error(call: object, code: grpc.StatusCode, starts_with: str = "") -> str:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call  # type: ignore[misc]
    assert raised.value.code() == code, raised.value.details()
    details = raised.value.details() or ""
    assert details.startswith(starts_with), details
    return details


async def create_dataset(stack: Stack, epochs: int = 2) -> None:
    await stack.dispatcher.CreateDataset(
        disp_pb.CreateDatasetRequest(
            job_id=JOB,
            dataset="train",
            parameters=disp_pb.DatasetParameters(
                record_count=500,
                batch_size=8,
                shard_batches=4,
                epochs=epochs,
                shuffle=True,
                seed=3,
                kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
            ),
        )
    )


async def test_the_trainer_pulls_every_index_once_through_the_agent(stack: Stack) -> None:
    health = health_pb2_grpc.HealthStub(stack.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    await create_dataset(stack)

    coverage: Counter[tuple[int, int]] = Counter()
    while True:
        reply = await stack.agent.NextShard(pb.NextShardRequest(dataset="train"))
        if reply.end_of_data:
            assert not reply.HasField("shard")
            break
        shard = reply.shard
        middle = (shard.end - shard.start) // 2
        await stack.agent.ReportProgress(
            pb.ReportProgressRequest(dataset="train", shard_id=shard.shard_id, offset=middle)
        )
        await stack.agent.ReportProgress(
            pb.ReportProgressRequest(dataset="train", shard_id=shard.shard_id, done=True)
        )
        coverage.update(
            (shard.epoch, index) for index in range(shard.start + shard.offset, shard.end)
        )
    assert set(coverage) == {(epoch, index) for epoch in range(2) for index in range(500)}
    assert set(coverage.values()) == {1}
    state = await stack.dispatcher.GetDatasetState(
        disp_pb.GetDatasetStateRequest(job_id=JOB, dataset="train")
    )
    assert state.finished and [w.worker for w in state.workers] == [POD]


async def test_the_agent_registers_again_after_being_declared_lost(stack: Stack) -> None:
    await create_dataset(stack, epochs=1)
    first = (await stack.agent.NextShard(pb.NextShardRequest(dataset="train"))).shard
    lost = await stack.dispatcher.MarkWorkerLost(
        disp_pb.MarkWorkerLostRequest(job_id=JOB, worker=POD)
    )
    assert lost.requeued == 1
    # The old shard was taken back: reporting on it is refused with the dispatcher's status.
    await expect_error(
        stack.agent.ReportProgress(
            pb.ReportProgressRequest(dataset="train", shard_id=first.shard_id, offset=1)
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    again = (await stack.agent.NextShard(pb.NextShardRequest(dataset="train"))).shard
    assert again.shard_id == first.shard_id  # re-registered and handed the requeued shard


async def test_shard_errors_reach_the_trainer_with_their_field(stack: Stack) -> None:
    await expect_error(
        stack.agent.NextShard(pb.NextShardRequest()), grpc.StatusCode.INVALID_ARGUMENT, "dataset:"
    )
    await expect_error(
        stack.agent.NextShard(pb.NextShardRequest(dataset="nope")), grpc.StatusCode.NOT_FOUND
    )
    await create_dataset(stack)
    shard = (await stack.agent.NextShard(pb.NextShardRequest(dataset="train"))).shard
    await expect_error(
        stack.agent.ReportProgress(
            pb.ReportProgressRequest(dataset="train", shard_id=shard.shard_id, offset=10_000)
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "offset:",
    )


def save_requests(
    header: ckpt_pb.CheckpointHeader, data: bytes, chunk: int = 50_000
) -> list[pb.SaveCheckpointRequest]:
    messages = [pb.SaveCheckpointRequest(chunk=ckpt_pb.SaveCheckpointRequest(header=header))]
    messages += [
        pb.SaveCheckpointRequest(chunk=ckpt_pb.SaveCheckpointRequest(data=data[i : i + chunk]))
        for i in range(0, len(data), chunk)
    ]
    return messages


async def save(
    stack: Stack, messages: Iterable[pb.SaveCheckpointRequest]
) -> pb.SaveCheckpointResponse:
    async def requests() -> AsyncIterator[pb.SaveCheckpointRequest]:
        for message in messages:
            yield message

    return await stack.agent.SaveCheckpoint(requests())


async def load(stack: Stack, checkpoint_id: str = "") -> tuple[ckpt_pb.CheckpointHeader, bytes]:
    replies = [
        r
        async for r in stack.agent.LoadCheckpoint(
            pb.LoadCheckpointRequest(checkpoint_id=checkpoint_id)
        )
    ]
    assert replies[0].chunk.WhichOneof("chunk") == "header"
    return replies[0].chunk.header, b"".join(r.chunk.data for r in replies[1:])


async def test_checkpoints_stream_through_the_agent(stack: Stack, nats_url: str) -> None:
    data = bytes(range(256)) * 1200  # 300 KiB, several chunks each way
    header = ckpt_pb.CheckpointHeader(
        checkpoint_id="step-40",
        step=40,
        size_bytes=len(data),
        crc32c=checksum(data),
        shard_snapshot=b"snap",
    )
    saved = await save(stack, save_requests(header, data))
    assert saved.tier == checkpoint_pb2.CHECKPOINT_TIER_MEMORY  # persisted in the background
    loaded_header, loaded = await load(stack, "step-40")
    assert (
        loaded == data and loaded_header.job_id == JOB and loaded_header.shard_snapshot == b"snap"
    )
    assert (await load(stack))[1] == data  # newest
    listed = await stack.ckptcache.ListCheckpoints(
        ckpt_pb.ListCheckpointsRequest(job_id=JOB), metadata=(("stride-job-id", JOB),)
    )
    assert [c.checkpoint_id for c in listed.checkpoints] == ["step-40"]
    events = await assert_eventually(
        lambda: stream_messages(nats_url, topics.CHECKPOINT_PERSISTED.subject(JOB))
    )
    assert len(events) == 1

    invalid = grpc.StatusCode.INVALID_ARGUMENT
    foreign = ckpt_pb.CheckpointHeader(
        job_id="job-other", checkpoint_id="x", size_bytes=len(data), crc32c=checksum(data)
    )
    # Refused streams are kept to two messages: when the server ends a call while the client
    # is still writing, grpc-aio's client reports its own INTERNAL ("Failed execute_batch")
    # instead of the server's status, a race of the client, not of the agent.
    await expect_error(
        save(stack, save_requests(foreign, data)[:2]), invalid, "chunk.header.job_id:"
    )
    await expect_error(save(stack, save_requests(header, data)[1:3]), invalid, "chunk.header:")
    await expect_error(save(stack, []), invalid, "chunk.header:")
    wrong_crc = ckpt_pb.CheckpointHeader(
        checkpoint_id="step-41", step=41, size_bytes=len(data), crc32c=checksum(data) ^ 1
    )
    await expect_error(save(stack, save_requests(wrong_crc, data)), invalid, "header.crc32c:")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await load(stack, "step-99")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_step_reports_land_on_the_metrics_stream_once(stack: Stack, nats_url: str) -> None:
    for step in (100, 200, 200):
        await stack.agent.ReportSteps(
            pb.ReportStepsRequest(
                global_step=step,
                steps=100,
                step_seconds=0.05,
                samples_per_second=10_240.0,
                plan_version=3,
            )
        )
    await expect_error(
        stack.agent.ReportSteps(pb.ReportStepsRequest(global_step=5, steps=0)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "steps:",
    )
    await expect_error(
        stack.agent.ReportSteps(pb.ReportStepsRequest(global_step=5, steps=1, plan_version=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "plan_version:",
    )
    await expect_error(
        stack.agent.ReportSteps(
            pb.ReportStepsRequest(
                global_step=5, steps=1, input_queue=metrics_pb2.InputQueue(wait_share=1.5)
            )
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "input_queue.wait_share:",
    )
    # The chief of a job read by steps reports its input queue with its window.
    queue = metrics_pb2.InputQueue(
        data_workers=2, enqueue_rate=30.0, dequeue_rate=31.0, wait_share=0.25, queue_length=7
    )
    await stack.agent.ReportSteps(
        pb.ReportStepsRequest(
            global_step=300,
            steps=100,
            step_seconds=0.05,
            samples_per_second=10_240.0,
            plan_version=3,
            input_queue=queue,
        )
    )

    async def three() -> list[Msg]:
        found = await stream_messages(nats_url, topics.STEP_METRICS.subject(JOB))
        assert len(found) >= 3
        return found

    messages = await assert_eventually(three)
    assert len(messages) == 3
    assert [logical_message_id((m.headers or {}).get("Nats-Msg-Id", "")) for m in messages] == [
        f"{POD}.3.100",
        f"{POD}.3.200",
        f"{POD}.3.300",
    ]
    assert metrics_pb2.StepMetrics.FromString(messages[2].data).input_queue == queue
    assert not metrics_pb2.StepMetrics.FromString(messages[0].data).HasField("input_queue")
    metrics = metrics_pb2.StepMetrics.FromString(messages[1].data)
    assert (
        metrics.job_id,
        metrics.pod_name,
        metrics.global_step,
        metrics.steps,
        metrics.plan_version,
    ) == (JOB, POD, 200, 100, 3)
    assert metrics.samples_per_second == 10_240.0 and metrics.reported_at.seconds > 0


async def test_watchers_get_stop_when_the_agent_shuts_down(stack: Stack) -> None:
    call = stack.agent.WatchControl(pb.WatchControlRequest())
    await call.initial_metadata()  # the watch is in place
    stack.agent_host.stop.set()
    command = await call.read()
    assert isinstance(command, pb.WatchControlResponse)
    assert command.action == control_pb2.CONTROL_ACTION_STOP and "shutting down" in command.reason
    assert await call.read() == grpc.aio.EOF  # type: ignore[attr-defined]


def closed_address() -> str:
    """An address nothing listens on (a port that was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


async def test_an_unreachable_upstream_is_named(nats_url: str, tmp_path: Path) -> None:
    closed = closed_address()
    settings = agent_settings(nats_url, closed, closed, tmp_path)
    async with (
        running_service(build_agent, settings) as agent,
        aio_channel(f"127.0.0.1:{agent.server.port}", "agent") as channel,
    ):
        stub = pb_grpc.AgentServiceStub(channel)
        details = await expect_error(
            stub.NextShard(pb.NextShardRequest(dataset="train")),
            grpc.StatusCode.UNAVAILABLE,
            "dispatcher at 127.0.0.1:",
        )
        assert closed in details
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.LoadCheckpoint(pb.LoadCheckpointRequest()).read()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (raised.value.details() or "").startswith("checkpoint cache at")


async def test_one_call_reports_a_shard_done_and_leases_the_next(stack: Stack) -> None:
    await create_dataset(stack, epochs=1)
    held = []
    while True:
        # Asked ahead while shards are held: "none now" instead of a wait on them.
        reply = await stack.agent.NextShard(pb.NextShardRequest(dataset="train", no_wait=True))
        if not reply.HasField("shard"):
            assert not reply.end_of_data
            break
        held.append(reply.shard)
    assert len(held) > 2
    covered = {index for shard in held for index in range(shard.start, shard.end)}
    assert covered == set(range(500))
    # Each call reports one shard done; with shards still held, the answer stays "none now".
    for shard in held[:-1]:
        reply = await stack.agent.NextShard(
            pb.NextShardRequest(dataset="train", done_shard_id=shard.shard_id, no_wait=True)
        )
        assert not reply.HasField("shard") and not reply.end_of_data
    state = await stack.dispatcher.GetDatasetState(
        disp_pb.GetDatasetStateRequest(job_id=JOB, dataset="train")
    )
    assert (state.todo, state.doing, state.done) == (0, 1, len(held) - 1), state
    # A done report on a shard not leased to the pod is refused and changes nothing.
    await expect_error(
        stack.agent.NextShard(pb.NextShardRequest(dataset="train", done_shard_id=held[0].shard_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        f"shard {held[0].shard_id} of 'train' is not leased",
    )
    await expect_error(
        stack.agent.NextShard(pb.NextShardRequest(dataset="train", done_shard_id=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "done_shard_id:",
    )
    # The last done report ends the data in the same call.
    reply = await stack.agent.NextShard(
        pb.NextShardRequest(dataset="train", done_shard_id=held[-1].shard_id)
    )
    assert reply.end_of_data and not reply.HasField("shard")
    state = await stack.dispatcher.GetDatasetState(
        disp_pb.GetDatasetStateRequest(job_id=JOB, dataset="train")
    )
    assert state.finished, state
