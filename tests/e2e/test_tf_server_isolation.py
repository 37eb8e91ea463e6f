"""#37 finding 1 as it was found: a TensorFlow server in a local pod, asked by a client it
does not know, read ``<state>/tokens/admin.token``.

A PS pod (``tf.distribute.Server``, as the trainer starts one) runs in the local backend's
sandbox, its port guarded for its job. A TensorFlow client pins ``tf.io.read_file`` to the PS
task (``tf.compat.v1.Session("grpc://...")``):

- from the suite's side (outside every pod), the PS reads a file of its own pod, and is
  refused the admin's token: the read runs in the PS's Landlock domain;
- from another job's pod, the client does not even reach the PS: the connection is reset.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import cast

import pytest

from stride.podwatcher.adapters.outbound.backends.localpods import (
    Limits,
    LocalPods,
    PodExit,
    PodLaunch,
    ProcessSpec,
)
from stride.podwatcher.adapters.outbound.backends.localpods.firewall import TfFirewall
from stride.podwatcher.adapters.outbound.backends.localpods.sandbox import (
    PodSandboxes,
    code_paths,
)
from stride.testing.eventually import assert_eventually

pytestmark = pytest.mark.e2e

MIB = 1024**2
SERVER = """
import sys, tensorflow as tf
cluster = tf.train.ClusterSpec({"ps": [sys.argv[1]]})
server = tf.distribute.Server(cluster, job_name="ps", task_index=0, protocol="grpc")
print("serving", flush=True)
server.join()
"""
CLIENT = """
import json, sys, tensorflow as tf
tf.compat.v1.disable_eager_execution()
results = {}
for path in sys.argv[2:]:
    graph = tf.Graph()
    with graph.as_default(), tf.device("/job:ps/replica:0/task:0"):
        read = tf.io.read_file(path)
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=15000)
    try:
        with tf.compat.v1.Session("grpc://" + sys.argv[1], graph=graph, config=config) as s:
            results[path] = "read " + s.run(read).decode()
    except Exception as error:
        results[path] = type(error).__name__ + ": " + str(error).splitlines()[0][:200]
print("results " + json.dumps(results), flush=True)
"""
SLEEPER = "import time\nwhile True: time.sleep(1)"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _pod(
    runtime: LocalPods,
    sandboxes: PodSandboxes,
    firewall: TfFirewall,
    job: str,
    name: str,
    argv: tuple[str, ...],
    tmp_path: Path,
) -> PodLaunch:
    env = {"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    processes = (
        ProcessSpec("trainer", argv, env),
        ProcessSpec("agent", (sys.executable, "-c", SLEEPER), env),
    )
    pod_dir = runtime.pod_dir(name)
    confined, policy = sandboxes.confine(processes, pod_dir, tmp_path / "jobs" / job, None)
    (tmp_path / "jobs" / job).mkdir(parents=True, exist_ok=True)
    return PodLaunch(
        pod=name,
        job_id=job,
        role="ps",
        index=0,
        node="node-0",
        plan_version=1,
        limits=Limits(1.0, 1024 * MIB),
        processes=confined,
        main="trainer",
        sandbox=policy,
        groups=(firewall.procs_file(job),),
    )


def _results(log: Path) -> dict[str, str]:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("results "):
            found: dict[str, str] = json.loads(line.removeprefix("results "))
            return found
    raise AssertionError(f"no results in {log} yet")


async def test_a_tensorflow_server_in_a_pod_reads_only_its_own_pods_files(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "state" / "tokens" / "admin.token"
    secret.parent.mkdir(parents=True, mode=0o700)
    secret.write_text("the admin's token")
    runtime = LocalPods(tmp_path / "pods", grace_seconds=2)
    firewall = TfFirewall(tmp_path / "pods")
    sandboxes = PodSandboxes(code_paths(sys.executable), ())
    address = f"127.0.0.1:{_free_port()}"
    ps = "job-a-ps-0"
    try:
        firewall.guard(ps, "job-a", int(address.rsplit(":", 1)[1]))
        await runtime.start(
            _pod(
                runtime,
                sandboxes,
                firewall,
                "job-a",
                ps,
                (sys.executable, "-c", SERVER, address),
                tmp_path,
            )
        )
        own = runtime.pod_dir(ps) / "own.txt"
        own.write_text("the pod's own file")

        def serving() -> bool:
            return "serving" in (runtime.pod_dir(ps) / "trainer.log").read_text()

        await assert_eventually(serving, timeout=120, interval=0.5)

        # The suite's side: reaches the PS, which reads as its pod would.
        asked = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", CLIENT, address, str(own), str(secret)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        line = next(x for x in asked.stdout.splitlines() if x.startswith("results "))
        found = json.loads(line.removeprefix("results "))
        assert found[str(own)] == "read the pod's own file", found
        assert found[str(secret)].startswith("PermissionDeniedError"), found

        # Another job's pod: the connection to job A's PS is reset.
        other = "job-b-worker-0"
        await runtime.start(
            _pod(
                runtime,
                sandboxes,
                firewall,
                "job-b",
                other,
                (sys.executable, "-c", CLIENT, address, str(own)),
                tmp_path,
            )
        )
        log = runtime.pod_dir(other) / "trainer.log"
        found = await assert_eventually(lambda: _results(log), timeout=180, interval=1.0)
        assert not found[str(own)].startswith("read"), found
        assert "Unavailable" in found[str(own)] or "DeadlineExceeded" in found[str(own)], found
    finally:
        for status in runtime.pods():
            await runtime.delete(status.launch.pod, grace_seconds=1)
        # Every end read and acknowledged, so each pod's supervisor process is reaped.
        ends = cast(AsyncGenerator[PodExit, None], runtime.exits())  # an async generator
        while runtime.known():
            end = await asyncio.wait_for(anext(ends), timeout=30)
            await runtime.acknowledge(end.pod)
        await ends.aclose()
        await runtime.close()
        for pod in (ps, "job-b-worker-0"):
            firewall.release(pod)
        firewall.remove()
