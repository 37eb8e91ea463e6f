"""Model-based test: across any interleaving of register, get, progress, done, failed, lost and
reports from fenced zombies, every record of every epoch is consumed exactly once.

Each worker process keeps its own view (the shards it was handed and the offset it reported)
and credits the records it reports as consumed. Two holders of one shard, a re-issued shard
that does not resume at its offset, or a shard that never comes back would all show up as
a record credited twice or never.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import ShardQueue
from stride.runtime.errors import FailedPrecondition, NotFound

NOW = datetime(2026, 1, 1, tzinfo=UTC)
WORKERS = ("w0", "w1", "w2")


@dataclass
class Lease:
    epoch: int
    start: int
    end: int
    reported: int


@dataclass
class Process:
    """One incarnation of a worker, as the worker itself sees it."""

    token: int
    leases: dict[int, Lease] = field(default_factory=dict)


class ShardQueueMachine(RuleBasedStateMachine):
    @initialize(
        record_count=st.integers(1, 40),
        batch_size=st.integers(1, 4),
        shard_batches=st.integers(1, 3),
        epochs=st.integers(1, 3),
        shuffle=st.booleans(),
        seed=st.integers(0, 1000),
    )
    def setup(
        self,
        record_count: int,
        batch_size: int,
        shard_batches: int,
        epochs: int,
        shuffle: bool,
        seed: int,
    ) -> None:
        self.params = DatasetParameters(
            record_count=record_count,
            batch_size=min(batch_size, record_count),
            shard_batches=shard_batches,
            epochs=epochs,
            shuffle=shuffle,
            seed=seed,
            kind=ShardingKind.INDEX_RANGE,
            partitions=0,
        )
        self.queue = ShardQueue(self.params, timedelta(seconds=60))
        self.processes: dict[str, Process] = {}
        self.zombies: list[tuple[str, Process]] = []
        self.coverage: Counter[tuple[int, int]] = Counter()

    def _credit(self, lease: Lease, offset: int) -> None:
        for index in range(lease.start + lease.reported, lease.start + offset):
            self.coverage[(lease.epoch, index)] += 1
        lease.reported = max(lease.reported, offset)

    def _held(self) -> list[tuple[str, Process, int, Lease]]:
        return [
            (worker, process, shard_id, lease)
            for worker, process in sorted(self.processes.items())
            for shard_id, lease in sorted(process.leases.items())
        ]

    def _pick(self, pick: int) -> tuple[str, Process, int, Lease]:
        held = self._held()
        return held[pick % len(held)]

    def _holding(self) -> bool:
        return hasattr(self, "queue") and bool(self._held())

    @rule(worker=st.sampled_from(WORKERS))
    def register(self, worker: str) -> None:
        old = self.processes.get(worker)
        if old is not None:
            self.zombies.append((worker, old))
        self.processes[worker] = Process(self.queue.register(worker))

    @precondition(lambda self: hasattr(self, "queue") and bool(self.processes))
    @rule(pick=st.integers(0, 99))
    def get(self, pick: int) -> None:
        worker = sorted(self.processes)[pick % len(self.processes)]
        process = self.processes[worker]
        shard = self.queue.get_shard(worker, process.token, NOW)
        if shard is None:
            return
        assert shard.shard_id not in process.leases
        assert 0 <= shard.offset <= shard.end - shard.start
        process.leases[shard.shard_id] = Lease(shard.epoch, shard.start, shard.end, shard.offset)

    @precondition(_holding)
    @rule(pick=st.integers(0, 99), amount=st.integers(0, 6))
    def progress(self, pick: int, amount: int) -> None:
        worker, process, shard_id, lease = self._pick(pick)
        offset = min(lease.reported + amount, lease.end - lease.start)
        self.queue.report_progress(worker, process.token, shard_id, offset, NOW)
        self._credit(lease, offset)

    @precondition(_holding)
    @rule(pick=st.integers(0, 99), twice=st.booleans())
    def done(self, pick: int, twice: bool) -> None:
        worker, process, shard_id, lease = self._pick(pick)
        self.queue.report_done(worker, process.token, shard_id)
        if twice:
            self.queue.report_done(worker, process.token, shard_id)
        self._credit(lease, lease.end - lease.start)
        del process.leases[shard_id]

    @precondition(_holding)
    @rule(pick=st.integers(0, 99), twice=st.booleans())
    def failed(self, pick: int, twice: bool) -> None:
        worker, process, shard_id, _ = self._pick(pick)
        self.queue.report_failed(worker, process.token, shard_id)
        if twice:
            self.queue.report_failed(worker, process.token, shard_id)
        del process.leases[shard_id]

    @rule(worker=st.sampled_from(WORKERS))
    def lost(self, worker: str) -> None:
        process = self.processes.pop(worker, None)
        if process is None:
            if worker not in self.queue.workers:
                with pytest.raises(NotFound):
                    self.queue.mark_lost(worker)
            return
        self.zombies.append((worker, process))
        self.queue.mark_lost(worker)

    @precondition(lambda self: bool(getattr(self, "zombies", None)))
    @rule(pick=st.integers(0, 99), kind=st.sampled_from(["progress", "done", "failed", "get"]))
    def zombie_report(self, pick: int, kind: str) -> None:
        worker, zombie = self.zombies[pick % len(self.zombies)]
        shard_id = min(zombie.leases, default=0)
        with pytest.raises(FailedPrecondition):
            if kind == "get":
                self.queue.get_shard(worker, zombie.token, NOW)
            elif kind == "progress":
                self.queue.report_progress(worker, zombie.token, shard_id, 0, NOW)
            elif kind == "done":
                self.queue.report_done(worker, zombie.token, shard_id)
            else:
                self.queue.report_failed(worker, zombie.token, shard_id)

    @invariant()
    def no_record_consumed_twice(self) -> None:
        if hasattr(self, "coverage") and self.coverage:
            assert max(self.coverage.values()) == 1

    def teardown(self) -> None:
        if not hasattr(self, "queue"):
            return
        # Live workers hand their shards back; a fresh worker drains what is left. Shards
        # still held by a stale incarnation would never come back, and fail the check.
        for worker, process, shard_id, _ in self._held():
            self.queue.report_failed(worker, process.token, shard_id)
        token = self.queue.register("drainer")
        while (shard := self.queue.get_shard("drainer", token, NOW)) is not None:
            lease = Lease(shard.epoch, shard.start, shard.end, shard.offset)
            self.queue.report_done("drainer", token, shard.shard_id)
            self._credit(lease, shard.end - shard.start)
        expected = {
            (epoch, index)
            for epoch in range(self.params.epochs)
            for index in range(self.params.record_count)
        }
        assert set(self.coverage) == expected
        assert set(self.coverage.values()) == {1}
        assert self.queue.counts().finished


ShardQueueMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestShardQueueModel = ShardQueueMachine.TestCase
