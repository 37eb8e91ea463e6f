"""Stragglers, live (DLRover-RM sec. 5.1), on real NATS and a real database.

Worker clients read a dataset through the client library while one of them trains ten
times slower than its peers. The dispatcher's sweeper flags it from the rates its reports
give and publishes StragglerDetected; its next grants are cut to half a shard while its
peers get whole ones; once it speeds up the flag clears and it gets whole shards again.
Every index of every epoch is still trained exactly once. A worker registered again (a new
process) starts afresh, without the old verdict or rate.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
from stride.bus import topics
from stride.dispatcher.app import build
from stride.dispatcher.settings import DispatcherSettings
from stride.events.v1 import shard_pb2
from stride.runtime.lifecycle import ServiceHost
from stride.shardclient import Committed, ShardClient, ShardReader
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.inprocess import local_settings, running_service
from stride.testing.streams import stream_messages

if TYPE_CHECKING:
    Stub = pb_grpc.DispatcherServiceAsyncStub

pytestmark = pytest.mark.integration

JOB = "job-strag01"
RECORDS = 6_000
EPOCHS = 2
BATCH = 5
SHARD_BATCHES = 8
SHARD = BATCH * SHARD_BATCHES
"""Records in a whole shard (40); a straggler's are cut to half."""
FAST_SECONDS_PER_BATCH = 0.004
SLOW_SECONDS_PER_BATCH = 0.04
"""The straggler trains ten times slower than its peers (the rule flags below one half of
their median) until it has had :data:`SLOW_GRANTS` cut-down shards, then as fast."""
SLOW_GRANTS = 4
SLOW = "slow"
WORKERS = ("fast-0", "fast-1", "fast-2", SLOW)


@dataclass(frozen=True)
class Grant:
    """A shard lease a worker started reading: records left in it, and the straggler mark
    its GetShard answer carried."""

    shard_id: int
    records: int
    straggler: bool


@dataclass
class Worker:
    """A training worker: a thread reading sample indices through the client library."""

    name: str
    address: str
    shards_per_call: int
    stop: threading.Event
    ledger: list[Committed] = field(default_factory=list)
    """What the dispatcher accepted as trained (the reader's ``on_commit``)."""
    grants: list[Grant] = field(default_factory=list)
    error: BaseException | None = None
    recovered: bool = False
    finished: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        try:
            with ShardClient(self.address, JOB, self.name, timeout=10.0) as client:
                reader = ShardReader(
                    client,
                    "train",
                    batch_size=BATCH,
                    report_every_batches=1,
                    report_every_seconds=0.1,
                    on_commit=self.ledger.append,
                    shards_per_call=self.shards_per_call,
                )
                try:
                    self._read(reader)
                finally:
                    reader.close()
        except BaseException as error:  # reported by the test
            self.error = error
        finally:
            self.finished.set()

    def _read(self, reader: ShardReader) -> None:
        current: tuple[int, int] | None = None
        for count, _ in enumerate(reader, 1):
            if self.stop.is_set():
                reader.stop()
            shard = reader.current
            assert shard is not None
            if (shard.shard_id, shard.lease) != current:
                current = (shard.shard_id, shard.lease)
                self.grants.append(
                    Grant(shard.shard_id, shard.size - shard.offset, shard.straggler)
                )
            if count % BATCH == 0:  # "training" on a batch
                time.sleep(self._pace())

    def _pace(self) -> float:
        if self.name == SLOW and not self.recovered:
            if sum(grant.straggler for grant in self.grants) < SLOW_GRANTS:
                return SLOW_SECONDS_PER_BATCH
            self.recovered = True
        return FAST_SECONDS_PER_BATCH


@pytest.fixture
def settings(nats_url: str, database_url: str) -> DispatcherSettings:
    return local_settings(
        DispatcherSettings,
        nats_url=nats_url,
        database_url=database_url,
        # Leases outlast any pause of a loaded machine: nothing is revoked, so what each
        # worker reported tiles the data.
        lease_seconds=30.0,
        sweep_interval_seconds=0.1,
        straggler_window_seconds=0.5,
        retry_after_seconds=0.05,
    )


