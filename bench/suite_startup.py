"""Benchmark: what the embedded PostgreSQL costs `stride up`, side by side with SQLite.

Run: ``.venv/bin/python bench/suite_startup.py [--rounds 3] [--settle 10]`` (writes
``bench/results/suite_startup.txt``).

The reference is the lightest setup, ``stride up --database sqlite`` (the default before
the embedded PostgreSQL). Each round starts both in turn, in fresh state folders: a first
``stride up`` (the embedded PostgreSQL makes its data folder then), ``stride down``, and a
second ``stride up`` on the same state (data kept). Measured for each:

- start-up: the wall time of ``stride up``, from the command to the suite ready;
- memory: the resident memory of every process of the suite (the supervisor and what it
  started: services, nats-server, PostgreSQL and its sessions) once ready and again after
  ``--settle`` seconds, as RSS (shared pages counted in each process) and as PSS (shared
  pages split between the processes sharing them: what the suite adds to the machine).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from suite import record, stride

from stride.cli.endpoints import SuiteState

RESULT = Path(__file__).parent / "results" / "suite_startup.txt"
KINDS = ("sqlite", "postgres")


def descendants(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def memory(pids: list[int]) -> tuple[float, float]:
    """(RSS, PSS) of ``pids`` together, in MiB."""
    rss = pss = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        fields = {line.split(":")[0]: line.split()[1] for line in rollup[1:] if ":" in line}
        rss += int(fields.get("Rss", 0))
        pss += int(fields.get("Pss", 0))
    return rss / 1024, pss / 1024


def one_up(kind: str, env: dict[str, str], settle: float) -> dict[str, float]:
    args = ("--database", "sqlite") if kind == "sqlite" else ()
    started = time.monotonic()
    up = stride("up", *args, env=env)
    took = time.monotonic() - started
    if up.returncode != 0:
        raise SystemExit(f"stride up ({kind}) failed:\n{up.stdout}{up.stderr}")
    state = SuiteState.read(Path(env["STRIDE_STATE_DIR"]))
    assert state is not None
    rss, pss = memory(descendants(state.supervisor_pid))
    time.sleep(settle)
    rss_settled, pss_settled = memory(descendants(state.supervisor_pid))
    down = stride("down", env=env)
    if down.returncode != 0:
        raise SystemExit(f"stride down ({kind}) failed:\n{down.stdout}{down.stderr}")
    return {
        "up_s": took,
        "rss_mib": rss,
        "pss_mib": pss,
        "rss_settled_mib": rss_settled,
        "pss_settled_mib": pss_settled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_number in range(args.rounds):
        for kind in KINDS:
            work = Path(tempfile.mkdtemp(prefix="stride-startup-"))
            env = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
            env.update({"STRIDE_STATE_DIR": str(work / "state"), "STRIDE_LOG_LEVEL": "WARNING"})
            try:
                for start in ("first up", "up again"):
                    measured = one_up(kind, env, args.settle)
                    results.setdefault((kind, start), []).append(measured)
                    print(f"round {round_number + 1} {kind:8} {start:8} {measured}", flush=True)
            finally:
                stride("down", env=env)
                shutil.rmtree(work, ignore_errors=True)

    def median(kind: str, start: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(kind, start)])

    lines = [
        "# bench/suite_startup.py",
        f"command: .venv/bin/python bench/suite_startup.py --rounds {args.rounds} "
        f"--settle {args.settle:g}",
        f"date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"machine: {os.cpu_count()} cores; medians of {args.rounds} rounds; memory of the "
        "supervisor and every process under it",
        "",
        f"{'database':10} {'start':9} {'up (s)':>7} {'RSS ready':>10} {'PSS ready':>10} "
        f"{'RSS +settle':>12} {'PSS +settle':>12}  (MiB)",
    ]
    for start in ("first up", "up again"):
        for kind in KINDS:
            lines.append(
                f"{kind:10} {start:9} {median(kind, start, 'up_s'):7.1f} "
                f"{median(kind, start, 'rss_mib'):10.0f} {median(kind, start, 'pss_mib'):10.0f} "
                f"{median(kind, start, 'rss_settled_mib'):12.0f} "
                f"{median(kind, start, 'pss_settled_mib'):12.0f}"
            )
        ratio_up = median("postgres", start, "up_s") / median("sqlite", start, "up_s")
        ratio_pss = median("postgres", start, "pss_settled_mib") / median(
            "sqlite", start, "pss_settled_mib"
        )
        added = median("postgres", start, "pss_settled_mib") - median(
            "sqlite", start, "pss_settled_mib"
        )
        lines.append(
            f"  {start}: embedded PostgreSQL / SQLite: start-up {ratio_up:.2f}x, "
            f"PSS settled {ratio_pss:.2f}x ({added:+.0f} MiB)"
        )
    record(RESULT, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
