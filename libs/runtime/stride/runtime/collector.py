"""Full garbage collections off the request path.

CPython collects its oldest generation (every tracked object) on its own schedule, in the
middle of whatever the event loop is doing. In a service that holds a thousand jobs' books
that pause is about 100 ms, every few hundred requests: measured in
``bench/admission_grpc.py`` (12 such pauses in 1,200 submissions, each 100 ms), it *was*
the admission service's p99. So a service host:

- freezes what start-up allocated (``gc.freeze``: modules, descriptors, settings, the
  rebuilt state), which is never garbage, so no collection scans it again;
- takes the oldest generation's automatic collection off the interpreter (its threshold
  set out of reach; the young generations are collected as usual, at no noticeable cost);
- runs that collection itself (:class:`Collector`) when it is due by the interpreter's
  own count (ten young collections since the last full one; the interpreter would also
  wait for the old generation to grow by a quarter, which Python does not expose, so this
  collects at least as often) and the service has been quiet for a moment, or at the
  latest ``every_seconds`` after it fell due, under unbroken load.

Quiet means no request in flight (:func:`working`, which the gRPC server wraps every
unary and client-streaming call in) as well as a loop that answers on time. A responsive
loop alone is not enough: a request waiting on its database is not holding the loop, and
a collection that starts then lands in the middle of it. Measured in
``bench/admission_grpc.py`` before this rule: a 25 ms collection every 4 s, each inside a
submission's write, were the p99. A forced collection also waits for a moment with no
request in flight, for up to another ``every_seconds``.

Cyclic garbage is still reclaimed, only later and at a better time; acyclic garbage is
freed by reference counting as always. One collector per process: several hosts in one
process (tests, in-process benchmarks) share it, and the last one to stop puts the
interpreter's thresholds back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

DUE_AFTER = 10
"""Young collections between full ones: CPython's own default third threshold."""
OUT_OF_REACH = 1 << 30
"""The third threshold while a collector runs: the interpreter never reaches it."""
TICK_SECONDS = 0.05
QUIET_TICKS = 3
"""Ticks in a row on time (the loop answering within ``LATE_SECONDS``) before a due
collection runs early: ~150 ms in which no request held the loop."""
LATE_SECONDS = 0.01
EVERY_SECONDS = 30.0
"""A due collection runs at the latest this long after it fell due, quiet or not."""


@dataclass
class _Process:
    """What the process's collectors share."""

    hosts: int = 0
    """Collectors running."""
    saved: tuple[int, int, int] | None = None
    """The interpreter's thresholds before the first one started."""
    frozen: bool = False
    in_flight: int = 0
    """Requests being served (:func:`working`)."""


_process = _Process()


@contextlib.contextmanager
def working() -> Iterator[None]:
    """Mark a request as being served: no collection starts early while one is."""
    _process.in_flight += 1
    try:
        yield
    finally:
        _process.in_flight -= 1


def in_flight() -> int:
    """Requests being served now (:func:`working`)."""
    return _process.in_flight


class Collector:
    """Runs the oldest generation's collection when due and quiet (see the module)."""

    def __init__(
        self,
        every_seconds: float = EVERY_SECONDS,
        tick_seconds: float = TICK_SECONDS,
        quiet_ticks: int = QUIET_TICKS,
        late_seconds: float = LATE_SECONDS,
    ) -> None:
        self.every_seconds = every_seconds
        self.tick_seconds = tick_seconds
        self.quiet_ticks = quiet_ticks
        self.late_seconds = late_seconds
        self.collections = 0
        """Full collections this collector ran (quiet or forced)."""
        self.forced = 0
        """Of which under load, ``every_seconds`` after they fell due."""

    @staticmethod
    def due() -> bool:
        """Whether a full collection is due (see the module)."""
        return gc.get_count()[2] >= DUE_AFTER

    async def run(self, stop: asyncio.Event) -> None:
        """Collect when due until ``stop`` is set (a host's root task)."""
        install()
        try:
            quiet = 0
            due_since: float | None = None
            while not stop.is_set():
                asked = time.monotonic()
                try:
                    await asyncio.wait_for(stop.wait(), self.tick_seconds)
                    break
                except TimeoutError:
                    pass
                now = time.monotonic()
                late = now - asked - self.tick_seconds
                idle = _process.in_flight == 0
                quiet = quiet + 1 if late <= self.late_seconds and idle else 0
                if not self.due():
                    due_since = None
                    continue
                due_since = now if due_since is None else due_since
                overdue = now - due_since
                forced = overdue >= self.every_seconds and (
                    idle or overdue >= 2 * self.every_seconds
                )
                if quiet >= self.quiet_ticks or forced:
                    self.collect(forced)
                    quiet, due_since = 0, None
        finally:
            uninstall()

    def collect(self, forced: bool) -> None:
        started = time.perf_counter()
        found = gc.collect()
        self.collections += 1
        self.forced += forced
        log.debug(
            "full garbage collection",
            unreachable=found,
            forced=forced,
            pause_ms=round(1000 * (time.perf_counter() - started), 1),
        )


def install() -> None:
    """Take full collections off the interpreter (first host in the process), and freeze
    what start-up allocated (once per process)."""
    if _process.hosts == 0:
        saved = gc.get_threshold()
        _process.saved = saved
        gc.set_threshold(saved[0], saved[1], OUT_OF_REACH)
    _process.hosts += 1
    if not _process.frozen:
        gc.collect()  # what start-up left as cyclic garbage is not frozen for good
        gc.freeze()
        _process.frozen = True


def uninstall() -> None:
    """The interpreter's thresholds back once the last host stopped."""
    _process.hosts = max(0, _process.hosts - 1)
    if _process.hosts == 0 and _process.saved is not None:
        gc.set_threshold(*_process.saved)
        _process.saved = None
