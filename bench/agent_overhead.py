"""Benchmark: what the agent and the dispatcher cost a training step.

Run: ``.venv/bin/python bench/agent_overhead.py`` (writes ``bench/results/agent_overhead.txt``).

The same Wide & Deep loop (``stride.trainer.loop.TrainingContext.fit``, TensorFlow's
ParameterServerStrategy with one PS and two workers as processes) runs twice over the same
samples, in one run, alternating three times:

- **agent**: shards come from a real dispatcher through a real agent sidecar (NextShard,
  ReportProgress per shard, step reports), as in every Stride pod;
- **file**: the reference. The same loop, with an agent stand-in that reads the same shards
  (the dispatcher's shuffled index lists, dumped to a local file first) from that file and
  reports nothing.

Checkpoints are off in both (they are measured by ``bench/ckptcache.py``). The goal is the
agent's loop at most 5 % slower than the file's (steps/s).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from stride.testing.channels import ensure_certificates, sync_channel

RESULTS = Path(__file__).parent / "results" / "agent_overhead.txt"
RECORDS = 160_000
BATCH = 256
ROUNDS = 3


def shard_batches() -> int:
    """Batches per shard: ``--shard-batches N``, else the trainer's default."""
    if "--shard-batches" in sys.argv:
        return int(sys.argv[sys.argv.index("--shard-batches") + 1])
    from stride.trainer.settings import TrainerSettings

    default = TrainerSettings.model_fields["shard_batches"].default
    return int(default)


SHARD_BATCHES = shard_batches()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spec_json(job_id: str) -> str:
    from google.protobuf import json_format

    from stride.events.v1 import job_pb2

    spec = job_pb2.JobSpec(
        name=job_id,
        user="bench",
        model=job_pb2.ModelReference(
            name="wide-and-deep", entrypoint="stride_examples.wide_deep:train", embedding_dim=8
        ),
        dataset=job_pb2.DatasetSpec(name="criteo-synthetic", record_count=RECORDS),
        batch_size=BATCH,
        hyperparameters={"learning_rate": "0.01"},
        termination=job_pb2.Termination(max_epochs=1),
    )
    return json_format.MessageToJson(spec, indent=None)


