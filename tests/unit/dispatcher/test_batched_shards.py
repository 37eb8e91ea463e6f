"""Batched GetShard (several shards leased and several reported done in one call) and
ReportProgress's renew_held, on the fast path of each database and on the general path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from stride.bus import topics
from stride.db.engine import Database
from stride.db.migrations import upgrade
from stride.db.outbox import Outbox
from stride.dispatcher.app import MIGRATIONS, open_fast_path
from stride.dispatcher.db.tables import outbox as outbox_table
from stride.dispatcher.db.tables import shards, workers
from stride.dispatcher.domain.datasets import DatasetParameters, ShardingKind
from stride.dispatcher.usecases import DoneReport, ShardDispatcher, WorkerRef
from stride.events.v1 import shard_pb2
from stride.runtime.errors import FailedPrecondition, InvalidArgument, NotFound

JOB, DATASET = "job-batch", "train"
LEASE = timedelta(seconds=60)
PARAMETERS = DatasetParameters(
    record_count=30,
    batch_size=10,
    shard_batches=1,
    epochs=2,
    shuffle=True,
    seed=3,
    kind=ShardingKind.INDEX_RANGE,
    partitions=0,
)
"""Three shards of ten records per epoch, two epochs."""


@pytest.fixture(params=["fast", "general"])
async def dispatcher(
    request: pytest.FixtureRequest, database_url: str
) -> AsyncIterator[ShardDispatcher]:
    upgrade(database_url, "dispatcher", MIGRATIONS)
    database = Database(database_url, "dispatcher")
    fast = (
        open_fast_path(database, LEASE, timedelta(seconds=30), sync_commits=False)
        if request.param == "fast"
        else None
    )
    opened = ShardDispatcher(database, Outbox(outbox_table), LEASE, fast=fast)
    await opened.create_dataset(JOB, DATASET, PARAMETERS)
    try:
        yield opened
    finally:
        if fast is not None:
            await fast.close()
        await database.dispose()


async def worker(dispatcher: ShardDispatcher, name: str = "w0") -> WorkerRef:
    return WorkerRef(JOB, DATASET, name, await dispatcher.register_worker(JOB, name))


async def events(dispatcher: ShardDispatcher) -> int:
    async with dispatcher.database.sessions() as session:
        count = await session.scalar(sa.select(sa.func.count()).select_from(outbox_table))
    return int(count or 0)


async def last_event(dispatcher: ShardDispatcher) -> tuple[str, bytes]:
    async with dispatcher.database.sessions() as session:
        row = (
            await session.execute(
                sa.select(outbox_table.c.subject, outbox_table.c.payload)
                .order_by(outbox_table.c.seq.desc())
                .limit(1)
            )
        ).one()
    return str(row.subject), bytes(row.payload)


async def backdate_leases(dispatcher: ShardDispatcher) -> None:
    async with dispatcher.database.transaction() as session:
        await session.execute(
            sa.update(shards)
            .where(shards.c.state == "DOING")
            .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )


async def test_a_batch_leases_in_hand_out_order_across_epochs_and_reports_all_done(
    dispatcher: ShardDispatcher,
) -> None:
    me = await worker(dispatcher)
    grant = await dispatcher.get_shard(me, max_shards=5)
    assert grant.shard is not None
    leased = [grant.shard, *grant.more]
    # Three in epoch 0, then the next epoch is cut in the same call for the other two.
    assert [shard.epoch for shard in leased] == [0, 0, 0, 1, 1]
    assert [(s.epoch, s.position) for s in leased] == sorted((s.epoch, s.position) for s in leased)
    assert len({shard.shard_id for shard in leased}) == 5
    assert all(shard.leases == 1 for shard in leased)
    state = await dispatcher.dataset_state(JOB, DATASET)
    assert (state.counts.doing, state.counts.todo) == (5, 1)
    assert sorted(state.workers[0].shard_ids) == sorted(shard.shard_id for shard in leased)

    before = await events(dispatcher)
    done = [DoneReport(shard.shard_id, shard.leases) for shard in leased]
    # A shard named twice (here the first, also as done_shard_id) is reported once.
    last = await dispatcher.get_shard(
        me, leased[0].shard_id, leased[0].leases, done=[*done, done[1]], max_shards=5
    )
    assert last.shard is not None and not last.more  # one shard was left
    # One event for the five: which shards, under which lease, finished by whom.
    assert await events(dispatcher) == before + 1
    subject, payload = await last_event(dispatcher)
    assert subject == topics.SHARDS_DONE.subject(JOB)
    event = shard_pb2.ShardsDone.FromString(payload)
    assert (event.job_id, event.dataset, event.worker) == (JOB, DATASET, "w0")
    assert [(f.shard_id, f.epoch, f.offset, f.lease) for f in event.shards] == [
        (s.shard_id, s.epoch, 10, 1) for s in leased
    ]
    state = await dispatcher.dataset_state(JOB, DATASET)
    assert (state.counts.doing, state.counts.todo) == (1, 0)
    assert state.workers[0].records_consumed == 20  # the two of epoch 1 (the current epoch)

    end = await dispatcher.get_shard(
        me, last.shard.shard_id, last.shard.leases, max_shards=3, done=[]
    )
    assert end.shard is None and end.why_none is not None and end.why_none.name == "END_OF_DATA"


async def test_one_refused_report_refuses_the_whole_call(dispatcher: ShardDispatcher) -> None:
    me, other = await worker(dispatcher), await worker(dispatcher, "w1")
    mine = await dispatcher.get_shard(me, max_shards=2)
    theirs = await dispatcher.get_shard(other)
    assert mine.shard is not None and theirs.shard is not None
    before = await events(dispatcher)
    reports = [
        DoneReport(mine.shard.shard_id, mine.shard.leases),
        DoneReport(theirs.shard.shard_id, theirs.shard.leases),  # not this worker's
    ]
    with pytest.raises(FailedPrecondition):
        await dispatcher.get_shard(me, done=reports, max_shards=2)
    stale = [DoneReport(mine.more[0].shard_id, mine.more[0].leases + 1)]
    with pytest.raises(FailedPrecondition):
        await dispatcher.get_shard(me, done=stale)
    with pytest.raises(NotFound) as missing:
        await dispatcher.get_shard(me, done=[DoneReport(mine.shard.shard_id), DoneReport(999_999)])
    assert str(missing.value.message).startswith("done_shards[1].shard_id: shard 999999")
    # Nothing changed: no shard done, no event, no further lease.
    assert await events(dispatcher) == before
    state = await dispatcher.dataset_state(JOB, DATASET)
    assert (state.counts.doing, state.counts.done) == (3, 0)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ({"max_shards": 0}, "max_shards"),
        ({"max_shards": 65}, "max_shards"),
        ({"done": [DoneReport(i) for i in range(65)]}, "done_shards"),
        ({"done": [DoneReport(-1)]}, "done_shards[0].shard_id"),
        ({"done": [DoneReport(4, -2)]}, "done_shards[0].lease"),
    ],
)
async def test_bad_batches_name_the_field_and_change_nothing(
    dispatcher: ShardDispatcher, call: dict[str, object], field: str
) -> None:
    me = await worker(dispatcher)
    with pytest.raises(InvalidArgument) as raised:
        await dispatcher.get_shard(me, **call)  # type: ignore[arg-type]
    assert raised.value.field == field
    state = await dispatcher.dataset_state(JOB, DATASET)
    assert state.counts.doing == 0


async def test_renew_held_keeps_the_shards_leased_ahead(dispatcher: ShardDispatcher) -> None:
    me = await worker(dispatcher)
    grant = await dispatcher.get_shard(me, max_shards=3)
    assert grant.shard is not None and len(grant.more) == 2
    await backdate_leases(dispatcher)
    await dispatcher.report_progress(me, grant.shard.shard_id, 4, renew_held=True)
    assert await dispatcher.expire_leases() == 0  # all three renewed

    await backdate_leases(dispatcher)
    await dispatcher.report_progress(me, grant.shard.shard_id, 5)
    assert await dispatcher.expire_leases() == 2  # only the shard reported on was renewed

    # Another incarnation's heartbeat renews nothing of the old one's.
    again = await dispatcher.get_shard(me, max_shards=2)
    assert again.shard is not None
    await backdate_leases(dispatcher)
    newer = await worker(dispatcher)
    with pytest.raises(FailedPrecondition):
        await dispatcher.report_progress(me, again.shard.shard_id, 1, renew_held=True)
    assert newer.incarnation == me.incarnation + 1


async def test_a_straggler_gets_one_smaller_shard(dispatcher: ShardDispatcher) -> None:
    # Shards of four batches of five records (a straggler's is cut to fewer batches).
    await dispatcher.create_dataset(
        JOB, "big", replace(PARAMETERS, record_count=100, batch_size=5, shard_batches=4)
    )
    me = WorkerRef(JOB, "big", "w0", await dispatcher.register_worker(JOB, "w0"))
    async with dispatcher.database.transaction() as session:
        await session.execute(sa.update(workers).values(straggler=True))
    grant = await dispatcher.get_shard(me, max_shards=4)
    assert grant.shard is not None and grant.straggler
    assert grant.more == ()
    assert grant.shard.end - grant.shard.start < 20
