"""The trainer's client of its pod's agent (``stride.api.agent.v1.AgentService``).

Calls retry while the agent is not up yet or restarting (UNAVAILABLE), with capped
exponential back-off, for up to ``patience`` seconds; any other refusal is raised as it is.
Control commands are watched on a thread and handed over through a queue.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from stride.api.agent.v1 import agent_service_pb2 as pb
from stride.api.agent.v1 import agent_service_pb2_grpc as pb_grpc
from stride.api.dispatcher.v1 import dispatcher_service_pb2 as dispatcher_pb
from stride.events.v1 import control_pb2, metrics_pb2, shard_pb2
from stride.runtime import tls
from stride.runtime.tokens import TokenSource

T = TypeVar("T")
RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class Command:
    """A control command for this trainer."""

    action: str
    """``pause``, ``resume``, ``stop`` or ``reconfigure``."""
    plan_version: int
    cluster_json: str
    reason: str
    paused_at: float = 0.0
    """For ``resume`` after a handover: when training paused (Unix time)."""
    checkpoint_id: str = ""
    """For ``resume`` after a handover: the checkpoint the old chief saved."""


_ACTIONS = {
    control_pb2.CONTROL_ACTION_PAUSE: "pause",
    control_pb2.CONTROL_ACTION_RESUME: "resume",
    control_pb2.CONTROL_ACTION_STOP: "stop",
    control_pb2.CONTROL_ACTION_RECONFIGURE: "reconfigure",
}
_ACTION_VALUES = {name: value for value, name in _ACTIONS.items()}


class AgentClient:
    """Calls the agent on behalf of the trainer."""

    def __init__(
        self,
        address: str,
        patience: float = 120.0,
        timeout: float = 60.0,
        token: tls.Token | None = None,
    ) -> None:
        """``token``: the pod's job token (default: ``STRIDE_JOB_TOKEN_FILE``'s); the agent
        serves only its own job's token."""
        self.address = address
        self.patience = patience
        self.timeout = timeout
        self.channel = tls.sync_channel(
            address,
            server="agent",
            identity="trainer",
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
            ],
            token=token or TokenSource.for_pod(),
        )
        self.stub = pb_grpc.AgentServiceStub(self.channel)
        self.commands: queue.Queue[Command] = queue.Queue()
        self._watcher: threading.Thread | None = None
        self._closed = threading.Event()

    def close(self) -> None:
        """Stop watching and close the channel."""
        self._closed.set()
        self.channel.close()

    def _call(self, rpc: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.patience
        delay = 0.1
        while True:
            try:
                return rpc()
            except grpc.RpcError as error:
                code = error.code()
                if code not in RETRIED or time.monotonic() + delay > deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def create_dataset(self, dataset: str, parameters: dispatcher_pb.DatasetParameters) -> bool:
        """Create the job's dataset (False if it existed with these parameters)."""
        reply = self._call(
            lambda: self.stub.CreateDataset(
                pb.CreateDatasetRequest(dataset=dataset, parameters=parameters),
                timeout=self.timeout,
            )
        )
        return bool(reply.created)

    def fetch_batches(self, dataset: str, max_batches: int) -> dispatcher_pb.FetchBatchesResponse:
        """Data-worker mode: index batches with step ids, leased to this pod."""
        reply = self._call(
            lambda: self.stub.FetchBatches(
                pb.FetchBatchesRequest(dataset=dataset, max_batches=max_batches),
                timeout=self.timeout,
            )
        )
        return reply.reply

    def report_consumed(self, dataset: str, step_id: int) -> int:
        """Data-worker mode: every step up to ``step_id`` was trained; the last consumed."""
        reply = self._call(
            lambda: self.stub.ReportConsumed(
                pb.ReportConsumedRequest(dataset=dataset, step_id=step_id), timeout=self.timeout
            )
        )
        return int(reply.consumed_step)

    def dataset_state(self, dataset: str) -> dispatcher_pb.GetDatasetStateResponse:
        """The dataset's progress at the dispatcher."""
        reply = self._call(
            lambda: self.stub.GetDatasetState(
                pb.GetDatasetStateRequest(dataset=dataset), timeout=self.timeout
            )
        )
        return reply.state

    def next_shard(
        self, dataset: str, done: int | None = None, wait: bool = True
    ) -> tuple[shard_pb2.Shard | None, bool]:
        """The next shard, and whether the data has ended; ``done`` (a finished shard's id)
        is reported done in the same call. Without ``wait``, (None, False) means "none free
        now, others still held"."""
        request = pb.NextShardRequest(dataset=dataset, no_wait=not wait)
        if done is not None:
            request.done_shard_id = done
        reply = self._call(lambda: self.stub.NextShard(request, timeout=self.timeout))
        return (reply.shard if reply.HasField("shard") else None), reply.end_of_data

    def report(self, dataset: str, shard_id: int, offset: int, done: bool) -> None:
        """Progress on a shard, or its completion."""
        self._call(
            lambda: self.stub.ReportProgress(
                pb.ReportProgressRequest(
                    dataset=dataset, shard_id=shard_id, offset=offset, done=done
                ),
                timeout=self.timeout,
            )
        )

    def report_steps(
        self,
        global_step: int,
        steps: int,
        step_seconds: float,
        samples_per_second: float,
        plan_version: int = 0,
        input_queue: metrics_pb2.InputQueue | None = None,
    ) -> None:
        """A window of steps: the samples the optimizer fits its throughput model to, with
        the chief's input queue for a job read by steps."""
        self._call(
            lambda: self.stub.ReportSteps(
                pb.ReportStepsRequest(
                    global_step=global_step,
                    steps=steps,
                    step_seconds=step_seconds,
                    samples_per_second=samples_per_second,
                    plan_version=plan_version,
                    input_queue=input_queue,
                ),
                timeout=self.timeout,
            )
        )

    def snapshot_shards(self, dataset: str) -> bytes:
        """The dataset's shard state now, to keep with a checkpoint."""
        reply = self._call(
            lambda: self.stub.SnapshotShards(
                pb.SnapshotShardsRequest(dataset=dataset), timeout=self.timeout
            )
        )
        return bytes(reply.snapshot.snapshot)

    def restore_shards(self, dataset: str, snapshot: bytes) -> int:
        """Put the shards back to ``snapshot``; returns how many leases were revoked."""
        reply = self._call(
            lambda: self.stub.RestoreShards(
                pb.RestoreShardsRequest(dataset=dataset, snapshot=snapshot), timeout=self.timeout
            )
        )
        return int(reply.restored.revoked)

    def ack(
        self,
        action: str,
        plan_version: int,
        ok: bool,
        message: str = "",
        checkpoint_id: str = "",
        paused_seconds: float = 0.0,
    ) -> None:
        """Tell the podwatcher what this trainer did with a command."""
        self._call(
            lambda: self.stub.AckControl(
                pb.AckControlRequest(
                    action=_ACTION_VALUES[action],
                    plan_version=plan_version,
                    ok=ok,
                    message=message,
                    checkpoint_id=checkpoint_id,
                    paused_seconds=paused_seconds,
                ),
                timeout=self.timeout,
            )
        )

    def watch_control(self) -> None:
        """Start a thread putting this pod's control commands on :attr:`commands`."""
        if self._watcher is not None:
            return

        def watch() -> None:
            while not self._closed.is_set():
                try:
                    for reply in self.stub.WatchControl(pb.WatchControlRequest()):
                        action = _ACTIONS.get(reply.action)
                        if action is not None:
                            self.commands.put(
                                Command(
                                    action,
                                    reply.plan_version,
                                    reply.cluster_json,
                                    reply.reason,
                                    reply.paused_at,
                                    reply.checkpoint_id,
                                )
                            )
                except grpc.RpcError:
                    pass  # the agent restarts or shuts down: watch again
                if self._closed.wait(0.5):
                    return

        self._watcher = threading.Thread(target=watch, name="stride-control", daemon=True)
        self._watcher.start()
