"""Benchmark: the text example (examples/criteo-text.yaml) with and without data workers,
side by side in one run, its trainer pods capped by the kernel (GoldMiner live, issue 40).

Run: ``.venv/bin/python bench/dataworkers_live.py [--rounds N]`` (writes
``bench/results/dataworkers_live.txt``).

The real dispatcher, checkpoint cache and pod watcher (local pods under cgroup limits) on a
NATS of its own and SQLite. The job's plan is published as the optimizer would publish it:
one chief, one PS and one worker, each capped at 0.2 core (the trainers' 0.6), and

- **without**: no data worker; the chief makes each step's raw records (``make_batch``) and
  the worker decodes, hashes and crosses them inside its step (GoldMiner's original mode);
- **with**: two data workers of 0.6 core each on the other virtual node, which make the
  records and run the model's data half (found by the partitioning); the chief trains the
  training half on what they stream.

Each run trains one epoch; its throughput is the samples of the steps after the first
quarter over their time (the chief's step reports), so start-up is left out. The batch is
large (4,096), as CTR jobs' are, so the PS strategy's per-step cost does not hide the
per-sample pre-processing. The rounds alternate. Reported beside the ratio: the share of the
cores given that the job's pods used over the measured stretch (their cgroups' CPU time;
100 % is the CPU-bound limit of those cores), the share of the time the chief
waited for data, and exactly-once (every sample of the epoch trained once, from the chief's
consumed log).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "dataworkers_live.txt"
RECORDS = 491_520
BATCH = 4096
TRAINER_CAP = 0.2
"""Cores of each trainer pod (chief, PS and worker: 0.6 in all)."""
DATA_CAP = 0.6
"""Cores of each data worker (1.2 in all): with the trainers', 1.8 of the machine's 2, the
rest for the dispatcher, the agents and the pod watcher."""
MIB = 1024**2
GOAL = 2.0


def plan(job_id: str, data_workers: int) -> Any:
    from stride.events.v1 import plan_pb2

    def role(kind: plan_pb2.Role.ValueType, count: int, memory: int) -> Any:
        cap = DATA_CAP if kind == plan_pb2.ROLE_DATA_WORKER else TRAINER_CAP
        return plan_pb2.RoleResources(
            role=kind, count=count, cpu=cap if count else 0.0, memory_bytes=memory if count else 0
        )

    return plan_pb2.ResourcePlan(
        job_id=job_id,
        version=1,
        reason="bench",
        algorithm="bench/1",
        roles=[
            role(plan_pb2.ROLE_CHIEF, 1, 1536 * MIB),
            role(plan_pb2.ROLE_PS, 1, 1024 * MIB),
            role(plan_pb2.ROLE_WORKER, 1, 1024 * MIB),
            role(plan_pb2.ROLE_DATA_WORKER, data_workers, 1024 * MIB),
        ],
    )


def spec(job_id: str) -> Any:
    from stride.events.v1 import job_pb2

    return job_pb2.JobSpec(
        name=job_id,
        user="bench",
        model=job_pb2.ModelReference(
            name="criteo-text", entrypoint="stride_examples.criteo_text:train"
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-text-synthetic", record_count=RECORDS),
        batch_size=BATCH,
        hyperparameters={"learning_rate": "0.001", "embedding_dim": "8"},
        termination=job_pb2.Termination(max_epochs=1),
    )


def cpu_seconds(job_id: str) -> tuple[float, float]:
    """CPU seconds the job's trainer pods and its data workers have used, read from their
    cgroups (cpuacct, v1; the pod watcher makes them under its own group's
    ``stride/<pod>``)."""
    trainers = data = 0.0
    for path in Path("/sys/fs/cgroup/cpuacct").glob(f"**/stride/{job_id}-*/cpuacct.usage"):
        used = int(path.read_text()) / 1e9
        if f"{job_id}-data-worker-" in path.parent.name:
            data += used
        else:
            trainers += used
    return trainers, data


async def run_job(nats_url: str, pods: Path, data_workers: int) -> dict[str, Any]:
    """Submit one job and wait for its end; what its chief measured."""
    from stride.bus import topics
    from stride.events.v1 import job_pb2
    from stride.testing.bus import producer_bus

    job_id = f"job-{uuid.uuid4().hex[:10]}"
    bus = await producer_bus(nats_url, name="bench")
    await bus.ensure_streams()
    decision = job_pb2.AdmissionDecision(
        job_id=job_id, outcome=job_pb2.ADMISSION_OUTCOME_ADMITTED, spec=spec(job_id)
    )
    await bus.publish(topics.JOB_ADMITTED, job_id, decision, f"{job_id}.admitted")
    await bus.publish(topics.PLAN, job_id, plan(job_id, data_workers), f"{job_id}.plan.1")
    await bus.close()
    log = pods / "pods" / f"{job_id}-chief-0" / "trainer.log"
    deadline = time.monotonic() + 1800
    total = -(-RECORDS // BATCH)
    stretch: list[tuple[float, int, float, float]] = []
    """(time, step, trainers' and data workers' CPU seconds) at the start of the measured
    stretch and at its newest poll."""
    while time.monotonic() < deadline:
        events = _events(log)
        if any(e.get("event") == "finished" for e in events):
            break
        steps_now = [e["step"] for e in events if e.get("event") == "steps"]
        if steps_now and total // 4 <= steps_now[-1] < total - 2:  # the measured stretch
            point = (time.monotonic(), steps_now[-1], *cpu_seconds(job_id))
            stretch = [stretch[0] if stretch else point, point]
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError(f"{job_id} did not finish; its chief's log is {log}")
    steps = [e for e in events if e.get("event") == "steps"]
    queue = next((e for e in events if e.get("event") == "input queue"), {})
    start = next(e for e in steps if e["step"] >= total // 4)
    end = steps[-1]
    seconds = end["time"] - start["time"]
    consumed = [
        json.loads(line)
        for line in (pods / "jobs" / job_id / "consumed.jsonl").read_text().splitlines()
    ]
    counts = Counter(index for entry in consumed for index in entry["indices"])
    exactly_once = set(counts) == set(range(RECORDS)) and set(counts.values()) == {1}
    return {
        "samples_per_second": (end["step"] - start["step"]) * BATCH / seconds,
        "wait_share": queue.get("wait_seconds", 0.0)
        / max(1e-9, steps[-1]["time"] - steps[0]["time"]),
        "exactly_once": exactly_once,
        "by_source": queue.get("by_source", {}),
        **_cpu_use(stretch),
        "cores_given": 3 * TRAINER_CAP + data_workers * DATA_CAP,
    }


def _cpu_use(stretch: list[tuple[float, int, float, float]]) -> dict[str, float]:
    """Cores the pods used over the stretch, and the CPU seconds per sample of the trainers
    and of the data workers (the simulator's ``m`` and ``r``, per sample)."""
    if len(stretch) != 2 or stretch[1][1] <= stretch[0][1] or stretch[1][0] <= stretch[0][0]:
        return {"cores_used": 0.0, "training_cpu": 0.0, "data_cpu": 0.0}
    (t0, step0, trainers0, data0), (t1, step1, trainers1, data1) = stretch
    samples = (step1 - step0) * BATCH
    return {
        "cores_used": (trainers1 - trainers0 + data1 - data0) / (t1 - t0),
        "training_cpu": (trainers1 - trainers0) / samples,
        "data_cpu": (data1 - data0) / samples,
    }


def predicted_gain(with_data_workers: dict[str, float]) -> tuple[float, float, float]:
    """``stride sim --env dataworkers``'s throughput model for this setting: the gain it
    predicts, and the job's ``m`` and ``r`` (CPU seconds per sample of training and of
    pre-processing, measured with data workers, where the two run in different pods).

    The simulator's job does ``1`` step per second at full speed; here a step is a sample,
    and full speed is never reached (no accelerator caps it), so full speed is set far above
    what the CPUs allow. Without data workers the trainers' cores do both (``L / (m + r)``),
    with them the trainers train and the data workers pre-process
    (``min(T / m, c / r)``)."""
    from stride.sim.dataworkers import (
        DataWorkerJob,
        throughput_with_data_workers,
        throughput_without_data_workers,
    )

    full_speed = 1e9
    m, r = with_data_workers["training_cpu"], with_data_workers["data_cpu"]
    job = DataWorkerJob(
        job_id="bench",
        submit_time=0.0,
        gpus=1,
        steps=float(RECORDS),
        training_cpu_per_gpu=m * full_speed,
        preprocessing_cpu_per_gpu=r * full_speed,
    )
    trainers, data = 3 * TRAINER_CAP, 2 * DATA_CAP
    gain = throughput_with_data_workers(job, trainers, data) / throughput_without_data_workers(
        job, trainers
    )
    return gain, m, r


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def main(rounds: int) -> str:
    from stride.runtime.embedded_nats import NatsServer
    from stride.testing.channels import ensure_certificates
    from stride.testing.processes import ServiceProcess

    ensure_certificates()
    root = Path(tempfile.mkdtemp(prefix="stride-bench-dw-"))
    nats = NatsServer(store_dir=root / "nats").start()
    logs = root / "logs"
    logs.mkdir()
    shm = Path("/dev/shm") / f"stride-bench-{uuid.uuid4().hex[:8]}"
    common = {"STRIDE_NATS_URL": nats.url, "STRIDE_LOG_LEVEL": "WARNING"}
    dispatcher = ServiceProcess(
        "dispatcher",
        {**common, "STRIDE_DISPATCHER_DATABASE_URL": f"sqlite:///{root / 'd.db'}"},
        logs,
    ).start()
    ckptcache = ServiceProcess(
        "ckptcache",
        {
            **common,
            "STRIDE_CKPTCACHE_STORE_DIR": str(root / "store"),
            "STRIDE_CKPTCACHE_SHM_DIR": str(shm),
        },
        logs,
    ).start()
    pods = root / "pods"
    podwatcher = ServiceProcess(
        "podwatcher",
        {
            **common,
            "STRIDE_PODWATCHER_DATABASE_URL": f"sqlite:///{root / 'p.db'}",
            "STRIDE_PODWATCHER_LOCAL_STATE_DIR": str(pods),
            # The trainers on one virtual node, the data workers on another.
            "STRIDE_PODWATCHER_LOCAL_NODES": "2x(cpu=1.2,memory=5Gi)",
            "STRIDE_PODWATCHER_DISPATCHER_ADDRESS": dispatcher.address,
            "STRIDE_PODWATCHER_CKPTCACHE_ADDRESS": ckptcache.address,
            # One checkpoint at the end: they are bench/ckptcache.py's to measure.
            "STRIDE_PODWATCHER_CHECKPOINT_EVERY_STEPS": "100000",
            "STRIDE_PODWATCHER_STEP_REPORT_SECONDS": "1",
        },
        logs,
    ).start()
    results: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    try:
        for number in range(rounds):
            for variant, count in (("without", 0), ("with", 2)):
                result = asyncio.run(run_job(nats.url, pods, count))
                results[variant].append(result)
                print(
                    f"round {number + 1} {variant}: {result['samples_per_second']:,.0f} "
                    f"samples/s, chief waited {result['wait_share']:.0%}, pods used "
                    f"{result['cores_used']:.2f} of {result['cores_given']:.2f} cores, "
                    f"exactly once: {result['exactly_once']}",
                    flush=True,
                )
    finally:
        for process in (podwatcher, ckptcache, dispatcher):
            process.terminate()
        # Pods outlive their pod watcher by design (a new one adopts them): end them here.
        asyncio.run(_delete_pods(pods))
        shutil.rmtree(shm, ignore_errors=True)
        nats.stop()
        shutil.rmtree(root, ignore_errors=True)
    return report(results, rounds)


async def _delete_pods(pods: Path) -> None:
    from stride.podwatcher.adapters.outbound.backends.localpods import LocalPods

    leftovers = LocalPods(pods)
    for status in leftovers.adopt():
        await leftovers.delete(status.launch.pod, grace_seconds=2)
    await leftovers.close()


def report(results: dict[str, list[dict[str, Any]]], rounds: int) -> str:
    def median(variant: str, key: str) -> float:
        values = sorted(r[key] for r in results[variant])
        return float(values[len(values) // 2])

    without, with_ = median("without", "samples_per_second"), median("with", "samples_per_second")
    ratio = with_ / without
    waited = median("with", "wait_share")
    share = median("with", "cores_used") / results["with"][0]["cores_given"]
    once = all(r["exactly_once"] for rs in results.values() for r in rs)
    fed = sorted(results["with"], key=lambda r: r["samples_per_second"])[len(results["with"]) // 2]
    predicted, m, r = predicted_gain(fed)
    off = abs(predicted - ratio) / ratio
    return "\n".join(
        [
            "$ .venv/bin/python bench/dataworkers_live.py"
            + (f" --rounds {rounds}" if rounds != 2 else ""),
            f"machine: {os.cpu_count()} cores; examples/criteo-text.yaml's model, {RECORDS:,} "
            f"records, batch {BATCH}, 1 epoch; chief, PS and worker each capped at {TRAINER_CAP} "
            "core "
            f"(cgroup); median of {rounds} alternating rounds",
            "",
            f"without data workers: {without:8,.0f} samples/s  (rounds: "
            + ", ".join(f"{r['samples_per_second']:,.0f}" for r in results["without"])
            + ")",
            f"with 2 data workers:  {with_:8,.0f} samples/s  (rounds: "
            + ", ".join(f"{r['samples_per_second']:,.0f}" for r in results["with"])
            + f"; {DATA_CAP} core each)",
            f"ratio with/without: {ratio:.2f}x; goal >= {GOAL:.0f}x: "
            + ("PASS" if ratio >= GOAL else "FAIL"),
            f"with data workers the job's pods used {share:.0%} of the cores given (the "
            "CPU-bound limit of those cores is 100 %; goal within 20 %: "
            + ("PASS" if share >= 0.80 else "FAIL")
            + f"); the chief waited for data {waited:.0%} of the time",
            f"every sample trained exactly once in every run: {'yes' if once else 'NO'}",
            f"simulator's prediction (stride.sim.dataworkers' model, m = {m * 1e6:.1f} and "
            f"r = {r * 1e6:.1f} CPU-us per sample measured with data workers): {predicted:.2f}x "
            f"against {ratio:.2f}x measured, {off:.0%} off; goal within 15 %: "
            + ("PASS" if off <= 0.15 else "FAIL"),
            "",
        ]
    )


if __name__ == "__main__":
    count = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    text = main(count)
    RESULTS.write_text(text)
    print(text)
