"""Full garbage collections run when the loop is quiet, or forced under unbroken load."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest

from stride.runtime import collector as module
from stride.runtime.collector import Collector


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
        for _ in range(50):
            await asyncio.sleep(0.01)
            if collector.collections:
                break
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
