"""Benchmark: flash checkpoints through the checkpoint cache, side by side with the limits.

Run: ``.venv/bin/python bench/ckptcache.py`` (writes ``bench/results/ckptcache.txt``);
``--sizes-mib 256,1024`` runs only those sizes.

A real cache process (``python -m stride.ckptcache``, embedded nats-server) with its shared
memory in /dev/shm and its durable store on the local disk. Each size is measured in child
processes of this one, one per phase, so every copy of the state is freed when its phase
ends and 4 GiB fits this 23 GiB machine: the cache phase holds the state, touched
memcpy targets of at most 1 GiB and the cache's two segments (about 3.3x the state at
4 GiB); the TensorFlow phases hold the state as tf.Variables plus TF's own buffers for
its checkpoint writes, or plus the copy-on-write copies while a snapshot is held and the
one segment the cache keeps (about 3x); between phases the bench empties the cache's free
pool. For each state size (16 float32 tensors) it measures, in one run:

- the blocking part of a save through the cache (copy into shared memory + RegisterSegment):
  the first save (a fresh segment: tmpfs pages faulted in) and the steady state (a segment
  from the free pool, as in training, where each save finds the previous ones persisted);
- a plain numpy memcpy of the same bytes into an already-touched buffer (the hardware limit),
  and the same copy split over two threads (whether both cores beat one here);
- ``tf.train.Checkpoint.write`` of the same state as tf.Variables to local disk, and
  ``np.save`` of every tensor to local disk (neither fsyncs, as users call them); TF's own
  async checkpoint (its blocking part, and until ``sync()``); the bound that any save which
  copies the state once has against TF (``tf.train.Checkpoint.write`` / memcpy);
- the TensorFlow integration: ``tensorflow.save`` (a zero-copy snapshot of the variables,
  then one copy into shared memory) and ``tensorflow.save_in_background`` (the snapshot
  only; the copy runs on a thread) together with what the next training step pays for it
  (a step updating every variable while the snapshot is held: TF's copy-on-write);
- restore through the cache (the cache verifies the segment's checksum over its mapping; the
  client maps the segment read-only: no copy), alone and with a first touch of every page
  (where the lazy mapping's page faults are paid);
- persistence throughput (the cache's own timing of copy, fsync, manifest and rename, from
  its log; and end to end, from the end of the save until the checkpoint is listed as
  durable, which adds the background checksum and the polling) against the raw disk write
  bandwidth of the same directory (8 MiB writes, then fsync), in interleaved pairs whose
  order alternates.

Goals (issue #6): steady-state blocking save <= 1.5x memcpy; >= 10x faster than
tf.train.Checkpoint.write; persistence >= 80% of raw disk bandwidth.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from stride.ckptclient import CheckpointClient
from stride.runtime.embedded_nats import NatsServer
from stride.runtime.healthcheck import check
from stride.testing.channels import ensure_certificates
from stride.testing.processes import ServiceProcess

MIB = 1024 * 1024
GIB = 1024 * MIB
SIZES = [256 * MIB, 1024 * MIB, 4096 * MIB]
TENSORS = 16
REPEATS = 3
ROUNDS = 5
JOB = "job-bench"
RESULT = Path(__file__).parent / "results" / "ckptcache.txt"
SERVICE = "stride.api.ckptcache.v1.CheckpointCacheService"


def available_memory() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def tensor(size: int, seed: int, index: int) -> np.ndarray:
    rng = np.random.default_rng([seed, index])
    return rng.random(size // TENSORS // 4, dtype=np.float32)


def state(size: int, seed: int) -> dict[str, np.ndarray]:
    return {f"layer_{i:02d}/kernel": tensor(size, seed, i) for i in range(TENSORS)}


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


def wait_serving(address: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if check(address, SERVICE, timeout=1)[0]:
            return
        time.sleep(0.1)
    raise RuntimeError("the cache did not start")


RAW_KEPT = 3
"""Raw reference files kept, like the cache's default ``RETAIN_LAST`` of 3 checkpoints: the
persister writes each checkpoint to new blocks while the retained ones stay, so the
reference does the same instead of rewriting blocks it just freed (on this VM's disk the
two differ by up to 3x)."""
_raw_files: list[Path] = []


def raw_disk_write(directory: Path, size: int) -> float:
    """Seconds to write ``size`` bytes to a new file in 8 MiB writes and fsync (like dd
    conv=fsync); the newest :data:`RAW_KEPT` files are kept, as retained checkpoints are."""
    block = np.random.default_rng(0).bytes(8 * MIB)
    path = directory / f"raw-{uuid.uuid4().hex}"
    started = time.perf_counter()
    with path.open("wb", buffering=0) as handle:
        written = 0
        while written < size:
            written += handle.write(block[: min(len(block), size - written)])
        os.fsync(handle.fileno())
    seconds = time.perf_counter() - started
    _raw_files.append(path)
    while len(_raw_files) > RAW_KEPT:
        _raw_files.pop(0).unlink()
    return seconds


def persist_seconds_logged(log_path: Path, checkpoint_id: str) -> float:
    """The cache's own timing of one persist (copy, fsync, manifest, rename), from its log
    (written just after the checkpoint becomes visible as durable)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for line in reversed(log_path.read_text().splitlines()):
            if '"checkpoint persisted"' in line:
                record = json.loads(line)
                if record.get("checkpoint_id") == checkpoint_id:
                    return float(record["seconds"])
        time.sleep(0.01)
    raise RuntimeError(f"no persist of {checkpoint_id} in the cache's log")


