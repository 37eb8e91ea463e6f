"""A chief whose steps take longer than the dispatcher's lease keeps its shard: the trainer's
lease heartbeat through the real agent and dispatcher (a short lease stands for a worker
being relaunched under a step)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import structlog

from stride.agent.app import build as build_agent
from stride.agent.settings import AgentSettings
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as disp_pb
from stride.dispatcher.app import build as build_dispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import shard_pb2
from stride.runtime.tokens import TokenSource
from stride.testing.channels import job_token_file, pod_key_file
from stride.testing.inprocess import running_service
from stride.trainer.agent_client import AgentClient
from stride.trainer.feed import LeaseKeeper

pytestmark = pytest.mark.integration

JOB = "job-leases01"
LEASE = 4.0
"""Seconds: the dispatcher takes an unreported shard back after this (and a sweep). Long
enough that a loaded host (a full test run starved this process for over 5 s once) does not
lapse a heartbeaten lease: every heartbeat is late only if the whole process stalls."""


@pytest.fixture
async def agent(nats_url: str, database_url: str, tmp_path: Path) -> AsyncIterator[AgentClient]:
    dispatcher_settings = DispatcherSettings(
        database_url=database_url,
        nats_url=nats_url,
        grpc_port=0,
        grpc_host="127.0.0.1",
        health_interval_seconds=0.2,
        lease_seconds=LEASE,
        sweep_interval_seconds=0.2,
    )
    async with running_service(build_dispatcher, dispatcher_settings) as dispatcher:
        settings = AgentSettings(
            job_id=JOB,
            pod_name=f"{JOB}-chief-0",
            role="chief",  # type: ignore[arg-type]
            dispatcher_address=f"127.0.0.1:{dispatcher.server.port}",
            nats_url=nats_url,
            grpc_port=0,
            health_interval_seconds=0.2,
            upstream_timeout_seconds=5,
            job_token_file=(token_file := job_token_file(tmp_path, JOB, f"{JOB}-chief-0", "chief")),
            job_key_file=pod_key_file(token_file),
        )
        async with running_service(build_agent, settings) as host:
            client = AgentClient(
                f"127.0.0.1:{host.server.port}",
                patience=10,
                timeout=10,
                token=TokenSource(path=tmp_path / f"{JOB}-chief-0.token"),
            )
            try:
                yield client
            finally:
                client.close()


async def leased_shard(agent: AgentClient) -> shard_pb2.Shard:
    await asyncio.to_thread(
        agent.create_dataset,
        "train",
        disp_pb.DatasetParameters(
            record_count=64,
            batch_size=8,
            shard_batches=2,
            epochs=1,
            kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
        ),
    )
    shard, _ = await asyncio.to_thread(agent.next_shard, "train")
    assert shard is not None
    return shard


class Refusals(list[dict[str, object]]):
    """The heartbeats the keeper says were refused (its ``say``)."""

    def __call__(self, event: str, **fields: object) -> None:
        self.append({"event": event, **fields})


async def test_a_shard_held_past_its_lease_is_kept_by_the_heartbeat(agent: AgentClient) -> None:
    """A run in which the host starved this process past the lease proves nothing (no
    heartbeat could leave, and the keeper says so when one times out): it is repeated, up to
    three times in all."""
    shard = await leased_shard(agent)
    for attempt in range(3):
        if attempt:
            again, _ = await asyncio.to_thread(agent.next_shard, "train")
            assert again is not None
            shard = again
        refused = Refusals()
        keeper = LeaseKeeper(agent, "train", every=LEASE / 8, say=refused)
        try:
            keeper.hold(shard)
            await asyncio.sleep(LEASE * 2.5)  # the steps of a shard that wait on a worker
            keeper.release(shard.shard_id)
        finally:
            keeper.close()
        if refused:
            structlog.get_logger().warning("starved past the lease; again", refused=refused)
            continue
        # Still ours: the done report counts.
        await asyncio.to_thread(agent.report, "train", shard.shard_id, shard.end, True)
        state = await asyncio.to_thread(agent.dataset_state, "train")
        assert state.done >= 1, state
        return
    pytest.fail("every attempt was starved past the lease")


async def test_without_the_heartbeat_the_lease_lapses_and_done_is_refused(
    agent: AgentClient,
) -> None:
    shard = await leased_shard(agent)
    started = time.monotonic()
    await asyncio.sleep(LEASE * 2)
    assert time.monotonic() - started > LEASE
    with pytest.raises(grpc.RpcError) as refused:
        await asyncio.to_thread(agent.report, "train", shard.shard_id, shard.end, True)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
