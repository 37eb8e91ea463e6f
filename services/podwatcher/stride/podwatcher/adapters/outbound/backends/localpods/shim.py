"""The per-pod supervisor (like containerd's shim): ``python -m <this module> <pod_dir>``.

It runs outside the pod's cgroup, in its own session, and outlives the podwatcher, so a
podwatcher restart re-adopts the pod instead of losing it. It starts the pod's processes,
each joining the pod's cgroups before it runs anything (a ``preexec_fn`` writes its pid
into every ``cgroup.procs``) and in its own process group, with stdout and stderr in
``<process>.log``. When any process ends, or on SIGTERM, the pod ends: the others get
SIGTERM, then SIGKILL after a grace period, and ``exit.json`` is written atomically:

- ``OOMKilled`` when the cgroup's ``oom_kill`` counter rose while the pod ran (read from the
  kernel, never guessed from exit code 137), or in the rlimit fallback when the sampler
  killed the pod for resident memory over its limit;
- ``Deleted`` / ``Evicted`` when the podwatcher asked (the reason is in ``stop-reason``);
- ``Succeeded`` when the main process exited 0;
- ``Error`` otherwise, with the exit code (or signal) and the last log lines.

Standard library only (and ``py-landlock``, for a confined pod): it starts fast and small,
one per pod.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GRACE_SECONDS = 5.0
POLL_SECONDS = 0.1
TAIL_LINES = 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def read_oom_kills(path: str) -> int:
    """The ``oom_kill`` count of a memory.events / memory.oom_control file (0 if none)."""
    if not path:
        return 0
    try:
        text = Path(path).read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value.strip())
    return 0


def tail(pod_dir: Path, names: list[str], lines: int = TAIL_LINES) -> list[str]:
    """The last lines of the pod's logs, each ``<process>| <text>``."""
    found: list[str] = []
    for name in names:
        path = pod_dir / f"{name}.log"
        try:
            with path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(size - 16384, 0))
                text = log.read().decode("utf-8", "replace")
        except OSError:
            continue
        found.extend(f"{name}| {line}" for line in text.splitlines()[-lines:])
    return found[-lines:]


def tree_rss(pids: list[int]) -> int:
    """Resident memory of ``pids`` and their descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        rss[pid] = int(fields[21]) * PAGE
    total, stack, seen = 0, list(pids), set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def _joiner(procs_files: list[str], sandbox: dict[str, Any] | None) -> Any:
    """What a pod's process does between fork and exec: its own process group, the pod's
    cgroups, then (if the pod is confined) its Landlock domain (:mod:`.sandbox`; last, as
    it closes the cgroup files)."""
    confine = None
    if sandbox is not None:
        # Imported here, before the fork: the child must not import anything.
        from stride.podwatcher.adapters.outbound.backends.localpods.sandbox import apply

        confine = apply

    def join() -> None:
        os.setpgid(0, 0)
        pid = str(os.getpid())
        for path in procs_files:
            with open(path, "w") as procs:
                procs.write(pid)
        if confine is not None and sandbox is not None:
            confine(sandbox)

    return join


def _write_exit(pod_dir: Path, record: dict[str, Any]) -> None:
    temporary = pod_dir / "exit.json.tmp"
    temporary.write_text(json.dumps(record))
    os.replace(temporary, pod_dir / "exit.json")


def run(pod_dir: Path) -> int:
    """Supervise the pod described by ``<pod_dir>/launch.json`` until it ends."""
    launch = json.loads((pod_dir / "launch.json").read_text())
    terminate = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal terminate
        terminate = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    oom_file: str = launch["oom_file"]
    oom_before = read_oom_kills(oom_file)
    names = [process["name"] for process in launch["processes"]]
    children: dict[str, subprocess.Popen[bytes]] = {}
    for process in launch["processes"]:
        with (pod_dir / f"{process['name']}.log").open("ab") as log:
            children[process["name"]] = subprocess.Popen(
                process["argv"],
                env=process["env"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(pod_dir),
                # The shim is single-threaded, so a preexec_fn is safe here; it is how a
                # process joins the pod's cgroups before it runs anything.
                preexec_fn=_joiner(launch["procs_files"], launch.get("sandbox")),  # noqa: PLW1509
                close_fds=True,
            )
    (pod_dir / "pids.json").write_text(json.dumps({n: c.pid for n, c in children.items()}))
    sampler_limit = int(launch.get("sample_memory_limit") or 0)
    sampled_over = 0
    first: tuple[str, int] | None = None
    while first is None and not terminate:
        for name, child in children.items():
            code = child.poll()
            if code is not None:
                first = (name, code)
                break
        if first is None and sampler_limit:
            used = tree_rss([c.pid for c in children.values()])
            if used > sampler_limit:
                sampled_over = used
                break
        if first is None:
            time.sleep(POLL_SECONDS)
    # The pod ends: stop what still runs, politely first.
    for child in children.values():
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL if sampled_over else signal.SIGTERM)
    deadline = time.monotonic() + float(launch.get("grace_seconds", GRACE_SECONDS))
    while any(c.poll() is None for c in children.values()) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    for child in children.values():
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    codes = {name: child.returncode for name, child in children.items()}
    main = launch["main"]
    oom_kills = read_oom_kills(oom_file) - oom_before
    stop_reason_file = pod_dir / "stop-reason"
    stop_reason = stop_reason_file.read_text().strip() if stop_reason_file.exists() else ""
    lines = tail(pod_dir, names)
    who, code = first if first is not None else (main, codes[main])
    if stop_reason:
        reason, _, why = stop_reason.partition(" ")
        message = why
    elif oom_kills > 0:
        reason = "OOMKilled"
        message = (
            f"the kernel killed {oom_kills} process(es) of the pod for memory over its "
            f"limit of {int(launch['memory_bytes']) // 1024**2} MiB (cgroup oom_kill counter)"
        )
    elif sampled_over:
        reason = "OOMKilled"
        message = (
            f"killed by the sampler: resident memory {sampled_over // 1024**2} MiB over the "
            f"limit of {sampler_limit // 1024**2} MiB (no memory cgroup here)"
        )
    elif terminate:
        reason, message = "Deleted", "stopped by SIGTERM"
    elif who == main and code == 0:
        reason, message = "Succeeded", ""
    else:
        reason = "Error"
        ended = (
            f"exit code {code}" if code >= 0 else f"killed by signal {signal.Signals(-code).name}"
        )
        message = f"{who} ended: {ended}"
    if reason in ("Error", "OOMKilled") and lines:
        message = message + "\n" + "\n".join(lines)
    _write_exit(
        pod_dir,
        {
            "reason": reason,
            "exit_code": codes.get(who),
            "process": who,
            "message": message,
            "log_tail": lines,
            "finished_at": time.time(),
            "codes": codes,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1])))
