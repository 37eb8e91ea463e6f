"""The client library's reader against a scripted dispatcher: what it yields, when it reports,
how it completes shards, and what it does when a shard is revoked or the data ends."""

from __future__ import annotations

from collections import deque
from typing import Any

import grpc
import pytest

from stride.shardclient import Committed, LeasedShard, Revoked, ShardReader, ShardReply
from stride.shardclient.client import RetryPolicy, ShardClient


def shard(shard_id: int, start: int, end: int, offset: int = 0, **extra: Any) -> LeasedShard:
    return LeasedShard("train", shard_id, 0, start, end, offset, **{"lease": 1, **extra})


class ScriptedClient:
    """Stands in for ShardClient: hands out scripted replies and records every report."""

    def __init__(self, replies: list[ShardReply], revoke_progress_at: int | None = None) -> None:
        self.replies = deque(replies)
        self.calls: list[tuple[Any, ...]] = []
        self.revoke_progress_at = revoke_progress_at

    def get_shard(self, dataset: str, done: LeasedShard | None = None) -> ShardReply:
        self.calls.append(("get", None if done is None else done.shard_id))
        return self.replies.popleft()

    def get_shards(
        self, dataset: str, done: tuple[LeasedShard, ...] | list[LeasedShard] = (), count: int = 1
    ) -> ShardReply:
        self.calls.append(("get-batch", tuple(s.shard_id for s in done), count))
        reply = self.replies.popleft()
        if isinstance(reply, Exception):
            raise reply
        return reply

    def report_progress(self, leased: LeasedShard, offset: int, renew_held: bool = False) -> None:
        self.calls.append(("progress", leased.shard_id, offset, *(["renew"] * renew_held)))
        if offset == self.revoke_progress_at:
            raise Revoked("lease lapsed")

    def report_done(self, leased: LeasedShard) -> None:
        self.calls.append(("done", leased.shard_id))


def read(client: ScriptedClient, **options: Any) -> tuple[list[int], list[Committed]]:
    committed: list[Committed] = []
    reader = ShardReader(
        client,  # type: ignore[arg-type]
        "train",
        batch_size=2,
        report_every_batches=2,
        report_every_seconds=3600,
        on_commit=committed.append,
        **options,
    )
    try:
        return list(reader), committed
    finally:
        reader.close()


def test_reports_every_n_batches_and_completes_with_the_next_get() -> None:
    client = ScriptedClient(
        [
            ShardReply(shard(0, 0, 10)),
            ShardReply(shard(1, 10, 15, offset=2)),  # re-issued: resumes at its offset
            ShardReply(None, end_of_data=True),
        ]
    )
    indices, committed = read(client, prefetch=False)
    assert indices == [*range(10), *range(12, 15)]
    assert client.calls == [
        ("get", None),
        ("progress", 0, 4),
        ("progress", 0, 8),
        ("get", 0),  # shard 0 done in the same call that leases shard 1
        ("get", 1),
    ]
    assert [(c.shard.shard_id, c.first, c.last) for c in committed] == [
        (0, 0, 4),
        (0, 4, 8),
        (0, 8, 10),
        (1, 2, 5),
    ]


def test_prefetches_the_next_shard_and_waits_when_told_to_retry() -> None:
    client = ScriptedClient(
        [
            ShardReply(shard(0, 0, 3)),
            ShardReply(None, retry_after=0.01),  # prefetched while shard 0 is read
            ShardReply(shard(1, 3, 5, indices=(9, 8), straggler=True)),
            ShardReply(None, end_of_data=True),
        ]
    )
    indices, committed = read(client, prefetch=True)
    assert indices == [0, 1, 2, 9, 8]
    assert ("done", 0) in client.calls and ("done", 1) in client.calls
    assert sum(c.last - c.first for c in committed) == 5


