"""The bus on a real nats-server: streams, de-duplication, acks, retries, dead letters, traces."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from functools import partial

import pytest
from nats.aio.msg import Msg
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stride.bus import client as client_module
from stride.bus import topics
from stride.bus.client import Bus, Delivery, Handler, PermanentError
from stride.events.v1 import job_pb2
from stride.runtime.errors import InvalidArgument
from stride.testing.bus import producer_bus
from stride.testing.eventually import assert_eventually
from stride.testing.streams import dead_letters

pytestmark = pytest.mark.integration


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[Bus]:
    connected = await producer_bus(nats_url, "test")
    await connected.ensure_streams()
    yield connected
    await connected.close()


def finished(job_id: str) -> job_pb2.JobFinished:
    return job_pb2.JobFinished(job_id=job_id, outcome=job_pb2.JOB_OUTCOME_SUCCEEDED)


async def run_consumer(
    bus: Bus, handler: Handler[job_pb2.JobFinished], stop: asyncio.Event, max_deliver: int = 5
) -> asyncio.Task[None]:
    return asyncio.create_task(
        bus.consume(
            topics.JOB_FINISHED,
            durable="test-consumer",
            handler=handler,
            stop=stop,
            max_deliver=max_deliver,
        )
    )


async def test_streams_are_idempotent_and_duplicates_are_dropped(bus: Bus) -> None:
    await bus.ensure_streams()
    first = await bus.publish(topics.JOB_FINISHED, "j1", finished("j1"), "j1.finished")
    again = await bus.publish(topics.JOB_FINISHED, "j1", finished("j1"), "j1.finished")
    assert again.duplicate and not first.duplicate
    info = await bus.js.stream_info(topics.JOBS.name)
    assert info.state.messages == 1


async def test_handler_sees_messages_in_order_and_acks(bus: Bus) -> None:
    seen: list[str] = []
    stop = asyncio.Event()

    async def handler(message: job_pb2.JobFinished, delivery: Delivery) -> None:
        seen.append(message.job_id)

    task = await run_consumer(bus, handler, stop)
    for index in range(5):
        await bus.publish(topics.JOB_FINISHED, f"j{index}", finished(f"j{index}"), f"j{index}.f")
    await assert_eventually(lambda: seen == [f"j{i}" for i in range(5)])
    info = await bus.js.consumer_info(topics.JOBS.name, "test-consumer")
    await assert_eventually(lambda: info.num_ack_pending == 0)
    stop.set()
    await task


async def test_malformed_and_mistyped_messages_are_dead_lettered_not_retried(
    bus: Bus, nats_url: str
) -> None:
    seen: list[str] = []
    stop = asyncio.Event()

    async def handler(message: job_pb2.JobFinished, delivery: Delivery) -> None:
        seen.append(message.job_id)

    task = await run_consumer(bus, handler, stop)
    await bus.publish_raw(
        topics.JOB_FINISHED.subject("bad"), b'{"job_id": "json is not protobuf"}', "bad", {}
    )
    wrong = job_pb2.JobSubmitted(job_id="x")
    await bus.publish_raw(
        topics.JOB_FINISHED.subject("wrong"),
        wrong.SerializeToString(),
        "wrong-type",
        topics.message_headers(wrong),
    )
    await bus.publish(topics.JOB_FINISHED, "good", finished("good"), "good.f")
    await assert_eventually(lambda: seen == ["good"])
    parked = await assert_eventually(lambda: dead_letters(nats_url, "test-consumer"))
    reasons = sorted((m.headers or {})["Stride-Dead-Letter-Reason"] for m in parked)
    assert len(reasons) == 2
    assert reasons[0].startswith("payload type stride.events.v1.JobSubmitted")
    assert reasons[1].startswith("undecodable")
    stop.set()
    await task


async def test_failures_retry_then_dead_letter_after_max_deliver(bus: Bus, nats_url: str) -> None:
    attempts: list[int] = []
    stop = asyncio.Event()

    async def flaky(message: job_pb2.JobFinished, delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        if message.job_id == "never":
            raise RuntimeError("database down")
        if message.job_id == "reject":
            raise PermanentError("cannot ever work")
        if delivery.attempt < 2:
            raise RuntimeError("first try fails")

    task = await run_consumer(bus, flaky, stop, max_deliver=3)
    await bus.publish(topics.JOB_FINISHED, "once", finished("once"), "once.f")
    await assert_eventually(lambda: attempts[:2] == [1, 2], timeout=10)
    attempts.clear()
    await bus.publish(topics.JOB_FINISHED, "never", finished("never"), "never.f")
    await assert_eventually(lambda: attempts == [1, 2, 3], timeout=15)
    await bus.publish(topics.JOB_FINISHED, "reject", finished("reject"), "reject.f")
    parked = await assert_eventually(lambda: _two(nats_url), timeout=10)
    reasons = sorted((m.headers or {})["Stride-Dead-Letter-Reason"] for m in parked)
    assert reasons[0].startswith("failed 3 times, last: RuntimeError: database down")
    assert reasons[1].startswith("rejected by handler: cannot ever work")
    stop.set()
    await task


async def _two(nats_url: str) -> list[Msg]:
    found = await dead_letters(nats_url, "test-consumer")
    return found if len(found) == 2 else []


async def test_trace_context_crosses_the_bus(bus: Bus, spans: InMemorySpanExporter) -> None:
    stop = asyncio.Event()
    consumed: list[str] = []

    async def handler(message: job_pb2.JobFinished, delivery: Delivery) -> None:
        consumed.append(format(trace.get_current_span().get_span_context().trace_id, "032x"))

    task = await run_consumer(bus, handler, stop)
    with trace.get_tracer("test").start_as_current_span("origin") as origin:
        await bus.publish(topics.JOB_FINISHED, "t", finished("t"), "t.f")
    await assert_eventually(lambda: consumed)
    assert consumed == [format(origin.get_span_context().trace_id, "032x")]
    stop.set()
    await task


async def test_a_batch_handler_settles_each_message_by_its_own_outcome(
    bus: Bus, nats_url: str, spans: InMemorySpanExporter
) -> None:
    """One call for a fetched batch; each message acked, retried or dead-lettered as its
    own outcome says, and the batch's span linked to every producer's."""
    batches: list[list[str]] = []
    stop = asyncio.Event()

    async def handler(
        batch: Sequence[tuple[job_pb2.JobFinished, Delivery]],
    ) -> list[BaseException | None]:
        batches.append([message.job_id for message, _ in batch])
        outcomes: list[BaseException | None] = []
        for message, delivery in batch:
            if message.job_id == "bad":
                outcomes.append(InvalidArgument("job_id", "is bad"))
            elif message.job_id == "flaky" and delivery.attempt == 1:
                outcomes.append(RuntimeError("first try fails"))
            else:
                outcomes.append(None)
        return outcomes

    with trace.get_tracer("test").start_as_current_span("origin") as origin:
        for job_id in ("a", "bad", "flaky", "b"):
            await bus.publish(topics.JOB_FINISHED, job_id, finished(job_id), f"{job_id}.f")
    task = asyncio.create_task(
        bus.consume(
            topics.JOB_FINISHED, durable="test-batches", batch_handler=handler, stop=stop, batch=8
        )
    )
    await assert_eventually(lambda: batches[1:] == [["flaky"]], timeout=10)
    assert batches[0] == ["a", "bad", "flaky", "b"]  # one call for what one fetch got
    parked = await assert_eventually(lambda: dead_letters(nats_url, "test-batches"))
    assert [(m.headers or {})["Stride-Dead-Letter-Reason"] for m in parked] == [
        "rejected by handler: job_id: is bad"
    ]
    info = await bus.js.consumer_info(topics.JOBS.name, "test-batches")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    batch_spans = [s for s in spans.get_finished_spans() if s.name.startswith("consume ")]
    assert any(
        link.context.trace_id == origin.get_span_context().trace_id
        for span in batch_spans
        for link in span.links
    )
    stop.set()
    await task


async def test_consume_needs_exactly_one_handler(bus: Bus) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        await bus.consume(topics.JOB_FINISHED, durable="test-none", stop=asyncio.Event())


async def test_a_deleted_consumer_is_recreated_from_what_it_had_acked(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a service's durable consumer (six times over, as stopped the suite once)
    neither stops the service nor makes it wait forever: it makes the consumer again from
    its ack floor, so later events arrive once and the ones it handled are not replayed."""
    monkeypatch.setattr(client_module, "CONSUMER_CHECK_SECONDS", 0.2)
    seen: list[str] = []
    stop = asyncio.Event()

    async def handler(message: job_pb2.JobFinished, delivery: Delivery) -> None:
        seen.append(message.job_id)

    async def floor_is(sequence: int) -> bool:
        info = await bus.js.consumer_info(topics.JOBS.name, "test-consumer")
        return bool(info.ack_floor.stream_seq == sequence)

    async def last_seen(job_id: str) -> bool:
        return seen[-1:] == [job_id]

    task = await run_consumer(bus, handler, stop)
    for index in range(3):
        await bus.publish(topics.JOB_FINISHED, f"j{index}", finished(f"j{index}"), f"j{index}.f")
    await assert_eventually(lambda: seen == ["j0", "j1", "j2"])
    for index in range(3, 9):
        await assert_eventually(partial(floor_is, index))
        await asyncio.sleep(1.5)  # idle past a fetch (1 s): the consumer notes its floor
        await bus.js.delete_consumer(topics.JOBS.name, "test-consumer")
        await bus.publish(topics.JOB_FINISHED, f"j{index}", finished(f"j{index}"), f"j{index}.f")
        await assert_eventually(partial(last_seen, f"j{index}"), timeout=10)
        assert not task.done()
    assert seen == [f"j{index}" for index in range(9)]  # each once, in order
    stop.set()
    await task


