"""Users and jobs as the services see them (#15): on the real services, with real NATS and a
real database, identity comes from verified tokens only.

- Job identity: a pod's job token for job A gets PERMISSION_DENIED from every job-scoped
  method of the dispatcher, the checkpoint cache and the agent when it names job B
  (whatever the request or a header says), and works on job A.
- User identity: a user sees, lists and cancels only their own jobs; a spec naming another
  user is refused; admins see all; no token is UNAUTHENTICATED; a token of another CA or
  signed by the wrong key is UNAUTHENTICATED.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from stride.admission.app import build as build_admission
from stride.admission.settings import AdmissionSettings
from stride.agent.app import build as build_agent
from stride.agent.settings import AgentSettings
from stride.api.admission.v1 import admission_service_pb2 as adm_pb
from stride.api.admission.v1 import admission_service_pb2_grpc as adm_grpc
from stride.api.agent.v1 import agent_service_pb2 as agent_pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2 as ckpt_pb
from stride.api.ckptcache.v1 import ckptcache_service_pb2_grpc as ckpt_grpc
from stride.api.configdb.v1 import configdb_service_pb2 as cdb_pb
from stride.api.configdb.v1 import configdb_service_pb2_grpc as cdb_grpc
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as disp_pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as disp_grpc
from stride.api.optimizer.v1 import optimizer_service_pb2 as opt_pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as opt_grpc
from stride.api.podwatcher.v1 import podwatcher_service_pb2 as pw_pb
from stride.api.podwatcher.v1 import podwatcher_service_pb2_grpc as pw_grpc
from stride.bus import topics
from stride.bus.client import Bus
from stride.ckptcache.app import build as build_ckptcache
from stride.ckptcache.settings import CheckpointCacheSettings
from stride.dispatcher.app import build as build_dispatcher
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import auth_pb2, job_pb2, shard_pb2
from stride.optimizer.app import build as build_optimizer
from stride.optimizer.settings import OptimizerSettings
from stride.podwatcher.adapters.outbound.dispatcher import DispatcherClient
from stride.podwatcher.app import build as build_podwatcher
from stride.podwatcher.settings import PodWatcherSettings
from stride.runtime.certs import init
from stride.runtime.tokens import Signer
from stride.testing.bus import producer_bus
from stride.testing.channels import (
    aio_channel,
    job_token,
    job_token_file,
    pod_key_file,
    user_token,
)
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service

pytestmark = pytest.mark.integration

A = "job-tenant-a"
B = "job-tenant-b"


async def code_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call
    return raised.value.code(), raised.value.details() or ""


async def drained(stream: Any) -> list[Any]:
    """Every message of a server stream (its status, if not OK, raised as AioRpcError)."""
    return [message async for message in stream]


def parameters() -> disp_pb.DatasetParameters:
    return disp_pb.DatasetParameters(
        record_count=64,
        batch_size=8,
        shard_batches=2,
        epochs=1,
        kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
    )


def worker(job: str) -> disp_pb.WorkerRef:
    return disp_pb.WorkerRef(job_id=job, dataset="train", worker=f"{job}-worker-0", incarnation=1)


def dispatcher_calls(
    stub: disp_grpc.DispatcherServiceAsyncStub, job: str
) -> dict[str, Callable[[], Awaitable[Any]]]:
    """One call per job-scoped dispatcher method, each naming ``job``."""
    return {
        "CreateDataset": lambda: stub.CreateDataset(
            disp_pb.CreateDatasetRequest(job_id=job, dataset="train", parameters=parameters())
        ),
        "RegisterWorker": lambda: stub.RegisterWorker(
            disp_pb.RegisterWorkerRequest(job_id=job, worker=f"{job}-worker-0")
        ),
        "GetShard": lambda: stub.GetShard(disp_pb.GetShardRequest(worker=worker(job))),
        "ReportProgress": lambda: stub.ReportProgress(
            disp_pb.ReportProgressRequest(worker=worker(job), shard_id=1, offset=1)
        ),
        "ReportShardDone": lambda: stub.ReportShardDone(
            disp_pb.ReportShardDoneRequest(worker=worker(job), shard_id=1)
        ),
        "ReportShardFailed": lambda: stub.ReportShardFailed(
            disp_pb.ReportShardFailedRequest(worker=worker(job), shard_id=1, reason="x")
        ),
        "GetDatasetState": lambda: stub.GetDatasetState(
            disp_pb.GetDatasetStateRequest(job_id=job, dataset="train")
        ),
        "ListDatasets": lambda: stub.ListDatasets(disp_pb.ListDatasetsRequest(job_id=job)),
        "SnapshotShards": lambda: stub.SnapshotShards(
            disp_pb.SnapshotShardsRequest(job_id=job, dataset="train")
        ),
        "RestoreShards": lambda: stub.RestoreShards(
            disp_pb.RestoreShardsRequest(job_id=job, dataset="train", snapshot=b"x")
        ),
        "MarkWorkerLost": lambda: stub.MarkWorkerLost(
            disp_pb.MarkWorkerLostRequest(job_id=job, worker=f"{job}-worker-0")
        ),
        "FetchBatches": lambda: stub.FetchBatches(
            disp_pb.FetchBatchesRequest(
                job_id=job, dataset="train", data_worker="dw-0", max_batches=1
            )
        ),
        "ReportConsumed": lambda: stub.ReportConsumed(
            disp_pb.ReportConsumedRequest(job_id=job, dataset="train", step_id=1)
        ),
    }


@pytest.fixture
async def dispatcher(nats_url: str, database_url: str) -> AsyncIterator[str]:
    settings = DispatcherSettings(
        database_url=database_url, nats_url=nats_url, grpc_port=0, grpc_host="127.0.0.1"
    )
    async with running_service(build_dispatcher, settings) as host:
        yield f"127.0.0.1:{host.server.port}"


async def test_every_dispatcher_method_refuses_another_jobs_data(dispatcher: str) -> None:
    async with aio_channel(dispatcher, "dispatcher", token=job_token(A)) as channel:
        stub = disp_grpc.DispatcherServiceStub(channel)
        calls = dispatcher_calls(stub, B)
        scoped = {
            m.name for m in disp_pb.DESCRIPTOR.services_by_name["DispatcherService"].methods
        } - {"ShardSession"}
        assert set(calls) == scoped  # every unary method is tried
        for name, call in calls.items():
            code, details = await code_of(call())
            assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
            assert f"{B!r} is another job" in details and A in details, details
        # The session stream answers in-band, with the unary call's code.
        stream: Any = stub.ShardSession()  # type: ignore[call-arg]
        await stream.write(
            disp_pb.ShardSessionRequest(
                sequence=1, get_shard=disp_pb.GetShardRequest(worker=worker(B))
            )
        )
        answer = await stream.read()
        assert answer.error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        await stream.done_writing()
        # Its own job's data is its own.
        own = dispatcher_calls(stub, A)
        assert (await own["CreateDataset"]()).created
        assert (await own["RegisterWorker"]()).incarnation >= 1
    # No token, or a plain user's: refused before anything is read.
    async with aio_channel(dispatcher, "dispatcher", token=None) as channel:
        code, details = await code_of(
            dispatcher_calls(disp_grpc.DispatcherServiceStub(channel), A)["GetShard"]()
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED and "job token" in details
    async with aio_channel(dispatcher, "dispatcher", token=user_token("alice")) as channel:
        code, details = await code_of(
            dispatcher_calls(disp_grpc.DispatcherServiceStub(channel), A)["ListDatasets"]()
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED and "user 'alice'" in details


async def test_the_operator_reads_a_jobs_data_progress_and_changes_nothing(
    dispatcher: str,
) -> None:
    """A StrideJob's progress (issue 38): the pod watcher's identity may read any job's
    dataset state, and nothing else of the dispatcher's."""
    progress = DispatcherClient(dispatcher)
    try:
        assert await progress.progress(A) is None  # no dataset yet: nothing to say
        async with aio_channel(dispatcher, "dispatcher", token=job_token(A)) as channel:
            assert (await dispatcher_calls(disp_grpc.DispatcherServiceStub(channel), A)[
                "CreateDataset"]()).created  # fmt: skip
        found = await progress.progress(A)
        assert found is not None and found.epoch == 0 and not found.finished
        assert found.epochs == parameters().epochs and found.shards > 0 and found.done == 0
    finally:
        await progress.close()
    async with aio_channel(dispatcher, "dispatcher", token=None, identity="podwatcher") as channel:
        calls = dispatcher_calls(disp_grpc.DispatcherServiceStub(channel), A)
        for name in ("CreateDataset", "GetShard", "SnapshotShards", "RestoreShards"):
            code, _ = await code_of(calls[name]())
            assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


