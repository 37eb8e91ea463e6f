"""The reconcile loop's work queue: one pass per burst of events, back-off per key, a rate."""

from __future__ import annotations

import asyncio

from stride.podwatcher.workqueue import WorkQueue


async def test_a_key_added_many_times_is_handed_out_once() -> None:
    queue = WorkQueue()
    for _ in range(5):
        queue.add("job-a")
    queue.add("job-b")
    assert len(queue) == 2
    assert [await queue.get(), await queue.get()] == ["job-a", "job-b"]
    assert len(queue) == 0


async def test_a_key_added_while_worked_on_comes_back_after_done() -> None:
    queue = WorkQueue()
    queue.add("job-a")
    key = await queue.get()
    queue.add("job-a")  # an event during the pass
    assert len(queue) == 0  # never two passes of one job at once
    queue.done(key)
    assert await asyncio.wait_for(queue.get(), 1) == "job-a"


async def test_failures_back_off_exponentially_up_to_the_limit_and_forget_resets() -> None:
    queue = WorkQueue(base=0.01, limit=0.04)
    delays = [queue.retry("job-a") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    assert queue.failures("job-a") == 4
    queue.forget("job-a")
    assert queue.retry("job-a") == 0.01
    assert await asyncio.wait_for(queue.get(), 1) == "job-a"  # the first timer fired


async def test_add_after_keeps_the_earliest_timer_and_close_cancels() -> None:
    queue = WorkQueue()
    queue.add_after("job-a", 0.05)
    queue.add_after("job-a", 10)
    assert await asyncio.wait_for(queue.get(), 1) == "job-a"
    queue.add_after("job-b", 0.05)
    queue.close()
    await asyncio.sleep(0.1)
    assert len(queue) == 0


async def test_the_rate_bounds_how_fast_keys_are_handed_out() -> None:
    queue = WorkQueue(rate=100, burst=5)
    for n in range(25):
        queue.add(f"job-{n}")
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(25):
        await queue.get()
    # 5 at once, then 20 at 100 a second: at least 0.2 s.
    assert loop.time() - began >= 0.18
