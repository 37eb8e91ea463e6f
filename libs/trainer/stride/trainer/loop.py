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
4. A step window goes to the agent once it has ``report_every_steps`` steps and spans
   ``report_interval_seconds`` (and a JSON line with the loss to stdout). A flash
   checkpoint is saved between shards, before the next one would take the job more than
   ``checkpoint_every_steps`` past the last checkpoint.
5. Control commands: PAUSE checkpoints and waits for RESUME; STOP checkpoints and exits;
   RECONFIGURE (a new cluster: DLRover-RM sec. 5.2) is followed without leaving the process
   where TensorFlow allows it (:mod:`stride.trainer.cluster`): workers only, the variables
   stay on the PS and nothing is saved; a PS change checkpoints, reconnects, rebuilds the
   model over the new PS and restores; a moved chief checkpoints and hands over to its
   standby pod. Otherwise the process re-executes on the new cluster and restores. The
   acknowledgement goes out once the first step on the new cluster has finished, with the
   length of the pause.
6. A PS that fails makes steps fail: the chief waits until every PS answers again (the
   podwatcher relaunches it at its address) and re-executes, restoring the newest
   checkpoint. A worker that fails is the coordinator's: it reschedules the worker's steps
   and takes the relaunched worker back.

Every start and every move logs ``first step`` when its first step has finished, with the
time: the end of the pause, for the migration benchmark and for ``stride logs``.
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
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from google.protobuf import json_format

from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.events.v1 import job_pb2, metrics_pb2, shard_pb2
from stride.trainer.agent_client import AgentClient, Command
from stride.trainer.batches import MakeBatch
from stride.trainer.cluster import Cluster, ClusterChange, ClusterConnection, MoveFailed, classify
from stride.trainer.dataqueue import DataQueue, StepFeed
from stride.trainer.feed import LeaseKeeper, ShardFeed, shard_indices
from stride.trainer.settings import TrainerSettings, parse_cluster

SHUFFLE_SEED = 7
DEFAULT_BATCH_SIZE = 256
PS_WAIT_SECONDS = 600.0


def say(event: str, **fields: Any) -> None:
    """One JSON line on stdout: the pod's log, which ``stride logs`` shows."""
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}), flush=True)


SAVE_ATTEMPTS = 6
SAVE_RETRY_SECONDS = 1.0
"""A save the checkpoint cache cannot take (restarting, unreachable) is tried this many
times, a second apart (the supervisor brings a killed cache back in about two); an interval
checkpoint is then skipped, a move's checkpoint fails."""


def _cache_away(error: Exception) -> bool:
    """Whether the cache was unreachable or too slow (worth another try), not a refusal."""
    text = f"{getattr(error, 'code', '')} {error}"
    return "UNAVAILABLE" in text or "DEADLINE_EXCEEDED" in text


def _cache_full(error: Exception) -> bool:
    """Whether the cache refused the save for memory (its budget, the job's quota, its
    uploads at once: RESOURCE_EXHAUSTED)."""
    return "RESOURCE_EXHAUSTED" in f"{getattr(error, 'code', '')} {error}"


def after_save_failure(
    error: Exception, moving: bool, attempt: int
) -> Literal["raise", "retry", "skip"]:
    """What a chief does when its checkpoint cache refused save ``attempt``: retry a cache
    that is away (restarting, slow); skip an interval checkpoint the cache is away for, or
    full for (it only bounds what a crash repeats: a cache restarted or full must not end
    the training; bench/chaos.py saw a SIGKILLed cache kill the chief); raise anything else,
    and any failure of the checkpoint a move needs."""
    away = _cache_away(error)
    if away and attempt < SAVE_ATTEMPTS:
        return "retry"
    if moving or not (away or _cache_full(error)):
        return "raise"
    return "skip"


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