async def test_a_header_naming_another_job_changes_nothing(dispatcher: str) -> None:
    """The old ``stride-job-id`` header is no identity: the token's job stands."""
    async with aio_channel(dispatcher, "dispatcher", token=job_token(A)) as channel:
        stub = disp_grpc.DispatcherServiceStub(channel)
        code, _ = await code_of(
            stub.ListDatasets(
                disp_pb.ListDatasetsRequest(job_id=B), metadata=(("stride-job-id", B),)
            )
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture
async def ckptcache(nats_url: str, tmp_path: Path) -> AsyncIterator[str]:
    shm = Path("/dev/shm") / f"stride-test-{uuid.uuid4().hex[:12]}"
    settings = CheckpointCacheSettings(
        nats_url=nats_url,
        store_dir=tmp_path / "store",
        shm_dir=shm,
        grpc_port=0,
        grpc_host="127.0.0.1",
    )
    try:
        async with running_service(build_ckptcache, settings) as host:
            yield f"127.0.0.1:{host.server.port}"
    finally:
        shutil.rmtree(shm, ignore_errors=True)


async def test_every_checkpoint_method_refuses_another_jobs_checkpoints(ckptcache: str) -> None:
    header = ckpt_pb.CheckpointHeader(job_id=B, checkpoint_id="step-1", step=1, size_bytes=4)
    async with aio_channel(ckptcache, "ckptcache", token=job_token(A)) as channel:
        stub = ckpt_grpc.CheckpointCacheServiceStub(channel)

        async def save() -> Any:
            async def requests() -> AsyncIterator[ckpt_pb.SaveCheckpointRequest]:
                yield ckpt_pb.SaveCheckpointRequest(header=header)
                yield ckpt_pb.SaveCheckpointRequest(data=b"abcd")

            return await stub.SaveCheckpoint(requests())

        async def load() -> Any:
            return await drained(
                stub.LoadCheckpoint(ckpt_pb.LoadCheckpointRequest(job_id=B, checkpoint_id="step-1"))
            )

        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "RegisterSegment": lambda: stub.RegisterSegment(
                ckpt_pb.RegisterSegmentRequest(header=header, segment_name="seg")
            ),
            "SaveCheckpoint": save,
            "LocateCheckpoint": lambda: stub.LocateCheckpoint(
                ckpt_pb.LocateCheckpointRequest(job_id=B, checkpoint_id="step-1")
            ),
            "LoadCheckpoint": load,
            "ListCheckpoints": lambda: stub.ListCheckpoints(
                ckpt_pb.ListCheckpointsRequest(job_id=B)
            ),
            "DeleteCheckpoint": lambda: stub.DeleteCheckpoint(
                ckpt_pb.DeleteCheckpointRequest(job_id=B, checkpoint_id="step-1")
            ),
        }
        methods = {
            m.name for m in ckpt_pb.DESCRIPTOR.services_by_name["CheckpointCacheService"].methods
        }
        assert set(calls) == methods - {"GetCacheInfo"}  # the one call naming no job
        for name, call in calls.items():
            code, details = await code_of(call())
            assert code == grpc.StatusCode.PERMISSION_DENIED, (name, code, details)
            assert f"{B!r} is another job" in details, details
        # A header naming B does not make the caller B: it lists A's (none) instead.
        listed = await stub.ListCheckpoints(
            ckpt_pb.ListCheckpointsRequest(), metadata=(("stride-job-id", B),)
        )
        assert list(listed.checkpoints) == []
        assert (await stub.GetCacheInfo(ckpt_pb.GetCacheInfoRequest())).chunk_bytes > 0
    async with aio_channel(ckptcache, "ckptcache", token=user_token("alice")) as channel:
        stub = ckpt_grpc.CheckpointCacheServiceStub(channel)
        code, _ = await code_of(stub.ListCheckpoints(ckpt_pb.ListCheckpointsRequest(job_id=A)))
        assert code == grpc.StatusCode.PERMISSION_DENIED


