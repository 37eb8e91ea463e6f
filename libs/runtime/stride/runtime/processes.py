"""Facts about local processes read from the OS: when one started, what its log ended with.

Shared by everything that starts and watches processes on one machine: the suite's
supervisor, the embedded servers, the local pods and the test run's own PostgreSQL.
"""

from __future__ import annotations

import os
from pathlib import Path

LOG_TAIL_LINES = 3
"""Log lines kept from a process that exited: the error a service prints last, with room
for the end of a traceback."""


def start_time(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (None if it is gone): with its pid,
    it names a process for good, where a pid alone may be reused."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def file_size(path: Path) -> int:
    """The size of a file, 0 if there is none."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def log_tail(
    path: Path, since: int = 0, lines: int = LOG_TAIL_LINES, max_line: int = 300
) -> list[str]:
    """The last ``lines`` non-empty lines a log got after byte ``since``, each cut short.

    ``since`` is the log's size when the process started, so the lines are what this run
    printed, not an earlier run's; if this run printed nothing, the lines before it.
    """
    try:
        with path.open("rb") as log:
            end = log.seek(0, os.SEEK_END)
            # Only the end matters, and a service's log may have grown large.
            log.seek(max(0, end - 16_384) if since >= end else max(since, end - 16_384))
            text = log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return [line if len(line) <= max_line else line[: max_line - 3] + "..." for line in kept]