@pytest.fixture
async def dispatcher(settings: DispatcherSettings) -> AsyncIterator[ServiceHost]:
    async with running_service(build, settings) as host:
        yield host


@pytest.fixture
async def stub(dispatcher: ServiceHost) -> AsyncIterator[Stub]:
    async with aio_channel(f"127.0.0.1:{dispatcher.server.port}", "dispatcher") as channel:
        yield pb_grpc.DispatcherServiceStub(channel)


async def create_dataset(stub: Stub, records: int = RECORDS, epochs: int = EPOCHS) -> None:
    await stub.CreateDataset(
        pb.CreateDatasetRequest(
            job_id=JOB,
            dataset="train",
            parameters=pb.DatasetParameters(
                record_count=records,
                batch_size=BATCH,
                shard_batches=SHARD_BATCHES,
                epochs=epochs,
                shuffle=True,
                seed=7,
                kind=shard_pb2.SHARDING_KIND_INDEX_RANGE,
            ),
        )
    )


async def workers_state(stub: Stub) -> dict[str, pb.WorkerProgress]:
    reply = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    return {worker.worker: worker for worker in reply.workers}


async def straggler_signals(nats_url: str) -> list[shard_pb2.StragglerDetected]:
    messages = await stream_messages(nats_url, topics.STRAGGLER_DETECTED.subject(JOB))
    return [shard_pb2.StragglerDetected.FromString(message.data) for message in messages]


@pytest.mark.parametrize("shards_per_call", [1, 4], ids=["one-shard-per-call", "batches-of-4"])
async def test_a_straggler_gets_smaller_shards_until_it_recovers_and_every_index_is_read_once(
    dispatcher: ServiceHost, stub: Stub, nats_url: str, shards_per_call: int
) -> None:
    await create_dataset(stub)
    address = f"127.0.0.1:{dispatcher.server.port}"
    stop = threading.Event()
    workers = {name: Worker(name, address, shards_per_call, stop) for name in WORKERS}
    for worker in workers.values():
        threading.Thread(target=worker.run, name=worker.name, daemon=True).start()
    verdicts: list[bool] = []
    """The slow worker's straggler mark, as GetDatasetState showed it over the run."""

    async def finished() -> bool:
        state = await workers_state(stub)
        if SLOW in state:
            verdicts.append(state[SLOW].straggler)
        assert all(worker.finished.is_set() for worker in workers.values())
        return True

    try:
        await assert_eventually(finished, timeout=90, interval=0.05)
    finally:
        stop.set()
        await asyncio.to_thread(lambda: [w.finished.wait(30) for w in workers.values()])
    for worker in workers.values():
        assert worker.error is None, f"{worker.name}: {worker.error!r}"

    # Flagged, then cleared once it trained as fast as its peers.
    assert True in verdicts, verdicts
    assert not verdicts[-1] and not (await workers_state(stub))[SLOW].straggler
    slow = workers[SLOW]
    assert slow.recovered
    # While flagged, one half-size shard per call; its peers got whole ones.
    cut = [grant for grant in slow.grants if grant.straggler]
    assert len(cut) >= SLOW_GRANTS
    assert max(grant.records for grant in cut) <= SHARD // 2
    peers = [grant.records for name in WORKERS if name != SLOW for grant in workers[name].grants]
    assert statistics.median(peers) == SHARD
    # After the flag cleared it got whole shards again.
    last_cut = max(index for index, grant in enumerate(slow.grants) if grant.straggler)
    assert any(grant.records == SHARD for grant in slow.grants[last_cut + 1 :]), slow.grants

    # Exactly once: what the dispatcher accepted tiles every epoch, the cut shards too.
    trained: Counter[tuple[int, int]] = Counter()
    for worker in workers.values():
        for committed in worker.ledger:
            for position in range(committed.first, committed.last):
                trained[(committed.shard.epoch, committed.shard.record(position))] += 1
    expected = {(epoch, index) for epoch in range(EPOCHS) for index in range(RECORDS)}
    assert set(trained) == expected, f"{len(expected - set(trained))} indices never trained"
    assert set(trained.values()) == {1}, trained.most_common(3)
    state = await stub.GetDatasetState(pb.GetDatasetStateRequest(job_id=JOB, dataset="train"))
    assert state.finished

    # The optimizer is told, through the bus.
    signals = await straggler_signals(nats_url)
    mine = [signal for signal in signals if signal.worker == SLOW]
    assert mine, [signal.worker for signal in signals]
    assert mine[0].job_id == JOB and mine[0].rate < mine[0].peer_median_rate / 2