def closed_address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


async def test_the_agent_serves_its_own_jobs_token_only(nats_url: str, tmp_path: Path) -> None:
    closed = closed_address()
    settings = AgentSettings(
        job_id=A,
        pod_name=f"{A}-worker-0",
        role="worker",  # type: ignore[arg-type]
        dispatcher_address=closed,
        ckptcache_address=closed,
        nats_url=nats_url,
        grpc_port=0,
        job_token_file=(token_file := job_token_file(tmp_path, A, f"{A}-worker-0")),
        job_key_file=pod_key_file(token_file),
    )
    service = agent_pb.DESCRIPTOR.services_by_name["AgentService"]
    async with (
        running_service(build_agent, settings) as agent,
        aio_channel(f"127.0.0.1:{agent.server.port}", "agent", token=job_token(B)) as channel,
    ):
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            if method.client_streaming:
                call: Any = channel.stream_unary(path, None, None)(iter([b""]))
            elif method.server_streaming:
                call = drained(channel.unary_stream(path, None, None)(b""))
            else:
                call = channel.unary_unary(path, None, None)(b"")
            code, details = await code_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED, (method.name, code, details)
            assert f"serves job {A!r} only" in details


def spec(user: str = "") -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="wide-deep",
        user=user,
        model=job_pb2.ModelReference(name="wide-and-deep", entrypoint="trainers.wide_deep:main"),
        dataset=job_pb2.DatasetSpec(name="criteo-mini", record_count=100_000),
        batch_size=512,
        termination=job_pb2.Termination(max_epochs=2),
    )


@pytest.fixture
async def admission(nats_url: str, database_url: str) -> AsyncIterator[str]:
    settings = local_settings(AdmissionSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build_admission, settings) as host:
        yield f"127.0.0.1:{host.server.port}"