# ---- phases (each in its own process) -----------------------------------------------------


def phase_cache(args: dict[str, Any]) -> dict[str, Any]:
    """Saves, restores and persistence through the cache, and the memcpy references."""
    size, scratch = int(args["size"]), Path(args["scratch"])
    client = CheckpointClient(args["address"], JOB)
    tensors = state(size, seed=size // MIB)
    # Touched targets for min(state, 1 GiB): tensor i goes to target i mod their count, so
    # the reference moves the same bytes as a whole-state memcpy into memory far past any
    # CPU cache, without holding a second copy of a 4 GiB state.
    first_tensor = next(iter(tensors.values()))
    count = max(1, min(TENSORS, GIB // max(1, first_tensor.nbytes)))
    targets = [np.ones_like(first_tensor) for _ in range(count)]
    workers = ThreadPoolExecutor(2)

    def memcpy_all() -> None:
        for index, value in enumerate(tensors.values()):
            np.copyto(targets[index % count], value)

    def memcpy_two_threads() -> None:
        half = first_tensor.size // 2
        for index, value in enumerate(tensors.values()):
            target = targets[index % count]
            other = workers.submit(np.copyto, target[:half], value[:half])
            np.copyto(target[half:], value[half:])
            other.result()

    memcpy_all()
    memcpy_two_threads()
    step = size // MIB * 100
    first = client.save(step, tensors).blocking_seconds
    client.wait_until_durable(f"step-{step}", 600)
    client.save(step + 1, tensors)  # a second fresh segment; from now on they are reused
    client.wait_until_durable(f"step-{step + 1}", 600)
    # The machine is shared (2 cores, other work running), so every round measures the
    # reference right next to the thing compared with it, and the medians are reported.
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "memcpy",
            "memcpy2",
            "save",
            "durable",
            "persist",
            "raw",
            "restore",
            "restore_touched",
        )
    }
    log_path = Path(args["log_path"])
    for offset in range(2, ROUNDS + 2):
        # The disk write that follows a deletion pays for its discard (the root ext4 is
        # mounted with `discard`), and the cache deletes an expired checkpoint after each
        # persist: alternating which of the pair goes first keeps such effects from
        # always landing on the same side.
        raw_first = offset % 2 == 1
        if raw_first:
            rows["raw"].append(raw_disk_write(scratch, size))
        rows["memcpy"].append(timed(memcpy_all))
        rows["memcpy2"].append(timed(memcpy_two_threads))
        saved = client.save(step + offset, tensors)
        rows["save"].append(saved.blocking_seconds)
        ended = time.perf_counter()
        client.wait_until_durable(saved.checkpoint_id, 600)
        rows["durable"].append(time.perf_counter() - ended)
        rows["persist"].append(persist_seconds_logged(log_path, saved.checkpoint_id))
        if not raw_first:
            rows["raw"].append(raw_disk_write(scratch, size))
        rows["restore"].append(timed(client.restore))
        rows["restore_touched"].append(timed(lambda: touch_every_page(client.restore())))
    restored = client.restore()
    assert all(np.array_equal(restored.tensors[k], v) for k, v in tensors.items())
    del restored
    for old in client.list():
        client.delete(old.checkpoint_id)
    client.close()
    np_save = np_save_seconds(tensors, scratch)
    for path in _raw_files:
        path.unlink(missing_ok=True)
    return {"first": first, "np_save": np_save, **rows}


def touch_every_page(restored: Any) -> None:
    """Read one byte of every 4 KiB page of the restored tensors: a restore maps the
    segment lazily, so this is where the rest of its cost (page faults) is paid, as a
    copying restore would have paid it before returning."""
    for value in restored.tensors.values():
        int(value.reshape(-1).view(np.uint8)[::4096].sum())


def np_save_seconds(tensors: dict[str, np.ndarray], directory: Path) -> float:
    seconds = []
    for repeat in range(REPEATS):
        target = directory / f"np-{repeat}"
        target.mkdir()

        def save_all() -> None:
            for index, value in enumerate(tensors.values()):
                np.save(target / f"{index}.npy", value)  # noqa: B023

        seconds.append(timed(save_all))
        shutil.rmtree(target, ignore_errors=True)
    return median(seconds)


def phase_tf(args: dict[str, Any]) -> dict[str, Any]:
    """tf.train.Checkpoint.write, synchronous and TF's own async checkpoint."""
    import tensorflow as tf

    size, scratch = int(args["size"]), Path(args["scratch"])
    checkpoint = tf.train.Checkpoint(**tf_variables(size))
    # The first write of a process builds TensorFlow's save functions (seconds); warm up so
    # only the write itself is timed.
    tf.train.Checkpoint(warm=tf.Variable(np.zeros(4, np.float32))).write(
        str(scratch / "tf-warmup" / "ckpt")
    )
    shutil.rmtree(scratch / "tf-warmup", ignore_errors=True)
    results: dict[str, list[float]] = {"tf_write": [], "tf_async": [], "tf_async_synced": []}
    async_options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
    for repeat in range(REPEATS):
        target = scratch / f"tf-{repeat}"
        results["tf_write"].append(timed(lambda: checkpoint.write(str(target / "ckpt"))))  # noqa: B023
        shutil.rmtree(target, ignore_errors=True)
    for repeat in range(REPEATS):
        target = scratch / f"tf-async-{repeat}"
        started = time.perf_counter()
        checkpoint.write(str(target / "ckpt"), options=async_options)
        results["tf_async"].append(time.perf_counter() - started)
        checkpoint.sync()
        results["tf_async_synced"].append(time.perf_counter() - started)
        shutil.rmtree(target, ignore_errors=True)
    return results


def tf_variables(size: int) -> dict[str, Any]:
    """The state as tf.Variables, made one tensor at a time (the numpy state is never held
    whole)."""
    import tensorflow as tf

    seed = size // MIB
    return {
        f"layer_{i:02d}": tf.Variable(tensor(size, seed, i), name=f"layer_{i:02d}")
        for i in range(TENSORS)
    }


def phase_tf_cache(args: dict[str, Any]) -> dict[str, Any]:
    """The TF integration through the cache: the blocking save, and the background save
    with what the next training step pays for it. Each checkpoint is deleted before the
    next save (its segment goes to the free pool and is reused), so the cache holds one
    segment: with the variables and their copy-on-write copies, 3x the state."""
    import tensorflow as tf

    from stride.ckptclient import tensorflow as tf_checkpoints

    size = int(args["size"])
    variables = tf_variables(size)
    checkpoint = tf.train.Checkpoint(**variables)

    # A training step that updates every variable in place, as an optimizer step does
    # (assign_sub of the scaled gradient); the tensors all have one shape, so one update
    # tensor serves them all.
    update = tf.ones_like(next(iter(variables.values())))

    def train_step() -> None:
        for variable in variables.values():
            variable.assign_add(update)
        _ = float(next(iter(variables.values()))[0])  # wait for the ops

    train_step()
    client = CheckpointClient(args["address"], JOB)
    step = size // MIB * 100 + 50

    def settle_and_free(checkpoint_id: str) -> None:
        client.wait_until_durable(checkpoint_id, 600)
        client.delete(checkpoint_id)  # its segment goes to the pool for the next save

    tf_checkpoints.save(client, checkpoint, step)  # a fresh segment; then the pool's
    settle_and_free(f"step-{step}")
    step += 1
    results: dict[str, list[float]] = {
        key: [] for key in ("step_plain", "snapshot", "step_with_snapshot", "tf_save")
    }
    results["background_save"] = []
    for _ in range(REPEATS):
        results["step_plain"].append(timed(train_step))
        saved = tf_checkpoints.save(client, checkpoint, step)
        results["tf_save"].append(saved.blocking_seconds)
        settle_and_free(saved.checkpoint_id)
        step += 1
        started = time.perf_counter()
        future = tf_checkpoints.save_in_background(client, checkpoint, step)
        results["snapshot"].append(time.perf_counter() - started)
        results["step_with_snapshot"].append(timed(train_step))
        future.result()
        results["background_save"].append(time.perf_counter() - started)
        settle_and_free(f"step-{step}")
        step += 1
    for old in client.list():
        client.delete(old.checkpoint_id)
    client.close()
    return results


PHASES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "cache": phase_cache,
    "tf": phase_tf,
    "tf_cache": phase_tf_cache,
}


