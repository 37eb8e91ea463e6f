"""What the benchmarks that run a real suite share: ``stride up``/``down`` in a private
state directory, and the percentile they report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def stride(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the ``stride`` CLI of this checkout."""
    return subprocess.run(
        [sys.executable, "-m", "stride.cli", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@contextlib.contextmanager
def running_suite(
    *up_args: str, settings: Mapping[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """A suite started with ``stride up`` (embedded NATS, SQLite) in a fresh state
    directory, with ``settings`` as extra environment; yields its endpoints, then stops it."""
    state = Path(tempfile.mkdtemp(prefix="stride-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    env.update({"STRIDE_STATE_DIR": str(state), "STRIDE_LOG_LEVEL": "WARNING", **(settings or {})})
    up = stride("up", *up_args, env=env)
    if up.returncode != 0:
        raise RuntimeError(f"stride up failed:\n{up.stdout}{up.stderr}")
    try:
        yield json.loads((state / "endpoints.json").read_text())
    finally:
        stride("down", env=env)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def record(path: Path, lines: list[str]) -> None:
    """Print a benchmark's report and keep it under ``bench/results/``."""
    text = "\n".join(lines) + "\n"
    print(text)
    path.write_text(text)