async def test_users_see_and_cancel_their_own_jobs_only(admission: str) -> None:
    async with (
        aio_channel(admission, "admission", token=user_token("alice")) as as_alice,
        aio_channel(admission, "admission", token=user_token("bob")) as as_bob,
        aio_channel(admission, "admission") as as_admin,
    ):
        alice = adm_grpc.AdmissionServiceStub(as_alice)
        bob = adm_grpc.AdmissionServiceStub(as_bob)
        admin = adm_grpc.AdmissionServiceStub(as_admin)
        # The user comes from the token: empty in the spec is filled in ...
        mine = (await alice.SubmitJob(adm_pb.SubmitJobRequest(spec=spec()))).job
        assert mine.spec.user == "alice"
        # ... and naming someone else is refused, storing nothing.
        code, details = await code_of(bob.SubmitJob(adm_pb.SubmitJobRequest(spec=spec("alice"))))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "spec.user" in details
        assert [j.job_id for j in (await admin.ListJobs(adm_pb.ListJobsRequest())).jobs] == [
            mine.job_id
        ]
        theirs = (await bob.SubmitJob(adm_pb.SubmitJobRequest(spec=spec("bob")))).job
        # Bob cannot see, list or cancel Alice's job.
        for call in (
            bob.GetJob(adm_pb.GetJobRequest(job_id=mine.job_id)),
            bob.CancelJob(adm_pb.CancelJobRequest(job_id=mine.job_id)),
            bob.ListJobs(adm_pb.ListJobsRequest(user="alice")),
        ):
            code, details = await code_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "user 'bob'" in details
        assert [j.job_id for j in (await bob.ListJobs(adm_pb.ListJobsRequest())).jobs] == [
            theirs.job_id
        ]
        still = (await alice.GetJob(adm_pb.GetJobRequest(job_id=mine.job_id))).job
        assert still.state != adm_pb.JOB_STATE_CANCELLED
        # An admin sees both, may act for a user, and manages quotas; a user may not.
        listed = (await admin.ListJobs(adm_pb.ListJobsRequest())).jobs
        assert {j.job_id for j in listed} == {mine.job_id, theirs.job_id}
        onbehalf = (await admin.SubmitJob(adm_pb.SubmitJobRequest(spec=spec("carol")))).job
        assert onbehalf.spec.user == "carol"
        quota = adm_pb.Quota(scope="user:bob", max_active_jobs=5)
        code, _ = await code_of(bob.SetQuota(adm_pb.SetQuotaRequest(quota=quota)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        await admin.SetQuota(adm_pb.SetQuotaRequest(quota=quota))
        await admin.SetQuota(
            adm_pb.SetQuotaRequest(quota=adm_pb.Quota(scope="user:alice", max_active_jobs=5))
        )
        # A user reads the quotas that bind them only.
        assert [
            q.quota.scope for q in (await bob.ListQuotas(adm_pb.ListQuotasRequest())).quotas
        ] == ["user:bob"]
        code, _ = await code_of(bob.GetQuota(adm_pb.GetQuotaRequest(scope="user:alice")))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        cancelled = (await alice.CancelJob(adm_pb.CancelJobRequest(job_id=mine.job_id))).job
        assert cancelled.state == adm_pb.JOB_STATE_CANCELLED


async def test_the_operator_submits_and_sees_kubernetes_namespaces_jobs_only(
    admission: str,
) -> None:
    """The pod watcher's identity (it submits StrideJobs) acts for ``k8s.<namespace>`` users
    only: never as a user a token names, never on their jobs (issue 38)."""
    async with (
        aio_channel(admission, "admission", token=None, identity="podwatcher") as as_operator,
        aio_channel(admission, "admission", token=user_token("alice")) as as_alice,
    ):
        operator = adm_grpc.AdmissionServiceStub(as_operator)
        alice = adm_grpc.AdmissionServiceStub(as_alice)
        team = (await operator.SubmitJob(adm_pb.SubmitJobRequest(spec=spec("k8s.team-a")))).job
        assert team.spec.user == "k8s.team-a"
        got = await operator.GetJob(adm_pb.GetJobRequest(job_id=team.job_id))
        assert got.job.job_id == team.job_id
        for user in ("alice", "", "k8s.", "k8s.Team_A"):
            code, details = await code_of(
                operator.SubmitJob(adm_pb.SubmitJobRequest(spec=spec(user)))
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED, (user, details)
            assert "Kubernetes namespace" in details
        hers = (await alice.SubmitJob(adm_pb.SubmitJobRequest(spec=spec()))).job
        for call in (
            operator.GetJob(adm_pb.GetJobRequest(job_id=hers.job_id)),
            operator.CancelJob(adm_pb.CancelJobRequest(job_id=hers.job_id)),
        ):
            code, details = await code_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and "another user's" in details
        code, _ = await code_of(operator.ListJobs(adm_pb.ListJobsRequest()))
        assert code == grpc.StatusCode.UNAUTHENTICATED  # listing is for users' tokens only
        cancelled = await operator.CancelJob(adm_pb.CancelJobRequest(job_id=team.job_id))
        assert cancelled.job.state == adm_pb.JOB_STATE_CANCELLED


async def test_a_request_id_is_each_users_own(admission: str) -> None:
    """Two users submitting the same file (the same derived request id) get a job each; a
    retry gets its own user's job back, never the other's."""
    async with (
        aio_channel(admission, "admission", token=user_token("alice")) as as_alice,
        aio_channel(admission, "admission", token=user_token("bob")) as as_bob,
    ):
        alice = adm_grpc.AdmissionServiceStub(as_alice)
        bob = adm_grpc.AdmissionServiceStub(as_bob)
        request = adm_pb.SubmitJobRequest(spec=spec(), request_id="spec-same")
        first = (await alice.SubmitJob(request)).job
        theirs = (await bob.SubmitJob(request)).job
        assert first.job_id != theirs.job_id and theirs.spec.user == "bob"
        assert (await alice.SubmitJob(request)).job.job_id == first.job_id
        assert (await bob.SubmitJob(request)).job.job_id == theirs.job_id


async def test_no_token_or_a_forged_one_is_unauthenticated(admission: str, tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    init(other)
    from stride.runtime import tls

    material = tls.load("users", {tls.TLS_DIR_ENV: str(other)})
    assert material is not None
    foreign = Signer(material).user_token("admin", admin=True)
    wrong_key = job_token(A)  # a job token is no user token
    for token, expected in (
        (None, "needs a user token"),
        (foreign, "not issued by this deployment's CA"),
        ("not.a.token", "not a JWT"),
    ):
        async with aio_channel(admission, "admission", token=token) as channel:
            stub = adm_grpc.AdmissionServiceStub(channel)
            code, details = await code_of(stub.ListJobs(adm_pb.ListJobsRequest()))
            assert code == grpc.StatusCode.UNAUTHENTICATED, details
            assert expected in details, details
    async with aio_channel(admission, "admission", token=wrong_key) as channel:
        code, details = await code_of(
            adm_grpc.AdmissionServiceStub(channel).ListJobs(adm_pb.ListJobsRequest())
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED and "needs a user token" in details


async def test_a_rate_limit_per_identity(nats_url: str, database_url: str) -> None:
    settings = local_settings(
        AdmissionSettings,
        nats_url=nats_url,
        database_url=database_url,
        grpc_rate_per_second=0.5,
        grpc_rate_burst=3,
    )
    async with (
        running_service(build_admission, settings) as host,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission", token=user_token("alice")) as a,
        aio_channel(f"127.0.0.1:{host.server.port}", "admission", token=user_token("bob")) as b,
    ):
        alice = adm_grpc.AdmissionServiceStub(a)
        for _ in range(3):
            await alice.ListJobs(adm_pb.ListJobsRequest())
        code, details = await code_of(alice.ListJobs(adm_pb.ListJobsRequest()))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "rate limit: user 'alice' calls admission more than 0.5 times a second" in details
        assert "retry in" in details
        # Bob is not held back by Alice.
        await adm_grpc.AdmissionServiceStub(b).ListJobs(adm_pb.ListJobsRequest())


def admitted(job_id: str, user: str) -> job_pb2.AdmissionDecision:
    return job_pb2.AdmissionDecision(
        job_id=job_id,
        outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED,
        policy="stride-guarantees/1",
        minimum_share=job_pb2.ResourceShare(workers=1, cpu=1.0, memory_bytes=2 * 1024**3),
        spec=spec(user),
    )


async def refused_as_someone_elses(call: Callable[[], Awaitable[Any]]) -> bool:
    """True once ``call`` is refused as another user's job (NOT_FOUND until the service
    has stored the admitted event)."""
    try:
        await call()
    except grpc.aio.AioRpcError as error:
        return error.code() == grpc.StatusCode.PERMISSION_DENIED
    return False


async def test_plans_are_their_owners(nats_url: str, database_url: str) -> None:
    """The optimizer answers a job's owner (the admitted spec's user, which admission took
    from the token) and admins; anyone else is refused for every method."""
    settings = local_settings(OptimizerSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build_optimizer, settings) as optimizer:
        address = f"127.0.0.1:{optimizer.server.port}"
        bus = await producer_bus(nats_url, name="test-producer")
        try:
            await bus.publish(topics.JOB_ADMITTED, A, admitted(A, "alice"), f"{A}.admitted")
        finally:
            await bus.close()
        async with (
            aio_channel(address, "optimizer", token=user_token("alice")) as as_alice,
            aio_channel(address, "optimizer", token=user_token("bob")) as as_bob,
            aio_channel(address, "optimizer") as as_admin,
        ):
            alice = opt_grpc.OptimizerServiceStub(as_alice)
            bob = opt_grpc.OptimizerServiceStub(as_bob)

            async def plan_known() -> bool:
                try:
                    await alice.GetPlan(opt_pb.GetPlanRequest(job_id=A))
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
                    return False
                return True

            await assert_eventually(plan_known, timeout=30)
            admin = opt_grpc.OptimizerServiceStub(as_admin)
            assert (await admin.ListPlans(opt_pb.ListPlansRequest(job_id=A))).plans
            for call in (
                bob.GetPlan(opt_pb.GetPlanRequest(job_id=A)),
                bob.ListPlans(opt_pb.ListPlansRequest(job_id=A)),
                bob.ListOptimizationEvents(opt_pb.ListOptimizationEventsRequest(job_id=A)),
                bob.GetPlanExplanation(opt_pb.GetPlanExplanationRequest(job_id=A)),
                bob.ScaleJob(opt_pb.ScaleJobRequest(job_id=A, workers=4, reason="mine now")),
            ):
                code, details = await code_of(call)
                assert code == grpc.StatusCode.PERMISSION_DENIED, details
                assert "another user's job" in details


async def test_pods_are_their_owners(nats_url: str, database_url: str, tmp_path: Path) -> None:
    settings = local_settings(
        PodWatcherSettings,
        nats_url=nats_url,
        database_url=database_url,
        local_state_dir=tmp_path / "pods",
        local_nodes="1x(cpu=2,memory=16Gi)",
    )
    async with running_service(build_podwatcher, settings) as podwatcher:
        address = f"127.0.0.1:{podwatcher.server.port}"
        bus = await producer_bus(nats_url, name="test-producer")
        try:
            await bus.publish(topics.JOB_ADMITTED, A, admitted(A, "alice"), f"{A}.admitted")
        finally:
            await bus.close()
        async with aio_channel(address, "podwatcher", token=user_token("bob")) as as_bob:
            bob = pw_grpc.PodWatcherServiceStub(as_bob)
            await assert_eventually(
                lambda: refused_as_someone_elses(
                    lambda: bob.GetJobPods(pw_pb.GetJobPodsRequest(job_id=A))
                ),
                timeout=30,
            )

            code, _ = await code_of(drained(bob.GetPodLogs(pw_pb.GetPodLogsRequest(job_id=A))))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert (await bob.ListNodes(pw_pb.ListNodesRequest())).nodes
            code, details = await code_of(bob.DrainNode(pw_pb.DrainNodeRequest(name="node-0")))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "admin" in details


async def test_forged_events_are_dead_lettered_and_change_nothing(
    nats_url: str, database_url: str
) -> None:
    """An ``admitted`` event nobody signed, or signed by a pod's agent key, makes no plan:
    the optimizer parks it with the reason. The genuine one (signed as admission) plans."""
    from stride.bus.signing import MessageSigner
    from stride.runtime import tls
    from stride.testing.streams import stream_messages

    settings = local_settings(OptimizerSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build_optimizer, settings) as optimizer:
        raw = await Bus.connect(nats_url, "forger")  # signs nothing
        agent = tls.load("agent")
        assert agent is not None
        as_agent = await Bus.connect(
            nats_url, "forger-agent", signer_for=lambda _subject: MessageSigner(agent)
        )
        genuine = await producer_bus(nats_url, "admission-stand-in")
        try:
            await raw.publish(topics.JOB_ADMITTED, A, admitted(A, "mallory"), f"{A}.forged")
            await as_agent.publish(topics.JOB_ADMITTED, B, admitted(B, "mallory"), f"{B}.forged")
            await genuine.publish(
                topics.JOB_ADMITTED, "job-real", admitted("job-real", "alice"), "r"
            )
        finally:
            for bus in (raw, as_agent, genuine):
                await bus.close()
        address = f"127.0.0.1:{optimizer.server.port}"
        async with aio_channel(address, "optimizer") as channel:
            stub = opt_grpc.OptimizerServiceStub(channel)

            async def planned() -> bool:
                try:
                    await stub.GetPlan(opt_pb.GetPlanRequest(job_id="job-real"))
                except grpc.aio.AioRpcError:
                    return False
                return True

            await assert_eventually(planned, timeout=30)
            for forged in (A, B):
                code, _ = await code_of(stub.GetPlan(opt_pb.GetPlanRequest(job_id=forged)))
                assert code == grpc.StatusCode.NOT_FOUND
        parked = await assert_eventually(
            lambda: stream_messages(nats_url, f"{topics.DEAD_LETTER_PREFIX}.>"), timeout=10
        )
        reasons = sorted((m.headers or {})["Stride-Dead-Letter-Reason"] for m in parked)
        assert len(reasons) == 2, reasons
        assert "sender: sent by 'agent'; only admission may publish it" in reasons
        assert "sender: unsigned: no sender signature" in reasons


async def test_one_jobs_pod_cannot_publish_another_jobs_step_metrics(
    nats_url: str, database_url: str
) -> None:
    """Every pod's agent holds the same ``agent`` certificate, so a signature by it says
    nothing of the job: step metrics signed with it, or by job A's pod (its own key and
    token) on job B's subject, are parked with the reason. Job B's own pod's are taken."""
    from stride.bus.signing import MessageSigner, PodSigner
    from stride.events.v1 import metrics_pb2
    from stride.runtime import tls
    from stride.runtime.tokens import new_pod_key
    from stride.testing.streams import stream_messages

    podwatcher = tls.load("podwatcher")
    agent = tls.load("agent")
    assert podwatcher is not None and agent is not None

    def pod_of(job: str) -> PodSigner:
        key = new_pod_key()
        token = Signer(podwatcher).job_token(
            job, f"{job}-worker-0", "worker", pod_key=key.public_key()
        )
        return PodSigner(key, lambda: token)

    def window(job: str, n: int) -> metrics_pb2.StepMetrics:
        return metrics_pb2.StepMetrics(
            job_id=job,
            pod_name=f"{job}-worker-0",
            global_step=10 * (n + 1),
            steps=10,
            step_seconds=0.1,
            samples_per_second=2560.0,
        )

    settings = local_settings(OptimizerSettings, nats_url=nats_url, database_url=database_url)
    async with running_service(build_optimizer, settings) as optimizer:
        genuine = await producer_bus(nats_url, "admission-stand-in")
        try:
            await genuine.publish(topics.JOB_ADMITTED, B, admitted(B, "bob"), f"{B}.admitted")
        finally:
            await genuine.close()
        async with aio_channel(f"127.0.0.1:{optimizer.server.port}", "optimizer") as channel:
            stub = opt_grpc.OptimizerServiceStub(channel)

            async def planned() -> bool:
                try:
                    await stub.GetPlan(opt_pb.GetPlanRequest(job_id=B))
                except grpc.aio.AioRpcError:
                    return False
                return True

            await assert_eventually(planned, timeout=30)
        buses = [
            await Bus.connect(nats_url, name, identity="agent", signer=signer)
            for name, signer in (
                ("shared-agent-key", MessageSigner(agent)),
                ("job-a-pod", pod_of(A)),
                ("job-b-pod", pod_of(B)),
            )
        ]
        try:
            for n, bus in enumerate(buses):
                await bus.publish(topics.STEP_METRICS, B, window(B, n), f"{B}.steps.{n}")
        finally:
            for bus in buses:
                await bus.close()

        async def parked_twice() -> list[str]:
            parked = await stream_messages(nats_url, f"{topics.DEAD_LETTER_PREFIX}.>")
            reasons = sorted(
                (m.headers or {})["Stride-Dead-Letter-Reason"]
                for m in parked
                if (m.headers or {}).get("Stride-Original-Subject")
                == topics.STEP_METRICS.subject(B)
            )
            assert len(reasons) == 2, reasons
            return reasons

        reasons = await assert_eventually(parked_twice, timeout=20)
        assert reasons == [
            f"sender: pod '{A}-worker-0' works for job '{A}', not '{B}'",
            "sender: unsigned: a pod's event needs its job token and its signature",
        ], reasons
        # Job B's own pod's window was taken (acknowledged), not parked.
        raw = await Bus.connect(nats_url, "reader")
        try:

            async def acknowledged() -> bool:
                info = await raw.js.consumer_info(
                    topics.STEP_METRICS.stream.name, "optimizer-step-metrics"
                )
                assert info.ack_floor.stream_seq >= 3 and info.num_pending == 0, info
                return True

            await assert_eventually(acknowledged, timeout=20)
        finally:
            await raw.close()
        assert len(await parked_twice()) == 2


async def test_revoked_tokens_are_refused_by_every_server(nats_url: str, database_url: str) -> None:
    """An admin revokes one token by its id, or every token of a user made until now:
    admission and the dispatcher (already running) refuse them within moments, a config DB
    started afterwards refuses them from its first call, and tokens made afterwards work.
    Only admins may revoke; bad requests are named; a revocation not signed by admission
    changes nothing."""
    from stride.configdb.app import build as build_configdb
    from stride.configdb.settings import ConfigDbSettings
    from stride.runtime.tokens import token_id_of

    def token_job(token: str) -> str:
        import jwt

        return str(jwt.decode(token, options={"verify_signature": False})["job"])

    def own(service: str) -> str:
        """Each service its own database (its own schema in PostgreSQL; a file in SQLite)."""
        return database_url.replace("test.db", f"{service}.db")

    ops, alice = user_token("ops", admin=True), user_token("alice")
    admission_settings = local_settings(
        AdmissionSettings, nats_url=nats_url, database_url=own("admission")
    )
    dispatcher_settings = DispatcherSettings(
        database_url=own("dispatcher"), nats_url=nats_url, grpc_port=0, grpc_host="127.0.0.1"
    )
    async with (
        running_service(build_admission, admission_settings) as admission_host,
        running_service(build_dispatcher, dispatcher_settings) as dispatcher_host,
    ):
        admission = f"127.0.0.1:{admission_host.server.port}"
        dispatcher = f"127.0.0.1:{dispatcher_host.server.port}"

        async def refused(address: str, server: str, token: str) -> tuple[grpc.StatusCode, str]:
            """How a call with ``token`` ends (``dispatcher-job``: as a pod of the token's
            job, naming that job)."""
            name = server.removesuffix("-job")
            async with aio_channel(address, name, token=token) as channel:
                try:
                    if server == "admission":
                        await adm_grpc.AdmissionServiceStub(channel).ListJobs(
                            adm_pb.ListJobsRequest()
                        )
                    else:
                        named = token_job(token) if server.endswith("-job") else A
                        await disp_grpc.DispatcherServiceStub(channel).ListDatasets(
                            disp_pb.ListDatasetsRequest(job_id=named)
                        )
                except grpc.aio.AioRpcError as error:
                    return error.code(), error.details() or ""
            return grpc.StatusCode.OK, ""

        assert await refused(admission, "admission", alice) == (grpc.StatusCode.OK, "")
        assert await refused(dispatcher, "dispatcher", ops) == (grpc.StatusCode.OK, "")
        async with (
            aio_channel(admission, "admission") as as_admin,
            aio_channel(admission, "admission", token=alice) as as_alice,
        ):
            admin_stub = adm_grpc.AdmissionServiceStub(as_admin)
            code, details = await code_of(
                adm_grpc.AdmissionServiceStub(as_alice).RevokeTokens(
                    adm_pb.RevokeTokensRequest(user="ops")
                )
            )
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            for request, named in (
                (adm_pb.RevokeTokensRequest(), "token_id: give exactly one of token_id and user"),
                (
                    adm_pb.RevokeTokensRequest(token_id=token_id_of(ops), user="ops"),
                    "give exactly one",
                ),
                (adm_pb.RevokeTokensRequest(token_id="../x"), "token_id: '../x' is not a token"),
                (adm_pb.RevokeTokensRequest(user="a\nb"), "user: must be 1 to 128 characters"),
                (
                    adm_pb.RevokeTokensRequest(user="ops", reason="x" * 257),
                    "reason: must be at most 256",
                ),
            ):
                code, details = await code_of(admin_stub.RevokeTokens(request))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and named in details, details
            # A revocation admission did not sign is skipped by every server.
            forger = await Bus.connect(nats_url, "forger")
            try:
                forged = auth_pb2.TokenRevocation(token_id=token_id_of(ops))
                key = topics.revoked_token_key(token_id_of(ops))
                await forger.publish(topics.TOKEN_REVOKED, key, forged, "forged-1")
            finally:
                await forger.close()
            await asyncio.sleep(0.5)  # delivered by now, had it been taken
            assert await refused(dispatcher, "dispatcher", ops) == (grpc.StatusCode.OK, "")
            reply = await admin_stub.RevokeTokens(
                adm_pb.RevokeTokensRequest(token_id=token_id_of(ops), reason="laptop stolen")
            )
            assert reply.revocation.token_id == token_id_of(ops)
            assert reply.revocation.revoked_by == "admin"
            assert reply.revocation.reason == "laptop stolen"
            await admin_stub.RevokeTokens(adm_pb.RevokeTokensRequest(user="alice"))
        later_alice = user_token("alice")

        async def revoked_everywhere() -> bool:
            for address, server, token in (
                (dispatcher, "dispatcher", ops),
                (admission, "admission", ops),
                (admission, "admission", alice),
            ):
                code, details = await refused(address, server, token)
                assert code == grpc.StatusCode.UNAUTHENTICATED and "revoked" in details, (
                    server,
                    code,
                    details,
                )
            return True

        await assert_eventually(revoked_everywhere, timeout=10)
        code, details = await refused(admission, "admission", alice)
        assert "every token of user 'alice' issued until" in details
        assert await refused(admission, "admission", later_alice) == (grpc.StatusCode.OK, "")
        # A job that ends takes its job tokens with it: a pod's token, copied anywhere,
        # opens none of the job's data at the dispatcher any more.
        async with aio_channel(admission, "admission", token=later_alice) as channel:
            stub = adm_grpc.AdmissionServiceStub(channel)
            job = (await stub.SubmitJob(adm_pb.SubmitJobRequest(spec=spec()))).job.job_id
            pods_token = job_token(job)
            assert await refused(dispatcher, "dispatcher-job", pods_token) == (
                grpc.StatusCode.OK,
                "",
            )
            await stub.CancelJob(adm_pb.CancelJobRequest(job_id=job))

        async def job_tokens_revoked() -> bool:
            code, details = await refused(dispatcher, "dispatcher-job", pods_token)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (code, details)
            return f"revoked: job {job!r} has ended" in details

        await assert_eventually(job_tokens_revoked, timeout=10)
        # A server started after the revocations replays them before its first call.
        configdb_settings = local_settings(
            ConfigDbSettings, nats_url=nats_url, database_url=own("configdb")
        )
        async with running_service(build_configdb, configdb_settings) as configdb_host:
            address = f"127.0.0.1:{configdb_host.server.port}"
            async with aio_channel(address, "configdb", token=ops) as channel:
                code, details = await code_of(
                    cdb_grpc.ConfigDbServiceStub(channel).ListJobRecords(
                        cdb_pb.ListJobRecordsRequest()
                    )
                )
                assert code == grpc.StatusCode.UNAUTHENTICATED, details
                assert f"token {token_id_of(ops)}" in details
            async with aio_channel(address, "configdb") as channel:  # the default admin's
                await cdb_grpc.ConfigDbServiceStub(channel).ListJobRecords(
                    cdb_pb.ListJobRecordsRequest()
                )
