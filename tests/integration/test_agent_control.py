# ruff: noqa: F811  (the ``stack`` fixture is imported from test_agent_service)
"""The agent's part in the live loop: dataset calls and shard snapshots forwarded for its
own job, control commands from the bus delivered to its trainer, and acks published."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from stride.api.agent.v1 import agent_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as disp_pb
from stride.bus import topics
from stride.bus.client import Bus
from stride.events.v1 import control_pb2, shard_pb2
from stride.testing.bus import producer_bus
from stride.testing.eventually import assert_eventually
from stride.testing.streams import stream_messages

from .test_agent_service import JOB, POD, Stack, expect_error, stack  # noqa: F401

pytestmark = pytest.mark.integration

PARAMETERS = disp_pb.DatasetParameters(
    record_count=400,
    batch_size=10,
    shard_batches=4,
    epochs=1,
    shuffle=True,
    seed=1,
    kind=shard_pb2.SHARDING_KIND_INDEX_LIST,
)


async def test_dataset_calls_and_shard_snapshots_are_forwarded_for_the_pods_job(
    stack: Stack,
) -> None:
    created = await stack.agent.CreateDataset(
        pb.CreateDatasetRequest(dataset="train", parameters=PARAMETERS)
    )
    assert created.created
    again = await stack.agent.CreateDataset(
        pb.CreateDatasetRequest(dataset="train", parameters=PARAMETERS)
    )
    assert not again.created
    state = (await stack.agent.GetDatasetState(pb.GetDatasetStateRequest(dataset="train"))).state
    assert not state.finished and state.done == 0
    snapshot = await stack.agent.SnapshotShards(pb.SnapshotShardsRequest(dataset="train"))
    shard = await stack.agent.NextShard(pb.NextShardRequest(dataset="train"))
    await stack.agent.ReportProgress(
        pb.ReportProgressRequest(dataset="train", shard_id=shard.shard.shard_id, done=True)
    )
    state = (await stack.agent.GetDatasetState(pb.GetDatasetStateRequest(dataset="train"))).state
    assert state.done == 1
    restored = await stack.agent.RestoreShards(
        pb.RestoreShardsRequest(dataset="train", snapshot=snapshot.snapshot.snapshot)
    )
    assert restored.restored.snapshot_id == snapshot.snapshot.snapshot_id
    state = (await stack.agent.GetDatasetState(pb.GetDatasetStateRequest(dataset="train"))).state
    assert state.done == 0  # back to the snapshot


async def test_bad_input_is_refused_naming_the_field(stack: Stack) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    await expect_error(stack.agent.CreateDataset(pb.CreateDatasetRequest()), invalid, "dataset:")
    await expect_error(
        stack.agent.GetDatasetState(pb.GetDatasetStateRequest()), invalid, "dataset:"
    )
    await expect_error(
        stack.agent.RestoreShards(pb.RestoreShardsRequest(dataset="train")), invalid, "snapshot:"
    )
    await expect_error(stack.agent.AckControl(pb.AckControlRequest()), invalid, "action:")
    await expect_error(
        stack.agent.AckControl(
            pb.AckControlRequest(
                action=control_pb2.CONTROL_ACTION_RECONFIGURE, paused_seconds=float("nan")
            )
        ),
        invalid,
        "paused_seconds:",
    )
    # The dispatcher's own refusal keeps its status.
    await expect_error(
        stack.agent.GetDatasetState(pb.GetDatasetStateRequest(dataset="nope")),
        grpc.StatusCode.NOT_FOUND,
    )


async def command(bus: Bus, pod: str, version: int, cluster: str = "{}") -> None:
    message = control_pb2.ControlCommand(
        job_id=JOB,
        pod_name=pod,
        action=control_pb2.CONTROL_ACTION_RECONFIGURE,
        plan_version=version,
        cluster_json=cluster,
        reason=f"plan v{version}",
    )
    await bus.publish(topics.CONTROL_COMMAND, JOB, message, f"{JOB}.{pod}.{version}")


async def read(stream: Any) -> pb.WatchControlResponse:
    reply: pb.WatchControlResponse = await asyncio.wait_for(stream.read(), 10)
    return reply


async def test_commands_reach_the_trainer_for_this_pod_only_and_newest_first(
    stack: Stack, nats_url: str
) -> None:
    bus = await producer_bus(nats_url, name="test-podwatcher")
    try:
        # Published before anyone watches: kept for the first watcher.
        await command(bus, POD, 2, '{"worker": ["a:1", "b:2"]}')
        await asyncio.sleep(0.3)
        stream = stack.agent.WatchControl(pb.WatchControlRequest())
        first = await read(stream)
        assert first.action == control_pb2.CONTROL_ACTION_RECONFIGURE
        assert (first.plan_version, first.cluster_json) == (2, '{"worker": ["a:1", "b:2"]}')
        await command(bus, "job-agent01-worker-9", 3)  # another pod's
        await command(bus, POD, 1)  # older than one already passed on
        await command(bus, "", 4)  # every pod's
        following = await read(stream)
        assert following.plan_version == 4
        # Garbage on the subject does not stop the agent.
        await bus.nc.publish(topics.CONTROL_COMMAND.subject(JOB), b"\xff not protobuf")
        await command(bus, POD, 5)
        last = await read(stream)
        assert last.plan_version == 5
        # A command the pod watcher did not sign is not obeyed, however new its plan (had
        # it been, v6 would come after v9 and be dropped as older).
        forged = control_pb2.ControlCommand(
            job_id=JOB,
            pod_name=POD,
            action=control_pb2.CONTROL_ACTION_RECONFIGURE,
            plan_version=9,
            cluster_json='{"worker": ["evil:1"]}',
        )
        await bus.nc.publish(
            topics.CONTROL_COMMAND.subject(JOB),
            forged.SerializeToString(),
            headers={topics.TYPE_HEADER: forged.DESCRIPTOR.full_name},
        )
        await command(bus, POD, 6)
        assert (await read(stream)).plan_version == 6
        stream.cancel()
    finally:
        await bus.close()


async def test_acks_are_published_for_the_podwatcher(stack: Stack, nats_url: str) -> None:
    await stack.agent.AckControl(
        pb.AckControlRequest(
            action=control_pb2.CONTROL_ACTION_RECONFIGURE,
            plan_version=7,
            ok=True,
            checkpoint_id="step-40",
            paused_seconds=1.5,
        )
    )

    async def published() -> list[Any]:
        found = await stream_messages(nats_url, topics.CONTROL_ACK.subject(JOB))
        assert found
        return found

    messages = await assert_eventually(published)
    ack = control_pb2.ControlAck.FromString(messages[0].data)
    assert (ack.job_id, ack.pod_name, ack.plan_version, ack.ok) == (JOB, POD, 7, True)
    assert ack.checkpoint_id == "step-40" and ack.paused_seconds == 1.5