def run_phase(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run one phase in a child process (its memory is all returned when it exits)."""
    output = Path(args["scratch"]) / f"phase-{name}-{uuid.uuid4().hex[:6]}.json"
    subprocess.run(
        [sys.executable, __file__, "--phase", name, json.dumps(args), str(output)],
        check=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    result: dict[str, Any] = json.loads(output.read_text())
    output.unlink()
    return result


def empty_free_pool(shm_dir: Path) -> None:
    """Give back the memory of the cache's free segments between phases (the bench's own
    shared-memory directory; the cache would expire them after its TTL)."""
    for segment in (shm_dir / JOB / ".free").glob("*.seg"):
        segment.unlink(missing_ok=True)


def bench_size(args: dict[str, Any], shm_dir: Path, lines: list[str]) -> None:
    size = int(args["size"])
    cache = run_phase("cache", args)
    empty_free_pool(shm_dir)
    tf_results = run_phase("tf", args)
    tf_results.update(run_phase("tf_cache", args))
    empty_free_pool(shm_dir)
    memcpy, save = median(cache["memcpy"]), median(cache["save"])
    memcpy2, first = median(cache["memcpy2"]), cache["first"]
    restore, durable = median(cache["restore"]), median(cache["durable"])
    persist_seconds, raw = median(cache["persist"]), median(cache["raw"])
    tf_write = median(tf_results["tf_write"])
    save_ratio = median([s / m for s, m in zip(cache["save"], cache["memcpy"], strict=True)])
    restore_ratio = median(
        [r / m for r, m in zip(cache["restore_touched"], cache["memcpy"], strict=True)]
    )
    persist_share = median([r / p for r, p in zip(cache["raw"], cache["persist"], strict=True)])
    gib = size / GIB

    def row(name: str, seconds: float, note: str) -> None:
        lines.append(f"{name:<44}{seconds * 1e3:9.1f} ms  {note}")

    first_line = len(lines)
    lines.append(f"## {size // MIB} MiB ({TENSORS} float32 tensors)")
    row("numpy memcpy (touched target)", memcpy, f"{gib / memcpy:6.2f} GiB/s")
    row("numpy memcpy, 2 threads", memcpy2, f"{memcpy2 / memcpy:6.2f}x memcpy")
    row("cache save, blocking, steady state", save, f"{save / memcpy:6.2f}x memcpy")
    row("cache save, blocking, fresh segment", first, f"{first / memcpy:6.2f}x memcpy")
    row("cache restore (from shared memory)", restore, f"{restore / memcpy:6.2f}x memcpy")
    touched = median(cache["restore_touched"])
    row("  restore + first touch of every page", touched, f"{touched / memcpy:6.2f}x memcpy")
    row(
        "tf.train.Checkpoint.write",
        tf_write,
        f"{tf_write / save:6.1f}x the cache save ({gib / tf_write:.2f} GiB/s)",
    )
    tf_async = median(tf_results["tf_async"])
    row(
        "tf.train.Checkpoint.write async, blocking",
        tf_async,
        f"until sync(): {median(tf_results['tf_async_synced']) * 1e3:.1f} ms",
    )
    row(
        "np.save (one file per tensor)",
        cache["np_save"],
        f"{cache['np_save'] / save:6.1f}x the cache save",
    )
    tf_save = median(tf_results["tf_save"])
    row("tensorflow.save through the cache, blocking", tf_save, f"{tf_save / memcpy:6.2f}x memcpy")
    snapshot = median(tf_results["snapshot"])
    row("tensorflow.save_in_background, blocking", snapshot, "the zero-copy snapshot only")
    plain, held = median(tf_results["step_plain"]), median(tf_results["step_with_snapshot"])
    row("  training step (updates all variables)", plain, "no snapshot held")
    row(
        "  the same step while the copy runs",
        held,
        f"+{(held - plain) * 1e3:.1f} ms copy-on-write and the copy's competition",
    )
    row(
        "  background save until done",
        median(tf_results["background_save"]),
        "snapshot, copy into shared memory, register",
    )
    row("save to listed durable (end to end)", durable, f"{gib / durable:6.2f} GiB/s")
    row("persistence (copy, fsync, commit)", persist_seconds, f"{gib / persist_seconds:6.2f} GiB/s")
    row("raw disk write + fsync", raw, f"{gib / raw:6.2f} GiB/s")
    bound = tf_write / memcpy
    lines.append(
        f"bound: a save that copies the state once is at most tf.train.Checkpoint.write / "
        f"memcpy = {bound:.2f}x faster than TF here"
    )
    checks = [
        ("blocking save <= 1.5x memcpy (median of paired ratios)", save_ratio, save_ratio <= 1.5),
        (">= 10x faster than tf.train.Checkpoint.write", tf_write / save, tf_write / save >= 10),
        (
            "persistence >= 80% of raw disk bandwidth (median of paired ratios)",
            persist_share,
            persist_share >= 0.8,
        ),
    ]
    for name, ratio, passed in checks:
        lines.append(f"goal: {name}: {ratio:.2f} {'PASS' if passed else 'FAIL'}")
    lines.append(
        f"restore + first touch / memcpy (median of paired ratios): {restore_ratio:.2f} "
        "(aim about 1.5)"
    )
    lines.append("")
    print("\n".join(lines[first_line:]), flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--phase":
        _, _, name, arguments, output = sys.argv
        Path(output).write_text(json.dumps(PHASES[name](json.loads(arguments))))
        return
    command = " ".join([".venv/bin/python", *sys.argv])
    sizes = SIZES
    if len(sys.argv) > 2 and sys.argv[1] == "--sizes-mib":
        sizes = [int(value) * MIB for value in sys.argv[2].split(",")]
    scratch = Path(
        tempfile.mkdtemp(prefix="stride-bench-", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    )
    shm_dir = Path("/dev/shm") / f"stride-bench-{uuid.uuid4().hex[:8]}"
    shm = shutil.disk_usage("/dev/shm")
    lines = [
        f"# python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cores, "
        f"{available_memory() / GIB:.1f} GiB available, /dev/shm "
        f"{shm.total / GIB:.1f} GiB ({shm.free / GIB:.1f} free), store on {scratch}, "
        f"load average {os.getloadavg()[0]:.1f} at the start",
        "",
    ]
    nats = NatsServer(scratch / "nats").start()
    cache = ServiceProcess(
        "ckptcache",
        {
            "STRIDE_NATS_URL": nats.url,
            "STRIDE_CKPTCACHE_STORE_DIR": str(scratch / "store"),
            "STRIDE_CKPTCACHE_SHM_DIR": str(shm_dir),
            "STRIDE_CKPTCACHE_MAX_CHECKPOINT_BYTES": str(8 * GIB),
            "STRIDE_CKPTCACHE_LOG_LEVEL": "info",  # its persist timings are read from the log
        },
        scratch,
    ).start()
    try:
        wait_serving(cache.address)
        for size in sizes:
            # The peak is the cache phase: the state, the cache's two segments, and the
            # page cache of the disk writes (reclaimable); 3.5x the state leaves margin.
            needed = int(3.5 * size)
            if available_memory() < needed or shutil.disk_usage("/dev/shm").free < 2 * size:
                lines.append(
                    f"## {size // MIB} MiB: skipped, needs about {needed / GIB:.0f} GiB of "
                    f"free memory and {2 * size / GIB:.0f} GiB of /dev/shm; "
                    f"{available_memory() / GIB:.1f} GiB available"
                )
                continue
            args = {
                "size": size,
                "scratch": str(scratch),
                "address": cache.address,
                "log_path": str(cache.log_path),
            }
            bench_size(args, shm_dir, lines)
    finally:
        cache.terminate()
        nats.stop()
        shutil.rmtree(shm_dir, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    lines.append(f"# load average {os.getloadavg()[0]:.1f} at the end")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(f"$ {command}\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    ensure_certificates()  # the services it starts serve mutual TLS
    main()
