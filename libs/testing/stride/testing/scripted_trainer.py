"""A trainer that follows a script instead of training: pod lifecycle tests run it in real
pods (``STRIDE_PODWATCHER_TRAINER_MODULE=stride.testing.scripted_trainer``) so they test
the podwatcher, the cgroups and the events in seconds, without TensorFlow.

The script is in the job spec's hyperparameters (``script_<role>``, else ``script``):

- ``run``: wait for SIGTERM, then exit 0 (a PS or worker server);
- ``exit:N``: exit with code N at once;
- ``exit-after:S:N``: run for S seconds, then exit with code N;
- ``oom``: allocate memory until the kernel (or the sampler) kills the pod;
- ``finish-on-file``: run until ``<consumed log's directory>/finish`` exists, then exit 0
  (a chief whose job ends when the test says so).

Every run appends a line to ``<consumed log's directory>/starts.log`` when it has a
consumed log (chiefs): ``<pod> standby=<true|false> <cluster JSON>``, and prints one line
per second so log tests see output.

What a job's own code could try (the pod sandbox's tests): with ``probe_read``,
``probe_write`` (paths, comma-separated), ``probe_signal`` (pids) or ``probe_connect``
(``host:port``s) in the hyperparameters, it first tries each and prints one line
``probe {"read <path>": "ok" | "<error>", ...}``; ``$JOB_TOKEN`` in a path is its own job
token file, ``$POD_DIR`` its working directory.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType


def _script() -> str:
    spec = json.loads(os.environ.get("STRIDE_TRAINER_SPEC_JSON", "{}") or "{}")
    hyperparameters = spec.get("hyperparameters", {})
    role = os.environ.get("STRIDE_TRAINER_ROLE", "worker")
    return str(hyperparameters.get(f"script_{role}", hyperparameters.get("script", "run")))


def _listen() -> socket.socket | None:
    """Listen on this pod's address in its cluster, as a TensorFlow server would, so the
    podwatcher sees the pod ready."""
    try:
        cluster = json.loads(os.environ.get("STRIDE_TRAINER_CLUSTER_JSON", "{}") or "{}")
        role = os.environ.get("STRIDE_TRAINER_ROLE", "worker")
        address = cluster[role][int(os.environ.get("STRIDE_TRAINER_INDEX", "0"))]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    host, _, port = address.rpartition(":")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    return server


def _expand(path: str) -> str:
    return path.replace("$JOB_TOKEN", os.environ.get("STRIDE_JOB_TOKEN_FILE", "")).replace(
        "$POD_DIR", os.getcwd()
    )


def _attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror}"
    return "ok"


def _connect(host: str, port: int) -> None:
    socket.create_connection((host, port), timeout=2).close()


def _probe(hyperparameters: dict[str, str]) -> dict[str, str]:
    """Try what ``probe_*`` asks (see the module); what each attempt met."""
    results: dict[str, str] = {}

    def items(key: str) -> list[str]:
        return [item for item in hyperparameters.get(key, "").split(",") if item]

    for path in map(_expand, items("probe_read")):
        results[f"read {path}"] = _attempt(functools.partial(Path(path).read_bytes))
    for path in map(_expand, items("probe_write")):
        results[f"write {path}"] = _attempt(functools.partial(Path(path).write_text, "x"))
    for pid in items("probe_signal"):
        results[f"signal {pid}"] = _attempt(functools.partial(os.kill, int(pid), 0))
    for address in items("probe_connect"):
        host, _, port = address.rpartition(":")
        results[f"connect {address}"] = _attempt(functools.partial(_connect, host, int(port)))
    return results


def main() -> int:
    """Follow the script; returns the exit code."""
    stop = False

    def on_term(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    script = _script()
    spec = json.loads(os.environ.get("STRIDE_TRAINER_SPEC_JSON", "{}") or "{}")
    probes = _probe(spec.get("hyperparameters", {}))
    if probes:
        print(f"probe {json.dumps(probes)}", flush=True)
    listening = _listen()
    pod = os.environ.get("STRIDE_TRAINER_POD_NAME", "?")
    consumed = os.environ.get("STRIDE_TRAINER_CONSUMED_LOG", "")
    job_dir = Path(consumed).parent if consumed else None
    if job_dir is not None:
        with (job_dir / "starts.log").open("a") as starts:
            standby = os.environ.get("STRIDE_TRAINER_STANDBY", "false")
            cluster = os.environ.get("STRIDE_TRAINER_CLUSTER_JSON", "")
            starts.write(f"{pod} standby={standby} {cluster}\n")
    print(f"scripted trainer {pod}: {script} (listening: {listening is not None})", flush=True)
    if script.startswith("exit:"):
        print("failing on purpose", file=sys.stderr, flush=True)
        return int(script.split(":", 1)[1])
    if script == "oom":
        hoard = []
        while True:
            hoard.append(bytearray(16 * 1024 * 1024))
            for page in range(0, len(hoard[-1]), 4096):
                hoard[-1][page] = 1
    deadline = None
    code = 0
    if script.startswith("exit-after:"):
        _, seconds, exit_code = script.split(":")
        deadline = time.monotonic() + float(seconds)
        code = int(exit_code)
    started = time.monotonic()
    while not stop:
        if deadline is not None and time.monotonic() >= deadline:
            return code
        if script == "finish-on-file" and job_dir is not None and (job_dir / "finish").exists():
            print("finished", flush=True)
            return 0
        print(f"step {int(time.monotonic() - started)}", flush=True)
        time.sleep(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
