"""A plain Python iterator of sample indices, fed by the shard dispatcher.

``for index in ShardReader(client, "train", batch_size=32): ...`` reads every shard the
dispatcher hands this worker, epoch after epoch, until the end of the data.

* Prefetch: while a shard is being read, the next one is leased in a background thread, so
  a worker never waits for the dispatcher between shards. The prefetched lease is renewed
  with every heartbeat so it cannot lapse while it waits.
* Batches (``shards_per_call=N``): for workers that finish shards faster than a call's
  round trip, N shards are leased per call, and the shards finished since the last call
  are reported done in the same call (one call and one commit per N shards). With
  prefetch, the next batch is asked for when half of a batch is taken. Heartbeats
  renew every lease the worker holds (``renew_held``), so shards waiting their turn do not
  lapse.
* Progress: the records consumed so far are reported every ``report_every_batches``
  batches or ``report_every_seconds`` seconds, whichever comes first, and at the end of
  each shard (done, combined with leasing the next one when nothing is prefetched).
* A record counts as consumed when the loop asks for the next one, i.e. once the loop body
  that used it has finished.
* Revocation: if the dispatcher takes a shard back (lease lapsed, worker marked lost,
  restore) the reader drops it and carries on with the next shard. Records read after
  the last accepted report of a revoked shard are read again by whoever gets the shard:
  exactly once holds for what was reported (``on_commit`` sees exactly that), and the
  unreported tail is at least once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import structlog

from stride.shardclient.client import (
    MAX_SHARDS_PER_CALL,
    Committed,
    LeasedShard,
    Revoked,
    ShardClient,
    ShardReply,
)

log = structlog.get_logger(__name__)


class ShardReader:
    """Iterates the sample indices of the shards a dispatcher leases to one worker."""

    def __init__(
        self,
        client: ShardClient,
        dataset: str,
        *,
        batch_size: int,
        report_every_batches: int = 16,
        report_every_seconds: float = 10.0,
        prefetch: bool = True,
        on_commit: Callable[[Committed], None] | None = None,
        shards_per_call: int = 1,
    ) -> None:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if report_every_batches <= 0 or report_every_seconds <= 0:
            raise ValueError("report intervals must be positive")
        if not 1 <= shards_per_call <= MAX_SHARDS_PER_CALL:
            raise ValueError(f"shards_per_call must be 1 to {MAX_SHARDS_PER_CALL}")
        self.shards_per_call = shards_per_call
        self.client = client
        self.dataset = dataset
        self.report_records = batch_size * report_every_batches
        self.report_seconds = report_every_seconds
        self.prefetch = prefetch
        self.on_commit = on_commit
        self.current: LeasedShard | None = None
        self.waiting: deque[LeasedShard] = deque()
        """Shards leased in a batch and not started yet (``shards_per_call`` > 1)."""
        self._reported = 0
        self._stopped = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-prefetch")
        self._next: Future[ShardReply] | None = None
        self._next_reports: list[tuple[LeasedShard, int]] = []
        """The finished shards (with the offset reported before) the batch call in
        ``_next`` reports done."""

    def stop(self) -> None:
        """Stop after the current record, reporting nothing more (as if the worker died)."""
        self._stopped = True

    def close(self) -> None:
        """Stop the prefetch thread."""
        self._stopped = True
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __iter__(self) -> Iterator[int]:
        for shard, position in self._walk():
            yield shard.record(position)

    def records(self) -> Iterator[tuple[int, int]]:
        """(partition, index) pairs: for stream datasets, the index is the partition offset."""
        for shard, position in self._walk():
            yield shard.partition, shard.record(position)

    def _walk(self) -> Iterator[tuple[LeasedShard, int]]:
        return self._batched_positions() if self.shards_per_call > 1 else self._positions()

    def _commit(self, shard: LeasedShard, first: int, upto: int) -> None:
        if upto > first and self.on_commit is not None:
            self.on_commit(Committed(shard, first, upto))

    def _positions(self) -> Iterator[tuple[LeasedShard, int]]:
        finished: tuple[LeasedShard, int] | None = None  # (shard, offset reported so far)
        try:
            while not self._stopped:
                reply = self._take(finished)
                finished = None
                if reply.end_of_data:
                    return
                if reply.shard is None:
                    time.sleep(reply.retry_after)
                    continue
                shard = reply.shard
                completed = yield from self._read(shard)
                if self._stopped or not completed:
                    continue
                if self._next is None:
                    finished = (shard, self._reported)  # done rides on the next GetShard
                    continue
                reported = self._reported
                if self._report(shard, partial(self.client.report_done, shard)):
                    self._commit(shard, reported, shard.size)
        finally:
            self.current = None

    def _batched_positions(self) -> Iterator[tuple[LeasedShard, int]]:
        held = self.waiting
        finished: list[tuple[LeasedShard, int]] = []  # (shard, offset reported so far)
        try:
            while not self._stopped:
                if not held:
                    reply, finished = self._take_batch(finished)
                    if reply.end_of_data:
                        return
                    if not reply.shards:
                        time.sleep(reply.retry_after)
                        continue
                    held.extend(reply.shards)
                shard = held.popleft()
                if self.prefetch and len(held) <= self.shards_per_call // 2 and self._next is None:
                    # Half the batch is taken: ask for the next one while the rest is read
                    # (a call has half a batch of shards to arrive in), reporting the ones
                    # finished so far.
                    self._next_reports, finished = finished, []
                    self._next = self._executor.submit(
                        self.client.get_shards,
                        self.dataset,
                        [done for done, _ in self._next_reports],
                        self.shards_per_call,
                    )
                completed = yield from self._read(shard)
                if not self._stopped and completed:
                    finished.append((shard, self._reported))
        finally:
            self.current = None

    def _take_batch(
        self, finished: list[tuple[LeasedShard, int]]
    ) -> tuple[ShardReply, list[tuple[LeasedShard, int]]]:
        """The next batch, and the finished shards still to report: the prefetched batch
        if there is one (``finished`` then rides on the next call), else a call reporting
        ``finished`` done (each committed once the call succeeded)."""
        pending, self._next = self._next, None
        if pending is not None:
            reports, self._next_reports = self._next_reports, []
            try:
                reply = pending.result()
            except Revoked:
                pass  # the token was fenced: the reported shards are void; ask again
            else:
                for shard, reported in reports:
                    self._commit(shard, reported, shard.size)
                if reply.shards or not finished:
                    return reply, finished
        try:
            reply = self.client.get_shards(
                self.dataset, [shard for shard, _ in finished], self.shards_per_call
            )
        except Revoked:
            # The token was fenced: every shard held, the finished ones too, is void.
            return self.client.get_shards(self.dataset, (), self.shards_per_call), []
        for shard, reported in finished:
            self._commit(shard, reported, shard.size)
        return reply, []

    def _take(self, finished: tuple[LeasedShard, int] | None) -> ShardReply:
        pending, self._next = self._next, None
        if pending is not None:
            try:
                return pending.result()
            except Revoked:
                pass  # the token was fenced meanwhile; ask again below with the new one
        if finished is None:
            return self.client.get_shard(self.dataset)
        shard, reported = finished
        try:
            reply = self.client.get_shard(self.dataset, done=shard)
        except Revoked:
            # The token was fenced: every shard held, the finished one too, is void.
            return self.client.get_shard(self.dataset)
        self._commit(shard, reported, shard.size)
        return reply

    def _read(self, shard: LeasedShard) -> Generator[tuple[LeasedShard, int], None, bool]:
        """Yield the shard's positions; True at its end, False if it was revoked or stopped."""
        self.current = shard
        self._reported = shard.offset
        if self.prefetch and self.shards_per_call == 1:
            self._next = self._executor.submit(self.client.get_shard, self.dataset)
        last_report = time.monotonic()
        position = shard.offset
        while position < shard.size:
            yield shard, position
            if self._stopped:
                return False
            position += 1
            if position == shard.size:
                break
            due = position - self._reported >= self.report_records
            if due or time.monotonic() - last_report >= self.report_seconds:
                last_report = time.monotonic()
                if not self._heartbeat(shard, position):
                    return False
        return True

    def _heartbeat(self, shard: LeasedShard, position: int) -> bool:
        reported = self._reported
        batched = self.shards_per_call > 1  # shards wait their turn: renew them all
        if not self._report(
            shard, lambda: self.client.report_progress(shard, position, renew_held=batched)
        ):
            return False
        self._commit(shard, reported, position)
        self._reported = position
        if not batched:
            self._renew_prefetched()
        return True

    def _renew_prefetched(self) -> None:
        pending = self._next
        if pending is None or not pending.done() or pending.exception() is not None:
            return
        reply = pending.result()
        if reply.shard is None:
            return
        try:
            # Same offset: the dispatcher keeps the highest, so this only renews the lease.
            self.client.report_progress(reply.shard, reply.shard.offset)
        except Revoked:
            self._next = None

    def _report(self, shard: LeasedShard, action: Callable[[], object]) -> bool:
        try:
            action()
        except Revoked as revoked:
            log.warning(
                "shard revoked by the dispatcher; dropping it",
                dataset=self.dataset,
                shard_id=shard.shard_id,
                reason=str(revoked),
            )
            self.current = None
            return False
        return True
