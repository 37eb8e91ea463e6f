"""The executor's worker processes: stopped at the time limit, when their caller goes away,
and replaced when they die, with the slot serving again each time."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import pytest

from stride.cli.endpoints import pid_alive
from stride.executor.adapters.outbound.workers import WorkerPool
from stride.executor.usecases import AlgorithmFailed, TimedOut
from stride.runtime.errors import InvalidArgument

REGISTRY = "stride.testing.algorithms:registry"


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    started = WorkerPool(1, 1.0, REGISTRY)
    await started.start()
    yield started
    await started.close()


async def spin(pool: WorkerPool, seconds: float) -> float:
    result, plans = await pool.run("test-spin", 1, {"seconds": seconds}, "job-1")
    assert plans == []
    return float(result.fields["spun_seconds"].number_value)


async def test_a_run_past_the_limit_is_stopped_and_its_worker_replaced(pool: WorkerPool) -> None:
    (first,) = pool._all
    with pytest.raises(TimedOut, match="time limit of 1 s"):
        await spin(pool, 30.0)
    assert pool.stopped == 1
    assert await asyncio.wait_for(spin(pool, 0.01), 30) >= 0.01  # the new worker answers
    assert not first.process.is_alive()  # the one that ran past the limit is gone


async def test_a_caller_that_goes_away_frees_its_slot(pool: WorkerPool) -> None:
    (first,) = pool._all
    abandoned = asyncio.create_task(spin(pool, 0.9))
    await asyncio.sleep(0.3)
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    assert await asyncio.wait_for(spin(pool, 0.01), 30) >= 0.01
    assert pool.stopped == 1 and not first.process.is_alive()


async def test_a_worker_that_dies_is_a_failure_and_is_replaced(pool: WorkerPool) -> None:
    (first,) = pool._all
    running = asyncio.create_task(spin(pool, 0.9))
    await asyncio.sleep(0.3)
    assert first.process.pid is not None
    os.kill(first.process.pid, signal.SIGKILL)  # the kernel's OOM killer, say
    with pytest.raises(AlgorithmFailed, match="worker process died"):
        await running
    assert await asyncio.wait_for(spin(pool, 0.01), 30) >= 0.01


async def test_errors_inside_a_worker_keep_their_kind(pool: WorkerPool) -> None:
    with pytest.raises(InvalidArgument) as invalid:
        await pool.run("test-spin", 1, {"seconds": "long"}, "job-1")
    assert invalid.value.field == "arguments.seconds"
    with pytest.raises(AlgorithmFailed, match="ZeroDivisionError: this algorithm always fails"):
        await pool.run("test-explode", 1, {}, "job-1")
    assert await spin(pool, 0.01) >= 0.01  # the same worker serves on


async def test_a_registry_that_cannot_load_fails_start() -> None:
    broken = WorkerPool(1, 1.0, "stride.testing.algorithms:no_such_function", 30.0)
    with pytest.raises(RuntimeError, match="did not load"):
        await broken.start()
    await broken.close()


async def test_slots_past_the_first_start_when_requests_first_overlap() -> None:
    grown = WorkerPool(2, 30.0, REGISTRY)
    await grown.start()
    try:
        assert len(grown._all) == 1  # one worker's memory until two runs overlap
        assert await spin(grown, 0.01) >= 0.01
        assert len(grown._all) == 1  # one at a time needs no second
        both = await asyncio.gather(spin(grown, 0.3), spin(grown, 0.3))
        assert all(spun >= 0.3 for spun in both)
        assert len(grown._all) == 2
        await asyncio.gather(*(spin(grown, 0.05) for _ in range(6)))
        assert len(grown._all) == 2  # never past the slots
    finally:
        await grown.close()


SERVICE = f"""
import asyncio
from stride.executor.adapters.outbound.workers import WorkerPool

async def main():
    pool = WorkerPool(1, 600.0, {REGISTRY!r})
    await pool.start()
    (worker,) = pool._all
    print(worker.process.pid, flush=True)
    await pool.run("test-spin", 1, {{"seconds": 600.0}}, "job-1")

asyncio.run(main())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
async def test_a_worker_does_not_outlive_its_service() -> None:
    """A replica killed with SIGKILL mid-search takes its worker with it: the search would
    otherwise run on for nobody, holding a core beside the replica that replaced it."""
    with subprocess.Popen(
        [sys.executable, "-c", SERVICE], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as service:
        try:
            assert service.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(service.stdout.readline), 60)
            worker = int(line)
            await asyncio.sleep(1.0)  # the search is under way
            assert pid_alive(worker)
            service.kill()
            service.wait()
            for _ in range(100):
                if not pid_alive(worker):
                    break
                await asyncio.sleep(0.1)
            assert not pid_alive(worker), "the worker kept running after its service was killed"
        finally:
            service.kill()
