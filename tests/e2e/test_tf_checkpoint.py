"""TensorFlow through the checkpoint cache, as a user runs it (the acceptance run): a
Wide & Deep training script (``stride.ckptclient.examples.wide_deep``) that saves its model
and optimizer every N steps is SIGKILLed; a new process restores from shared memory, its
variables are bit for bit those saved, it continues, and its loss curve has no jump.

TensorFlow runs only in the trainer processes, so collecting the suite stays fast.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stride.runtime.healthcheck import check
from stride.testing.eventually import assert_eventually
from stride.testing.processes import ServiceProcess

pytestmark = pytest.mark.e2e

SERVICE = "stride.api.ckptcache.v1.CheckpointCacheService"


@pytest.fixture
def cache(nats_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    shm_dir = Path("/dev/shm") / f"stride-test-{uuid.uuid4().hex[:12]}"
    process = ServiceProcess(
        "ckptcache",
        {
            "STRIDE_NATS_URL": nats_url,
            "STRIDE_CKPTCACHE_STORE_DIR": str(tmp_path / "store"),
            "STRIDE_CKPTCACHE_SHM_DIR": str(shm_dir),
        },
        tmp_path,
    )
    process.start()
    try:
        yield process
    finally:
        code = process.terminate()
        shutil.rmtree(shm_dir, ignore_errors=True)
        assert code == 0, process.log_text()[-3000:]


def serving(address: str) -> bool:
    return check(address, SERVICE, timeout=1)[0]


def events(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def trainer(cache: ServiceProcess, log: Path, steps: int) -> subprocess.Popen[bytes]:
    with (log.parent / "trainer.err").open("ab") as errors:
        return start_trainer(cache, log, steps, errors)


def start_trainer(
    cache: ServiceProcess, log: Path, steps: int, errors: Any
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stride.ckptclient.examples.wide_deep",
            "--job",
            "job-tfkill",
            "--address",
            cache.address,
            "--steps",
            str(steps),
            "--save-every",
            "20",
            "--log",
            str(log),
        ],
        stdout=subprocess.DEVNULL,
        stderr=errors,
    )


async def test_a_killed_training_process_resumes_from_memory_without_a_loss_jump(
    cache: ServiceProcess, tmp_path: Path
) -> None:
    await assert_eventually(lambda: serving(cache.address), timeout=30, interval=0.1)
    log = tmp_path / "train.jsonl"
    first = trainer(cache, log, steps=100_000)
    try:
        # Let it pass a few saves, then kill it between saves.
        await assert_eventually(
            lambda: sum(1 for e in events(log) if e["event"] == "saved") >= 3,
            timeout=90,
            interval=0.1,
        )
        first.kill()
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    before = events(log)
    saved = [e for e in before if e["event"] == "saved"]
    assert all(e["transport"] == "shared-memory" for e in saved)
    killed_at = max(e["step"] for e in before if e["event"] == "step")

    second = trainer(cache, log, steps=killed_at + 30)
    assert await asyncio.to_thread(second.wait, 90) == 0, (tmp_path / "trainer.err").read_text()[
        -3000:
    ]
    after = [e for e in events(log) if e["pid"] == second.pid]
    restored = after[0]
    assert restored["event"] == "restored", after[:3]
    # The newest save: the last one logged, or one the kill cut off before its log line.
    last_saved = restored["step"]
    assert last_saved in {saved[-1]["step"], saved[-1]["step"] + 20}
    assert last_saved <= killed_at and restored["transport"] == "shared-memory"
    assert restored["snapshot"] == f"data-step-{last_saved}"
    # Every variable of the model and the optimizer is restored bit for bit.
    saving = {e["step"]: e["digest"] for e in before if e["event"] == "saving"}
    assert restored["digest"] == saving[last_saved]

    old = {e["step"]: e["loss"] for e in before if e["event"] == "step"}
    new = {e["step"]: e["loss"] for e in after if e["event"] == "step"}
    assert min(new) == last_saved + 1
    # The steps replayed after the restore see the same weights and the same data: the
    # curve continues where the checkpoint left it (to float noise), with no jump.
    replayed = [step for step in new if step in old]
    assert replayed == list(range(last_saved + 1, killed_at + 1))
    for step in replayed:
        assert abs(new[step] - old[step]) <= 1e-4 * max(1.0, abs(old[step])), step
    # And against training's own step-to-step noise, the first loss after the restore is
    # an ordinary next value, not a restart from scratch.
    recent = [old[s] for s in range(last_saved - 19, last_saved + 1)]
    assert abs(new[last_saved + 1] - np.mean(recent)) <= 4 * np.std(recent) + 1e-6
    fresh_start = next(e["loss"] for e in before if e["event"] == "step" and e["step"] == 1)
    assert new[last_saved + 1] < fresh_start - 4 * np.std(recent)
