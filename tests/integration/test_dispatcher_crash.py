"""Eight worker clients read a dataset through the client library while the dispatcher, a
real process on PostgreSQL and NATS, is SIGKILLed mid-epoch and restarted, and then two
workers die: one is reported by the podwatcher's pod event on NATS, the other is found by
lease expiry. Every index of every epoch is consumed exactly once, and the dead workers'
shards are finished by others.

Exactly once is checked against what the workers actually read. Each hand-out of a shard
(a lease) starts at the offset the dispatcher had committed for it, so the records a lease
contributed are those from its start to the next lease's start (or to the end, for the
lease that finished it). These committed parts must tile every shard, and each must lie
within what that lease's worker really read: nothing skipped, nothing counted twice, no
record counted that was never read. What a killed or revoked worker read past its last
accepted report is read again by the next lease (the at-least-once tail the README
documents), and is not counted. The reader's ``on_commit`` ledger, which can miss a report
whose answer was lost in the dispatcher's crash, must never count a record twice.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
from stride.bus import topics
from stride.bus.client import Bus
from stride.dispatcher.app import SERVICE_NAME
from stride.events.v1 import plan_pb2, pod_pb2, shard_pb2
from stride.shardclient import Committed, LeasedShard, ShardClient, ShardReader
from stride.testing.bus import producer_bus
from stride.testing.channels import aio_channel
from stride.testing.eventually import assert_eventually
from stride.testing.processes import ServiceProcess

pytestmark = pytest.mark.integration

JOB = "job-crash01"
RECORDS = 3_000
EPOCHS = 2
BATCH = 10
WORKERS = [f"{JOB}-worker-{n}" for n in range(8)]


async def wait_until_serving(address: str) -> None:
    async def serving() -> bool:
        async with aio_channel(address, "dispatcher") as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1
                )
            except grpc.aio.AioRpcError as error:
                raise AssertionError(f"not serving yet: {error.code()}") from None
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    await assert_eventually(serving, timeout=30)


class Reaper:
    """Once asked for n deaths, kills the first n workers to read a sample that leaves their
    shard unfinished. Each dies from its own thread, so what it held is known exactly (a kill
    from outside races the reader between two shards, where a shard being leased is in no
    field yet), and only a worker with data in hand can be picked (near the end of the data,
    with shards leased in batches, some workers hold nothing and only wait)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted = 0
        self.victims: list[Worker] = []
        self.reaped = threading.Event()

    def reap(self, count: int) -> None:
        with self._lock:
            self._wanted = count

    def claim(self, worker: Worker) -> bool:
        with self._lock:
            if len(self.victims) >= self._wanted:
                return False
            self.victims.append(worker)
            if len(self.victims) == self._wanted:
                self.reaped.set()
            return True


class Worker:
    """A training worker: a thread reading sample indices through the client library."""

    def __init__(
        self,
        address: str,
        name: str,
        ledger: list[tuple[str, Committed]],
        reaper: Reaper,
        shards_per_call: int = 1,
    ) -> None:
        self.name = name
        self.reaper = reaper
        self.client = ShardClient(address, JOB, name, timeout=5.0)
        self.reader = ShardReader(
            self.client,
            "train",
            batch_size=BATCH,
            report_every_batches=2,
            report_every_seconds=0.5,
            on_commit=lambda committed: ledger.append((name, committed)),
            shards_per_call=shards_per_call,
        )
        self.read: dict[tuple[int, int], list[int]] = {}  # (shard, lease) -> [start, upto]
        self.shards: dict[int, LeasedShard] = {}
        self.error: BaseException | None = None
        self.killed = False
        self.finished = threading.Event()
        self.held: set[int] = set()
        """The shards it held when it died."""
        self.most_waiting = 0
        """The most shards seen waiting their turn (leased by one batched call)."""
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            for _ in self.reader:
                shard = self.reader.current
                assert shard is not None
                span = self.read.setdefault((shard.shard_id, shard.lease), [shard.offset] * 2)
                time.sleep(0.0004)  # "training" on the sample
                span[1] += 1
                self.shards[shard.shard_id] = shard
                self.most_waiting = max(self.most_waiting, len(self.reader.waiting))
                if span[1] < shard.size and self.reaper.claim(self):
                    self._die()
                    break
        except BaseException as error:  # reported by the test
            if not self.killed:  # a dead worker's call in flight fails: that is expected
                self.error = error
        finally:
            self.finished.set()

    def _die(self) -> None:
        """Stop dead in the middle of a shard, reporting nothing more."""
        held = {s for s in (self.reader.current, *self._prefetched()) if s is not None}
        self.held = {s.shard_id for s in (*held, *self.reader.waiting)}
        self.killed = True
        self.reader.stop()
        self.client.close()  # a dead pod makes no more calls, not even to register again

    def _prefetched(self) -> tuple[LeasedShard, ...]:
        pending = self.reader._next
        if pending is None or not pending.done() or pending.exception() is not None:
            return ()
        return pending.result().shards