async def test_a_follower_replays_the_stream_then_follows_and_catches_up(nats_url: str) -> None:
    """What the stream held before it started, each event as published, and (catch-up) one
    its live subscription missed; an unsigned one is skipped."""
    from stride.bus.client import Follower
    from stride.events.v1 import auth_pb2

    producer = await producer_bus(nats_url, "admission-stand-in")
    reader = await Bus.connect(nats_url, "reader", identity="dispatcher")
    forger = await Bus.connect(nats_url, "forger")  # signs nothing
    seen: list[str] = []
    try:
        await producer.ensure_streams()

        async def revoke(token_id: str, bus: Bus = producer) -> None:
            key = topics.revoked_token_key(token_id)
            event = auth_pb2.TokenRevocation(token_id=token_id)
            await bus.publish(topics.TOKEN_REVOKED, key, event, f"m-{token_id}")

        await revoke("a" * 32)
        await revoke("b" * 32)
        follower = Follower(reader, topics.TOKEN_REVOKED, lambda _k, m: seen.append(m.token_id))
        await follower.start()
        assert seen == ["a" * 32, "b" * 32]  # replayed before start() returned
        await revoke("c" * 32)
        await assert_eventually(lambda: seen[-1] == "c" * 32, timeout=5)
        assert follower.subscription is not None
        await follower.subscription.unsubscribe()  # as if the connection dropped a while
        await revoke("d" * 32)
        await revoke("e" * 32, forger)
        assert await follower.catch_up() == 3  # c (seen live, read again), d, e (skipped)
        assert seen == ["a" * 32, "b" * 32, "c" * 32, "c" * 32, "d" * 32]
        assert await follower.catch_up() == 0
        stop = asyncio.Event()
        stop.set()
        await follower.run(stop, every=0.01)  # returns at once when stopped
    finally:
        for bus in (producer, reader, forger):
            await bus.close()