async def report(stub: Stub, worker: str, token: int, shard: shard_pb2.Shard, step: int) -> None:
    """Report ``step`` more records of ``shard`` (done at its end, with a new lease in it)."""
    ref = pb.WorkerRef(job_id=JOB, dataset="train", worker=worker, incarnation=token)
    offset = min(shard.offset + step, shard.end - shard.start)
    await stub.ReportProgress(
        pb.ReportProgressRequest(worker=ref, shard_id=shard.shard_id, offset=offset)
    )
    shard.offset = offset
    if offset == shard.end - shard.start:
        await stub.ReportShardDone(pb.ReportShardDoneRequest(worker=ref, shard_id=shard.shard_id))
        shard.CopyFrom((await stub.GetShard(pb.GetShardRequest(worker=ref))).shard)


async def register(stub: Stub, worker: str) -> int:
    reply = await stub.RegisterWorker(pb.RegisterWorkerRequest(job_id=JOB, worker=worker))
    return int(reply.incarnation)


async def lease(stub: Stub, worker: str, token: int) -> pb.GetShardResponse:
    ref = pb.WorkerRef(job_id=JOB, dataset="train", worker=worker, incarnation=token)
    return await stub.GetShard(pb.GetShardRequest(worker=ref))


ROUND_SECONDS = 0.15
"""Between two rounds of reports: a third of the window, as the agent's 10 s heartbeats
are of the default 30 s window."""


async def test_a_worker_registered_again_is_judged_afresh_at_its_own_pace(
    stub: Stub, nats_url: str
) -> None:
    await create_dataset(stub, records=40_000, epochs=1)
    tokens = {name: await register(stub, name) for name in WORKERS}
    held = {name: (await lease(stub, name, tokens[name])).shard for name in WORKERS}

    async def round_of_reports(slow_step: int | None) -> None:
        for name in WORKERS:
            step = 8 if name != SLOW else slow_step
            if step is not None:
                await report(stub, name, tokens[name], held[name], step)

    async def flagged() -> bool:
        await round_of_reports(slow_step=1)
        assert (await workers_state(stub))[SLOW].straggler
        return True

    await assert_eventually(flagged, timeout=30, interval=ROUND_SECONDS)
    # Its pod is replaced by one on a healthy node while its peers train on: a new process,
    # registered again, that trains as fast as they do.
    for _ in range(5):
        await round_of_reports(slow_step=None)
        await asyncio.sleep(ROUND_SECONDS)
    tokens[SLOW] = await register(stub, SLOW)
    fresh = (await workers_state(stub))[SLOW]
    assert not fresh.straggler and fresh.rate == 0
    grant = await lease(stub, SLOW, tokens[SLOW])
    assert grant.HasField("shard") and not grant.straggler
    held[SLOW] = grant.shard
    # Measured from its registration, it is judged at its peers' pace: never flagged again
    # (the old process's rate and time had it flagged at once; a rate from zero without the
    # correction put it near the line when first judged).
    deadline = time.monotonic() + 8 * 0.5  # eight windows
    while time.monotonic() < deadline:
        await asyncio.sleep(ROUND_SECONDS)
        await round_of_reports(slow_step=8)
        assert not (await workers_state(stub))[SLOW].straggler
    state = await workers_state(stub)
    assert state[SLOW].rate > 0.75 * statistics.median(
        state[name].rate for name in WORKERS if name != SLOW
    )
    flags = [signal for signal in await straggler_signals(nats_url) if signal.worker == SLOW]
    assert len(flags) == 1, flags
