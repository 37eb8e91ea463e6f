"""The chief's training loop: TensorFlow's ParameterServerStrategy with a ClusterCoordinator
and a custom loop (Keras 3's ``fit`` does not run under this strategy), fed by the shard
dispatcher through the pod's agent, checkpointed into the checkpoint cache's memory.

What a job's entrypoint gets is a :class:`TrainingContext`. The built-in loop,
:meth:`TrainingContext.fit`, is what ``stride_examples.wide_deep:train`` uses:

1. The job's dataset is created at the dispatcher (idempotent), shuffled per epoch.
2. The newest flash checkpoint of the job is restored, if there is one, together with the
   dispatcher's shard state saved with it (DLRover sec. 5.3), so at most one checkpoint
   interval of samples is repeated and none is lost.
3. Shards come from the agent; each shard's sample indices become batches
   (``make_batch(indices)``), each batch a step scheduled on whichever worker is free. When
   every step of a shard has finished, the shard is reported done and logged.
4. Every ``report_every_steps`` steps a step window goes to the agent (and a JSON line with
   the loss to stdout); every ``checkpoint_every_steps`` steps a flash checkpoint is saved.
5. Control commands: PAUSE checkpoints and waits for RESUME; STOP checkpoints and exits;
   RECONFIGURE (a new cluster: scale out or in, more PS, migrated pods) checkpoints and
   re-executes this process on the new cluster, which restores and acknowledges with the
   length of the pause (DLRover-RM sec. 5.2). Rebuilding the strategy inside the process
   is not done: TensorFlow's coordinator keeps the cluster it was created with.
6. A PS that fails makes steps fail: the chief waits until every PS answers again (the
   podwatcher relaunches it at its address) and re-executes, restoring the newest
   checkpoint. A worker that fails is the coordinator's: it reschedules the worker's steps
   and takes the relaunched worker back.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import json_format

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.events.v1 import job_pb2, shard_pb2
from stride.trainer.agent_client import AgentClient, Command
from stride.trainer.settings import TrainerSettings

SHUFFLE_SEED = 7
DEFAULT_BATCH_SIZE = 256
PS_WAIT_SECONDS = 600.0

MakeBatch = Callable[[np.ndarray], Sequence[np.ndarray]]
"""Sample indices -> the step's arrays, inputs first and labels last."""


def say(event: str, **fields: Any) -> None:
    """One JSON line on stdout: the pod's log, which ``stride logs`` shows."""
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}), flush=True)


def shard_indices(shard: shard_pb2.Shard) -> np.ndarray:
    """The sample indices of ``shard`` not yet consumed (from its offset on)."""
    if shard.indices:
        return np.asarray(shard.indices[shard.offset :], dtype=np.int64)
    return np.arange(shard.start + shard.offset, shard.end, dtype=np.int64)


@dataclass(frozen=True)
class Batch:
    """One batch of a shard, for entrypoints that write their own loop."""

    shard_id: int
    epoch: int
    indices: np.ndarray
    last_of_shard: bool


class ReExec(Exception):
    """Leave the loop and re-execute this process with ``env`` changes."""

    def __init__(self, changes: dict[str, str], why: str) -> None:
        super().__init__(why)
        self.changes = changes