def child(variant: str) -> None:
    """Run the loop once (in this process) and print steps/s."""
    import numpy as np
    from stride_examples import wide_deep

    from stride.trainer.loop import TrainingContext
    from stride.trainer.settings import TrainerSettings

    settings = TrainerSettings()  # type: ignore[call-arg]
    if variant == "file":
        shards = [
            json.loads(line) for line in Path(os.environ["BENCH_SHARDS"]).read_text().splitlines()
        ]

        class FileAgent:
            """The reference's data source: a local file, nothing reported."""

            commands: object = None

            def __init__(self) -> None:
                import queue

                self.commands = queue.Queue()

            def watch_control(self) -> None: ...
            def create_dataset(self, *_: object) -> bool:
                return False

            def next_shard(self, *_: object, **__: object) -> tuple[object, bool]:
                from stride.events.v1 import shard_pb2

                if not shards:
                    return None, True
                entry = shards.pop(0)
                shard = shard_pb2.Shard(
                    shard_id=entry["shard_id"], epoch=0, indices=entry["indices"]
                )
                return shard, False

            def report(self, *_: object, **__: object) -> None: ...
            def report_steps(self, *_: object) -> None: ...
            def snapshot_shards(self, *_: object) -> bytes:
                return b""

            def restore_shards(self, *_: object) -> int:
                return 0

            def close(self) -> None: ...

        context: TrainingContext = TrainingContext(settings, FileAgent())  # type: ignore[arg-type]
    else:
        context = TrainingContext(settings)
    # Warm the strategy before the clock starts: connecting is not the data path.
    context.coordinator  # noqa: B018
    print("BEGIN", flush=True)  # the parent starts counting the helpers' CPU here
    begin = time.perf_counter()
    wide_deep.train(context)
    elapsed = time.perf_counter() - begin
    steps = int(np.ceil(RECORDS / BATCH))
    print(json.dumps({"variant": variant, "steps_per_second": steps / elapsed}), flush=True)
    os._exit(0)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> str:
    from stride.api.dispatcher.v1 import dispatcher_service_pb2 as pb
    from stride.api.dispatcher.v1 import dispatcher_service_pb2_grpc as pb_grpc
    from stride.events.v1 import shard_pb2
    from stride.runtime.embedded_nats import NatsServer
    from stride.testing.processes import ServiceProcess

    root = Path(tempfile.mkdtemp(prefix="stride-bench-agent-"))
    nats = NatsServer(store_dir=root / "nats")
    nats.start(10)
    logs = root / "logs"
    logs.mkdir()
    common = {"STRIDE_NATS_URL": nats.url, "STRIDE_LOG_LEVEL": "WARNING"}
    dispatcher = ServiceProcess(
        "dispatcher",
        {**common, "STRIDE_DISPATCHER_DATABASE_URL": f"sqlite:///{root / 'd.db'}"},
        logs,
    ).start()
    shm = Path("/dev/shm") / f"stride-bench-{uuid.uuid4().hex[:8]}"
    ckptcache = ServiceProcess(
        "ckptcache",
        {
            **common,
            "STRIDE_CKPTCACHE_STORE_DIR": str(root / "store"),
            "STRIDE_CKPTCACHE_SHM_DIR": str(shm),
        },
        logs,
    ).start()
    cluster = {
        "chief": [f"127.0.0.1:{free_port()}"],
        "ps": [f"127.0.0.1:{free_port()}"],
        "worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"],
    }
    servers = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("STRIDE_")}
    base["STRIDE_TLS_DIR"] = os.environ["STRIDE_TLS_DIR"]  # the trainers' agent client
    for role in ("ps", "worker"):
        for index in range(len(cluster[role])):
            env = {
                **base,
                "TF_CPP_MIN_LOG_LEVEL": "2",
                "STRIDE_TRAINER_ROLE": role,
                "STRIDE_TRAINER_INDEX": str(index),
                "STRIDE_TRAINER_JOB_ID": "job-bench",
                "STRIDE_TRAINER_POD_NAME": f"bench-{role}-{index}",
                "STRIDE_TRAINER_CLUSTER_JSON": json.dumps(cluster),
            }
            servers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "stride.trainer"],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    results: dict[str, list[float]] = {"agent": [], "file": []}
    cpu: list[dict[str, float]] = []
    try:
        time.sleep(3)
        for round_number in range(ROUNDS):
            for variant in ("agent", "file"):
                job = f"job-bench-{uuid.uuid4().hex[:6]}"
                agent = ServiceProcess(
                    "agent",
                    {
                        **common,
                        "STRIDE_AGENT_JOB_ID": job,
                        "STRIDE_AGENT_POD_NAME": f"{job}-chief-0",
                        "STRIDE_AGENT_ROLE": "chief",
                        "STRIDE_AGENT_DISPATCHER_ADDRESS": dispatcher.address,
                        "STRIDE_AGENT_CKPTCACHE_ADDRESS": ckptcache.address,
                    },
                    logs,
                ).start()
                shards_file = root / f"{job}.jsonl"
                if variant == "file":
                    # The dispatcher's own shards of an identical dataset, dumped first.

                    with sync_channel(dispatcher.address, "dispatcher") as channel:
                        stub = pb_grpc.DispatcherServiceStub(channel)
                        stub.CreateDataset(
                            pb.CreateDatasetRequest(
                                job_id=job,
                                dataset="train",
                                parameters=pb.DatasetParameters(
                                    record_count=RECORDS,
                                    batch_size=BATCH,
                                    shard_batches=SHARD_BATCHES,
                                    epochs=1,
                                    shuffle=True,
                                    seed=7,
                                    kind=shard_pb2.SHARDING_KIND_INDEX_LIST,
                                ),
                            ),
                            timeout=30,
                        )
                        worker = stub.RegisterWorker(
                            pb.RegisterWorkerRequest(job_id=job, worker="dump"), timeout=30
                        ).incarnation
                        ref = pb.WorkerRef(
                            job_id=job, dataset="train", worker="dump", incarnation=worker
                        )
                        with shards_file.open("w") as out:
                            while True:
                                reply = stub.GetShard(pb.GetShardRequest(worker=ref), timeout=30)
                                if not reply.HasField("shard"):
                                    break
                                out.write(
                                    json.dumps(
                                        {
                                            "shard_id": reply.shard.shard_id,
                                            "indices": list(reply.shard.indices),
                                        }
                                    )
                                    + "\n"
                                )
                                stub.ReportShardDone(
                                    pb.ReportShardDoneRequest(
                                        worker=ref, shard_id=reply.shard.shard_id
                                    ),
                                    timeout=30,
                                )
                env = {
                    **base,
                    "TF_CPP_MIN_LOG_LEVEL": "2",
                    "STRIDE_TRAINER_ROLE": "chief",
                    "STRIDE_TRAINER_JOB_ID": job,
                    "STRIDE_TRAINER_POD_NAME": f"{job}-chief-0",
                    "STRIDE_TRAINER_CLUSTER_JSON": json.dumps(cluster),
                    # ServiceProcess chose the agent's port (its GRPC_PORT is set for it).
                    "STRIDE_TRAINER_AGENT_ADDRESS": agent.address,
                    "STRIDE_TRAINER_CKPTCACHE_ADDRESS": ckptcache.address,
                    "STRIDE_TRAINER_SPEC_JSON": spec_json(job),
                    "STRIDE_TRAINER_CHECKPOINT_EVERY_STEPS": "1000000000",
                    "STRIDE_TRAINER_REPORT_EVERY_STEPS": "10",
                    "STRIDE_TRAINER_SHARD_BATCHES": str(SHARD_BATCHES),
                    # The shard path is what this measures (wide_deep would read by steps).
                    "STRIDE_TRAINER_DATA_MODE": "shards",
                    "BENCH_SHARDS": str(shards_file),
                }
                helpers = {"agent": agent, "dispatcher": dispatcher}
                pids = {name: service.process.pid for name, service in helpers.items()}  # type: ignore[union-attr]
                pids["nats"] = nats.pid
                child_process = subprocess.Popen(
                    [sys.executable, __file__, "--child", variant],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                assert child_process.stdout is not None
                output: list[str] = []
                # The helpers' CPU is counted over the timed loop only (not their start-up).
                for line in child_process.stdout:
                    output.append(line)
                    if line.startswith("BEGIN"):
                        break
                before = {name: process_cpu(pid) for name, pid in pids.items()}
                rest, errors = child_process.communicate(timeout=900)
                used = {name: process_cpu(pid) - before[name] for name, pid in pids.items()}
                done = subprocess.CompletedProcess(
                    child_process.args, child_process.returncode, "".join(output) + rest, errors
                )
                if variant == "agent":
                    cpu.append(used)
                agent.terminate()
                lines = [line for line in done.stdout.splitlines() if line.startswith('{"variant"')]
                if not lines:
                    raise RuntimeError(
                        f"{variant} run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
                    )
                rate = json.loads(lines[-1])["steps_per_second"]
                results[variant].append(rate)
                print(f"round {round_number + 1} {variant}: {rate:.1f} steps/s", flush=True)
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(10)
        dispatcher.terminate()
        ckptcache.terminate()
        shutil.rmtree(shm, ignore_errors=True)
        nats.stop()
        shutil.rmtree(root, ignore_errors=True)
    agent_rate = sorted(results["agent"])[len(results["agent"]) // 2]
    file_rate = sorted(results["file"])[len(results["file"]) // 2]
    slower = 1.0 - agent_rate / file_rate
    shards = -(-RECORDS // (BATCH * SHARD_BATCHES))
    steps = -(-RECORDS // BATCH)
    per_shard = {
        name: 1000 * sorted(run[name] for run in cpu)[len(cpu) // 2] / shards
        for name in ("agent", "dispatcher", "nats")
    }
    command = "$ .venv/bin/python bench/agent_overhead.py" + (
        f" --shard-batches {SHARD_BATCHES}" if "--shard-batches" in sys.argv else ""
    )
    lines = [
        command,
        f"machine: {os.cpu_count()} cores; 1 PS + 2 workers + chief, {RECORDS:,} samples, "
        f"batch {BATCH}, shards of {SHARD_BATCHES} batches ({shards} shards, {steps} steps); "
        f"median of {ROUNDS} alternating rounds",
        "",
        f"agent + dispatcher: {agent_rate:8.1f} steps/s   (rounds: "
        + ", ".join(f"{r:.1f}" for r in results["agent"])
        + ")",
        f"local file (ref.):  {file_rate:8.1f} steps/s   (rounds: "
        + ", ".join(f"{r:.1f}" for r in results["file"])
        + ")",
        "CPU per shard on the shared cores: "
        + ", ".join(f"{name} {ms:.1f} ms" for name, ms in per_shard.items())
        + f" ({sum(per_shard.values()) * shards / steps:.1f} ms per step)",
        f"agent is {slower:+.1%} slower; goal <= 5%: {'PASS' if slower <= 0.05 else 'FAIL'}",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ensure_certificates()  # the services it starts serve mutual TLS
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
    else:
        report = main()
        suffix = f"-shards{SHARD_BATCHES}" if "--shard-batches" in sys.argv else ""
        RESULTS.with_name(f"agent_overhead{suffix}.txt").write_text(report)
        print(report)