def test_a_revoked_shard_is_dropped_and_not_counted() -> None:
    client = ScriptedClient(
        [
            ShardReply(shard(0, 0, 10)),
            ShardReply(shard(1, 10, 12)),
            ShardReply(None, end_of_data=True),
        ],
        revoke_progress_at=8,
    )
    indices, committed = read(client, prefetch=False)
    assert indices == [*range(8), 10, 11]  # stops reading shard 0 at the refusal
    assert ("get", 0) not in client.calls  # never reported done
    assert [(c.shard.shard_id, c.first, c.last) for c in committed] == [(0, 0, 4), (1, 0, 2)]


def test_batches_report_what_finished_and_renew_the_shards_waiting() -> None:
    client = ScriptedClient(
        [
            ShardReply(shard(0, 0, 10), more=(shard(1, 10, 14), shard(2, 14, 16))),
            ShardReply(shard(3, 16, 18)),
            ShardReply(None, end_of_data=True),
        ]
    )
    indices, committed = read(client, prefetch=False, shards_per_call=3)
    assert indices == list(range(18))
    assert client.calls == [
        ("get-batch", (), 3),
        ("progress", 0, 4, "renew"),  # every heartbeat renews the shards leased ahead
        ("progress", 0, 8, "renew"),
        ("get-batch", (0, 1, 2), 3),  # the three finished ride on the next call
        ("get-batch", (3,), 3),
    ]
    # Each shard's records are committed once; a shard's last part once its call succeeded.
    assert [(c.shard.shard_id, c.first, c.last) for c in committed] == [
        (0, 0, 4),
        (0, 4, 8),
        (0, 8, 10),
        (1, 0, 4),
        (2, 0, 2),
        (3, 0, 2),
    ]


def test_a_prefetched_batch_is_asked_for_when_half_the_batch_is_taken() -> None:
    client = ScriptedClient(
        [
            ShardReply(shard(0, 0, 2), more=(shard(1, 2, 4),)),
            ShardReply(shard(2, 4, 6), more=(shard(3, 6, 8),)),  # prefetched during shard 0
            ShardReply(None, retry_after=0.01),  # prefetched during shard 2: nothing yet
            ShardReply(None, end_of_data=True),  # the last finished ones reported
        ]
    )
    indices, committed = read(client, prefetch=True, shards_per_call=2)
    assert indices == list(range(8))
    assert [c for c in client.calls if c[0] == "get-batch"] == [
        ("get-batch", (), 2),
        ("get-batch", (), 2),  # sent when shard 0 (half the batch) started
        ("get-batch", (0, 1), 2),  # sent when shard 2 started
        ("get-batch", (2, 3), 2),
    ]
    assert sum(c.last - c.first for c in committed) == 8


def test_a_fenced_batch_call_voids_what_it_reported() -> None:
    client = ScriptedClient(
        [
            ShardReply(shard(0, 0, 2), more=(shard(1, 2, 4),)),
            Revoked("token fenced"),  # type: ignore[list-item]
            ShardReply(shard(0, 0, 2, lease=2), more=()),
            ShardReply(None, end_of_data=True),
        ]
    )
    indices, committed = read(client, prefetch=False, shards_per_call=2)
    assert indices == [0, 1, 2, 3, 0, 1]  # shard 0 again, from its start: re-leased
    assert [c for c in client.calls if c[0] == "get-batch"] == [
        ("get-batch", (), 2),
        ("get-batch", (0, 1), 2),  # refused: 0 and 1 are void, nothing committed for them
        ("get-batch", (), 2),
        ("get-batch", (0,), 2),
    ]
    assert [(c.shard.shard_id, c.first, c.last) for c in committed] == [(0, 0, 2)]


def test_retries_with_backoff_then_gives_up() -> None:
    class Unavailable(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 4:
            raise Unavailable()
        return "ok"

    client = ShardClient(
        "127.0.0.1:1", "job", "w", retry=RetryPolicy(first_delay=0.001, give_up_after=5)
    )
    try:
        assert client.call(flaky) == "ok" and len(attempts) == 4
        impatient = RetryPolicy(first_delay=0.001, max_delay=0.002, give_up_after=0.01)
        client.retry = impatient

        def down() -> str:
            raise Unavailable()

        with pytest.raises(Unavailable):
            client.call(down)
        assert all(0 <= impatient.delay(n) <= 0.002 for n in range(1, 30))
    finally:
        client.close()
