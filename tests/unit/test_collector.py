"""Full garbage collections run when the loop is quiet, or forced under unbroken load."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import grpc
import pytest

from stride.runtime import collector as module
from stride.runtime.collector import Collector
from stride.runtime.grpc_server import GrpcServer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    """A reference cycle nothing else holds (only a full collection frees it once it has
    aged into the oldest generation), and a weak reference to tell whether it was."""
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gc.collect(1)  # both now sit in the oldest generation
    return weakref.ref(first)


def _make_due() -> None:
    for _ in range(module.DUE_AFTER):
        gc.collect(1)  # each young collection counts towards the next full one


async def _collected(collector: Collector, ticks: int) -> None:
    """Wait up to ``ticks`` 10 ms ticks for the collector's first collection."""
    for _ in range(ticks):
        await asyncio.sleep(0.01)
        if collector.collections:
            return


async def _started(collector: Collector, stop: asyncio.Event) -> asyncio.Task[None]:
    # Nothing due at the start, whatever the process did before (a test suite's worker
    # may be due already), so every collection counted is one this test caused.
    gc.collect()
    task = asyncio.create_task(collector.run(stop))
    await asyncio.sleep(0.05)  # installed: thresholds set, start-up frozen
    assert collector.collections == 0
    return task


async def test_a_due_collection_runs_once_the_loop_is_quiet_and_frees_cycles() -> None:
    before = gc.get_threshold()
    collector = Collector(every_seconds=60.0, tick_seconds=0.01, quiet_ticks=3)
    stop = asyncio.Event()
    task = await _started(collector, stop)
    try:
        # The interpreter no longer runs full collections on its own.
        assert gc.get_threshold()[:2] == before[:2]
        assert gc.get_threshold()[2] == module.OUT_OF_REACH
        alive = _cycle()
        assert alive() is not None
        _make_due()
        assert collector.due()
        await _collected(collector, 50)
        assert collector.collections >= 1
        assert collector.forced == 0
        assert alive() is None, "the cycle outlived a full collection"
        assert not collector.due()
    finally:
        stop.set()
        await task
    assert gc.get_threshold() == before  # the last host put the interpreter's back


async def test_under_unbroken_load_a_due_collection_is_forced_after_the_limit() -> None:
    collector = Collector(every_seconds=0.3, tick_seconds=0.01, quiet_ticks=3)
    stop = asyncio.Event()
    task = await _started(collector, stop)
    try:
        _make_due()
        started = time.monotonic()
        # Requests back to back: the loop is held 30 ms at a time, never quiet.
        while not collector.collections and time.monotonic() - started < 5.0:
            time.sleep(0.03)
            await asyncio.sleep(0)
        waited = time.monotonic() - started
        assert collector.forced == 1, (collector.collections, collector.forced)
        assert waited >= 0.3, f"forced after {waited:.2f} s, before the 0.3 s limit"
    finally:
        stop.set()
        await task


async def test_nothing_runs_while_nothing_is_due() -> None:
    collector = Collector(every_seconds=0.05, tick_seconds=0.01, quiet_ticks=1)
    stop = asyncio.Event()
    task = await _started(collector, stop)
    try:
        await asyncio.sleep(0.15)
        assert collector.collections == 0
    finally:
        stop.set()
        await task


@pytest.mark.parametrize("hosts", [1, 3])
async def test_hosts_in_one_process_share_the_thresholds(hosts: int) -> None:
    before = gc.get_threshold()
    stops = [asyncio.Event() for _ in range(hosts)]
    tasks = [await _started(Collector(tick_seconds=0.01), stop) for stop in stops]
    for stop, task in zip(stops[:-1], tasks[:-1], strict=True):
        stop.set()
        await task
        assert gc.get_threshold()[2] == module.OUT_OF_REACH  # another host still runs
    stops[-1].set()
    await tasks[-1]
    assert gc.get_threshold() == before


async def test_no_early_collection_while_a_request_is_in_flight() -> None:
    """A request awaiting its database leaves the loop responsive; the collection waits for
    it to end rather than landing inside it."""
    collector = Collector(every_seconds=60.0, tick_seconds=0.01, quiet_ticks=3)
    stop = asyncio.Event()
    task = await _started(collector, stop)
    try:
        _make_due()
        with module.working():
            assert module.in_flight() == 1
            await asyncio.sleep(0.2)  # twenty ticks, all on time, one request in flight
            assert collector.collections == 0
        assert module.in_flight() == 0
        await _collected(collector, 50)
        assert collector.collections == 1 and collector.forced == 0
    finally:
        stop.set()
        await task


async def test_a_forced_collection_waits_for_a_gap_between_requests_then_runs_anyway() -> None:
    collector = Collector(every_seconds=0.2, tick_seconds=0.01, quiet_ticks=100)
    stop = asyncio.Event()
    task = await _started(collector, stop)
    try:
        _make_due()
        started = time.monotonic()
        with module.working():
            await _collected(collector, 500)
        waited = time.monotonic() - started
        # Never a gap: forced at twice the limit, not at the limit.
        assert collector.forced == 1, (collector.collections, collector.forced)
        assert waited >= 0.4, f"forced after {waited:.2f} s inside a request"
    finally:
        stop.set()
        await task


async def test_a_server_counts_its_unary_calls_in_flight() -> None:
    """The gRPC server's interceptor marks every unary call as work in flight, and the mark
    is gone once the call answered (also when it failed)."""
    seen: list[int] = []

    async def count(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        seen.append(module.in_flight())
        if request == b"fail":
            raise RuntimeError("the handler broke")
        return b"ok"

    handler = grpc.method_handlers_generic_handler(
        "stride.test.Count",
        {"Me": grpc.unary_unary_rpc_method_handler(count)},
    )
    server = GrpcServer(["stride.test.Count"], "127.0.0.1", 0)
    server.server.add_generic_rpc_handlers([handler])
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/stride.test.Count/Me", None, None)
            assert await call(b"", timeout=5) == b"ok"
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call(b"fail", timeout=5)
            assert failed.value.code() == grpc.StatusCode.INTERNAL
    finally:
        await server.stop(0)
    assert seen == [1, 1]
    assert module.in_flight() == 0
