"""The shard queue's transitions and fencing, one rule at a time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from stride.dispatcher.domain import queue
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.domain.queue import Holder, ShardQueue, ShardRecord, ShardState, WorkerRecord
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)
ALICE = Holder("alice", 1)
BOB = Holder("bob", 1)


def todo() -> ShardRecord:
    return ShardRecord(shard_id=3, epoch=0, position=0, start=300, end=400)


def leased(holder: Holder = ALICE) -> ShardRecord:
    return queue.lease(todo(), holder, NOW, LEASE)


def test_lease_moves_todo_to_doing_and_counts_leases() -> None:
    shard = leased()
    assert shard.state is ShardState.DOING and shard.holder == ALICE
    assert shard.leases == 1 and shard.lease_expires_at == NOW + LEASE
    with pytest.raises(ValueError):
        queue.lease(shard, BOB, NOW, LEASE)


def test_progress_keeps_the_highest_offset_and_renews_the_lease() -> None:
    later = NOW + timedelta(seconds=30)
    shard = queue.record_progress(leased(), ALICE, 40, later, LEASE)
    assert shard.offset == 40 and shard.lease_expires_at == later + LEASE
    out_of_order = queue.record_progress(shard, ALICE, 10, later, LEASE)
    assert out_of_order.offset == 40


@pytest.mark.parametrize("offset", [-1, 101])
def test_progress_offset_outside_the_shard_is_invalid(offset: int) -> None:
    with pytest.raises(InvalidArgument) as raised:
        queue.record_progress(leased(), ALICE, offset, NOW, LEASE)
    assert raised.value.field == "offset"


def test_progress_from_another_worker_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="not leased to worker 'bob'"):
        queue.record_progress(leased(), BOB, 5, NOW, LEASE)
    with pytest.raises(FailedPrecondition):
        queue.record_progress(leased(), Holder("alice", 2), 5, NOW, LEASE)


def test_late_heartbeat_after_done_is_ignored() -> None:
    done = queue.complete(leased(), ALICE)
    assert queue.record_progress(done, ALICE, 50, NOW, LEASE) == done


def test_done_is_idempotent_and_fills_the_offset() -> None:
    done = queue.complete(queue.record_progress(leased(), ALICE, 10, NOW, LEASE), ALICE)
    assert done.state is ShardState.DONE and done.offset == 100 and done.lease_expires_at is None
    assert queue.complete(done, ALICE) == done
    assert queue.complete(done, ALICE, lease=done.leases) == done
    # Someone else's late done is refused even though the shard is finished: that worker
    # must not count the records as its own.
    with pytest.raises(FailedPrecondition):
        queue.complete(done, BOB)
    with pytest.raises(FailedPrecondition, match="stale"):
        queue.complete(done, ALICE, lease=done.leases - 1)
    with pytest.raises(FailedPrecondition):
        queue.complete(todo(), ALICE)


def test_failed_goes_back_to_todo_keeping_the_offset() -> None:
    shard = queue.record_progress(leased(), ALICE, 25, NOW, LEASE)
    failed = queue.fail(shard, ALICE)
    assert failed.state is ShardState.TODO and failed.offset == 25
    assert queue.fail(failed, ALICE) == failed  # the retried report is harmless
    with pytest.raises(FailedPrecondition):
        queue.fail(failed, BOB)
    again = queue.lease(failed, BOB, NOW, LEASE)
    assert again.offset == 25 and again.leases == 2
    with pytest.raises(FailedPrecondition):
        queue.fail(queue.complete(again, BOB), BOB)


def test_release_only_touches_doing() -> None:
    assert queue.release(todo()) == todo()
    released = queue.release(queue.record_progress(leased(), ALICE, 7, NOW, LEASE))
    assert released.state is ShardState.TODO and released.offset == 7


def test_fence() -> None:
    assert queue.fence(WorkerRecord("alice", 3), "alice", 3) == Holder("alice", 3)
    with pytest.raises(FailedPrecondition, match="not registered"):
        queue.fence(None, "alice", 1)
    with pytest.raises(FailedPrecondition, match="stale"):
        queue.fence(WorkerRecord("alice", 3), "alice", 2)
    with pytest.raises(FailedPrecondition, match="marked lost"):
        queue.fence(WorkerRecord("alice", 3, lost=True), "alice", 3)


def small_queue(epochs: int = 2, shuffle: bool = False) -> ShardQueue:
    params = DatasetParameters(
        record_count=10,
        batch_size=2,
        shard_batches=2,
        epochs=epochs,
        shuffle=shuffle,
        seed=1,
        kind=ShardingKind.INDEX_RANGE,
        partitions=0,
    )
    return ShardQueue(params, LEASE)


def test_queue_hands_out_epochs_lazily_then_ends() -> None:
    shards = small_queue()
    token = shards.register("w")
    assert shards.counts().todo == 0
    got = []
    while (shard := shards.get_shard("w", token, NOW)) is not None:
        got.append((shard.epoch, shard.start, shard.end))
        shards.report_done("w", token, shard.shard_id)
    assert got == [(0, 0, 4), (0, 4, 8), (0, 8, 10), (1, 0, 4), (1, 4, 8), (1, 8, 10)]
    counts = shards.counts()
    assert counts.finished and counts.epoch == 1 and counts.done == 3 and counts.todo == 0


def test_next_epoch_starts_while_the_last_shard_of_this_one_is_out() -> None:
    shards = small_queue()
    a, b = shards.register("a"), shards.register("b")
    first = [shards.get_shard("a", a, NOW) for _ in range(3)]
    assert all(s is not None and s.epoch == 0 for s in first)
    nxt = shards.get_shard("b", b, NOW)
    assert nxt is not None and nxt.epoch == 1
    held = first[0]
    assert held is not None
    shards.report_failed("a", a, held.shard_id)
    retried = shards.get_shard("b", b, NOW)
    assert retried is not None and retried.shard_id == held.shard_id  # older epoch first


def test_register_again_fences_the_old_incarnation_and_requeues() -> None:
    shards = small_queue()
    old = shards.register("w")
    shard = shards.get_shard("w", old, NOW)
    assert shard is not None
    shards.report_progress("w", old, shard.shard_id, 3, NOW)
    new = shards.register("w")
    assert new == old + 1
    with pytest.raises(FailedPrecondition, match="stale"):
        shards.report_done("w", old, shard.shard_id)
    again = shards.get_shard("w", new, NOW)
    assert again is not None and again.shard_id == shard.shard_id and again.offset == 3


def test_lost_worker_is_fenced_and_its_shards_requeued() -> None:
    shards = small_queue()
    token = shards.register("w")
    shards.get_shard("w", token, NOW)
    shards.get_shard("w", token, NOW)
    assert shards.mark_lost("w") == 2
    assert shards.mark_lost("w") == 0
    with pytest.raises(FailedPrecondition, match="lost"):
        shards.get_shard("w", token, NOW)
    with pytest.raises(NotFound):
        shards.mark_lost("nobody")
    assert shards.counts().todo == 3
