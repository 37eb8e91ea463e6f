"""Admission places GPU jobs on the cluster's tree (ElasticFlow sec. 4.3), live: on NATS and a
real database, through gRPC, on the stepped clock so every instant is the test's.

The tree is 1 switch x 2 nodes x 8 GPUs. The GPU job's profile scales 1, 2, 4 and 8 GPUs,
so its shares are power-of-two blocks, placed with buddy allocation: aligned, on one node.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import grpc
import pytest

from stride.admission.app import build
from stride.admission.settings import AdmissionSettings
from stride.api.admission.v1 import admission_service_pb2 as pb
from stride.api.admission.v1 import admission_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.events.v1 import cluster_pb2, job_pb2
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import running_service

from .test_admission_stepped_clock import at
from .test_admission_stepped_clock import settings as stepped_settings

pytestmark = pytest.mark.integration

GIB = 1024**3


def settings(nats_url: str, database_url: str, **changes: object) -> AdmissionSettings:
    """The stepped-clock tests' admission, with 16 GPUs on a tree of 2 nodes of 8."""
    return stepped_settings(
        nats_url, database_url, **{"cluster_gpus": 16, "cluster_topology": "1x2x8", **changes}
    )


def gpu_job(name: str, steps: int, largest: int = 8) -> job_pb2.JobSpec:
    """A best-effort GPU job that scales to ``largest`` GPUs (1, 2, 4, 8 at most)."""
    sizes = [size for size in (1, 2, 4, 8) if size <= largest]
    return job_pb2.JobSpec(
        name=name,
        user="alice",
        model=job_pb2.ModelReference(name="resnet50", entrypoint="trainers.resnet:main"),
        dataset=job_pb2.DatasetSpec(name="imagenet", record_count=1_000_000),
        batch_size=256,
        termination=job_pb2.Termination(max_steps=steps),
        resource_kind=job_pb2.RESOURCE_KIND_GPU,
        profile=job_pb2.ScalingProfile(
            kind=job_pb2.RESOURCE_KIND_GPU,
            points=[
                job_pb2.ProfilePoint(workers=size, steps_per_second=10.0 * size**0.9)
                for size in sizes
            ],
        ),
        simulated=True,
    )


def placed(share: job_pb2.JobShare) -> list[tuple[str, int]]:
    return [(gpu.node, gpu.index) for gpu in share.gpus]


@pytest.fixture
async def channel(nats_url: str, database_url: str) -> AsyncIterator[grpc.aio.Channel]:
    async with (
        running_service(build, settings(nats_url, database_url)) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
    ):
        yield opened


async def test_gpu_jobs_get_aligned_blocks_on_one_node_and_the_share_names_them(
    channel: grpc.aio.Channel,
) -> None:
    stub = pb_grpc.AdmissionServiceStub(channel)
    clock = pb_grpc.ReplayClockServiceStub(channel)
    await clock.Advance(pb.AdvanceRequest(to=at(0)))
    first = (await stub.SubmitJob(pb.SubmitJobRequest(spec=gpu_job("a", 10_000_000)))).job
    assert first.share.units == 8
    # Alone, it takes a whole node: an aligned block of 8 (buddy), GPUs 0..7 of one node.
    block = placed(first.share)
    assert sorted(index for _, index in block) == list(range(8))
    assert len({node for node, _ in block}) == 1
    await clock.Advance(pb.AdvanceRequest(to=at(10)))
    second = (await stub.SubmitJob(pb.SubmitJobRequest(spec=gpu_job("b", 10_000, 4)))).job
    assert second.share.units == 4
    theirs = placed(second.share)
    # The other node's first half: aligned, on one node, beside nothing of the first job.
    assert len({node for node, _ in theirs}) == 1 and set(theirs).isdisjoint(block)
    assert sorted(index for _, index in theirs) in ([0, 1, 2, 3], [4, 5, 6, 7])
    # The first job was not moved to make room (a free aligned block existed).
    still = (await stub.GetJob(pb.GetJobRequest(job_id=first.job_id))).job
    assert placed(still.share) == block and still.share.version == first.share.version


async def test_the_tree_follows_the_node_inventory_and_survives_a_restart(
    nats_url: str, database_url: str
) -> None:
    node_settings = settings(
        nats_url, database_url, cluster_topology=None, cluster_gpus=0, capacity_source="nodes"
    )
    bus = await producer_bus(nats_url, "test-podwatcher")
    try:
        async with (
            running_service(build, node_settings) as host,
            aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
        ):
            inventory = cluster_pb2.NodeInventory(
                cluster="local",
                nodes=[
                    cluster_pb2.ClusterNode(name=name, cpu=8, memory_bytes=32 * GIB, gpus=gpus)
                    for name, gpus in (("gpu-b", 8), ("gpu-a", 8), ("cpu-only", 0))
                ],
                reason="start",
            )
            inventory.observed_at.FromDatetime(datetime.now(UTC))
            await bus.publish(topics.NODE_INVENTORY, "local", inventory, "local.nodes.1")
            stub = pb_grpc.AdmissionServiceStub(opened)
            submitted = (await stub.SubmitJob(pb.SubmitJobRequest(spec=gpu_job("a", 10**7)))).job

            async def eight_gpus() -> pb.Job:
                # Queued with no GPUs if it came before the inventory; given 8 by the round
                # the inventory's arrival runs.
                job = (await stub.GetJob(pb.GetJobRequest(job_id=submitted.job_id))).job
                assert job.share.units == 8, job.share
                return job

            first = await assert_eventually(eight_gpus)
            # The GPU nodes by name (gpu-a first), 8 GPUs each; the CPU node holds none.
            assert placed(first.share) == [("gpu-a", i) for i in range(8)]
        async with (
            running_service(build, node_settings) as host,
            aio_channel(f"127.0.0.1:{host.server.port}", "admission") as opened,
        ):
            stub = pb_grpc.AdmissionServiceStub(opened)
            kept = (await stub.GetJob(pb.GetJobRequest(job_id=first.job_id))).job
            assert placed(kept.share) == placed(first.share)
            # The restarted pool knows where the first job is: the next goes to gpu-b.
            second = (await stub.SubmitJob(pb.SubmitJobRequest(spec=gpu_job("b", 10**7)))).job
            assert placed(second.share) == [("gpu-b", i) for i in range(8)]
    finally:
        await bus.close()


def test_a_tree_that_does_not_hold_the_gpus_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="cluster_topology: 1x2x8 holds 16 GPUs, cluster_gpus"):
        settings("nats://127.0.0.1:1", "sqlite:///unused.db", cluster_gpus=32)
    with pytest.raises(ValueError, match="cluster_topology: 'two switches' is not switches"):
        settings("nats://127.0.0.1:1", "sqlite:///unused.db", cluster_topology="two switches")