def wait_for_addresses(addresses: Sequence[str], timeout: float) -> None:
    """Block until every ``host:port`` accepts a TCP connection (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    for address in addresses:
        host, _, port = address.rpartition(":")
        while True:
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{address} did not come back in {timeout:g} s") from None
                time.sleep(0.5)


def re_exec(changes: dict[str, str]) -> None:
    """Replace this process by a fresh trainer with ``changes`` in its environment."""
    env = {**os.environ, **changes}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "stride.trainer"], env)


class TrainingContext:
    """What a job's entrypoint gets: its spec, the strategy and the data."""

    def __init__(self, settings: TrainerSettings, agent: AgentClient | None = None) -> None:
        self.settings = settings
        self.spec = json_format.Parse(
            settings.spec_json or "{}", job_pb2.JobSpec(), ignore_unknown_fields=True
        )
        self.hyperparameters = dict(self.spec.hyperparameters)
        self.batch_size = int(self.spec.batch_size or DEFAULT_BATCH_SIZE)
        self.epochs = int(self.spec.termination.max_epochs or 1)
        self.agent = agent or AgentClient(settings.agent_address)
        self._strategy: Any = None
        self._coordinator: Any = None

    # --- the cluster -----------------------------------------------------------------------

    @property
    def strategy(self) -> Any:
        """The job's ``tf.distribute.experimental.ParameterServerStrategy``."""
        if self._strategy is None:
            import tensorflow as tf

            cluster = tf.train.ClusterSpec(self.settings.cluster)
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                cluster, task_type="chief", task_id=0, rpc_layer="grpc"
            )
            self._strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        return self._strategy

    @property
    def coordinator(self) -> Any:
        """The strategy's ``ClusterCoordinator``."""
        if self._coordinator is None:
            import tensorflow as tf

            self._coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
                self.strategy
            )
        return self._coordinator

    # --- data -------------------------------------------------------------------------------

    def create_dataset(self) -> None:
        """Create the job's dataset at the dispatcher (idempotent)."""
        record_count = int(self.spec.dataset.record_count)
        if record_count <= 0:
            raise ValueError("the job spec's dataset.record_count must be positive")
        created = self.agent.create_dataset(
            self.settings.dataset,
            dispatcher_pb.DatasetParameters(
                record_count=record_count,
                batch_size=self.batch_size,
                shard_batches=self.settings.shard_batches,
                epochs=self.epochs,
                shuffle=True,
                seed=SHUFFLE_SEED,
                kind=shard_pb2.SHARDING_KIND_INDEX_LIST,
            ),
        )
        say("dataset", created=created, records=record_count, epochs=self.epochs)

    def shards(self) -> Iterator[shard_pb2.Shard]:
        """The job's shards, until the data ends."""
        while True:
            self._check_commands()
            shard, end_of_data = self.agent.next_shard(self.settings.dataset)
            if shard is not None:
                yield shard
            elif end_of_data:
                return

    def batches(self) -> Iterator[Batch]:
        """Batches of sample indices for a loop of one's own; a shard is reported done when
        its last batch has been taken and the next is asked for (at least once)."""
        for shard in self.shards():
            indices = shard_indices(shard)
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                last = start + self.batch_size >= len(indices)
                yield Batch(shard.shard_id, shard.epoch, chunk, last)
            self.agent.report(self.settings.dataset, shard.shard_id, 0, done=True)

    # --- control -----------------------------------------------------------------------------

    def _check_commands(self) -> None:
        try:
            command = self.agent.commands.get_nowait()
        except queue.Empty:
            return
        self._handle(command)

    def _handle(self, command: Command) -> None:
        """Act on a command; raises ReExec or SystemExit to leave the loop."""
        say("command", action=command.action, version=command.plan_version, why=command.reason)
        if command.action == "reconfigure":
            paused = time.time()
            checkpoint_id = self.checkpoint("reconfigure")
            raise ReExec(
                {
                    "STRIDE_TRAINER_CLUSTER_JSON": command.cluster_json,
                    "STRIDE_TRAINER_PENDING_ACK": (
                        f"{command.plan_version}:{paused}:{checkpoint_id}"
                    ),
                },
                f"moving to the cluster of plan v{command.plan_version}",
            )
        if command.action == "stop":
            self.checkpoint("stop")
            say("stopped", why=command.reason)
            raise SystemExit(0)
        if command.action == "pause":
            checkpoint_id = self.checkpoint("pause")
            self.agent.ack("pause", command.plan_version, True, checkpoint_id=checkpoint_id)
            while True:
                following = self.agent.commands.get()
                if following.action == "resume":
                    self.agent.ack("resume", following.plan_version, True)
                    return
                self._handle(following)

    # --- checkpoints (set by fit) --------------------------------------------------------------

    def checkpoint(self, why: str) -> str:
        """Save a flash checkpoint now; returns its id ('' before training started)."""
        saver = getattr(self, "_saver", None)
        return "" if saver is None else str(saver(why))

    # --- the standard loop -----------------------------------------------------------------------

    def fit(
        self,
        build_model: Callable[[TrainingContext], Any],
        make_batch: MakeBatch,
        build_optimizer: Callable[[TrainingContext], Any] | None = None,
    ) -> None:
        """Train ``build_model(ctx)`` on the job's data with binary cross-entropy until the
        data ends (see the module docstring)."""
        import keras
        import tensorflow as tf

        from stride.ckptclient.client import CheckpointCacheError, CheckpointClient
        from stride.ckptclient.tensorflow import restore, save, snapshot

        settings = self.settings
        self.agent.watch_control()
        self.create_dataset()
        strategy, coordinator = self.strategy, self.coordinator
        with strategy.scope():
            model = build_model(self)
            optimizer = (
                build_optimizer(self)
                if build_optimizer is not None
                else keras.optimizers.Adam(float(self.hyperparameters.get("learning_rate", 0.001)))
            )
            optimizer.build(model.trainable_variables)
        root = tf.train.Checkpoint(model=model, optimizer=optimizer)
        cache = CheckpointClient(settings.ckptcache_address, settings.job_id)
        step = 0
        try:
            restored = restore(cache, root)
        except CheckpointCacheError as error:
            if "NOT_FOUND" not in str(error.code) and "not found" not in str(error).lower():
                raise
            say("fresh start", why="no checkpoint of this job yet")
        else:
            step = restored.step
            revoked = 0
            if restored.shard_snapshot:
                revoked = self.agent.restore_shards(settings.dataset, restored.shard_snapshot)
            # The values now in the variables, read back from the PS: equal to the saved
            # ones bit for bit (the tests compare this digest with the save's).
            say(
                "restored",
                checkpoint=restored.checkpoint_id,
                step=step,
                revoked=revoked,
                digest=digest(snapshot(root)),
            )

        saved_at: dict[int, str] = {}

        def saver(why: str) -> str:
            coordinator.join()
            if step in saved_at:  # nothing trained since: that checkpoint is this state
                return saved_at[step]
            shard_state = self.agent.snapshot_shards(settings.dataset)
            try:
                saved = save(cache, root, step, shard_snapshot=shard_state)
            except CheckpointCacheError as error:
                if "ALREADY_EXISTS" not in str(error):
                    raise
                # Saved at this step by this job before (a restored chief that has not
                # trained yet): the same state, so that checkpoint stands.
                saved_at[step] = f"step-{step}"
                return saved_at[step]
            saved_at[step] = saved.checkpoint_id
            moving = why in ("reconfigure", "pause", "stop")
            say(
                "checkpoint",
                id=saved.checkpoint_id,
                step=step,
                why=why,
                seconds=round(saved.blocking_seconds, 4),
                bytes=saved.size_bytes,
                # Before a move, the digest of what was saved (training is stopped, so the
                # variables are what the save copied); the restore logs its own.
                **({"digest": digest(snapshot(root))} if moving else {}),
            )
            return saved.checkpoint_id

        self._saver = saver
        if settings.pending_ack:
            version, began, checkpoint_id = [*settings.pending_ack.split(":", 2), "", ""][:3]
            paused = max(time.time() - float(began or time.time()), 0.0)
            self.agent.ack(
                "reconfigure",
                int(version),
                True,
                checkpoint_id=checkpoint_id,
                paused_seconds=paused,
            )
            say("reconfigured", version=int(version), paused_seconds=round(paused, 3))

        @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]
        def train_step(*arrays: Any) -> Any:
            def replica(*arrays: Any) -> Any:
                *inputs, labels = arrays
                with tf.GradientTape() as tape:
                    logits = model(list(inputs), training=True)
                    loss = tf.reduce_mean(
                        tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
                    )
                gradients = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
                return loss

            return strategy.run(replica, args=arrays)

        consumed = settings.consumed_log.open("a") if settings.consumed_log else None
        window_started, window_steps, window_samples = time.monotonic(), 0, 0
        last_checkpoint = step
        losses: list[Any] = []
        try:
            for shard in self.shards():
                indices = shard_indices(shard)
                results = []
                for start in range(0, len(indices), self.batch_size):
                    arrays = make_batch(indices[start : start + self.batch_size])
                    results.append(coordinator.schedule(train_step, args=tuple(arrays)))
                coordinator.join()
                losses = [float(r.fetch()) for r in results] or losses
                step += len(results)
                window_steps += len(results)
                window_samples += len(indices)
                self.agent.report(
                    settings.dataset, shard.shard_id, shard.offset + len(indices), done=True
                )
                if consumed is not None:
                    consumed.write(
                        json.dumps(
                            {
                                "epoch": shard.epoch,
                                "shard_id": shard.shard_id,
                                "indices": indices.tolist(),
                            }
                        )
                        + "\n"
                    )
                    consumed.flush()
                if window_steps >= settings.report_every_steps:
                    elapsed = max(time.monotonic() - window_started, 1e-9)
                    self.agent.report_steps(
                        step, window_steps, elapsed / window_steps, window_samples / elapsed
                    )
                    say(
                        "steps",
                        step=step,
                        loss=round(float(np.mean(losses)), 5),
                        samples_per_second=round(window_samples / elapsed, 1),
                    )
                    window_started, window_steps, window_samples = time.monotonic(), 0, 0
                if step - last_checkpoint >= settings.checkpoint_every_steps:
                    saver("interval")
                    last_checkpoint = step
        except (ReExec, SystemExit):
            raise
        except Exception as error:
            if not _is_cluster_failure(error):
                raise
            say("cluster failure", error=f"{type(error).__name__}: {str(error)[:300]}")
            wait_for_addresses(settings.cluster["ps"], PS_WAIT_SECONDS)
            raise ReExec(
                {"STRIDE_TRAINER_PENDING_ACK": ""}, "restoring after a PS failure"
            ) from None
        finally:
            if consumed is not None:
                consumed.close()
        saver("end of data")
        say("finished", step=step, loss=round(float(np.mean(losses)), 5) if losses else None)


def digest(arrays: dict[str, np.ndarray]) -> str:
    """A CRC-32 over every tensor's name, dtype, shape and bytes, in name order."""
    total = 0
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        header = f"{name}|{value.dtype.str}|{value.shape}".encode()
        total = zlib.crc32(value.tobytes(), zlib.crc32(header, total))
    return f"{total:08x}"


def _is_cluster_failure(error: BaseException) -> bool:
    """Whether ``error`` comes from a lost PS or worker (TensorFlow's op errors)."""
    import tensorflow as tf

    return isinstance(error, (tf.errors.OpError, ConnectionError)) or "PS" in type(error).__name__
