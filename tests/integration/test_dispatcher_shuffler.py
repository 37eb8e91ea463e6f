"""The dispatcher's shuffle worker (a spawned process) ends with its dispatcher, even a
SIGKILLed one: `make chaos` had left one idle orphan per killed dispatcher, for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from stride.testing.eventually import assert_eventually

STARTER = """
import time
from stride.dispatcher.app import Shuffler
shuffler = Shuffler()
shuffler.submit(int).result()  # the worker runs
print(*shuffler._processes, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not alive
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_the_shuffle_worker_ends_with_a_sigkilled_dispatcher() -> None:
    dispatcher = subprocess.Popen(
        [sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert dispatcher.stdout is not None
        worker = int(dispatcher.stdout.readline().split()[0])
        assert _alive(worker)
        dispatcher.send_signal(signal.SIGKILL)
        dispatcher.wait(timeout=10)
        await assert_eventually(lambda: not _alive(worker), timeout=10, interval=0.2)
    finally:
        if dispatcher.poll() is None:
            dispatcher.kill()
            dispatcher.wait(timeout=10)
        if dispatcher.stdout is not None:
            dispatcher.stdout.close()