def check_exactly_once(workers: list[Worker]) -> None:
    """The leases' committed parts tile every shard, within what each lease really read."""
    leases: dict[int, list[tuple[int, int, int]]] = {}  # shard -> [(lease, start, upto)]
    shards: dict[int, LeasedShard] = {}
    for worker in workers:
        shards.update(worker.shards)
        for (shard_id, lease), (start, upto) in worker.read.items():
            leases.setdefault(shard_id, []).append((lease, start, upto))
    coverage: Counter[tuple[int, int]] = Counter()
    for shard_id, spans in leases.items():
        spans.sort()
        shard = shards[shard_id]
        assert spans[0][1] == 0, f"shard {shard_id} was first read from {spans[0][1]}"
        for (lease, start, upto), following in zip(spans, [*spans[1:], None], strict=True):
            end = shard.size if following is None else following[1]
            assert start <= end <= upto, (
                f"shard {shard_id} lease {lease} read [{start}, {upto}) but committed "
                f"[{start}, {end})"
            )
            for position in range(start, end):
                coverage[(shard.epoch, shard.record(position))] += 1
    expected = {(epoch, index) for epoch in range(EPOCHS) for index in range(RECORDS)}
    assert set(coverage) == expected, f"{len(expected - set(coverage))} records never read"
    assert set(coverage.values()) == {1}, coverage.most_common(3)


def committed_records(ledger: list[tuple[str, Committed]]) -> int:
    return sum(c.last - c.first for _, c in ledger)