@dataclass(frozen=True)
class PendingAck:
    """A pause that ends with the next finished step, and the answer owed for it."""

    action: str
    """``reconfigure`` (this chief moved) or ``resume`` (a standby took over)."""
    plan_version: int
    paused_at: float
    """When training paused, in Unix time."""
    checkpoint_id: str = ""
    change: str = ""
    """What the move changed (:class:`~stride.trainer.cluster.ClusterChange` value)."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds from the pause to the end of each phase of the move (saved, connected,
    restored, scheduled), logged with the answer: where a pause goes."""

    def mark(self, phase: str) -> None:
        """``phase`` ended now."""
        self.phases[phase] = round(time.time() - self.paused_at, 3)

    def encode(self) -> str:
        """The ``STRIDE_TRAINER_PENDING_ACK`` value a re-executed chief reads back."""
        return f"{self.plan_version}:{self.paused_at}:{self.checkpoint_id}"

    @classmethod
    def decode(cls, text: str) -> PendingAck:
        """Read :meth:`encode`'s form back (the re-execution path)."""
        version, began, checkpoint_id = [*text.split(":", 2), "", ""][:3]
        return cls(
            "reconfigure", int(version), float(began or time.time()), checkpoint_id, "re-exec"
        )


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


class StepWindow:
    """The steps since the last report: the throughput samples the optimizer fits to."""

    def __init__(
        self,
        agent: AgentClient,
        every_steps: int,
        every_seconds: float,
        queue: Callable[[], metrics_pb2.InputQueue] | None = None,
    ) -> None:
        self.queue = queue
        """The input queue's window, for a job read by steps."""
        self.agent = agent
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.restart()

    def restart(self) -> None:
        """Start a new window now (after a pause, whose time is no step's)."""
        self.started, self.steps, self.samples = time.monotonic(), 0, 0

    def add(self, steps: int, samples: int) -> None:
        """Steps finished."""
        self.steps += steps
        self.samples += samples

    def report(
        self, global_step: int, plan_version: int, losses: list[float], force: bool = False
    ) -> None:
        """Report the window once it is long enough (or now, ``force``: the data ended, or
        the plan is about to change), with a JSON line for ``stride logs``."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        if not self.steps or (
            not force and (self.steps < self.every_steps or elapsed < self.every_seconds)
        ):
            return
        queue = self.queue() if self.queue is not None else None
        self.agent.report_steps(
            global_step,
            self.steps,
            elapsed / self.steps,
            self.samples / elapsed,
            plan_version,
            queue,
        )
        said: dict[str, Any] = {}
        if queue is not None:
            said["data_workers"] = queue.data_workers
            said["waited"] = round(queue.wait_share, 3)
            said["ready"] = queue.queue_length
        say(
            "steps",
            step=global_step,
            loss=round(float(np.mean(losses)), 5) if losses else None,
            samples_per_second=round(self.samples / elapsed, 1),
            plan=plan_version,
            **said,
        )
        self.restart()


@dataclass
class _Trainable:
    """What :meth:`TrainingContext.fit` trains; rebuilt when the PS change."""

    model: Any
    optimizer: Any
    root: Any
    train_step: Any
    split_step: Any = None
    """The training half's step (on a data worker's mini-batches), for a model with a data
    half (:func:`stride.trainer.partition.split_model`); None otherwise."""
    train_model: Any = None

    def step_for(self, split: bool) -> Any:
        """The step that trains a mini-batch made by a data worker (``split``) or here."""
        return self.split_step if split else self.train_step


DENSE_GRADIENT_BYTES = 4 * 1024 * 1024
"""An embedding table of at most this size has its gradient sent to its parameter server
dense (the table's size a step) instead of as a row per lookup: a large batch's lookups
outnumber a small table's rows (the text example: 209k rows of gradient, 8.4 MB with their
indices, for a table of 51k rows, 1.6 MB), and the PS, which parses and applies what it is
sent, was the data-worker mode's bottleneck (bench/dataworkers_live.py: the PS's CPU per
sample 9.7 us before, 2.2 us after; the worker's sum of the rows costs it 3 us). A larger
table keeps the sparse gradient: its size does not grow with the table."""


def _dense_if_small(gradient: Any, variable: Any) -> Any:
    """``gradient`` as a dense tensor if it is a sparse one (IndexedSlices) of a variable of
    at most :data:`DENSE_GRADIENT_BYTES`."""
    import tensorflow as tf

    if not isinstance(gradient, tf.IndexedSlices):
        return gradient
    # A Keras variable's dtype is a name, its shape a tuple.
    size = tf.TensorShape(variable.shape).num_elements()
    if size is None or size * tf.as_dtype(variable.dtype).size > DENSE_GRADIENT_BYTES:
        return gradient
    return tf.convert_to_tensor(gradient)


def _make_train_step(strategy: Any, model: Any, optimizer: Any) -> Any:
    """One step of binary cross-entropy under ``strategy``, as a tf.function."""
    import tensorflow as tf

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
            gradients = [
                _dense_if_small(gradient, variable)
                for gradient, variable in zip(gradients, model.trainable_variables, strict=True)
            ]
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss

        return strategy.run(replica, args=arrays)

    return train_step


def _moving_by_re_exec(command: Command, paused: float, checkpoint_id: str, why: str) -> ReExec:
    """Re-execute on the command's cluster; the new process restores and answers it."""
    pending = PendingAck("reconfigure", command.plan_version, paused, checkpoint_id, "re-exec")
    return ReExec(
        {
            "STRIDE_TRAINER_CLUSTER_JSON": command.cluster_json,
            "STRIDE_TRAINER_PENDING_ACK": pending.encode(),
        },
        f"moving to the cluster of plan v{command.plan_version} by re-execution: {why}",
    )


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
        self.connection: ClusterConnection | None = None
        self.plan_version = settings.plan_version
        """The plan version the job trains under now (step reports carry it)."""
        self._follow: Callable[[Command], None] | None = None
        self._saver: Callable[[str], str] | None = None
        self._leases: LeaseKeeper | None = None

    # --- the cluster -----------------------------------------------------------------------

    def _connection(self) -> ClusterConnection:
        if self.settings.role == "data_worker":
            raise RuntimeError(
                "a data worker has no TensorFlow cluster: it serves mini-batches from "
                "ctx.fit, and an entrypoint with a loop of its own gets no data workers"
            )
        if self.connection is None:
            self.connection = ClusterConnection(self.settings.cluster)
            self.connection.connect()
        return self.connection

    @property
    def strategy(self) -> Any:
        """The job's ``tf.distribute.experimental.ParameterServerStrategy``. A loop of one's
        own that holds on to it follows a new cluster by re-execution (only :meth:`fit`
        moves in place)."""
        return self._connection().strategy

    @property
    def coordinator(self) -> Any:
        """The strategy's ``ClusterCoordinator``."""
        return self._connection().coordinator

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

    def index_dataset(self) -> Any:
        """A ``tf.data.Dataset`` of the job's batches of sample indices (int64 vectors of up
        to ``batch_size``), read from the dispatcher shard by shard through the agent, for a
        loop of one's own: ``ctx.index_dataset().map(to_features)`` and schedule steps on
        ``ctx.coordinator``. Shards are reported done as :meth:`batches` does, when the
        batch after a shard's last is taken."""
        import tensorflow as tf

        return tf.data.Dataset.from_generator(
            lambda: (batch.indices for batch in self.batches()),
            output_signature=tf.TensorSpec(shape=(None,), dtype=tf.int64),
        )

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
            if self._follow is not None:
                self._follow(command)
                return
            paused = time.time()
            checkpoint_id = self.checkpoint("reconfigure")
            raise _moving_by_re_exec(command, paused, checkpoint_id, "a loop of its own")
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

    def _wait_for_takeover(self) -> Command:
        """A standby chief: wait for RESUME (take over) for this pod; STOP ends it.

        Meanwhile it listens on its own address, as a PS or worker's server does once it is
        up: the podwatcher tells the old chief to move only when the new pods accept
        connections, and this one is ready once its TensorFlow and the job's code are
        loaded. The socket is closed before TensorFlow binds the address itself."""
        address = self.settings.cluster["chief"][0]
        host, _, port = address.rpartition(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, int(port)))
            listener.listen()
        except OSError as error:
            say("standby", warning=f"cannot listen on {address}: {error}")
        say("standby", why="waiting for the chief it replaces to hand over")
        try:
            while True:
                command = self.agent.commands.get()
                say(
                    "command",
                    action=command.action,
                    version=command.plan_version,
                    why=command.reason,
                )
                if command.action == "resume":
                    return command
                if command.action == "stop":
                    say("stopped", why=command.reason)
                    raise SystemExit(0)
        finally:
            listener.close()

    def _hand_over(self, command: Command, paused: float) -> None:
        """This chief's pod moved: save, tell the podwatcher (which resumes the standby in
        the new pod), and wait to be removed. Never returns."""
        checkpoint_id = self.checkpoint("reconfigure")
        new_chief = parse_cluster(command.cluster_json)["chief"][0]
        # Said before the ack: the ack lets the podwatcher delete this pod, and its SIGTERM
        # can arrive before a line written after it (seen on a loaded 2-core machine).
        say("handed over", version=command.plan_version, to=new_chief, checkpoint=checkpoint_id)
        self.agent.ack(
            "reconfigure",
            command.plan_version,
            True,
            message=f"handed over to the chief at {new_chief}",
            checkpoint_id=checkpoint_id,
            paused_seconds=time.time() - paused,
        )
        if self._leases is not None:  # the new chief restores the shards from the checkpoint
            self._leases.close()
        while True:  # the podwatcher deletes this pod (SIGTERM) once the standby has it
            following = self.agent.commands.get()
            if following.action == "stop":
                say("stopped", why=following.reason)
                raise SystemExit(0)

    # --- checkpoints (set by fit) --------------------------------------------------------------

    def checkpoint(self, why: str) -> str:
        """Save a flash checkpoint now; returns its id ('' before training started)."""
        return "" if self._saver is None else str(self._saver(why))

    # --- the standard loop -----------------------------------------------------------------------

    def fit(
        self,
        build_model: Callable[[TrainingContext], Any],
        make_batch: MakeBatch,
        build_optimizer: Callable[[TrainingContext], Any] | None = None,
    ) -> None:
        """Train ``build_model(ctx)`` on the job's data with binary cross-entropy until the
        data ends (see the module docstring)."""

        from stride.ckptclient.client import CheckpointCacheError, CheckpointClient
        from stride.ckptclient.tensorflow import restore, save, snapshot

        settings = self.settings
        if settings.role == "data_worker":
            self._serve_data(build_model, make_batch)
            return
        self.agent.watch_control()
        self.create_dataset()
        cluster: Cluster = settings.cluster
        pending: PendingAck | None = None
        if settings.standby:
            takeover = self._wait_for_takeover()
            if takeover.cluster_json:
                cluster = parse_cluster(takeover.cluster_json)
            pending = PendingAck(
                "resume",
                takeover.plan_version,
                takeover.paused_at or time.time(),
                takeover.checkpoint_id,
                ClusterChange.CHIEF_MOVED.value,
            )
        elif settings.pending_ack:
            pending = PendingAck.decode(settings.pending_ack)
        if self.connection is None or self.connection.cluster != cluster:
            self.connection = ClusterConnection(cluster)
            self.connection.connect()
        if pending is not None:
            pending.mark("connected")
        connection = self.connection
        cache = CheckpointClient(settings.ckptcache_address, settings.job_id)
        leases = LeaseKeeper(self.agent, settings.dataset, settings.lease_heartbeat_seconds, say)
        self._leases = leases

        def build() -> _Trainable:
            return self._trainable(connection.strategy, build_model, build_optimizer)

        def verified() -> dict[str, str]:
            # Reading every variable back costs seconds for a large model: off by default.
            return {"digest": digest(snapshot(trained.root))} if settings.verify_restores else {}

        trained = build()
        step = 0
        try:
            # After a move by re-execution or a handover, the checkpoint saved for it.
            restored = restore(cache, trained.root, pending.checkpoint_id if pending else "")
        except CheckpointCacheError as error:
            if "NOT_FOUND" not in str(error.code) and "not found" not in str(error).lower():
                raise
            say("fresh start", why="no checkpoint of this job yet")
        else:
            step = restored.step
            revoked = 0
            if restored.shard_snapshot:
                revoked = self.agent.restore_shards(settings.dataset, restored.shard_snapshot)
            if pending is not None:
                pending.mark("restored")
            say(
                "restored",
                checkpoint=restored.checkpoint_id,
                step=step,
                revoked=revoked,
                **verified(),
            )

        feed: ShardFeed | StepFeed = (
            self._step_feed(make_batch, cluster)
            if trained.split_step is not None
            else ShardFeed(self.agent, settings.dataset, leases, make_batch, self.batch_size)
        )
        saved_at: dict[int, str] = {}

        def saver(why: str) -> str:
            connection.coordinator.join()
            moving = why in ("reconfigure", "pause", "stop")
            # The snapshot below must count every shard this state has trained on.
            feed.flush()
            if step in saved_at:  # nothing trained since: that checkpoint is this state
                if moving:
                    say(
                        "checkpoint",
                        id=saved_at[step],
                        step=step,
                        why=why,
                        reused=True,
                        **verified(),
                    )
                return saved_at[step]
            shard_state = self.agent.snapshot_shards(settings.dataset)
            for attempt in range(1, SAVE_ATTEMPTS + 1):
                try:
                    saved = save(cache, trained.root, step, shard_snapshot=shard_state)
                    break
                except CheckpointCacheError as error:
                    if "ALREADY_EXISTS" in str(error):
                        # Saved at this step by this job before (a restored chief that has
                        # not trained yet): the same state, so that checkpoint stands.
                        saved_at[step] = f"step-{step}"
                        return saved_at[step]
                    action = after_save_failure(error, moving, attempt)
                    if action == "raise":
                        raise
                    if action == "retry":
                        time.sleep(SAVE_RETRY_SECONDS)
                        continue
                    say("checkpoint skipped", step=step, why=why, error=str(error)[:200])
                    return ""
            saved_at[step] = saved.checkpoint_id
            say(
                "checkpoint",
                id=saved.checkpoint_id,
                step=step,
                why=why,
                seconds=round(saved.blocking_seconds, 4),
                bytes=saved.size_bytes,
                # Before a move, the digest of what was saved (training is stopped, so the
                # variables are what the save copied); the restore logs its own.
                **(verified() if moving else {}),
            )
            return saved.checkpoint_id

        def follow(command: Command) -> None:
            """Move to the command's cluster (see stride.trainer.cluster)."""
            nonlocal trained, pending
            # What this plan measured so far is its own; the next window is the new plan's.
            window.report(step, self.plan_version, losses, force=True)
            paused = time.time()
            new = parse_cluster(command.cluster_json)
            feed.follow(new.get("data_worker", ()))
            change = classify(connection.cluster, new)
            say("moving", version=command.plan_version, change=change.value)
            if change is ClusterChange.NONE:
                # Only data workers or pod sizes changed: nothing to move, but the windows
                # from here on measure the new plan.
                self.plan_version = max(self.plan_version, command.plan_version)
                self.agent.ack("reconfigure", command.plan_version, True, paused_seconds=0.0)
                return
            if change is ClusterChange.CHIEF_MOVED:
                self._hand_over(command, paused)
            checkpoint_id = ""
            moving = PendingAck("reconfigure", command.plan_version, paused, "", change.value)
            if change is not ClusterChange.WORKERS:
                checkpoint_id = saver("reconfigure")
                moving.mark("saved")
            if change is ClusterChange.INCOMPATIBLE:
                raise _moving_by_re_exec(command, paused, checkpoint_id, change.value)
            if change is ClusterChange.PARAMETER_SERVERS:
                # The old variables go first, so the PS that stay never hold two copies.
                trained = _Trainable(None, None, None, None)
            try:
                connection.move(new, keep_state=change is ClusterChange.WORKERS)
            except MoveFailed as error:
                # This process's view of the variables is gone. After a PS change the
                # checkpoint just saved is restored; after a workers-only move (nothing
                # saved) the newest periodic one, with at most one interval repeated.
                say("move failed", why=str(error), then="re-executing")
                raise _moving_by_re_exec(command, paused, checkpoint_id, str(error)) from None
            moving.mark("connected")
            if change is ClusterChange.PARAMETER_SERVERS:
                trained = build()
                restored = restore(cache, trained.root, checkpoint_id)
                say(
                    "restored",
                    checkpoint=restored.checkpoint_id,
                    step=restored.step,
                    revoked=0,
                    **verified(),
                )
            else:
                trained.train_step = _make_train_step(
                    connection.strategy, trained.model, trained.optimizer
                )
                if trained.split_step is not None:
                    trained.split_step = _make_train_step(
                        connection.strategy, trained.train_model, trained.optimizer
                    )
            moving.mark("restored" if change is ClusterChange.PARAMETER_SERVERS else "rebuilt")
            pending = replace(moving, checkpoint_id=checkpoint_id)

        self._saver = saver
        self._follow = follow
        consumed = settings.consumed_log.open("a") if settings.consumed_log else None
        window = StepWindow(
            self.agent,
            settings.report_every_steps,
            settings.report_interval_seconds,
            feed.queue.window if isinstance(feed, StepFeed) else None,
        )
        last_checkpoint = step
        losses: list[Any] = []
        first_step = True
        try:
            self._check_commands()
            unit = feed.take(wait=True)
            while unit is not None:
                results = [
                    connection.coordinator.schedule(trained.step_for(split), args=tuple(arrays))
                    for split, arrays in unit.batches()
                ]
                if pending is not None:
                    pending.mark("scheduled")  # the new step function traced and sent
                if (first_step or pending is not None) and results:
                    # The pause ends when training makes progress again: the first of these
                    # steps to finish, on whichever worker (a new one's first step also
                    # loads the function there).
                    first_finished(results)
                    self._first_step(pending, step + 1)
                    if pending is not None:  # a new plan's measurements start now
                        window.restart()
                    first_step, pending = False, None
                # While the steps run: the next unit, with the last one reported done.
                upcoming = feed.take(wait=False)
                connection.coordinator.join()
                losses = [float(r.fetch()) for r in results] or losses
                step += len(results)
                window.add(len(results), unit.samples)
                feed.finished(unit)  # type: ignore[arg-type]  # the feed's own unit
                if consumed is not None:
                    consumed.writelines(json.dumps(r) + "\n" for r in unit.log_records())
                    consumed.flush()
                window.report(step, self.plan_version, losses)
                # Checkpoints fall between units; one is saved before the next unit would
                # take the job past the interval, so a restore never repeats more than it.
                coming = upcoming.step_count if upcoming is not None else settings.shard_batches
                if step - last_checkpoint + coming > settings.checkpoint_every_steps:
                    saver("interval")
                    last_checkpoint = step
                self._check_commands()
                unit = upcoming if upcoming is not None else feed.take(wait=True)
            feed.flush()
            window.report(step, self.plan_version, losses, force=True)
            if pending is not None:
                # Moved (or took over) with no data left to train on: the move is still
                # complete, and whoever waits for its answer must hear it.
                self._first_step(pending, step, trained=False)
                pending = None
        except (ReExec, SystemExit):
            raise
        except Exception as error:
            if not _is_cluster_failure(error):
                raise
            say("cluster failure", error=f"{type(error).__name__}: {str(error)[:300]}")
            wait_for_addresses(connection.cluster["ps"], PS_WAIT_SECONDS)
            raise ReExec(
                {
                    "STRIDE_TRAINER_PENDING_ACK": "",
                    "STRIDE_TRAINER_CLUSTER_JSON": json.dumps(connection.cluster),
                },
                "restoring after a PS failure",
            ) from None
        finally:
            leases.close()
            feed.close()
            if consumed is not None:
                consumed.close()
        saver("end of data")
        say("finished", step=step, loss=round(float(np.mean(losses)), 5) if losses else None)

    def _trainable(
        self,
        strategy: Any,
        build_model: Callable[[TrainingContext], Any],
        build_optimizer: Callable[[TrainingContext], Any] | None,
    ) -> _Trainable:
        """The job's model and optimizer under ``strategy``, with their train steps: the
        whole model's, and the training half's for a model with a data half."""
        import keras
        import tensorflow as tf

        from stride.trainer.partition import split_model

        with strategy.scope():
            model = build_model(self)
            optimizer = (
                build_optimizer(self)
                if build_optimizer is not None
                else keras.optimizers.Adam(float(self.hyperparameters.get("learning_rate", 0.001)))
            )
            optimizer.build(model.trainable_variables)
        # The whole model is what a checkpoint holds, whichever half trains.
        root = tf.train.Checkpoint(model=model, optimizer=optimizer)
        half = split_model(model).train_model if self.settings.data_mode == "auto" else model
        return _Trainable(
            model,
            optimizer,
            root,
            _make_train_step(strategy, model, optimizer),
            _make_train_step(strategy, half, optimizer) if half is not model else None,
            half,
        )

    def _step_feed(self, make_batch: MakeBatch, cluster: Cluster) -> StepFeed:
        """The data-worker mode's feed, from the step the dispatcher has as consumed (after a
        restore, the checkpoint's), reading from the plan's data workers."""
        settings = self.settings
        state = self.agent.dataset_state(settings.dataset)
        consumed = state.consumed_step if state.HasField("consumed_step") else -1
        per_epoch = -(-int(self.spec.dataset.record_count) // self.batch_size)
        queue = DataQueue(
            self.agent,
            settings.job_id,
            settings.dataset,
            make_batch,
            consumed,
            per_epoch * self.epochs,
            say,
            in_flight=state.steps_in_flight if state.HasField("steps_in_flight") else 64,
        )
        queue.follow(cluster.get("data_worker", ()))
        say("data-worker mode", consumed_step=consumed, data_workers=len(queue.addresses))
        return StepFeed(queue, self.agent, settings.dataset, settings.shard_batches)

    def _serve_data(
        self, build_model: Callable[[TrainingContext], Any], make_batch: MakeBatch
    ) -> None:
        """This pod is a data worker: serve the job's ready mini-batches until SIGTERM."""
        from stride.trainer.batches import Producer
        from stride.trainer.dataworker import serve_batches
        from stride.trainer.partition import split_model

        split = split_model(build_model(self))
        if split.data_model is None:
            say("no data half", why="the model has no stateless part ahead of its state")
        producer = Producer(make_batch, split.data_model)
        code = serve_batches(self.settings.job_id, self.settings.port, self.agent, producer, say)
        raise SystemExit(code)

    def _first_step(self, pending: PendingAck | None, step: int, *, trained: bool = True) -> None:
        """The first step since this process started or moved has finished (or, with
        ``trained`` false, none will: the data ran out): the pause is over; answer the
        command that caused it."""
        if pending is None:
            say("first step", step=step, after="start")
            return
        paused = max(time.time() - pending.paused_at, 0.0)
        self.plan_version = max(self.plan_version, pending.plan_version)
        self.agent.ack(
            pending.action,
            pending.plan_version,
            True,
            checkpoint_id=pending.checkpoint_id,
            paused_seconds=paused,
        )
        if trained:
            say("first step", step=step, after=pending.action, change=pending.change)
        else:
            say("no step left", step=step, after=pending.action, change=pending.change)
        say(
            "reconfigured" if pending.action == "reconfigure" else "resumed",
            version=pending.plan_version,
            change=pending.change,
            paused_seconds=round(paused, 3),
            phases=pending.phases,
        )


def first_finished(results: Sequence[Any]) -> None:
    """Wait until one of the coordinator's ``RemoteValue`` results is ready."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=len(results), thread_name_prefix="stride-first")
    try:
        wait([pool.submit(result.fetch) for result in results], return_when=FIRST_COMPLETED)
    finally:
        # The other fetches end with their steps, which the loop joins next anyway.
        pool.shutdown(wait=False)


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
