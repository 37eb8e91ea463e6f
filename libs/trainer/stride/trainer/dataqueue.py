"""The chief's input queue in the data-worker mode (GoldMiner sec. 3.3 and 4).

A job whose model has a data half (:func:`stride.trainer.partition.split_model`) always
takes its mini-batches by step id from the dispatcher, whether or not it has data workers
now, so that switching between the two never mixes two cursors over the same epoch:

- **with data workers**, one stream per data worker (``StreamBatches``) brings whole ready
  mini-batches, made by the data half there; the chief trains the training half on them;
- **without**, a thread of the chief fetches the steps itself (the agent names the chief's
  pod as their data worker) and makes the raw arrays with ``make_batch``; the chief trains
  the whole model on them, so the pre-processing runs on its training workers as before
  (GoldMiner's "original mode").

:class:`DataQueue` merges them and hands the loop each step exactly once, in step order
(:class:`stride.shardclient.steps.StepOrderer`): a step made twice (its data worker was
slow, the dispatcher timed it out and gave it to another) is dropped the second time, and a
step whose data worker died waits, with the steps after it held, until the dispatcher
gives it to a live one. :class:`StepFeed` groups steps into the units the loop trains and
reports them consumed once trained, which is what makes a data worker's death lose and
repeat nothing.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from stride.api.dataworker.v1 import dataworker_service_pb2 as pb
from stride.api.dataworker.v1 import dataworker_service_pb2_grpc as pb_grpc
from stride.events.v1 import metrics_pb2
from stride.shardclient.steps import StepOrderer
from stride.trainer.agent_client import AgentClient
from stride.trainer.batches import BatchError, MakeBatch, Ready, from_wire

Say = Callable[..., None]

RECONNECT_SECONDS = 1.0
"""After a data worker's stream breaks, how long before asking it again (its pod is being
relaunched at the same address, or the plan is about to drop it)."""
WAITING_LOG_SECONDS = 30.0
LOCAL_PREFETCH = 16
"""Steps the chief fetches at once when it makes them itself: one fetch per unit of
steps the loop trains (the trainer's shard_batches), as one NextShard per shard."""


@dataclass
class QueueCounters:
    """What the input queue saw: the job-level tuner's observations (GoldMiner sec. 3.4.1)."""

    arrived: int = 0
    """Mini-batches that reached the chief (duplicates included)."""
    taken: int = 0
    """Mini-batches the loop took, in order."""
    duplicates: int = 0
    wait_seconds: float = 0.0
    """Time the loop waited for its next step: the trainers starved of data."""
    produce_seconds: float = 0.0
    """Time spent making the mini-batches that arrived (on data workers or here)."""
    by_source: dict[str, int] = field(default_factory=dict)


@dataclass
class _Mark:
    """Where the counters stood when the last window began."""

    at: float
    arrived: int
    taken: int
    wait_seconds: float


class _Stream:
    """Reads one data worker's stream on a thread, reconnecting until stopped or ended."""

    def __init__(self, address: str, request: pb.StreamBatchesRequest, sink: Any, say: Say):
        self.address = address
        self.request = request
        self.sink = sink
        self.say = say
        self.stopped = threading.Event()
        self.ended = threading.Event()
        self._channel: grpc.Channel | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"stride-data-{address}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self._channel is not None:
            self._channel.close()

    def _run(self) -> None:
        while not self.stopped.is_set():
            self._channel = grpc.insecure_channel(
                self.address, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
            )
            try:
                stub = pb_grpc.DataWorkerServiceStub(self._channel)
                for message in stub.StreamBatches(self.request):
                    self.sink(self.address, from_wire(message.batch))
                self.ended.set()
                return
            except grpc.RpcError as error:
                if self.stopped.is_set():
                    return
                if error.code() in (
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.INVALID_ARGUMENT,
                ):
                    # A data worker of another job at this address, or a bad request: asking
                    # again changes nothing, and its steps go to others by time-out.
                    self.say("data worker refused", address=self.address, why=error.details())
                    return
                self.say("data worker stream broke", address=self.address, code=error.code().name)
            except BatchError as error:
                self.say("data worker sent a bad batch", address=self.address, why=str(error))
            finally:
                self._channel.close()
            self.stopped.wait(RECONNECT_SECONDS)


class _LocalProducer:
    """The chief making its own steps (no data workers): ``make_batch`` only.

    It makes only a little ahead: it fetches while fewer than ``2 x LOCAL_PREFETCH`` of its
    steps wait to be taken, or whenever the chief waits for a step it does not hold (one a
    data worker that was dropped had fetched, dispatched again: the steps made ahead of it
    cannot be taken before it). What it fetched it always makes: those steps are leased
    here."""

    def __init__(
        self,
        agent: AgentClient,
        dataset: str,
        make_batch: MakeBatch,
        sink: Any,
        say: Say,
        starving: Callable[[], bool],
    ):
        self.agent = agent
        self.dataset = dataset
        self.make_batch = make_batch
        self.sink = sink
        self.say = say
        self.starving = starving
        self.stopped = threading.Event()
        self.held = 0
        """Steps made here and not yet taken."""
        self._room = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="stride-data-local", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        with self._room:
            self._room.notify_all()

    def taken(self) -> None:
        """One of its steps was taken (or dropped as a duplicate)."""
        with self._room:
            self.held -= 1
            self._room.notify_all()

    def _may_fetch(self) -> bool:
        return self.held < LOCAL_PREFETCH * 2 or self.starving()

    def _run(self) -> None:
        while not self.stopped.is_set():
            with self._room:
                if not self._room.wait_for(self._may_fetch, timeout=0.2):
                    continue
            try:
                reply = self.agent.fetch_batches(self.dataset, LOCAL_PREFETCH)
            except grpc.RpcError as error:
                self.say("local data fetch failed", code=error.code().name)
                self.stopped.wait(RECONNECT_SECONDS)
                continue
            # What was fetched is made even if stopped meanwhile: its steps are leased here.
            for batch in reply.batches:
                with self._room:
                    self.held += 1
                started = time.perf_counter()
                indices = np.asarray(batch.indices, dtype=np.int64)
                arrays = [np.asarray(a) for a in self.make_batch(indices)]
                made = time.perf_counter() - started
                self.sink("local", Ready(batch.step_id, batch.epoch, indices, arrays, False, made))
            if not reply.batches:
                if reply.end_of_data:
                    return
                self.stopped.wait(0.2)


class DataQueue:
    """Every step once, in step order, from the job's data workers or made here."""

    def __init__(
        self,
        agent: AgentClient,
        job_id: str,
        dataset: str,
        make_batch: MakeBatch,
        consumed_step: int,
        total_steps: int,
        say: Say,
        in_flight: int = 64,
    ) -> None:
        """``in_flight``: the most steps the dispatcher hands out before the oldest is
        consumed (its ``steps_in_flight``), which bounds what can wait here."""
        self.agent = agent
        self.in_flight = in_flight
        self.dataset = dataset
        self.make_batch = make_batch
        self.total_steps = total_steps
        self.say = say
        self.counters = QueueCounters()
        self.request = pb.StreamBatchesRequest(job_id=job_id, dataset=dataset)
        self._arrivals: queue.Queue[tuple[str, Ready]] = queue.Queue()
        self._orderer: StepOrderer[Ready] = StepOrderer(consumed_step)
        self._in_order: deque[Ready] = deque()
        self._streams: dict[str, _Stream] = {}
        self._local: _LocalProducer | None = None
        self.addresses: tuple[str, ...] = ()
        self._mark = _Mark(time.monotonic(), 0, 0, 0.0)
        self._waiting = False

    @property
    def next_step(self) -> int:
        """The step the loop gets next."""
        return self._orderer.consumed_step + 1 - len(self._in_order)

    def follow(self, addresses: Sequence[str]) -> None:
        """Take mini-batches from these data workers from now on (none: make them here)."""
        wanted = tuple(addresses)
        for address in set(self._streams) - set(wanted):
            self._streams.pop(address).stop()
        for address in wanted:
            if address not in self._streams:
                self._streams[address] = _Stream(address, self.request, self._arrive, self.say)
        if wanted and self._local is not None:
            self._local.stop()
            self._local = None
        elif not wanted and self._local is None:
            self._local = _LocalProducer(
                self.agent, self.dataset, self.make_batch, self._arrive, self.say, self._starving
            )
        if wanted != self.addresses:
            self.say("data workers", addresses=list(wanted) or "none: made by the chief")
        self.addresses = wanted

    def _starving(self) -> bool:
        """Whether the loop waits for a step none of the arrivals hold."""
        return self._waiting and self._arrivals.empty()

    def _arrive(self, source: str, ready: Ready) -> None:
        self._arrivals.put((source, ready))

    def take(self) -> Ready | None:
        """The next step's mini-batch, waiting for it; None once every step was taken."""
        if self.next_step >= self.total_steps:
            return None
        started = time.monotonic()
        logged = started
        while not self._in_order:
            self._waiting = True
            try:
                source, ready = self._arrivals.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - logged > WAITING_LOG_SECONDS:
                    logged = time.monotonic()
                    self.say("waiting for a step", step=self.next_step, sources=self._sources())
                continue
            self._count(source, ready)
            self._in_order.extend(ready for _, ready in self._orderer.push(ready.step_id, ready))
        self._waiting = False
        self.counters.wait_seconds += time.monotonic() - started
        self.counters.taken += 1
        taken = self._in_order.popleft()
        if not taken.split and self._local is not None:
            self._local.taken()
        return taken

    def _count(self, source: str, ready: Ready) -> None:
        self.counters.arrived += 1
        self.counters.produce_seconds += ready.produce_seconds
        self.counters.by_source[source] = self.counters.by_source.get(source, 0) + 1
        if ready.step_id < self.next_step:
            self.counters.duplicates += 1
            if not ready.split and self._local is not None:
                self._local.taken()

    def window(self) -> metrics_pb2.InputQueue:
        """The queue since the last call (GoldMiner's indicator, sec. 3.4): arrivals and
        consumption per second, the share of the time the chief waited, what is ready."""
        now, counters, mark = time.monotonic(), self.counters, self._mark
        seconds = max(now - mark.at, 1e-9)
        waited = min(counters.wait_seconds - mark.wait_seconds, seconds)
        self._mark = _Mark(now, counters.arrived, counters.taken, counters.wait_seconds)
        capacity = self.capacity
        return metrics_pb2.InputQueue(
            data_workers=len(self.addresses),
            enqueue_rate=(counters.arrived - mark.arrived) / seconds,
            dequeue_rate=(counters.taken - mark.taken) / max(seconds - waited, 1e-9),
            wait_share=waited / seconds,
            # A step sent again after a time-out may wait beside its first copy for a while.
            queue_length=min(len(self._in_order) + self._arrivals.qsize(), capacity),
            steps_per_second=(counters.taken - mark.taken) / seconds,
            queue_capacity=capacity,
        )

    @property
    def capacity(self) -> int:
        """The most mini-batches that can be ready here: the dispatcher's steps in flight,
        or what the chief makes ahead when it makes them itself."""
        if self.addresses:
            return self.in_flight
        return min(self.in_flight, LOCAL_PREFETCH * 2)

    def _sources(self) -> list[str]:
        return list(self._streams) or ["local"]

    def close(self) -> None:
        """Stop every stream and the local producer; log what the queue saw."""
        counters = self.counters
        self.say(
            "input queue",
            arrived=counters.arrived,
            taken=counters.taken,
            duplicates=counters.duplicates,
            wait_seconds=round(counters.wait_seconds, 3),
            produce_seconds=round(counters.produce_seconds, 3),
            by_source=counters.by_source,
        )
        for stream in self._streams.values():
            stream.stop()
        self._streams.clear()
        if self._local is not None:
            self._local.stop()
            self._local = None


@dataclass(frozen=True)
class StepUnit:
    """A run of consecutive steps the loop trains together, then reports consumed."""

    steps: tuple[Ready, ...]

    @property
    def last_step(self) -> int:
        return self.steps[-1].step_id

    @property
    def samples(self) -> int:
        return sum(len(ready.indices) for ready in self.steps)

    @property
    def step_count(self) -> int:
        return len(self.steps)

    def batches(self) -> Iterator[tuple[bool, Sequence[np.ndarray]]]:
        """(made by a data worker, the arrays) per step."""
        for ready in self.steps:
            yield ready.split, ready.arrays

    def log_records(self) -> Iterator[dict[str, Any]]:
        """What the consumed log records of each step."""
        for ready in self.steps:
            yield {
                "epoch": ready.epoch,
                "step_id": ready.step_id,
                "indices": ready.indices.tolist(),
            }


class StepFeed:
    """The loop's source of steps in the data-worker mode: units of up to ``unit_steps``
    steps, reported consumed after they are trained (with the next take, or at a flush)."""

    def __init__(self, queue: DataQueue, agent: AgentClient, dataset: str, unit_steps: int):
        self.queue = queue
        self.agent = agent
        self.dataset = dataset
        self.unit_steps = unit_steps
        self._trained: int | None = None
        self.reported = queue.next_step - 1

    def take(self, wait: bool = True) -> StepUnit | None:
        """The next unit, waiting for its steps (they arrive on threads of their own, so
        asking ahead, ``wait`` false, waits too); None when every step was taken."""
        steps: list[Ready] = []
        while len(steps) < self.unit_steps:
            ready = self.queue.take()
            if ready is None:
                break
            steps.append(ready)
            if self.queue.next_step % self.unit_steps == 0:
                break  # units end on multiples, so restarts cut the same units
        return StepUnit(tuple(steps)) if steps else None

    def finished(self, unit: StepUnit) -> None:
        """Every step of ``unit`` was trained."""
        self._trained = unit.last_step
        self.flush()

    def flush(self) -> None:
        """Report the last trained step consumed (before a snapshot, or at the end)."""
        if self._trained is None or self._trained <= self.reported:
            return
        self.reported = self.agent.report_consumed(self.dataset, self._trained)

    def follow(self, addresses: Sequence[str]) -> None:
        """The plan's data workers now (see :meth:`DataQueue.follow`)."""
        self.queue.follow(addresses)

    def close(self) -> None:
        """Stop reading."""
        self.queue.close()
