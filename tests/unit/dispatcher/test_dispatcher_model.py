"""Model-based test of the database-backed dispatcher (SQLite): across random interleavings of
get (alone or completing the previous shard), progress, done, failed, lease expiry, duplicate
and late reports, worker loss (by call and by pod event), straggler splits, snapshot and
restore, and dispatcher restarts over the same database file, every index of every epoch is
consumed exactly once and the queue counts agree with what the workers hold. Epochs are cut
without their rows, which are written two at a time as the TODO rows run out (issue 37),
and every shard handed out is the one a whole cut plans (id, place in hand-out order, range).

"Consumed" is what the dispatcher accepted: each worker credits the records of a progress
or done report only when the call succeeds, the way the client library's ``on_commit``
does. A restart re-creates the engine and the dispatcher over the same file, so anything
held only in memory would be lost and show up as a record never credited.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import update

from stride.db.engine import Database
from stride.db.migrations import upgrade
from stride.db.outbox import Outbox
from stride.dispatcher.adapters.outbound.fastpath import SqliteFastPath
from stride.dispatcher.app import MIGRATIONS
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.db.tables import shards, workers
from stride.dispatcher.domain.datasets import SPLIT_ID_BASE, DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import Grant, ShardRecord
from stride.dispatcher.domain.sharding import plan_epoch
from stride.dispatcher.usecases import DoneReport, ShardDispatcher, Snapshot, WorkerRef
from stride.runtime.errors import FailedPrecondition, NotFound

T = TypeVar("T")
JOB = "job-model"
DATASET = "train"
WORKERS = ("w0", "w1", "w2")
LEASE = timedelta(seconds=60)
ROWS = 2
"""Shard rows written at a time: small, so epochs are written in many batches."""


@dataclass
class Lease:
    epoch: int
    start: int
    end: int
    reported: int
    lease: int | None = None
    """The hand-out number, when the model reports it back (batched reports)."""


@dataclass
class Process:
    """One incarnation of a worker, as the worker itself sees it."""

    token: int
    leases: dict[int, Lease] = field(default_factory=dict)
    completed: set[int] = field(default_factory=set)
    """Shards this incarnation reported done (a later report of its own repeats them)."""


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dispatcher-model") / "template.db"
    upgrade(f"sqlite:///{path}", "dispatcher", MIGRATIONS)
    return path


class DispatcherMachine(RuleBasedStateMachine):
    template: Path
    workdir: Path
    fast: bool = False
    """Serve the hot calls through the SQLite fast path (group commit), as the service does."""

    @initialize(
        record_count=st.integers(1, 30),
        batch_size=st.integers(1, 3),
        shard_batches=st.integers(1, 4),
        epochs=st.integers(1, 2),
        shuffle=st.booleans(),
        kind=st.sampled_from([ShardingKind.INDEX_RANGE, ShardingKind.INDEX_LIST]),
    )
    def setup(
        self,
        record_count: int,
        batch_size: int,
        shard_batches: int,
        epochs: int,
        shuffle: bool,
        kind: ShardingKind,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.path = self.workdir / f"model-{id(self)}.db"
        shutil.copy(self.template, self.path)
        self.params = DatasetParameters(
            record_count=record_count,
            batch_size=min(batch_size, record_count),
            shard_batches=shard_batches,
            epochs=epochs,
            shuffle=shuffle,
            seed=7,
            kind=kind,
            partitions=0,
        )
        self._open()
        self.run(self.dispatcher.create_dataset(JOB, DATASET, self.params))
        self.processes: dict[str, Process] = {}
        self.zombies: list[tuple[str, Process]] = []
        self.late: list[tuple[str, int, int]] = []  # (worker, token, shard id) taken back
        self.coverage: Counter[tuple[int, int]] = Counter()
        self.saved: tuple[Snapshot, Counter[tuple[int, int]]] | None = None

    def _open(self) -> None:
        self.database = Database(f"sqlite:///{self.path}", "dispatcher")
        fast = (
            SqliteFastPath(str(self.path), LEASE, timedelta(seconds=30), False, rows_per_write=ROWS)
            if self.fast
            else None
        )
        self.dispatcher = ShardDispatcher(
            self.database, Outbox(outbox_table), LEASE, fast=fast, rows_per_write=ROWS
        )

    def _close(self) -> None:
        if self.dispatcher.fast is not None:
            self.run(self.dispatcher.fast.close())
        self.run(self.database.dispose())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def ref(self, worker: str, token: int) -> WorkerRef:
        return WorkerRef(JOB, DATASET, worker, token)

    def _check_planned(self, shard: ShardRecord) -> None:
        """A shard handed out is the one a whole cut of its epoch plans at its place (a
        straggler's split keeps the place and the start, and may end sooner)."""
        if shard.shard_id >= SPLIT_ID_BASE:
            return
        planned = plan_epoch(self.params, shard.epoch)[shard.position]
        assert (planned.shard_id, planned.start) == (shard.shard_id, shard.start)
        assert shard.end <= planned.end

    def _credit(self, lease: Lease, offset: int) -> None:
        for position in range(lease.start + lease.reported, lease.start + offset):
            self.coverage[(lease.epoch, position)] += 1
        lease.reported = max(lease.reported, offset)

    def _held(self) -> list[tuple[str, Process, int, Lease]]:
        return [
            (worker, process, shard_id, lease)
            for worker, process in sorted(self.processes.items())
            for shard_id, lease in sorted(process.leases.items())
        ]

    def _holding(self) -> bool:
        return hasattr(self, "dispatcher") and bool(self._held())

    def _revoke(self, worker: str, process: Process) -> None:
        for shard_id in process.leases:
            self.late.append((worker, process.token, shard_id))
        process.leases.clear()

    @rule(worker=st.sampled_from(WORKERS))
    def register(self, worker: str) -> None:
        old = self.processes.get(worker)
        if old is not None:
            self._revoke(worker, old)
            self.zombies.append((worker, old))
        self.processes[worker] = Process(self.run(self.dispatcher.register_worker(JOB, worker)))

    @precondition(lambda self: hasattr(self, "dispatcher") and bool(self.processes))
    @rule(pick=st.integers(0, 99), complete=st.booleans())
    def get(self, pick: int, complete: bool) -> None:
        worker = sorted(self.processes)[pick % len(self.processes)]
        process = self.processes[worker]
        done_id = min(process.leases) if complete and process.leases else None
        grant = self.run(self.dispatcher.get_shard(self.ref(worker, process.token), done_id))
        if done_id is not None:
            lease = process.leases.pop(done_id)
            self._credit(lease, lease.end - lease.start)
            process.completed.add(done_id)
        if grant.shard is None:
            doing = self.run(self.dispatcher.dataset_state(JOB, DATASET)).counts.doing
            assert grant.why_none is (Grant.RETRY_LATER if doing else Grant.END_OF_DATA)
            return
        shard = grant.shard
        self._check_planned(shard)
        assert shard.shard_id not in process.leases
        # Equal when a worker gave the shard up after reading it to its end.
        assert 0 <= shard.offset <= shard.end - shard.start
        process.leases[shard.shard_id] = Lease(shard.epoch, shard.start, shard.end, shard.offset)

    @precondition(lambda self: hasattr(self, "dispatcher") and bool(self.processes))
    @rule(pick=st.integers(0, 99), finished=st.integers(0, 3), most=st.integers(1, 4))
    def get_batch(self, pick: int, finished: int, most: int) -> None:
        """A batched GetShard: several finished shards reported, several leased."""
        worker = sorted(self.processes)[pick % len(self.processes)]
        process = self.processes[worker]
        done_ids = sorted(process.leases)[:finished]
        done = [DoneReport(shard_id, process.leases[shard_id].lease) for shard_id in done_ids]
        grant = self.run(
            self.dispatcher.get_shard(self.ref(worker, process.token), done=done, max_shards=most)
        )
        for shard_id in done_ids:
            lease = process.leases.pop(shard_id)
            self._credit(lease, lease.end - lease.start)
            process.completed.add(shard_id)
        if grant.shard is None:
            assert not grant.more
            doing = self.run(self.dispatcher.dataset_state(JOB, DATASET)).counts.doing
            assert grant.why_none is (Grant.RETRY_LATER if doing else Grant.END_OF_DATA)
            return
        leased = [grant.shard, *grant.more]
        assert len(leased) <= (1 if grant.straggler else most)
        assert len({shard.shard_id for shard in leased}) == len(leased)
        order = [(shard.epoch, shard.position) for shard in leased]
        assert order == sorted(order)  # hand-out order
        for shard in leased:
            self._check_planned(shard)
            assert shard.shard_id not in process.leases
            assert 0 <= shard.offset <= shard.end - shard.start
            process.leases[shard.shard_id] = Lease(
                shard.epoch, shard.start, shard.end, shard.offset, shard.leases
            )

    @precondition(_holding)
    @rule(
        pick=st.integers(0, 99),
        amount=st.integers(0, 6),
        twice=st.booleans(),
        renew_held=st.booleans(),
    )
    def progress(self, pick: int, amount: int, twice: bool, renew_held: bool) -> None:
        worker, process, shard_id, lease = self._held()[pick % len(self._held())]
        offset = min(lease.reported + amount, lease.end - lease.start)
        for _ in range(2 if twice else 1):
            self.run(
                self.dispatcher.report_progress(
                    self.ref(worker, process.token), shard_id, offset, renew_held=renew_held
                )
            )
        self._credit(lease, offset)

    @precondition(_holding)
    @rule(pick=st.integers(0, 99), twice=st.booleans())
    def done(self, pick: int, twice: bool) -> None:
        worker, process, shard_id, lease = self._held()[pick % len(self._held())]
        for _ in range(2 if twice else 1):
            self.run(self.dispatcher.report_done(self.ref(worker, process.token), shard_id))
        self._credit(lease, lease.end - lease.start)
        del process.leases[shard_id]
        process.completed.add(shard_id)

    @precondition(_holding)
    @rule(pick=st.integers(0, 99), twice=st.booleans())
    def failed(self, pick: int, twice: bool) -> None:
        worker, process, shard_id, _ = self._held()[pick % len(self._held())]
        for _ in range(2 if twice else 1):
            self.run(self.dispatcher.report_failed(self.ref(worker, process.token), shard_id, "x"))
        del process.leases[shard_id]

    @precondition(_holding)
    @rule(pick=st.integers(0, 99))
    def lease_expires(self, pick: int) -> None:
        worker, process, shard_id, _ = self._held()[pick % len(self._held())]
        self.run(self._backdate(shard_id))
        assert self.run(self.dispatcher.expire_leases()) == 1
        del process.leases[shard_id]
        self.late.append((worker, process.token, shard_id))

    async def _backdate(self, shard_id: int) -> None:
        async with self.database.transaction() as session:
            await session.execute(
                update(shards)
                .where(shards.c.shard_id == shard_id)
                .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
            )

    @rule(worker=st.sampled_from(WORKERS), by_pod_event=st.booleans())
    def lost(self, worker: str, by_pod_event: bool) -> None:
        process = self.processes.pop(worker, None)
        if process is None:
            return
        self._revoke(worker, process)
        self.zombies.append((worker, process))
        if by_pod_event:
            later = datetime.now(UTC) + timedelta(seconds=1)
            assert self.run(self.dispatcher.pod_gone(JOB, worker, later)) is not None
            # A redelivered event from before the worker's next registration is ignored.
            stale = datetime(2000, 1, 1, tzinfo=UTC)
            assert self.run(self.dispatcher.pod_gone(JOB, worker, stale)) is None
        else:
            self.run(self.dispatcher.mark_worker_lost(JOB, worker))

    @precondition(lambda self: hasattr(self, "dispatcher") and bool(self.processes))
    @rule(pick=st.integers(0, 99), straggler=st.booleans())
    def straggler_verdict(self, pick: int, straggler: bool) -> None:
        worker = sorted(self.processes)[pick % len(self.processes)]
        self.run(self._set_straggler(worker, straggler))

    async def _set_straggler(self, worker: str, straggler: bool) -> None:
        async with self.database.transaction() as session:
            await session.execute(
                update(workers).where(workers.c.worker == worker).values(straggler=straggler)
            )

    @precondition(lambda self: bool(getattr(self, "zombies", None) or getattr(self, "late", None)))
    @rule(pick=st.integers(0, 99), kind=st.sampled_from(["progress", "done", "failed", "get"]))
    def late_report(self, pick: int, kind: str) -> None:
        reports = [(w, z.token, min(z.leases, default=0)) for w, z in self.zombies] + self.late
        worker, token, shard_id = reports[pick % len(reports)]
        current = self.processes.get(worker)
        if current is not None and current.token == token:
            if shard_id in current.leases:
                return  # leased again to the same incarnation: a report would be valid
            if kind == "get":
                return
            if shard_id in current.completed:
                # Taken back (e.g. by a restore), leased again to this same incarnation and
                # finished by it: without the lease number a late report cannot be told from
                # a repeat of its own, which is an idempotent no-op. The invariants check
                # that it changed nothing.
                with contextlib.suppress(FailedPrecondition, NotFound):
                    if kind == "progress":
                        self.run(
                            self.dispatcher.report_progress(self.ref(worker, token), shard_id, 0)
                        )
                    elif kind == "done":
                        self.run(self.dispatcher.report_done(self.ref(worker, token), shard_id))
                    else:
                        self.run(
                            self.dispatcher.report_failed(self.ref(worker, token), shard_id, "late")
                        )
                return
        ref = self.ref(worker, token)
        if kind == "failed":
            # The last holder's "failed" for a shard that went back to TODO since (lease
            # lapsed) cannot be told from a repeated report, and is a no-op; the invariants
            # check that it changed nothing.
            with contextlib.suppress(FailedPrecondition, NotFound):
                self.run(self.dispatcher.report_failed(ref, shard_id, "late"))
            return
        # NotFound: a restore to a snapshot from before the shard's epoch was cut.
        with pytest.raises((FailedPrecondition, NotFound)):
            if kind == "get":
                self.run(self.dispatcher.get_shard(ref))
            elif kind == "progress":
                self.run(self.dispatcher.report_progress(ref, shard_id, 0))
            else:
                self.run(self.dispatcher.report_done(ref, shard_id))

    @rule()
    def restart(self) -> None:
        self._close()
        self._open()

    @precondition(lambda self: hasattr(self, "dispatcher"))
    @rule()
    def snapshot(self) -> None:
        self.saved = (self.run(self.dispatcher.snapshot(JOB, DATASET)), Counter(self.coverage))

    @precondition(lambda self: getattr(self, "saved", None) is not None)
    @rule()
    def restore(self) -> None:
        assert self.saved is not None
        snapshot, coverage = self.saved
        self.run(self.dispatcher.restore(JOB, DATASET, snapshot.data))
        for worker, process in self.processes.items():
            self._revoke(worker, process)
        self.coverage = Counter(coverage)

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "dispatcher"):
            return
        assert max(self.coverage.values(), default=1) == 1
        state = self.run(self.dispatcher.dataset_state(JOB, DATASET))
        assert state.counts.doing == sum(len(p.leases) for p in self.processes.values())
        assert state.counts.todo >= 0

    def teardown(self) -> None:
        if not hasattr(self, "dispatcher"):
            return
        try:
            self._drain_and_check()
        finally:
            self._close()
            self.loop.close()
            self.path.unlink(missing_ok=True)

    def _drain_and_check(self) -> None:
        for worker, process, shard_id, _ in self._held():
            self.run(self.dispatcher.report_failed(self.ref(worker, process.token), shard_id, "x"))
        self.run(self._set_straggler("drainer", False))
        token = self.run(self.dispatcher.register_worker(JOB, "drainer"))
        ref = self.ref("drainer", token)
        while (grant := self.run(self.dispatcher.get_shard(ref))).shard is not None:
            shard = grant.shard
            lease = Lease(shard.epoch, shard.start, shard.end, shard.offset)
            self.run(self.dispatcher.report_done(ref, shard.shard_id))
            self._credit(lease, shard.end - shard.start)
        assert grant.why_none is Grant.END_OF_DATA
        expected = {
            (epoch, position)
            for epoch in range(self.params.epochs)
            for position in range(self.params.record_count)
        }
        assert set(self.coverage) == expected
        assert set(self.coverage.values()) == {1}
        counts = self.run(self.dispatcher.dataset_state(JOB, DATASET)).counts
        assert (counts.todo, counts.doing, counts.finished) == (0, 0, True)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("fast", [False, True], ids=["general-path", "sqlite-fast-path"])
def test_dispatcher_model(template: Path, tmp_path: Path, fast: bool) -> None:
    DispatcherMachine.template = template
    DispatcherMachine.fast = fast
    # Memory-backed when the machine has it: the test is about logic, not fsync latency.
    shm = Path("/dev/shm")
    DispatcherMachine.workdir = tmp_path
    if shm.is_dir():
        DispatcherMachine.workdir = Path(tempfile.mkdtemp(prefix="stride-model-", dir=shm))
    try:
        run_state_machine_as_test(
            DispatcherMachine,
            settings=settings(
                max_examples=40,
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    finally:
        shutil.rmtree(DispatcherMachine.workdir, ignore_errors=True)