@pytest.mark.parametrize("shards_per_call", [1, 4], ids=["one-shard-per-call", "batches-of-4"])
async def test_exactly_once_through_a_dispatcher_sigkill_and_two_dead_workers(
    nats_url: str, postgres_url: str, tmp_path: Path, shards_per_call: int
) -> None:
    process = ServiceProcess(
        "dispatcher",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_DATABASE_URL": postgres_url,
            "STRIDE_DISPATCHER_HEALTH_INTERVAL_SECONDS": "0.2",
            "STRIDE_DISPATCHER_LEASE_SECONDS": "2",
            "STRIDE_DISPATCHER_SWEEP_INTERVAL_SECONDS": "0.2",
            "STRIDE_DISPATCHER_RETRY_AFTER_SECONDS": "0.1",
        },
        tmp_path,
    ).start()
    workers: list[Worker] = []
    bus: Bus | None = None
    try:
        await wait_until_serving(process.address)
        with ShardClient(process.address, JOB, "creator") as creator:
            creator.create_dataset(
                "train",
                pb.DatasetParameters(
                    record_count=RECORDS,
                    batch_size=BATCH,
                    shard_batches=5,
                    epochs=EPOCHS,
                    shuffle=True,
                    seed=3,
                    kind=shard_pb2.SHARDING_KIND_INDEX_LIST,
                ),
            )
        ledger: list[tuple[str, Committed]] = []
        reaper = Reaper()
        workers = [
            Worker(process.address, name, ledger, reaper, shards_per_call) for name in WORKERS
        ]
        for worker in workers:
            worker.thread.start()
        total = RECORDS * EPOCHS

        await assert_eventually(lambda: committed_records(ledger) >= total // 5, timeout=60)
        process.kill()  # mid-epoch: calls in flight fail, some after their commit
        await asyncio.sleep(0.3)
        process.start()
        await wait_until_serving(process.address)

        await assert_eventually(lambda: committed_records(ledger) >= total // 2, timeout=60)
        reaper.reap(2)
        assert await asyncio.to_thread(reaper.reaped.wait, 60), "no two workers were reading"
        by_event, by_expiry = reaper.victims
        for victim in reaper.victims:
            assert await asyncio.to_thread(victim.finished.wait, 30), f"{victim.name} lives"
        orphaned = by_event.held | by_expiry.held
        bus = await producer_bus(nats_url, name="test-podwatcher")
        occurred = Timestamp()
        occurred.FromDatetime(datetime.now(UTC))
        await bus.publish(
            topics.POD_FAILED,
            JOB,
            pod_pb2.PodEvent(
                job_id=JOB,
                pod_name=by_event.name,
                role=plan_pb2.ROLE_WORKER,
                phase=pod_pb2.POD_PHASE_FAILED,
                reason=pod_pb2.POD_FAILURE_REASON_OOM_KILLED,
                occurred_at=occurred,
            ),
            message_id=f"{JOB}.{by_event.name}.failed.1",
        )

        for worker in workers:
            await asyncio.to_thread(worker.thread.join, 90)
            assert not worker.thread.is_alive(), f"{worker.name} did not finish"
            assert worker.error is None, f"{worker.name}: {worker.error!r}"

        check_exactly_once(workers)
        # Batches really were leased (one call gave a worker several shards at once).
        assert max(w.most_waiting for w in workers) == shards_per_call - 1
        ledger_counts = Counter(
            (c.shard.epoch, c.shard.record(position))
            for _, c in ledger
            for position in range(c.first, c.last)
        )
        assert max(ledger_counts.values()) == 1, ledger_counts.most_common(3)
        # The dead workers' shards were finished by the living.
        dead = {by_event.name, by_expiry.name}
        # Who finished a shard is read from the workers' own reads, not from the ledger: the
        # ledger misses a final report whose answer was lost in the dispatcher's crash. The
        # shard's last lease finished it (check_exactly_once showed it reaches the end).
        last_lease: dict[int, tuple[int, str]] = {}
        for worker in workers:
            for shard_id, lease in worker.read:
                last_lease[shard_id] = max(last_lease.get(shard_id, (0, "")), (lease, worker.name))
        finished_by = {shard_id: name for shard_id, (_, name) in last_lease.items()}
        # Every shard a dead worker held was finished; each died in the middle of a shard,
        # so each left at least that one to be finished by another worker. (Usually a living
        # one; but a worker can die reading a lease that was already stale, its shard handed
        # to the other victim, which finished it before dying in the middle of its own.)
        assert orphaned <= set(finished_by), orphaned - set(finished_by)
        for worker in (by_event, by_expiry):
            taken_over = {s for s in worker.held if finished_by[s] != worker.name}
            assert taken_over, f"nothing {worker.name} held was finished by another worker"
        assert any(finished_by[s] not in dead for s in orphaned), "the living finished nothing"

        with ShardClient(process.address, JOB, "observer") as observer:
            state = observer.dataset_state("train")
            assert state.finished and (state.todo, state.doing) == (0, 0)

            def marked_lost() -> bool:
                workers = {w.worker for w in observer.dataset_state("train").workers}
                assert by_event.name not in workers, "the pod event was not applied"
                return "pod gone; worker marked lost" in process.log_text()

            await assert_eventually(lambda: asyncio.to_thread(marked_lost), timeout=20)
        log = process.log_text()
        assert "lease expired; shard back to TODO" in log
        assert process.terminate() == 0, log[-2000:]
    finally:
        for worker in workers:
            worker.reader.stop()
        if bus is not None:
            await bus.close()
        process.kill()
        for worker in workers:
            worker.reader.close()
            worker.client.close()
